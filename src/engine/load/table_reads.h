// A load's part of a chunk table (docs/format.md §3a): the chunks of the
// tensors a rank loads that can hold the slices it loads, and no others.
//
// Rounds of ranged reads of the table file: the top level of the wanted
// tensors' block directories, then a round per level below it of the
// entries under those whose bounds meet a wanted slice's, then the blocks
// of records under the meeting level-0 entries (format/chunk_table.h).
// Ranges of one round are sorted and read together where at most
// kTableJoinGap bytes lie between them, 4 requests in flight (on a disk;
// kTableJoinGapObjectStore and 16 in flight on an object store, where a
// request costs a round trip). Every directory and block is
// checked against its CRC-32C and every record as the JSON index's chunks
// are; the chunks read for a tensor must not overlap (with the planner's
// count of the elements a request gets, that proves exact cover). In a
// version-3 checkpoint the chunks' checksums then come from the checksum
// files of the ranks that wrote them (checksum_files.h).
#pragma once

#include <cstdint>

#include "shardsafe/checkpoint.h"
#include "shardsafe/filesystem.h"
#include "format/index_packed.h"
#include "shardsafe/source.h"

namespace shardsafe {

inline constexpr uint64_t kTableJoinGap = 4 << 10;
inline constexpr uint64_t kTableJoinGapObjectStore = 256 << 10;

// What a load read of the table.
struct TableReadStats {
  uint64_t bytes = 0;     // of the table
  uint64_t requests = 0;  // ranged reads
  uint64_t chunks = 0;    // records decoded
  uint64_t checksum_bytes = 0;  // of the checksum files read (version 3)
};

// A copy of `src` (chunks_pending) whose tensors that `request` names hold
// the chunks that can hold the targets' slices (the others hold none).
// DataLoss naming the table, tensor and chunk or block for a corrupt or
// truncated table.
Result<CheckpointSource> ReadChunksFor(FileSystem& fs, const CheckpointSource& src,
                                       const LoadRequest& request,
                                       TableReadStats* stats = nullptr);
// The same of a packed source (chunks_pending): the tensors `request`
// and `whole` name, each with its dtype, shape and the chunks read (the
// source is left as it is). A few thousand tensors' reads at a time.
Result<PackedTensors> ReadTableChunks(FileSystem& fs, const CheckpointSource& src,
                                      const LoadRequest& request,
                                      std::span<const WholeTensorTarget> whole = {},
                                      TableReadStats* stats = nullptr);

}  // namespace shardsafe
