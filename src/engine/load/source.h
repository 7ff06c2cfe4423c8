// What a path names, opened as a CheckpointIndex: a shardsafe checkpoint, a
// root of checkpoints (its latest), a single .safetensors file, or a
// Hugging Face model directory (model.safetensors, or shards listed by
// model.safetensors.index.json, or any *.safetensors files).
//
// Foreign files get a synthesized index: one whole-tensor chunk per header
// entry, no checksums. Every index, native or synthesized, is checked for
// tiling before it is returned, so a loader can trust the geometry.
#pragma once

#include <string>

#include "format/index.h"
#include "format/safetensors.h"
#include "shardsafe/filesystem.h"

namespace shardsafe {

struct CheckpointSource {
  std::string path;      // what was resolved: checkpoint dir or file
  std::string data_dir;  // directory holding the data files
  bool native = false;   // a shardsafe checkpoint (has checksums)
  CheckpointIndex index;
};

// NotFound if nothing loadable is at `path`; DataLoss for a corrupt index or
// header (naming the file and rule).
Result<CheckpointSource> OpenSource(FileSystem& fs, const std::string& path);

// Reads and validates the header of the safetensors file at `path`.
Result<SafetensorsHeader> ReadSafetensorsHeader(FileSystem& fs, const std::string& path,
                                                uint64_t* file_size);

// Checks that every tensor's chunks tile it (DataLoss naming the tensor).
Status CheckIndexTiling(const CheckpointIndex& index, const std::string& source);

// Encodes a source for a broadcast to other ranks, and decodes it.
std::string EncodeSource(const CheckpointSource& source);
Result<CheckpointSource> DecodeSource(std::string_view msg);

}  // namespace shardsafe
