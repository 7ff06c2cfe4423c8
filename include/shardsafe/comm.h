// Comm: the collective operations shardsafe needs from the job's own
// distributed engine (MPI, torch.distributed, or threads in one process).
//
// Contract for every backend:
// - Collectives are called by every rank of the group in the same order
//   (SPMD). A rank that hits a local error still enters the remaining
//   collectives of the protocol and sends its error through them, so no rank
//   is left waiting; the engine is written that way.
// - Byte payloads may differ in size between ranks and may be empty.
// - A Comm object is used by one thread at a time (its rank's thread).
// - Errors: Unavailable when the transport fails; InvalidArgument for a bad
//   root rank.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "shardsafe/status.h"

namespace shardsafe {

class Comm {
 public:
  virtual ~Comm() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;

  // Every rank contributes `mine`; every rank receives all contributions,
  // indexed by rank.
  virtual Result<std::vector<std::string>> AllGather(std::string_view mine) = 0;

  // Rank `root` sends `data`; every rank (root included) receives it. The
  // argument is ignored on other ranks.
  virtual Result<std::string> Broadcast(std::string_view data, int root) = 0;

  // Returns when every rank has entered the barrier.
  virtual Status Barrier() = 0;

  // Rank `root` receives every rank's `mine`, indexed by rank; the other
  // ranks receive an empty vector. The default all-gathers (correct, but
  // every rank receives everything); the backends here override it so that
  // only the root receives.
  virtual Result<std::vector<std::string>> Gather(std::string_view mine, int root);

  // Rank `root` sends parts[r] to rank r (`parts` has one entry per rank
  // there, else InvalidArgument; it is ignored on other ranks); every rank
  // receives its own part. The default broadcasts every part to every rank
  // (correct, but each receives all); the backends here send each its own.
  virtual Result<std::string> Scatter(const std::vector<std::string>& parts, int root);

  // Every rank sends parts[r] to rank r (`parts` has one entry per rank,
  // else InvalidArgument on every rank) and receives, indexed by rank, what
  // each rank sent it. The default all-gathers every rank's parts (correct,
  // but every rank receives everything); the backends here send each part
  // to its rank only, so that a rank's traffic is its own parts.
  virtual Result<std::vector<std::string>> AllToAll(const std::vector<std::string>& parts);

  // The elementwise maximum of `values` over all ranks; every rank passes
  // the same number of values (else InvalidArgument). The default
  // all-gathers; the backends here reduce, so that a rank sends and
  // receives a few times `values`, whatever the group's size.
  virtual Result<std::vector<uint64_t>> AllReduceMax(std::span<const uint64_t> values);
};

// One process, one rank: collectives return immediately.
std::unique_ptr<Comm> MakeSingleProcessComm();

// `n` ranks as threads of one process. Returns n Comm objects sharing a
// rendezvous; give object i to the thread that plays rank i. The objects
// must outlive every collective call on them.
std::vector<std::unique_ptr<Comm>> MakeThreadComms(int n);

}  // namespace shardsafe
