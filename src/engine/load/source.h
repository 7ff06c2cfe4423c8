// The engine side of opening a source (shardsafe/source.h): reading
// safetensors headers, and the message that carries an opened source from
// rank 0 to the others.
#pragma once

#include <string>
#include <string_view>

#include "engine/load/load_executor.h"
#include "format/safetensors.h"
#include "shardsafe/source.h"

namespace shardsafe {

// The data files of `src` as the load executor opens them: paths, their
// confinement (SourceReadOptions) and, for a native checkpoint, the sizes
// the index records.
LoadSources FileSources(const CheckpointSource& src);

// Reads and validates the header of the safetensors file at `path`, opened
// with `options`.
Result<SafetensorsHeader> ReadSafetensorsHeader(FileSystem& fs, const std::string& path,
                                                uint64_t* file_size,
                                                const ReadOptions& options = {});

// OpenSource, and `*index_text` receives the index bytes it read (a native
// checkpoint; left empty for a synthesized index). Without `whole`, a chunk
// table is left unread (CheckpointSource::chunks_pending).
Result<CheckpointSource> OpenSource(FileSystem& fs, const std::string& path,
                                    std::string* index_text, bool whole);

// Encodes a source for a broadcast to other ranks: the index bytes rank 0
// read, `index_text` (a synthesized index, when empty, as SerializeIndex
// writes it); and decodes it (the receiver parses the index).
std::string EncodeSource(const CheckpointSource& source, std::string_view index_text);
Result<CheckpointSource> DecodeSource(std::string_view msg);

}  // namespace shardsafe
