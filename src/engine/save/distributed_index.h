// The index of a save whose plan all ranks made (distributed_plan.h), made
// by all ranks too: each home encodes its keys' part of the chunk table
// (docs/format.md §3c) from where their writers put each chunk, and rank 0
// assembles the rest of the index (files, tensors' table references,
// blobs) from one summary per rank. No rank handles every chunk: a home
// its keys' chunks, a writer its own, rank 0 a few numbers per file, key
// and blob.
//
// A data file's layout (its header, each entry's offset, its size) follows
// from the plan alone (LayOutFile), so both rounds run once per plan,
// before anything is written, and what they make holds for every save of
// the plan (a save then only fills in the blobs' checksums and what
// changes per save: the tag, the time, the user's JSON, the files' names):
//
//   7. all-to-all, writer -> home: for each chunk of the home's keys the
//      writer writes, U32 chunk number (the whole plan's), U32 file (the
//      whole plan's), U64 offset in the file. Each home checks that it got
//      every chunk of its keys exactly once, and encodes its part of the
//      table (EncodeTablePart, keys in order).
//   8. gather to rank 0: Status; if OK: U64 files, each U64 bytes (the
//      rank's files in order: the whole plan numbers them by rank); U64
//      its checksum file's entries (its non-empty chunks); U64 blobs it
//      writes, each U32 file (among the rank's), Str name, U8 per-rank,
//      U32 rank, U64 offset, U64 bytes (in file order, each file's in
//      entry order); as a home: U64 part bytes, U64 keys, each Str key, U8
//      dtype, Shape, U64 chunks, U64 directory offset, U64 records offset,
//      U32 directory CRC-32C.
//
// A failure anywhere (a message cut short, a chunk missing at its home)
// reaches every rank: rank 0 broadcasts the outcome.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "engine/plan/plan_home.h"
#include "engine/save/save_writer.h"
#include "engine/save/user_json.h"
#include "format/chunk_table.h"
#include "layout/save_planner.h"
#include "shardsafe/comm.h"
#include "shardsafe/index.h"

namespace shardsafe {

// What rank 0 keeps of a plan's index: every save of the plan commits it
// with the blobs' checksums and the save's names and values filled in
// (IndexOfSave).
struct IndexSkeleton {
  // Files (data files, then checksum files, then the table's parts; names
  // unset), tensors (with their table references), blobs (checksums
  // unset), checksum files and chunk tables (names unset).
  CheckpointIndex index;
  // Each file's writer and, for a data file, its number among the rank's.
  enum class FileKind : uint8_t { kData, kChecksums, kTablePart };
  struct FileName {
    FileKind kind = FileKind::kData;
    int rank = 0;
    uint32_t number = 0;
  };
  std::vector<FileName> names;
  // By data file (the whole plan's number): its blobs in entry order, as
  // (blob name, position among the blob's chunks).
  std::vector<std::vector<std::pair<std::string, size_t>>> blob_slots;
};

// The index of one save of the plan: `skeleton` with files named with
// `file_suffix` (SaveDirs), stamped (StampIndex), and the blobs' checksums
// from what each data file reported (`written`, every rank's files by
// whole plan number, blobs in entry order). InternalError for a report of
// another file or blob count.
Result<CheckpointIndex> IndexOfSave(const IndexSkeleton& skeleton,
                                    const std::vector<std::vector<WrittenFile>>& written,
                                    const UserJson& json, const std::string& tag,
                                    const std::string& file_suffix);

// One rank's side of rounds 7 and 8; the collectives are the caller's
// (IndexOverComm), as for RankPlanner.
class IndexRounds {
 public:
  // `part`: this rank's part of the plan; `home`: its side as a home
  // (RankPlanner::TakeHome; null: the rank is home to no key).
  IndexRounds(int rank, int world, const SavePlan& part, const KeyHome* home);

  // Round 7: one message per rank (empty where it writes none of that
  // rank's keys' chunks).
  std::vector<std::string> ToHomes();
  // Round 8: from the round-7 messages to this rank (any order; empty ones
  // may be left out); this rank's summary.
  std::string Summary(const std::vector<std::string>& from_writers);
  // This rank's part of the table, once Summary ran (empty: no keys).
  const std::string& table_part() const { return table_part_; }
  // Rank 0: the skeleton from every rank's summary.
  static Result<IndexSkeleton> Assemble(const std::vector<std::string>& summaries);

 private:
  Status EncodePart(const std::vector<std::string>& from_writers, std::vector<IndexTableRef>* refs);

  int rank_;
  int world_;
  const SavePlan& part_;
  const KeyHome* home_;
  std::vector<SafetensorsLayout> layouts_;  // of the part's files
  Status error_;
  std::vector<HomeTensor> tensors_;
  std::string table_part_;
};

// Runs rounds 7 and 8 over `comm` and broadcasts rank 0's outcome: on rank
// 0 the skeleton, on every rank its part of the table (`*table_part`), or
// the same error everywhere.
Result<IndexSkeleton> IndexOverComm(Comm& comm, const SavePlan& part, const KeyHome* home,
                                    std::string* table_part);

}  // namespace shardsafe
