#include "engine/load/table_reads.h"

#include <algorithm>
#include <map>
#include <numeric>

#include "base/thread_pool.h"
#include "engine/load/checksum_files.h"
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

// Disks: a request costs little, so only near spans join, and a few are
// in flight (a cold table is random reads). Object stores: a request costs
// a round trip, so spans join across larger gaps and many are in flight.
ReadShape ShapeFor(const FileSystem& fs) {
  return fs.IsObjectStore() ? ReadShape{kTableJoinGapObjectStore, 16} : ReadShape{kTableJoinGap, 4};
}

// The parts of the table a load reads (by part; null: not needed) and
// their paths.
struct TableFiles {
  std::vector<std::unique_ptr<RandomAccessFile>> files;
  std::vector<std::string> paths;
};

// A byte span of one part.
struct PartSpan {
  uint32_t part = 0;
  ByteSpan span;
};

// Reads byte spans of the parts; `views[i]` are span i's bytes (into
// `buffers`).
struct SpanReads {
  std::vector<std::string> buffers;
  std::vector<std::string_view> views;
};

Result<SpanReads> ReadSpans(const TableFiles& table, const std::vector<PartSpan>& spans,
                            ReadShape shape, TableReadStats* stats) {
  std::vector<size_t> order(spans.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return std::pair(spans[a].part, spans[a].span.at) < std::pair(spans[b].part, spans[b].span.at);
  });
  struct Request {
    uint32_t part = 0;
    uint64_t at = 0, end = 0;
    size_t first = 0, last = 0;  // into `order`
  };
  std::vector<Request> requests;
  for (size_t i = 0, j; i < order.size(); i = j) {
    const PartSpan& head = spans[order[i]];
    Request r{head.part, head.span.at, head.span.at + head.span.bytes, i, 0};
    for (j = i + 1; j < order.size() && spans[order[j]].part == r.part &&
                    spans[order[j]].span.at <= r.end + shape.join_gap;
         ++j) {
      r.end = std::max(r.end, spans[order[j]].span.at + spans[order[j]].span.bytes);
    }
    r.last = j;
    const RandomAccessFile& file = *table.files[r.part];
    if (r.end > file.size()) {
      return DataLossError(table.paths[r.part] + ": chunk table cut short: " +
                           std::to_string(file.size()) + " bytes, the index needs " +
                           std::to_string(r.end));
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
    reads.Add([&file = *table.files[requests[q].part], &buffer, at = requests[q].at] {
      return file.ReadAt(at, buffer.data(), buffer.size());
    });
  }
  SS_RETURN_IF_ERROR(reads.Wait());
  for (size_t q = 0; q < requests.size(); ++q) {
    stats->bytes += out.buffers[q].size();
    ++stats->requests;
    for (size_t k = requests[q].first; k < requests[q].last; ++k) {
      const ByteSpan& s = spans[order[k]].span;
      out.views[order[k]] = std::string_view(out.buffers[q]).substr(s.at - requests[q].at, s.bytes);
    }
  }
  return out;
}

// A tensor a load wants, the bounds of its targets, and the directory
// entries (of `level`) that meet them: the next round reads what they
// cover.
struct Wanted {
  const std::string* key = nullptr;
  const IndexTensor* tensor = nullptr;
  std::vector<Bounds> wants;  // of its targets' slices
  size_t level = 0;
  std::vector<std::pair<uint64_t, BlockEntry>> meeting;  // (index in its level, entry)
  std::vector<IndexChunk> chunks;

