// A checksum file (docs/format.md §3b): the CRC-32C of every chunk one rank
// wrote, kept beside its data files by a version-3 save, so that the index
// and its chunk table follow from the plan alone and a repeated save need
// not send rank 0 a checksum per chunk.
//
// Layout (little-endian):
//   magic "SSCRC32C", u64 count,
//   count x {u32 file (into the index's files), u32 crc32c, u64 at},
//           sorted by (file, at), no two equal,
//   u32 CRC-32C of every byte before it.
//
// Encoding is the writer's; decoding takes untrusted bytes. Pure
// functions; thread-safe.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "shardsafe/status.h"

namespace shardsafe {

inline constexpr std::string_view kChecksumFileMagic = "SSCRC32C";

// One chunk's checksum, found by the chunk's data file and byte offset.
struct ChunkChecksum {
  uint32_t file = 0;  // into CheckpointIndex::files
  uint64_t at = 0;    // the chunk's byte offset in that file
  uint32_t crc32c = 0;
  friend bool operator==(const ChunkChecksum&, const ChunkChecksum&) = default;
};

// Bytes of a checksum file of `count` entries.
constexpr uint64_t ChecksumFileBytes(uint64_t count) { return 8 + 8 + 16 * count + 4; }

// The file of `entries` (in any order; sorted here): the chunks a rank
// wrote but the empty ones, whose (file, at) are unique.
std::string EncodeChecksumFile(std::vector<ChunkChecksum> entries);

// The entries of a checksum file, sorted, one per (file, at). DataLoss
// naming `source` when the bytes are cut short, longer than their count
// says, out of order or repeated, or fail their checksum; a repeat of
// which one has checksum 0 (an empty chunk, which earlier writers listed)
// is read as the other.
Result<std::vector<ChunkChecksum>> DecodeChecksumFile(std::string_view bytes,
                                                      std::string_view source);

// The checksum of the chunk at `at` in `file`, in sorted `entries`.
std::optional<uint32_t> FindChecksum(const std::vector<ChunkChecksum>& entries, uint32_t file,
                                     uint64_t at);

}  // namespace shardsafe
