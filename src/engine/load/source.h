// The engine side of opening a source (shardsafe/source.h): reading
// safetensors headers, and the message that carries an opened source from
// rank 0 to the others.
#pragma once

#include <functional>
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

// ReadSafetensorsHeader's reads and checks without keeping the entries
// (ScanSafetensorsHeader): each entry to `each`, the repeated names to
// `duplicates`; `*file_size` and `*data_start` (where the data buffer
// starts) set. The header's text is held while it is scanned.
Status ScanSafetensorsHeader(FileSystem& fs, const std::string& path, const ReadOptions& options,
                             uint64_t* file_size, uint64_t* data_start,
                             const std::function<void(const SafetensorsEntry&)>& each,
                             std::vector<std::string>* duplicates);

// How OpenSource below opens.
struct OpenHow {
  // Receives the index bytes read (a native checkpoint; left empty for a
  // synthesized index). Null: the index is read a piece at a time, its
  // text never held whole (but on an object store: one GET).
  std::string* text = nullptr;
  // A chunk table is read too; else left unread (chunks_pending).
  bool whole = true;
  // The tensors in CheckpointSource::packed (index.tensors empty), else in
  // index.tensors (what the public OpenSource returns).
  bool packed = true;
};
// OpenSource as `how` says.
Result<CheckpointSource> OpenSource(FileSystem& fs, const std::string& path, const OpenHow& how);
// Moves `src`'s tensors into CheckpointSource::packed (`packed`) or into
// index.tensors, where they are not.
void Repack(CheckpointSource* src, bool packed);

// Encodes a source for a broadcast to other ranks: the index bytes rank 0
// read, `index_text` (a synthesized index, when empty, as SerializeIndex
// writes it), or only the path and the name of another tool's format
// (other_format); and decodes it (the receiver parses the index, its
// tensors packed).
std::string EncodeSource(const CheckpointSource& source, std::string_view index_text);
Result<CheckpointSource> DecodeSource(std::string_view msg);

}  // namespace shardsafe
