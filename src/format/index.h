// The checkpoint index (shardsafe.json) as JSON text: the structs are public
// (shardsafe/index.h), their byte form is this module's.
//
// docs/format.md §3 is the specification. Serialize writes it; Parse reads
// it from untrusted bytes and validates everything that can be checked
// without the data files and without geometry beyond one chunk (the tiling
// of a tensor by its chunks is checked by the engine with layout/tiling.h).
// Thread-safe (pure functions).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "format/chunk_table.h"
#include "shardsafe/index.h"
#include "shardsafe/status.h"

namespace shardsafe {

class PackedTensors;  // format/index_packed.h

// Compact JSON text of `index` (docs/format.md §3): version 4 when its
// chunk table is in parts (CheckpointIndex::chunk_tables, listed in
// `files`), 3 or 2 with one table (with checksum files or not), its
// tensors naming their place in it; else version 1 with the chunks.
std::string SerializeIndex(const CheckpointIndex& index);
// What a commit writes: the index text, and the parts of the chunk table
// when it has one (docs/format.md §3c).
struct CommitIndex {
  std::string text;
  std::shared_ptr<const EncodedChunkTable> table;  // null: none
};
// The index of `index` for a commit, with `table` (null: none) set in it
// (SetChunkTable). ResourceExhausted, naming the size, the limit and the
// chunk count, when the text is larger than `limit` (what a loader reads,
// kMaxIndexBytes), so that no save commits an index that no load can open.
Result<CommitIndex> SerializeIndexToCommit(const CheckpointIndex& index,
                                           std::shared_ptr<const EncodedChunkTable> table,
                                           uint64_t limit = kMaxIndexBytes);
// Whether file `file` of `index` holds data (a safetensors file), not
// checksums (§3b) or a part of the chunk table (§3c).
bool IsDataFile(const CheckpointIndex& index, uint32_t file);
// Chunks of all tensors of `index` (a table's count where a tensor has one).
uint64_t ChunkCount(const CheckpointIndex& index);
// The index with every chunk inline (the version-1 form, also for an index
// read with its chunk table: what tools print), handed to `sink` in
// consecutive pieces of about 1 MiB, so that a large index is printed
// without a copy in memory.
void SerializeIndex(const CheckpointIndex& index,
                    const std::function<void(std::string_view)>& sink);
// The same of an index whose tensors are `tensors` (its own `tensors`
// ignored), every tensor with the chunks `tensors` holds.
void SerializeIndex(const CheckpointIndex& index, const PackedTensors& tensors,
                    const std::function<void(std::string_view)>& sink);

// Parses untrusted index bytes. `source` (the file path) prefixes every
// error. DataLoss naming the field for any violation listed in
// docs/format.md §3 "Validation on read" except tiling (left to the engine),
// and for: a duplicate key in any JSON object, nesting deeper than 256, a
// repeated file name, a file or blob rank >= world_size, world_size 0, a
// global blob without exactly one chunk, a per-rank blob naming a rank
// twice, a tensor whose element count overflows 64 bits. FailedPrecondition
// for a newer version than this reader supports.
Result<CheckpointIndex> ParseIndex(std::string_view text, std::string_view source);

// The index text a piece at a time: each call returns the next piece
// (empty at the end), valid until the next call; an error ends the text.
using IndexTextReader = std::function<Result<std::string_view>()>;
// ParseIndex of the text `next` gives, never held whole: a reader's error
// comes first, then those of the whole-text checks (size, NUL, byte order
// mark), then the parser's, as ParseIndex of the whole text.
Result<CheckpointIndex> ParseIndex(const IndexTextReader& next, std::string_view source);

// ParseIndex with the tensors read into `*tensors` (empty before; sealed:
// format/index_packed.h), not into the index returned, which holds none.
// The same checks and errors.
Result<CheckpointIndex> ParseIndex(std::string_view text, std::string_view source,
                                   PackedTensors* tensors);
Result<CheckpointIndex> ParseIndex(const IndexTextReader& next, std::string_view source,
                                   PackedTensors* tensors);

// The name under which a chunk of `key` covering `slice` is stored in its
// data file: `key` itself for the whole tensor, else "key[o:e,...]" with
// ".flat[b:e]" for a flat range (docs/format.md §2).
std::string ChunkEntryName(std::string_view key, const Slice& slice, const Shape& shape);
// "__blob__/NAME" or "__blob__/NAME/rank-RRRRR".
std::string BlobEntryName(std::string_view name, std::optional<int> rank);

}  // namespace shardsafe
