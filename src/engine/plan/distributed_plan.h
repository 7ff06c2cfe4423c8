// A save plan made by all ranks together: each tensor planned on its home
// rank, rank 0 left only what needs the whole job (the writers of
// replicated chunks, the blobs, the totals), so that no rank handles every
// rank's layout.
//
// PlanSave (layout/save_planner.h) on one rank needs every rank's shards:
// at 16,384 ranks millions of them, seconds of work and gigabytes of memory
// on that rank. Here the same plan is reached in six rounds, and every rank,
// 0 included, ends with the part PartOfPlan(PlanSave(all), rank) would give
// it, byte for byte (distributed_plan_test.cc checks it); no rank holds the
// whole plan:
//
//   1. all-to-all: every rank sends each of its shards to the key's home,
//      HomeOf(key, world), a hash of the key: a rank sends its own layout.
//   2. all-to-all: each home checks its keys as PlanSave does (dtype and
//      shape agree, slices valid, each slice held once per rank, the
//      unique slices tile the tensor), finds each key's chunks and their
//      holders, and tells every rank how many bytes of chunks it alone
//      holds (it writes those): 8 bytes per home and holder.
//   3. gather to rank 0: each rank's own-chunk bytes and blobs; as a home,
//      its keys (names, chunk counts), the bytes of its chunks, and its
//      replicated chunks (size, position, holders; the holder lists
//      deduplicated and written as arithmetic runs, so that a DP group of
//      2,048 ranks takes 5 bytes); any error.
//   4. scatter from rank 0: rank 0 numbers the chunks (keys in name
//      order), cuts large replicated chunks into pieces and gives them
//      and the other replicated chunks writers, largest first to the
//      least-loaded holder as PlanSave does (a heap per distinct holder
//      list of over 64 ranks), plans the blobs (PlanSave over
//      the blobs alone) and the totals; each rank gets its blobs' writers
//      and the totals, each home its keys' first chunk numbers and its
//      replicated chunks' writers; or every rank the lowest failing
//      rank's error.
//   5. all-to-all: each home sends each holder the chunks it writes (the
//      whole plan's numbers) and the copies it checks.
//   6. all-gather: each rank packs its files (PackIntoFiles) and sends
//      their count, or that it failed: the whole plan's file numbers follow,
//      and every rank returns the same status.
//
// What each rank handles is its own layout and part, and, as a home, its
// keys' shards (a home of an FSDP tensor receives one shard from every
// rank of its group); rank 0 also a few numbers per rank (own-chunk bytes,
// blobs, file counts) and per replicated chunk. Homes spread the keys: a
// job with fewer keys than ranks leaves most ranks without one.
//
// RankPlanner holds one rank's side; the rounds' collectives are the
// caller's (PlanOverComm runs them over a Comm; plan_simulation.h routes
// the messages of simulated ranks in one process), so the
// same code runs either way. Each method is called once, in order, by
// every rank (Coordinate by rank 0 only). A failure is carried through the
// remaining rounds, never returned early: Finish returns it on every rank.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "layout/save_planner.h"
#include "shardsafe/comm.h"
#include "shardsafe/status.h"

namespace shardsafe {

namespace wire {
class Reader;
}
class KeyHome;

class RankPlanner {
 public:
  // `holdings` must outlive the planner; its shards are read in ToHomes
  // only, its blobs in every round.
  RankPlanner(int rank, int world, const RankHoldings& holdings, const SavePlanOptions& options);
  ~RankPlanner();

  // Round 1: one message per rank (empty where it is no home of a key this
  // rank holds).
  std::vector<std::string> ToHomes();
  // Round 2: as a home, from every rank's round-1 message (index = rank);
  // returns one message per rank.
  std::vector<std::string> PlanHome(const std::vector<std::string>& from_ranks);
  // Round 3: from every home's round-2 message; the message for rank 0.
  std::string Summary(const std::vector<std::string>& from_homes);
  // Round 4, on rank 0: from every rank's summary, one message per rank.
  static std::vector<std::string> Coordinate(const std::vector<std::string>& summaries,
                                             const SavePlanOptions& options);
  // Round 5: from rank 0's message for this rank; one message per rank.
  std::vector<std::string> Assign(std::string_view decision);
  // Round 6: from every home's round-5 message; this rank's message for
  // the all-gather.
  std::string PackPart(const std::vector<std::string>& from_homes);
  // This rank's part of the plan, from every rank's round-6 message; the
  // lowest failing rank's error on every rank.
  Result<SavePlan> Finish(const std::vector<std::string>& packed);
  // After Finish: this rank's side as a home (its keys' chunks, for the
  // index: distributed_index.h).
  std::unique_ptr<KeyHome> TakeHome();

 private:
  void Fail(Status s);
  Status ReadTotals(wire::Reader& r);
  Status TakeAssignments(const std::vector<std::string>& from_homes);

  int rank_;
  int world_;
  const RankHoldings& holdings_;
  SavePlanOptions options_;
  Status error_;  // the first failure; carried through the later rounds
  std::unique_ptr<KeyHome> home_;
  std::vector<int> homes_;  // the homes this rank sent shards to
  size_t shards_ = 0;       // in its holdings (read in round 1 only)
  SavePlan part_;  // totals from Assign, built in PackPart, numbered in Finish
  std::vector<uint8_t> blob_writes_;     // whether this rank writes each of its blobs
  std::vector<std::string> chunk_keys_;  // the key of each chunk of part_
};

// Bytes a rank sent and received in the six rounds of a distributed plan:
// each message once as sent by its sender and once as received by each
// rank that gets it, a rank's message to itself included (the all-gather's
// message: sent once, received by every rank).
struct PlanTraffic {
  uint64_t sent = 0;
  uint64_t received = 0;
};

// Runs the six rounds over `comm`: this rank's part of the plan of every
// rank's `holdings`, or the error every rank returns.
// `home` (when set) receives RankPlanner::TakeHome.
Result<SavePlan> PlanOverComm(Comm& comm, const RankHoldings& holdings,
                              const SavePlanOptions& options, PlanTraffic* traffic = nullptr,
                              std::unique_ptr<KeyHome>* home = nullptr);

}  // namespace shardsafe