  size_t ndim() const { return tensor->shape.size(); }
  const IndexTableRef& ref() const { return *tensor->table; }
  uint32_t part() const { return ref().part; }
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

// Keeps, of `entries` (entry i is number first + i of its level), those
// that meet a want of `w`.
void KeepMeeting(Wanted& w, const std::vector<BlockEntry>& entries, uint64_t first,
                 std::vector<std::pair<uint64_t, BlockEntry>>* out) {
  for (uint64_t i = 0; i < entries.size(); ++i) {
    const bool meets = std::any_of(w.wants.begin(), w.wants.end(),
                                   [&](const Bounds& b) { return entries[i].bounds.Meets(b); });
    if (meets) out->emplace_back(first + i, entries[i]);
  }
}

// One round: for each tensor still above level 0, the entries of the
// level below that its meeting entries cover, read and decoded.
Status DescendOneLevel(const TableFiles& table, ReadShape shape, std::vector<Wanted>& wanted,
                       TableReadStats* stats) {
  std::vector<PartSpan> spans;
  std::vector<std::pair<size_t, size_t>> parents;  // (wanted, its meeting entry)
  for (size_t i = 0; i < wanted.size(); ++i) {
    const Wanted& w = wanted[i];
    if (w.level == 0) continue;
    for (size_t m = 0; m < w.meeting.size(); ++m) {
      spans.push_back({w.part(), ChildBytes(w.ref(), w.ndim(), w.level, w.meeting[m].first)});
      parents.emplace_back(i, m);
    }
  }
  SS_ASSIGN_OR_RETURN(SpanReads read, ReadSpans(table, spans, shape, stats));
  std::vector<std::vector<std::pair<uint64_t, BlockEntry>>> below(wanted.size());
  for (size_t k = 0; k < parents.size(); ++k) {
    Wanted& w = wanted[parents[k].first];
    const auto& [index, entry] = w.meeting[parents[k].second];
    SS_ASSIGN_OR_RETURN(std::vector<BlockEntry> children,
                        DecodeEntries(read.views[k], w.ndim(), entry.crc32c, *w.key,
                                      table.paths[w.part()]));
    KeepMeeting(w, children, index * kChunksPerBlock, &below[parents[k].first]);
  }
  for (size_t i = 0; i < wanted.size(); ++i) {
    if (wanted[i].level == 0) continue;
    --wanted[i].level;
    wanted[i].meeting = std::move(below[i]);
  }
  return Status();
}

// Opens the parts that hold `wanted` tensors, several at once (in an
// object store each open may cost a request), each checked against the
// size the index records.
Result<TableFiles> OpenParts(FileSystem& fs, const CheckpointSource& src,
                             const std::vector<Wanted>& wanted, ReadShape shape) {
  const std::vector<IndexChunkTable>& parts = src.index.chunk_tables;
  TableFiles table;
  table.files.resize(parts.size());
  table.paths.resize(parts.size());
  std::vector<uint32_t> needed;
  for (const Wanted& w : wanted) {
    if (table.paths[w.part()].empty()) needed.push_back(w.part());
    table.paths[w.part()] = JoinPath(src.data_dir, parts[w.part()].name);
  }
  ThreadPool pool(needed.size() > 1 ? shape.parallel : 0);
  TaskGroup opens(&pool);
  for (uint32_t p : needed) {
    opens.Add([&, p]() -> Status {
      ReadOptions options = SourceReadOptions(src);
      options.size = parts[p].bytes;
      SS_ASSIGN_OR_RETURN(table.files[p], fs.NewRandomAccessFile(table.paths[p], options));
      if (table.files[p]->size() == parts[p].bytes) return Status();
      return DataLossError(table.paths[p] + ": chunk table is " +
                           std::to_string(table.files[p]->size()) + " bytes, the index records " +
                           std::to_string(parts[p].bytes));
    });
  }
  SS_RETURN_IF_ERROR(opens.Wait());
  return table;
}

}  // namespace

Result<CheckpointSource> ReadChunksFor(FileSystem& fs, const CheckpointSource& src,
                                       const LoadRequest& request, TableReadStats* stats) {
  TableReadStats ignored;
  if (stats == nullptr) stats = &ignored;
  const CheckpointIndex& index = src.index;
  const ReadShape shape = ShapeFor(fs);
  std::vector<Wanted> wanted = WantedTensors(index, request);
  SS_ASSIGN_OR_RETURN(TableFiles table, OpenParts(fs, src, wanted, shape));
  // Round 1: the top level of every directory.
  std::vector<PartSpan> spans;
  for (Wanted& w : wanted) {
    w.level = LevelSizes(w.ref().count).size() - 1;
    spans.push_back({w.part(), TopBytes(w.ref(), w.ndim())});
  }
  SS_ASSIGN_OR_RETURN(SpanReads tops, ReadSpans(table, spans, shape, stats));
  size_t depth = 0;
  for (size_t i = 0; i < wanted.size(); ++i) {
    Wanted& w = wanted[i];
    SS_ASSIGN_OR_RETURN(std::vector<BlockEntry> entries,
                        DecodeEntries(tops.views[i], w.ndim(), w.ref().directory_crc32c, *w.key,
                                      table.paths[w.part()]));
    KeepMeeting(w, entries, 0, &w.meeting);
    depth = std::max(depth, w.level);
  }
  // A round per level below the top, then the blocks the meeting level-0
  // entries cover.
  for (; depth > 0; --depth) {
    SS_RETURN_IF_ERROR(DescendOneLevel(table, shape, wanted, stats));
  }
  spans.clear();
  std::vector<std::pair<size_t, size_t>> blocks;  // (wanted, its meeting entry)
  for (size_t i = 0; i < wanted.size(); ++i) {
    for (size_t m = 0; m < wanted[i].meeting.size(); ++m) {
      const Wanted& w = wanted[i];
      spans.push_back({w.part(), BlockBytes(w.ref(), w.ndim(), w.meeting[m].first)});
      blocks.emplace_back(i, m);
    }
  }
  SS_ASSIGN_OR_RETURN(SpanReads records, ReadSpans(table, spans, shape, stats));
  for (size_t k = 0; k < blocks.size(); ++k) {
    Wanted& w = wanted[blocks[k].first];
    const auto& [block, entry] = w.meeting[blocks[k].second];
    SS_RETURN_IF_ERROR(DecodeBlock(records.views[k], block, entry, *w.tensor, *w.key,
                                   index, table.paths[w.part()], &w.chunks));
  }
  CheckpointSource out = src;
  out.chunks_pending = false;
  std::vector<Slice> slices;
  for (Wanted& w : wanted) {
    slices.clear();
    for (const IndexChunk& c : w.chunks) slices.push_back(c.slice);
    Status s = CheckNoOverlap(*w.key, slices);
    if (!s.ok()) return DataLossError(table.paths[w.part()] + ": " + s.message());
    stats->chunks += w.chunks.size();
    out.index.tensors.find(*w.key)->second.chunks = std::move(w.chunks);
  }
  SS_RETURN_IF_ERROR(FillChecksums(fs, src.data_dir, SourceReadOptions(src), &out.index,
                                   &stats->checksum_bytes));
  return out;
}

}  // namespace shardsafe
