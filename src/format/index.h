// The checkpoint index (shardsafe.json): structs and their JSON form.
//
// docs/format.md §3 is the specification. Serialize writes it; Parse reads
// it from untrusted bytes and validates everything that can be checked
// without the data files and without geometry beyond one chunk (the tiling
// of a tensor by its chunks is checked by the engine with layout/tiling.h).
// Thread-safe (pure functions).
#pragma once

#include <cstdint>
#include <functional>
#include <iterator>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "shardsafe/status.h"
#include "shardsafe/types.h"

namespace shardsafe {

inline constexpr std::string_view kIndexFileName = "shardsafe.json";
inline constexpr int kFormatVersion = 1;
inline constexpr uint64_t kMaxIndexBytes = uint64_t{1} << 30;

struct IndexFile {
  std::string name;
  uint64_t bytes = 0;
  int rank = 0;
};

struct IndexChunk {
  Slice slice;
  uint32_t file = 0;
  uint64_t at = 0;
  uint64_t bytes = 0;
  std::optional<uint32_t> crc32c;  // absent for data read from foreign files
};

struct IndexTensor {
  DType dtype = DType::kF32;
  Shape shape;
  std::vector<IndexChunk> chunks;
};

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

struct CheckpointIndex {
  int version = kFormatVersion;
  std::string tag;
  int64_t created_unix = 0;
  int world_size = 1;
  // User JSON, as compact JSON text (docs/format.md §3): written as given
  // (the engine canonicalizes it before), read back minified.
  std::string layout = "null";
  std::string metadata = "null";
  std::vector<IndexFile> files;
  IndexTensors tensors;
  std::string values = "{}";  // a JSON object
  std::map<std::string, IndexBlob> blobs;
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

// Compact JSON text of `index` (docs/format.md §3).
std::string SerializeIndex(const CheckpointIndex& index);

// Parses untrusted index bytes. `source` (the file path) prefixes every
// error. DataLoss naming the field for any violation listed in
// docs/format.md §3 "Validation on read" except tiling (left to the engine),
// and for: a duplicate key in any JSON object, nesting deeper than 256, a
// repeated file name, a file or blob rank >= world_size, world_size 0, a
// global blob without exactly one chunk, a per-rank blob naming a rank
// twice, a tensor whose element count overflows 64 bits. FailedPrecondition
// for a newer version than this reader supports.
Result<CheckpointIndex> ParseIndex(std::string_view text, std::string_view source);

// The name under which a chunk of `key` covering `slice` is stored in its
// data file: `key` itself for the whole tensor, else "key[o:e,...]" with
// ".flat[b:e]" for a flat range (docs/format.md §2).
std::string ChunkEntryName(std::string_view key, const Slice& slice, const Shape& shape);
// "__blob__/NAME" or "__blob__/NAME/rank-RRRRR".
std::string BlobEntryName(std::string_view name, std::optional<int> rank);

}  // namespace shardsafe
