// No byte of a data file belongs to two chunks (index_objects.h
// CheckNoSharedBytes), for an index whose tensors are IndexTensors or
// PackedTensors.
//
// The streamed checksums (engine/load/stream_checksums.h) rely on it, and
// a hostile index could otherwise make one tensor's bytes pass for
// another's. The ranges are grouped by file (a counting sort, which keeps
// the index's order: tensors in key order, then blobs) and each group
// sorted by start: ranges overlap only if two neighbours do. Memory: 16
// bytes a chunk, while it runs.
#include <algorithm>
#include <numeric>
#include <string>

#include "format/index_objects.h"
#include "format/index_packed.h"

namespace shardsafe::internal {
namespace {

// A chunk's bytes in its data file: [begin, end) (the file is that of the
// group the range is in).
struct Range {
  uint64_t begin;
  uint64_t end;
};

// A chunk as `for_each(f)` calls f: its file and range, and how messages
// name it (`tensor "k"` and its position among the tensor's chunks).
struct ChunkPlace {
  uint32_t file;
  Range range;
  const char* kind;
  std::string_view name;
  size_t index;
};

// Calls `f(place)` for every chunk of the tensors (`tensors(f)`) then the
// blobs of `index`.
template <typename Tensors, typename F>
void ForEachChunk(const CheckpointIndex& index, const Tensors& tensors, F f) {
  tensors(f);
  for (const auto& [name, blob] : index.blobs) {
    for (size_t i = 0; i < blob.chunks.size(); ++i) {
      const IndexBlobChunk& c = blob.chunks[i];
      f(ChunkPlace{c.file, {c.at, c.at + c.bytes}, "blob", name, i});
    }
  }
}

template <typename Tensors>
Status NoSharedBytes(const CheckpointIndex& index, const Tensors& tensors) {
  std::vector<size_t> group(index.files.size() + 1, 0);  // file f: [group[f], group[f+1])
  ForEachChunk(index, tensors, [&](const ChunkPlace& c) {
    if (c.range.end > c.range.begin) ++group[c.file + 1];
  });
  std::partial_sum(group.begin(), group.end(), group.begin());
  std::vector<Range> ranges(group.back());
  std::vector<size_t> next(group.begin(), group.end() - 1);
  ForEachChunk(index, tensors, [&](const ChunkPlace& c) {
    if (c.range.end > c.range.begin) ranges[next[c.file]++] = c.range;
  });
  for (uint32_t f = 0; f < index.files.size(); ++f) {
    const auto first = ranges.begin() + group[f];
    const auto last = ranges.begin() + group[f + 1];
    // Stable: of two ranges that start together, the first in the index
    // comes first (the one reported overlapped).
    std::stable_sort(first, last, [](const Range& a, const Range& b) { return a.begin < b.begin; });
    const auto overlap = std::adjacent_find(
        first, last, [](const Range& a, const Range& b) { return a.end > b.begin; });
    if (overlap == last) continue;
    const Range a = overlap[0], b = overlap[1];
    // The two chunks, found again by a search of the index (for a message
    // only): the first at `a`, then the first at `b` other than that one.
    std::string earlier, later;
    ForEachChunk(index, tensors, [&](const ChunkPlace& c) {
      if (c.file != f || (!earlier.empty() && !later.empty())) return;
      const bool at_a = c.range.begin == a.begin && c.range.end == a.end;
      const bool at_b = c.range.begin == b.begin && c.range.end == b.end;
      if (!at_a && !at_b) return;
      const std::string name = std::string(c.kind) + " \"" + std::string(c.name) + "\"";
      const std::string chunk = "chunk " + std::to_string(c.index);
      if (at_a && earlier.empty()) {
        earlier = name + " " + chunk;
      } else if (at_b && later.empty()) {
        later = name + ": " + chunk;
      }
    });
    return Loss(later, "byte range [" + std::to_string(b.begin) + ", " + std::to_string(b.end) +
                           ") of file " + index.files[f].name + " overlaps [" +
                           std::to_string(a.begin) + ", " + std::to_string(a.end) + ") of " +
                           earlier);
  }
  return Status();
}

}  // namespace

Status CheckNoSharedBytes(const CheckpointIndex& index) {
  return NoSharedBytes(index, [&](const auto& f) {
    for (const auto& [key, t] : index.tensors) {
      for (size_t i = 0; i < t.chunks.size(); ++i) {
        const IndexChunk& c = t.chunks[i];
        f(ChunkPlace{c.file, {c.at, c.at + c.bytes}, "tensor", key, i});
      }
    }
  });
}

Status CheckNoSharedBytes(const CheckpointIndex& index, const PackedTensors& tensors) {
  return NoSharedBytes(index, [&](const auto& f) {
    for (size_t t = 0; t < tensors.size(); ++t) {
      const uint64_t first = tensors.first_chunk(t);
      for (uint64_t i = 0; i < tensors.chunk_count(t); ++i) {
        const uint64_t c = first + i;
        f(ChunkPlace{tensors.file(c), {tensors.at(c), tensors.at(c) + tensors.bytes(c)},
                     "tensor", tensors.key(t), i});
      }
    }
  });
}

}  // namespace shardsafe::internal
