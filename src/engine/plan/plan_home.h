// A home's side of a distributed plan (distributed_plan.h): the keys whose
// home this rank is, checked and cut into chunks as PlanSave does, and the
// home's messages in rounds 2, 3 and 5.
//
// The messages of every round (comm/wire.h encoding; "home part" is what
// KeyHome writes or reads, the rest RankPlanner):
//   1. rank -> home: U64 keys, each: Str key, U8 dtype, Shape, U64 shards,
//      each: U32 shard (index into the rank's holdings), Slice.
//   2. home -> holder: U64 bytes of the chunks only that rank holds.
//   3. rank -> rank 0: Status; if OK: U64 bytes of the chunks only this
//      rank holds, U64 blobs, each Str name, U64 bytes, U8 per-rank; the
//      home part: U64 chunk bytes, U64 chunk bytes x holders, U64 holder
//      lists, each a list of runs (U64 runs, each U64 first rank, U64
//      stride, U64 count: ascending ranks), U64 keys, each: Str key, U8
//      dtype, U64 chunks, U64 replicated chunks, each: U64 position among
//      the key's chunks, U64 bytes, U64 elements, U64 holder list.
//   4. rank 0 -> rank: Status (the lowest failing rank's); if OK: U64
//      unique bytes, U64 bytes x holders, U64 the most any rank writes,
//      U64 what this rank writes, U64 blobs (as sent), each U8 whether this
//      rank writes it; the home part: U64 split size, per key U64 its first
//      chunk number, per replicated chunk (keys in order) U64 pieces (1:
//      not cut), each U32 writer.
//   5. home -> holder: groups, each U8 1, Str key, U8 dtype, Shape, U64
//      chunks the holder writes, each U32 shard, Slice, U64 bytes, U64
//      offset in the shard, U32 holders, U32 chunk number; U64 copies it
//      checks, each U32 shard, U32 first chunk number, U32 chunks, U64
//      bytes, U64 bytes of a piece; then U8 0.
//   6. rank -> every rank: Status; if OK: U64 files.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "comm/wire.h"
#include "layout/save_planner.h"
#include "shardsafe/index.h"

namespace shardsafe {

// The home rank of `key` in a job of `world` ranks: a hash of the key.
int HomeOf(std::string_view key, int world);

// One of a home's keys as the index lists it: its chunks (pieces cut, in
// the whole plan's order from `first_number`) with their slices and bytes
// (file and offset unset).
struct HomeTensor {
  std::string key;
  uint64_t first_number = 0;
  IndexTensor tensor;
};

class KeyHome {
 public:
  KeyHome(int rank, int world) : rank_(rank), world_(world) {}

  // Round 2: every rank's round-1 message (index = rank). InvalidArgument
  // on a layout PlanSave refuses, naming the key and ranks.
  Status Plan(const std::vector<std::string>& from_ranks);
  // Round 2's messages: to every rank that sent shards, its single-holder
  // bytes (0 after a failure, whose error the home's summary carries).
  std::vector<std::string> OwnBytesMessages() const;
  // Round 3.
  void PutSummary(wire::Writer& w) const;
  // Round 4.
  Status ReadDecision(wire::Reader& r);
  // Round 5: one message per rank.
  std::vector<std::string> AssignmentMessages() const;
  // After round 4: the home's keys, in key order (distributed_index.h).
  std::vector<HomeTensor> IndexTensors() const;

 private:
  struct Holder {
    int rank;
    uint32_t shard;  // index into the rank's holdings
  };
  struct Held {
    Holder holder;
    Slice slice;
  };
  struct Chunk {
    Slice slice;
    uint64_t bytes;
    uint64_t elements;
    uint32_t begin, end;  // its holders: Key::holders[begin, end), ranks ascending
    int item;             // index into items_ if replicated, else -1
  };
  struct Key {
    std::string name;
    DType dtype;
    Shape shape;
    int first_rank;
    std::vector<Held> held;        // as received; freed once planned
    std::vector<Holder> holders;   // of the chunks, in chunk order
    std::vector<Chunk> chunks;
    uint64_t first_number = 0;
  };
  struct Item {
    Key* key;
    uint32_t chunk;
    uint32_t set;             // index into sets_
    std::vector<int> writers;  // one per piece
  };

  Status Receive(int rank, std::string_view msg);
  uint64_t& OwnBytes(int rank);
  Status PlanKey(Key& key);
  uint32_t SetOf(const Key& key, const Chunk& c);

  int rank_;
  int world_;
  std::map<std::string, Key> keys_;  // by name: the whole plan's order
  std::vector<Item> items_;          // keys in order, then position
  std::vector<std::vector<int>> sets_;
  std::map<std::vector<int>, uint32_t> set_ids_;
  // The ranks that sent shards (ascending) and the bytes of the chunks
  // each alone holds: as many as the home's keys have holders, not the
  // job's ranks.
  std::vector<int> senders_;
  std::vector<uint64_t> own_bytes_;  // by position in senders_
  uint64_t unique_bytes_ = 0;
  uint64_t held_bytes_ = 0;
  uint64_t split_bytes_ = 0;
  bool failed_ = false;
};

// A chunk a rank writes, as its home assigned it.
struct ReceivedChunk {
  uint32_t number = 0;  // in the whole plan
  std::string key;
  PlannedChunk chunk;  // tensor unset
};

// Decodes a round-5 message to `rank`: the chunks it writes, their
// tensors (by key) and the copies it checks.
Status ReadAssignment(std::string_view msg, int rank, std::vector<ReceivedChunk>* chunks,
                      std::map<std::string, PlannedTensor>* tensors,
                      std::vector<std::pair<HeldCopy, CopyShape>>* copies);

// Piece [lo, hi) of the elements of replicated chunk `chunk`: a flat range.
Slice PieceSlice(const Slice& chunk, uint64_t lo, uint64_t hi);

// A dtype as the messages write it (U8), checked (Internal when unknown).
Result<DType> GetDType(wire::Reader& r);

// Bytes of `n` elements of a chunk whose bytes are known to fit.
uint64_t BytesOf(DType dtype, uint64_t n);

// Ascending ranks as arithmetic runs, and back (at least one run,
// ascending, within `world`, else Internal).
struct RankRun {
  uint32_t first, stride, count;
  uint32_t last() const { return first + stride * (count - 1); }
};
void PutRanks(wire::Writer& w, const std::vector<int>& ranks);
Result<std::vector<RankRun>> GetRankRuns(wire::Reader& r, int world);

}  // namespace shardsafe
