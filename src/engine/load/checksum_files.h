// The chunks' checksums of a version-3 checkpoint (docs/format.md §3b): the
// chunk table holds none; each rank that wrote chunks left a checksum file
// beside its data files, and a reader takes each chunk's CRC-32C from the
// file of the rank that wrote the chunk's data file, by (file, offset).
#pragma once

#include <cstdint>
#include <string>

#include "shardsafe/filesystem.h"
#include "shardsafe/index.h"

namespace shardsafe {

class PackedTensors;  // format/index_packed.h

// Fills the crc32c of every chunk `index` holds that has none (all of a
// version-3 table's, none of an older index's), reading the checksum files
// of the ranks that wrote them (each whole, once; several at a time) from
// `dir` with `options`. `*bytes_read` (when set) grows by their bytes.
// DataLoss naming the checksum file (cut short, corrupt, or not the size
// the index records) or the tensor, chunk and file whose checksum is
// missing from it.
Status FillChecksums(FileSystem& fs, const std::string& dir, const ReadOptions& options,
                     CheckpointIndex* index, uint64_t* bytes_read = nullptr);
// The same for the chunks `tensors` (of `index`) holds.
Status FillChecksums(FileSystem& fs, const std::string& dir, const ReadOptions& options,
                     const CheckpointIndex& index, PackedTensors* tensors,
                     uint64_t* bytes_read = nullptr);

}  // namespace shardsafe
