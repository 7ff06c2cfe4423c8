// The checkpoint index in memory: what shardsafe.json (docs/format.md §3)
// says about a checkpoint, as the engine reads it (and as it describes a
// safetensors file or Hugging Face directory: one whole-tensor chunk per
// entry, no checksums). Plain data; shardsafe/source.h opens one.
#pragma once

#include <cstdint>
#include <functional>
#include <iterator>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "shardsafe/types.h"

namespace shardsafe {

inline constexpr std::string_view kIndexFileName = "shardsafe.json";
// The newest format version this reader reads (docs/format.md §3; 2: the
// chunks are in a chunk table, §3a; 3: their checksums in checksum files
// beside the data, §3b; 4: the table in parts, §3c).
inline constexpr int kFormatVersion = 4;
inline constexpr uint64_t kMaxIndexBytes = uint64_t{1} << 30;

// A data file: its name in the checkpoint directory, size, and writer.
struct IndexFile {
  std::string name;
  uint64_t bytes = 0;
  int rank = 0;
};

// Part of a tensor stored contiguously in one data file.
struct IndexChunk {
  Slice slice;        // of the tensor (a box, or a flat range of one)
  uint32_t file = 0;  // into CheckpointIndex::files
  uint64_t at = 0;    // byte offset in the file
  uint64_t bytes = 0;
  std::optional<uint32_t> crc32c;  // absent for data read from foreign files
};

// Where a tensor's chunks lie in the chunk table (docs/format.md §3a, §3c).
struct IndexTableRef {
  uint32_t part = 0;          // into CheckpointIndex::chunk_tables
  uint64_t count = 0;         // chunks
  uint64_t directory_at = 0;  // byte offset of its block directory
  uint64_t records_at = 0;    // byte offset of its first chunk record
  uint32_t directory_crc32c = 0;
};

struct IndexTensor {
  DType dtype = DType::kF32;
  Shape shape;
  // Empty, for an index with a chunk table, until they are read from it
  // (shardsafe/source.h: a collective open reads none, a load those it
  // needs).
  std::vector<IndexChunk> chunks;
  std::optional<IndexTableRef> table = std::nullopt;  // with a chunk table only
};

// A blob's bytes in one data file (one per rank for a per-rank blob).
struct IndexBlobChunk {
  int rank = 0;
  uint32_t file = 0;
  uint64_t at = 0;
  uint64_t bytes = 0;
  std::optional<uint32_t> crc32c;
};

struct IndexBlob {
  bool per_rank = false;
  std::vector<IndexBlobChunk> chunks;
};

// Tensors by key; found by std::string_view too (no string built per lookup).
using IndexTensors = std::map<std::string, IndexTensor, std::less<>>;

// A chunk table file: the one of a version-2 or 3 index, or a part of a
// version-4 one (also listed in CheckpointIndex::files, as `file`).
struct IndexChunkTable {
  std::string name;  // in the checkpoint directory
  uint64_t bytes = 0;
  std::optional<uint32_t> file;  // version 4: into CheckpointIndex::files
};

struct CheckpointIndex {
  // As read. A writer writes 4 when chunk_tables are parts listed in
  // `files`, else 3 when checksum_files is not empty, else 2 with a chunk
  // table, else 1.
  int version = 1;
  std::string tag;
  int64_t created_unix = 0;
  int world_size = 1;
  // User JSON as compact JSON text (shardsafe/checkpoint.h SaveState).
  std::string layout = "null";
  std::string metadata = "null";
  std::vector<IndexFile> files;
  IndexTensors tensors;
  std::string values = "{}";  // a JSON object
  std::map<std::string, IndexBlob> blobs;
  // The chunk table's files: none (version 1), one (versions 2 and 3), or
  // its parts (version 4), which IndexTableRef::part indexes.
  std::vector<IndexChunkTable> chunk_tables;
  // Version 3: the files (indices into `files`, ascending) that hold the
  // chunks' checksums, one per rank that wrote chunks (format/checksum_file.h);
  // the chunks read from the table have no crc32c until it is filled from
  // them (engine/load/checksum_files.h).
  std::vector<uint32_t> checksum_files;
};

// Finds an index's tensors by key. Keys asked in the index's order (sorted,
// as the keys of many state dicts are) are found without a search: the
// entry after the previous one found is tried first; others by a search
// that builds no string.
class TensorFinder {
 public:
  using Iterator = IndexTensors::const_iterator;
  explicit TensorFinder(const CheckpointIndex& index)
      : tensors_(index.tensors), next_(tensors_.begin()) {}
  // The entry under `key`, or end().
  Iterator Find(std::string_view key) {
    const Iterator it = next_ != tensors_.end() && next_->first == key
                            ? next_
                            : tensors_.find(key);
    if (it != tensors_.end()) next_ = std::next(it);
    return it;
  }
  Iterator end() const { return tensors_.end(); }

 private:
  const IndexTensors& tensors_;
  Iterator next_;
};

}  // namespace shardsafe
