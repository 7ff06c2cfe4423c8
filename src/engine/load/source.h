// The engine side of opening a source (shardsafe/source.h): reading
// safetensors headers, checking an index's tiling, and the message that
// carries an opened source from rank 0 to the others.
#pragma once

#include <string>
#include <string_view>

#include "format/safetensors.h"
#include "shardsafe/source.h"

namespace shardsafe {

// Reads and validates the header of the safetensors file at `path`.
Result<SafetensorsHeader> ReadSafetensorsHeader(FileSystem& fs, const std::string& path,
                                                uint64_t* file_size);

// Checks that every tensor's chunks tile it (DataLoss naming the tensor).
Status CheckIndexTiling(const CheckpointIndex& index, const std::string& source);

// Encodes a source for a broadcast to other ranks, and decodes it.
std::string EncodeSource(const CheckpointSource& source);
Result<CheckpointSource> DecodeSource(std::string_view msg);

}  // namespace shardsafe
