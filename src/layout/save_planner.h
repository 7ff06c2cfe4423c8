// The save planner: from what every rank holds to who writes what, where.
//
// Input: for each rank, the shards it holds (key, dtype, global shape,
// slice) and the blobs it wants saved. Output: a SavePlan (pure and
// deterministic, no I/O); under 1,024 ranks the engine plans on rank 0
// and sends each rank its part (plan_part.h); from 1,024 ranks all ranks
// reach the same parts together (engine/plan/distributed_plan.h).
//
// Guarantees:
// - All ranks agree on dtype and shape of each key, else InvalidArgument.
// - Equal slices of a tensor on several ranks are one chunk with several
//   holders (replicas). The unique chunks of each tensor tile it exactly
//   (tiling.h), else InvalidArgument.
// - Every holder of a replicated chunk other than its writer is listed in
//   SavePlan::copies, so that the engine can check that the copies are
//   replicas indeed (equal bytes), not different data under one slice. For
//   a chunk cut into pieces every holder is listed, once, for all pieces.
// - Each unique chunk is written exactly once, by one of its holders.
//   Writers are balanced: chunks held by one rank go to that rank; replicated
//   chunks are then assigned largest first to the least-loaded holder (ties:
//   lowest rank). A replicated chunk larger than the split size (a
//   sixteenth of the ideal share, unique bytes / ranks, and at least
//   SavePlanOptions::min_split_bytes) is first cut into up to one piece per
//   holder: flat ranges of its slice, each written by the holder it is
//   assigned to (PlannedChunk::shard_offset says where the piece starts in
//   that holder's shard), so one large replicated tensor does not land on
//   one rank. On DP x TP x PP and ZeRO layouts no rank writes more than
//   1.1x its ideal share (engine/bench/planner_benchmark.cc measures it).
// - Each rank's chunks are packed into files of at most max_file_bytes of
//   payload (a chunk larger than the cap gets its own file), filled largest
//   chunk first into the file with the least payload, so files are similar
//   in size and can be written in parallel.
// - Global blobs are written by the lowest rank that supplied them (all
//   suppliers must supply the same size); per-rank blobs by their rank. A
//   name may not be both per-rank and global, nor appear twice on one rank.
// - Chunks without elements (e.g. an empty ZeRO flat shard) are dropped,
//   unless the tensor itself has no elements: then its chunks are kept so
//   the key still appears in the checkpoint.
// - A rank with nothing to write gets no file; any other rank gets
//   max(1, ceil(bytes of its items up to the cap / max_file_bytes)) files,
//   one more whenever the least-full file cannot take the next item, and one
//   per item larger than the cap.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "shardsafe/status.h"
#include "shardsafe/types.h"

