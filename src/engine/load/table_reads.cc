#include "engine/load/table_reads.h"

#include <algorithm>
#include <map>
#include <numeric>

#include "base/thread_pool.h"
#include "engine/load/checksum_files.h"
#include "format/chunk_table.h"
#include "format/index_packed.h"
#include "layout/tiling.h"

namespace shardsafe {
namespace {

// Tensors a packed load reads the table for at once (ReadTableChunks).
constexpr size_t kTableReadGroup = 4096;

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
  std::string_view key;  // as the index holds it
  IndexTensor tensor;    // its dtype, shape and table ref (no chunks)
  std::vector<Bounds> wants;  // of its targets' slices
  size_t level = 0;
  std::vector<std::pair<uint64_t, BlockEntry>> meeting;  // (index in its level, entry)
  std::vector<IndexChunk> chunks;

  size_t ndim() const { return tensor.shape.size(); }
  const IndexTableRef& ref() const { return *tensor.table; }
  uint32_t part() const { return ref().part; }
};

// The tensors `request` wants, in key order; `find(key)` returns a
// tensor's key as the index holds it and its dtype, shape and table ref,
// or nullopt.
template <typename Find>
std::vector<Wanted> WantedTensors(const LoadRequest& request, Find find) {
  std::map<std::string_view, Wanted> by_key;
  for (const TensorTarget& t : request.tensors) {
    auto found = find(t.key);
    // A target of another shape fails the load when it is matched; it
    // reads nothing here.
    if (!found || found->second.shape != t.shape) continue;
    Wanted& w = by_key[found->first];
    if (w.wants.empty()) {
      w.key = found->first;
      w.tensor = std::move(found->second);
    }
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
                        DecodeEntries(read.views[k], w.ndim(), entry.crc32c, w.key,
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
// (`parts`: the parts needed, each once.)
Result<TableFiles> OpenParts(FileSystem& fs, const CheckpointSource& src,
                             const std::vector<uint32_t>& needed, ReadShape shape) {
  const std::vector<IndexChunkTable>& parts = src.index.chunk_tables;
  TableFiles table;
  table.files.resize(parts.size());
  table.paths.resize(parts.size());
  for (uint32_t p : needed) table.paths[p] = JoinPath(src.data_dir, parts[p].name);
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

// The parts `wanted` tensors lie in, each once.
std::vector<uint32_t> PartsOf(const std::vector<Wanted>& wanted, size_t parts) {
  std::vector<bool> seen(parts);
  std::vector<uint32_t> needed;
  for (const Wanted& w : wanted) {
    if (!seen[w.part()]) needed.push_back(w.part());
    seen[w.part()] = true;
  }
  return needed;
}

// Reads, for each of `wanted`, the chunks that can hold its targets'
// slices, into Wanted::chunks: the rounds of the header's comment, in the
// parts `table` has open.
Status ReadWanted(const TableFiles& table, ReadShape shape, const CheckpointSource& src,
                  std::vector<Wanted>& wanted, TableReadStats* stats) {
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
                        DecodeEntries(tops.views[i], w.ndim(), w.ref().directory_crc32c, w.key,
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
    SS_RETURN_IF_ERROR(DecodeBlock(records.views[k], block, entry, w.tensor, w.key, src.index,
                                   table.paths[w.part()], &w.chunks));
  }
  std::vector<Slice> slices;
  for (Wanted& w : wanted) {
    slices.clear();
    for (const IndexChunk& c : w.chunks) slices.push_back(c.slice);
    Status s = CheckNoOverlap(std::string(w.key), slices);
    if (!s.ok()) return DataLossError(table.paths[w.part()] + ": " + s.message());
    stats->chunks += w.chunks.size();
  }
  return Status();
}

}  // namespace

Result<CheckpointSource> ReadChunksFor(FileSystem& fs, const CheckpointSource& src,
                                       const LoadRequest& request, TableReadStats* stats) {
  TableReadStats ignored;
  if (stats == nullptr) stats = &ignored;
  TensorFinder finder(src.index);
  std::vector<Wanted> wanted = WantedTensors(request, [&](const std::string& key) {
    const auto it = finder.Find(key);
    return it == finder.end() ? std::nullopt
                              : std::optional(std::pair<std::string_view, IndexTensor>(
                                    it->first, IndexTensor{it->second.dtype, it->second.shape,
                                                           {}, it->second.table}));
  });
  const ReadShape shape = ShapeFor(fs);
  SS_ASSIGN_OR_RETURN(
      TableFiles table,
      OpenParts(fs, src, PartsOf(wanted, src.index.chunk_tables.size()), shape));
  SS_RETURN_IF_ERROR(ReadWanted(table, shape, src, wanted, stats));
  CheckpointSource out = src;
  out.chunks_pending = false;
  for (Wanted& w : wanted) out.index.tensors.find(w.key)->second.chunks = std::move(w.chunks);
  SS_RETURN_IF_ERROR(FillChecksums(fs, src.data_dir, SourceReadOptions(src), &out.index,
                                   &stats->checksum_bytes));
  return out;
}

Result<PackedTensors> ReadTableChunks(FileSystem& fs, const CheckpointSource& src,
                                      const LoadRequest& request,
                                      std::span<const WholeTensorTarget> whole,
                                      TableReadStats* stats) {
  TableReadStats ignored;
  if (stats == nullptr) stats = &ignored;
  const PackedTensors& tensors = *src.packed;
  // (tensor, target) of each target of a tensor of its shape, by tensor.
  std::vector<std::pair<uint32_t, uint32_t>> wants;
  std::vector<bool> needed(src.index.chunk_tables.size());
  for (uint32_t i = 0; i < request.tensors.size(); ++i) {
    const TensorTarget& target = request.tensors[i];
    const std::optional<size_t> t = tensors.Find(target.key);
    // A target of another shape fails the load when it is matched; it
    // reads nothing here.
    if (!t || tensors.ndim(*t) != target.shape.size() || tensors.shape(*t) != target.shape) {
      continue;
    }
    wants.emplace_back(static_cast<uint32_t>(*t), i);
    needed[tensors.table(*t)->part] = true;
  }
  // Whole-tensor targets: numbered after the request's.
  for (size_t j = 0; j < whole.size(); ++j) {
    if (whole[j].tensor >= tensors.size()) continue;  // the load's match fails it
    wants.emplace_back(whole[j].tensor, static_cast<uint32_t>(request.tensors.size() + j));
    needed[tensors.table(whole[j].tensor)->part] = true;
  }
  std::sort(wants.begin(), wants.end());
  // The bounds of target i's slice.
  auto bounds = [&](uint32_t i, uint32_t t) {
    if (i < request.tensors.size()) return BoundsOf(request.tensors[i].slice);
    return BoundsOf(Slice{Box::Whole(tensors.shape(t)), std::nullopt});
  };
  std::vector<uint32_t> parts;
  for (uint32_t p = 0; p < needed.size(); ++p) {
    if (needed[p]) parts.push_back(p);
  }
  const ReadShape shape = ShapeFor(fs);
  SS_ASSIGN_OR_RETURN(TableFiles table, OpenParts(fs, src, parts, shape));
  // A group of tensors at a time: its rounds of reads, then its chunks
  // packed, so that what a tensor takes while it is read (its directory
  // entries, its chunks unpacked) is held for one group only.
  PackedTensors read;
  std::vector<Wanted> group;
  for (size_t next = 0; next < wants.size();) {
    group.clear();
    for (; next < wants.size() && group.size() < kTableReadGroup; ++next) {
      const uint32_t t = wants[next].first;
      if (group.empty() || tensors.key(t) != group.back().key) {
        Wanted& w = group.emplace_back();
        w.key = tensors.key(t);
        w.tensor = tensors.Tensor(t);
      }
      group.back().wants.push_back(bounds(wants[next].second, t));
    }
    // The rest of the last tensor's targets.
    for (; next < wants.size() && tensors.key(wants[next].first) == group.back().key; ++next) {
      group.back().wants.push_back(bounds(wants[next].second, wants[next].first));
    }
    SS_RETURN_IF_ERROR(ReadWanted(table, shape, src, group, stats));
    for (Wanted& w : group) {
      w.tensor.chunks = std::move(w.chunks);
      read.Add(w.key, w.tensor);
    }
  }
  read.Seal();
  SS_RETURN_IF_ERROR(FillChecksums(fs, src.data_dir, SourceReadOptions(src), src.index, &read,
                                   &stats->checksum_bytes));
  return read;
}

}  // namespace shardsafe
