// The chunk table of a version-2 index and later (docs/format.md §3a,
// §3c: in parts from version 4): every
// tensor's chunks as fixed-size binary records, grouped in blocks of 16
// that a directory describes by the bounding box of their elements, so
// that a loader reads only the blocks that can hold what it loads.
//
// Layout of one tensor's part (little-endian), at offsets the index gives
// (the writer puts every directory first, then every tensor's records):
//   directory: its levels (LevelSizes), top first, each entry
//              {u64 lo[ndim], u64 hi[ndim], u32 crc32c, u32 0}
//   records:   count x {u64 at, u64 bytes, u64 flat_begin, u64 flat_end,
//                       u32 file, u32 crc32c, u32 flags, u32 0,
//                       u64 offset[ndim], u64 size[ndim]}
//
// Bounds. A slice's bounds are a box holding all its elements: a box
// without a flat range is its own bounds. A flat range [b, e) of box B
// runs row-major from element b to element e-1 of B; where their
// coordinates first differ, in dimension k, the bounds take the
// coordinates both share before k, [first_k, last_k] in k, and B's whole
// extent after k (exactly the range when it is one row). A block's bounds
// are the smallest box holding its records' bounds. Two slices that share
// an element have bounds that meet in every dimension, so a block whose
// bounds do not meet a wanted slice's holds nothing of it.
//
// Encoding is the writer's; decoding takes untrusted bytes and checks each
// record as the JSON reader checks a chunk (format/index_objects.h
// CheckChunk), DataLoss naming the table, tensor and chunk.
// Pure functions; thread-safe.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "format/chunk_table_sizes.h"
#include "shardsafe/index.h"
#include "shardsafe/status.h"

namespace shardsafe {

class PackedTensors;  // format/index_packed.h

// A box holding elements of a tensor: [lo[d], hi[d]) in each dimension;
// `empty` when it holds none.
struct Bounds {
  Shape lo, hi;
  bool empty = true;
  bool Meets(const Bounds& o) const;
  // The smallest box holding this and `o`.
  void Add(const Bounds& o);
  bool Holds(const Bounds& o) const;
  friend bool operator==(const Bounds&, const Bounds&) = default;
};
// The bounds of `slice` (valid for its tensor; empty without elements).
Bounds BoundsOf(const Slice& slice);
// The same into `*b`, reusing its memory.
void BoundsInto(const Slice& slice, Bounds* b);

// A chunk table of a version-4 index, in parts (docs/format.md §3c), and
// where each tensor's records lie in it.
struct EncodedChunkTable {
  std::vector<IndexChunkTable> parts;  // names and sizes (`file` unset)
  std::vector<int> ranks;              // each part's writer
  std::vector<std::string> bytes;      // each part's
  std::vector<IndexTableRef> refs;     // each tensor's, in the index's key order
};
// The table of `index` (whose tensors hold their chunks): tensor i (in key
// order) in the part of rank part_ranks[i], the parts by rank, the part
// of rank r named name(r).
EncodedChunkTable EncodeChunkTable(const CheckpointIndex& index, std::span<const int> part_ranks,
                                   const std::function<std::string(int)>& name);
// One part: the magic, then the directories and records of `tensors` (in
// the order given), their refs (naming part `part`) appended to *refs.
std::string EncodeTablePart(std::span<const IndexTensor* const> tensors, uint32_t part,
                            std::vector<IndexTableRef>* refs);
// Puts `table` (made for `index`'s tensors) into `index`: its parts listed
// in `files` after the others and in `chunk_tables`, each tensor's ref set
// and its chunks dropped. InternalError for a table of other tensors.
Status SetChunkTable(const EncodedChunkTable& table, CheckpointIndex* index);

// One block directory entry.
struct BlockEntry {
  Bounds bounds;
  uint32_t crc32c = 0;
};

// A tensor's directory has levels: level 0 one entry per block of 16
// records, level L+1 one entry per 16 entries of level L (their bounds'
// hull and the CRC-32C of their bytes), up to a top level of at most 16
// entries, whose CRC-32C the index holds. Stored top level first. Entries
// per level, level 0 first (one level of no entry for no chunk).
std::vector<uint64_t> LevelSizes(uint64_t count);

// Decodes directory entries from their bytes (whole entries), checking
// their CRC-32C against `crc32c` (the index's for the top level, the
// parent entry's below). `source` names the table file in errors.
Result<std::vector<BlockEntry>> DecodeEntries(std::string_view bytes, size_t ndim,
                                              uint32_t crc32c, std::string_view key,
                                              std::string_view source);

// Decodes block `block` of tensor `key` (its record bytes) and appends its
// chunks to *out, checking the block's CRC-32C, each record against the
// tensor and `index`'s files, and its bounds against the block's. In a
// version-3 table (index.checksum_files) a record's checksum field must be
// 0 and its file not a checksum file; its chunk has no crc32c.
Status DecodeBlock(std::string_view bytes, uint64_t block, const BlockEntry& entry,
                   const IndexTensor& tensor, std::string_view key,
                   const CheckpointIndex& index, std::string_view source,
                   std::vector<IndexChunk>* out);

// Where block `block`'s records lie in the table: [at, at + bytes).
struct ByteSpan {
  uint64_t at = 0;
  uint64_t bytes = 0;
};
ByteSpan BlockBytes(const IndexTableRef& ref, size_t ndim, uint64_t block);
// The whole directory; its top level (stored first; the index holds its
// CRC-32C); entries [first, first + n) of level `level`; what entry
// `entry` of level `level` covers: 16 entries of the level below, or for
// level 0 its block's records.
ByteSpan DirectoryBytes(const IndexTableRef& ref, size_t ndim);
ByteSpan TopBytes(const IndexTableRef& ref, size_t ndim);
ByteSpan EntryBytes(const IndexTableRef& ref, size_t ndim, size_t level, uint64_t first,
                    uint64_t n);
ByteSpan ChildBytes(const IndexTableRef& ref, size_t ndim, size_t level, uint64_t entry);

// The whole table read: fills every tensor's chunks from `tables` (the
// bytes of each of index->chunk_tables, read from the files `sources`
// name), checking everything the JSON reader checks but tiling (left to
// the engine, as for JSON) and, exactly, each block's bounds and each
// file's size and magic. DataLoss naming the file.
Status FillChunksFromTables(std::span<const std::string> tables,
                            std::span<const std::string> sources, CheckpointIndex* index);
// The same into `tensors` (the tensors of `index`, none holding chunks),
// a part at a time: `read_part(p)` returns the bytes of part p of
// index.chunk_tables (named sources[p]), held only while its tensors are
// filled.
Status FillChunksFromTables(const std::function<Result<std::string>(uint32_t)>& read_part,
                            std::span<const std::string> sources, const CheckpointIndex& index,
                            PackedTensors* tensors);

}  // namespace shardsafe