namespace shardsafe {

struct ShardInfo {
  std::string key;
  DType dtype = DType::kF32;
  Shape shape;  // global shape
  Slice slice;
};

struct BlobInfo {
  std::string name;
  uint64_t bytes = 0;
  bool per_rank = false;
};

// What one rank holds. Index positions matter: the plan refers to a rank's
// shards and blobs by their index in these vectors.
struct RankHoldings {
  std::vector<ShardInfo> shards;
  std::vector<BlobInfo> blobs;
};

struct PlannedChunk {
  uint32_t tensor = 0;  // index into SavePlan::tensors
  Slice slice;
  uint64_t bytes = 0;
  int writer = 0;             // rank that writes it
  uint32_t writer_shard = 0;  // index into holdings[writer].shards
  uint64_t shard_offset = 0;  // byte offset of its first byte in that shard
  uint32_t holders = 0;       // number of ranks that held it
};

// A holder of a replicated chunk that does not write it, or a holder of a
// chunk cut into pieces: its copy covers `chunks` consecutive chunks from
// `chunk` (the pieces, in order), whose written checksums combine into the
// checksum of the copy.
struct HeldCopy {
  int rank = 0;
  uint32_t shard = 0;   // index into holdings[rank].shards
  uint32_t chunk = 0;   // index into the whole plan's SavePlan::chunks
  uint32_t chunks = 1;  // how many
};

// The size of a copy in a part of a plan, which holds none of the copy's
// chunks: `bytes` in all, in pieces of `piece_bytes` but the last.
struct CopyShape {
  uint64_t bytes = 0;
  uint64_t piece_bytes = 0;
};

struct PlannedTensor {
  std::string key;
  DType dtype = DType::kF32;
  Shape shape;
  // Indices into SavePlan::chunks, in row-major order of box offset, then
  // flat begin.
  std::vector<uint32_t> chunks;
};

struct PlannedBlob {
  std::string name;
  bool per_rank = false;
  int rank = 0;          // for per-rank blobs: whose blob; for global: the writer
  uint32_t writer_blob;  // index into holdings[rank].blobs
  uint64_t bytes = 0;
};

struct PlannedFile {
  int rank = 0;         // the writer
  uint32_t number = 0;  // per-rank file number, from 0
  std::vector<uint32_t> chunks;  // indices into SavePlan::chunks
  std::vector<uint32_t> blobs;   // indices into SavePlan::blobs
  uint64_t payload_bytes = 0;    // sum of chunk and blob bytes
};

// Set in one rank's part of a plan (plan_part.h): the whole plan's numbers
// of the part's files and chunks (what the rank's reports name), what the
// rank writes, and the whole plan's totals.
struct PlanPartInfo {
  std::vector<uint32_t> files;   // whole-plan number of each file of the part
  std::vector<uint32_t> chunks;  // whole-plan number of each chunk of the part
  uint64_t rank_bytes = 0;       // payload the part's rank writes
  uint64_t max_rank_bytes = 0;   // the most any rank writes
  uint64_t whole_files = 0;      // files in the whole plan
  uint64_t held_bytes = 0;       // chunk bytes x holders, summed over the whole plan
  std::vector<CopyShape> copy_shapes;  // of each copy of the part (SavePlan::copies)
};

struct SavePlan {
  std::vector<PlannedTensor> tensors;  // sorted by key
  std::vector<PlannedChunk> chunks;
  std::vector<PlannedBlob> blobs;      // sorted by (name, rank)
  std::vector<PlannedFile> files;      // sorted by (rank, number)
  std::vector<HeldCopy> copies;        // sorted by (rank, chunk)
  std::vector<uint64_t> bytes_per_rank;  // payload each rank writes (empty in a part)
  uint64_t unique_bytes = 0;             // sum over chunks and blobs
  std::optional<PlanPartInfo> part;      // set in a rank's part only
};

struct SavePlanOptions {
  uint64_t max_file_bytes = uint64_t{2} << 30;
  // Replicated chunks are never cut into pieces smaller than this.
  uint64_t min_split_bytes = uint64_t{1} << 20;
};

// Plans a save of `holdings` (index = rank). InvalidArgument on any layout
// violation, with the key and ranks involved in the message.
Result<SavePlan> PlanSave(std::span<const RankHoldings> holdings,
                          const SavePlanOptions& options);

// The rules PlanSave follows, for a planner that runs them in parts on
// several ranks (engine/plan/distributed_plan.h) and must reach the same
// plan.

// The split size: a sixteenth of `unique_bytes` / `ranks`, and at least
// options.min_split_bytes (and 1).
uint64_t SplitBytes(uint64_t unique_bytes, size_t ranks, const SavePlanOptions& options);

// How many pieces a chunk of `bytes` held by `holders` ranks is cut into:
// 1 (not cut) unless it is replicated and larger than `split_bytes`.
uint64_t PieceCount(uint64_t bytes, uint64_t holders, uint64_t split_bytes);

// The elements of each piece but the last when `elements` are cut into
// `count` pieces: a multiple of 8 (whole bytes of every dtype).
uint64_t PieceElements(uint64_t elements, uint64_t count);

// How a chunk of `elements` is cut when PieceCount gave `count`: cut or
// not, the elements of each piece but the last, and how many pieces there
// are (rounding a piece up to 8 elements can leave fewer than `count`; a
// chunk cut into one piece is still cut: a flat range, every holder a copy).
struct PieceCut {
  bool cut = false;
  uint64_t per = 0;
  uint64_t pieces = 1;
};
PieceCut CutInto(uint64_t elements, uint64_t count);

// Packs one rank's items (chunks, then blobs, in the plan's order) into
// files: largest first into the file with the least payload (ties: lowest
// number), a new file when that one would pass the cap, a file of its own
// for an item larger than the cap. Returns each file's items, in the order
// they were placed.
std::vector<std::vector<uint32_t>> PackIntoFiles(std::span<const uint64_t> item_bytes,
                                                 uint64_t max_file_bytes);

}  // namespace shardsafe
