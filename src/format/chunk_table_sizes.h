// The sizes of a chunk table's parts (docs/format.md §3a), which the
// index reader checks a tensor's table reference against
// (format/index_objects.h) and the table's reader and writer use
// (format/chunk_table.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace shardsafe {

inline constexpr std::string_view kChunkTableMagic = "SSCHUNKS";
inline constexpr uint64_t kChunksPerBlock = 16;
// Chunks from which a save writes a chunk table unless told otherwise
// (SaveOptions::chunk_table_min_chunks).
inline constexpr uint64_t kDefaultChunkTableMinChunks = 65536;

// Bytes of one chunk record, and of one directory entry, of a tensor of
// `ndim` dimensions.
constexpr uint64_t ChunkRecordBytes(size_t ndim) { return 48 + 16 * uint64_t{ndim}; }
constexpr uint64_t BlockEntryBytes(size_t ndim) { return 8 + 16 * uint64_t{ndim}; }
// Blocks (directory entries) of a tensor of `count` chunks.
constexpr uint64_t BlockCount(uint64_t count) {
  return (count + kChunksPerBlock - 1) / kChunksPerBlock;
}

}  // namespace shardsafe
