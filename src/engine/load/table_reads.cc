#include "engine/load/table_reads.h"

#include <algorithm>
#include <map>
#include <numeric>

#include "base/thread_pool.h"
#include "format/chunk_table.h"
#include "layout/tiling.h"

namespace shardsafe {
namespace {

// How a load reads the table: spans closer than `join_gap` in one request,
// `parallel` requests in flight.
struct ReadShape {
  uint64_t join_gap = 0;
  size_t parallel = 1;
};

// Disks: a request costs little, so only near spans join and one thread
// reads. Object stores: a request costs a round trip, so spans join across
// larger gaps and many are in flight.
ReadShape ShapeFor(const FileSystem& fs) {
  return fs.IsObjectStore() ? ReadShape{kTableJoinGapObjectStore, 16} : ReadShape{kTableJoinGap, 1};
}

// Reads byte spans of one file; `views[i]` are span i's bytes (into
// `buffers`).
struct SpanReads {
  std::vector<std::string> buffers;
  std::vector<std::string_view> views;
};

Result<SpanReads> ReadSpans(const RandomAccessFile& file, const std::vector<ByteSpan>& spans,
                            const std::string& path, ReadShape shape, TableReadStats* stats) {
  std::vector<size_t> order(spans.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return spans[a].at < spans[b].at; });
  struct Request {
    uint64_t at = 0, end = 0;
    size_t first = 0, last = 0;  // into `order`
  };
  std::vector<Request> requests;
  for (size_t i = 0, j; i < order.size(); i = j) {
    Request r{spans[order[i]].at, spans[order[i]].at + spans[order[i]].bytes, i, 0};
    for (j = i + 1; j < order.size() && spans[order[j]].at <= r.end + shape.join_gap; ++j) {
      r.end = std::max(r.end, spans[order[j]].at + spans[order[j]].bytes);
    }
    r.last = j;
    if (r.end > file.size()) {
      return DataLossError(path + ": chunk table cut short: " + std::to_string(file.size()) +
                           " bytes, the index needs " + std::to_string(r.end));
    }
    requests.push_back(r);
  }
  SpanReads out;
  out.views.resize(spans.size());
  out.buffers.resize(requests.size());
  ThreadPool pool(std::min(shape.parallel, requests.size()) > 1 ? shape.parallel : 0);
  TaskGroup reads(&pool);
  for (size_t q = 0; q < requests.size(); ++q) {
    std::string& buffer = out.buffers[q];
    buffer.resize(requests[q].end - requests[q].at);
    reads.Add([&file, &buffer, at = requests[q].at] {
      return file.ReadAt(at, buffer.data(), buffer.size());
    });
  }
  SS_RETURN_IF_ERROR(reads.Wait());
  for (size_t q = 0; q < requests.size(); ++q) {
    stats->bytes += out.buffers[q].size();
    ++stats->requests;
    for (size_t k = requests[q].first; k < requests[q].last; ++k) {
      const ByteSpan& s = spans[order[k]];
      out.views[order[k]] = std::string_view(out.buffers[q]).substr(s.at - requests[q].at, s.bytes);
    }
  }
  return out;
}

// A tensor a load wants, and the bounds of its targets.
struct Wanted {
  const std::string* key = nullptr;
  const IndexTensor* tensor = nullptr;
  std::vector<Bounds> wants;  // of its targets' slices
  std::vector<BlockEntry> directory;
  std::vector<IndexChunk> chunks;
};

std::vector<Wanted> WantedTensors(const CheckpointIndex& index, const LoadRequest& request) {
  std::map<std::string_view, Wanted> by_key;
  TensorFinder finder(index);
  for (const TensorTarget& t : request.tensors) {
    const auto it = finder.Find(t.key);
    // A target of another shape fails the load when it is matched; it
    // reads nothing here.
    if (it == finder.end() || it->second.shape != t.shape) continue;
    Wanted& w = by_key[it->first];
    w.key = &it->first;
    w.tensor = &it->second;
    w.wants.push_back(BoundsOf(t.slice));
  }
  std::vector<Wanted> wanted;
  for (auto& [key, w] : by_key) wanted.push_back(std::move(w));
  return wanted;
}

bool MeetsAny(const Bounds& block, const std::vector<Bounds>& wants) {
  return std::any_of(wants.begin(), wants.end(), [&](const Bounds& w) { return block.Meets(w); });
}

}  // namespace

Result<CheckpointSource> ReadChunksFor(FileSystem& fs, const CheckpointSource& src,
                                       const LoadRequest& request, TableReadStats* stats) {
  TableReadStats ignored;
  if (stats == nullptr) stats = &ignored;
  const CheckpointIndex& index = src.index;
  const std::string path = JoinPath(src.data_dir, index.chunk_table->name);
  std::vector<Wanted> wanted = WantedTensors(index, request);
  SS_ASSIGN_OR_RETURN(auto file, fs.NewRandomAccessFile(path, SourceReadOptions(src)));
  if (file->size() != index.chunk_table->bytes) {
    return DataLossError(path + ": chunk table is " + std::to_string(file->size()) +
                         " bytes, the index records " + std::to_string(index.chunk_table->bytes));
  }
  // Round 1: the directories.
  std::vector<ByteSpan> spans;
  for (const Wanted& w : wanted) {
    spans.push_back(DirectoryBytes(*w.tensor->table, w.tensor->shape.size()));
  }
  SS_ASSIGN_OR_RETURN(SpanReads dirs, ReadSpans(*file, spans, path, ShapeFor(fs), stats));
  // Round 2: the blocks that can hold a wanted element.
  spans.clear();
  std::vector<std::pair<size_t, uint64_t>> blocks;  // (wanted, block)
  for (size_t i = 0; i < wanted.size(); ++i) {
    Wanted& w = wanted[i];
    SS_ASSIGN_OR_RETURN(w.directory,
                        DecodeDirectory(dirs.views[i], *w.tensor->table, w.tensor->shape.size(),
                                        *w.key, path));
    for (uint64_t b = 0; b < w.directory.size(); ++b) {
      if (!MeetsAny(w.directory[b].bounds, w.wants)) continue;
      blocks.emplace_back(i, b);
      spans.push_back(BlockBytes(*w.tensor->table, w.tensor->shape.size(), b));
    }
  }
  SS_ASSIGN_OR_RETURN(SpanReads records, ReadSpans(*file, spans, path, ShapeFor(fs), stats));
  for (size_t k = 0; k < blocks.size(); ++k) {
    Wanted& w = wanted[blocks[k].first];
    SS_RETURN_IF_ERROR(DecodeBlock(records.views[k], blocks[k].second,
                                   w.directory[blocks[k].second], *w.tensor, *w.key, index.files,
                                   path, &w.chunks));
  }
  CheckpointSource out = src;
  out.chunks_pending = false;
  std::vector<Slice> slices;
  for (Wanted& w : wanted) {
    slices.clear();
    for (const IndexChunk& c : w.chunks) slices.push_back(c.slice);
    Status s = CheckNoOverlap(*w.key, slices);
    if (!s.ok()) return DataLossError(path + ": " + s.message());
    stats->chunks += w.chunks.size();
    out.index.tensors.find(*w.key)->second.chunks = std::move(w.chunks);
  }
  return out;
}

}  // namespace shardsafe
