#include "engine/load/load_executor.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <thread>
#include <tuple>
#include <type_traits>

#include "base/crc32c.h"
#include "base/thread_pool.h"
#include "engine/load/convert.h"

namespace shardsafe {
namespace {

// Opens data files on first use; shared by all workers.
class FileCache {
 public:
  FileCache(FileSystem& fs, const LoadSources& sources, bool direct)
      : fs_(fs), sources_(sources), direct_(direct), files_(sources.file_paths.size()) {}

  Result<const RandomAccessFile*> Get(uint32_t index) {
    if (sources_.rings) {
      if (const RandomAccessFile* ring = sources_.rings->FileFor(index)) return ring;
    }
    std::lock_guard<std::mutex> lock(mu_);
    if (!files_[index]) {
      const bool buffered = index < sources_.buffered.size() && sources_.buffered[index];
      const std::string& path = sources_.file_paths[index];
      ReadOptions read{.direct = direct_ && !buffered, .within = sources_.within};
      if (index < sources_.file_bytes.size()) read.size = sources_.file_bytes[index];
      auto opened = fs_.NewRandomAccessFile(path, read);
      if (opened.status().code() == StatusCode::kNotFound) {
        // A file the source names and lacks: the checkpoint is incomplete.
        return DataLossError(opened.status().message() + " (a data file of the checkpoint)");
      }
      SS_ASSIGN_OR_RETURN(auto file, std::move(opened));
      if (index < sources_.file_bytes.size() && file->size() != sources_.file_bytes[index]) {
        return DataLossError(path + ": size " + std::to_string(file->size()) +
                             " bytes, index records " + std::to_string(sources_.file_bytes[index]));
      }
      files_[index] = std::move(file);
    }
    return files_[index].get();
  }

 private:
  FileSystem& fs_;
  const LoadSources& sources_;
  bool direct_;
  std::mutex mu_;
  std::vector<std::unique_ptr<RandomAccessFile>> files_;
};

struct Context {
  const std::vector<SavedTensor>& tensors;
  const std::vector<Want>& wants;
  const std::vector<LoadDestination>& dests;
  const LoadSources& sources;
  FileCache& files;
  LoadCounters* counters;
};

// Where row `row` of `seg` lands.
char* DestBytes(const Context& ctx, const Segment& seg, uint64_t row = 0) {
  const LoadDestination& d = ctx.dests[seg.want];
  return static_cast<char*>(d.data) + seg.row_dst(row) * DTypeBits(d.dtype) / 8;
}

DType SavedDType(const Context& ctx, const Segment& seg) {
  return ctx.tensors[ctx.wants[seg.want].tensor].dtype;
}

// Bytes of the saved data one row of `seg` covers.
uint64_t SavedBytes(const Context& ctx, const Segment& seg) {
  return seg.count * DTypeBits(SavedDType(ctx, seg)) / 8;
}

// Where the last row of `seg` ends in the read's buffer.
uint64_t SpanEnd(const Context& ctx, const Segment& seg) {
  return seg.row_src(seg.rows - 1) + SavedBytes(ctx, seg);
}

// True if the whole read is one contiguous run of one destination.
bool IsSingleRun(const Context& ctx, const ReadOp& read) {
  if (read.segments.size() != 1) return false;
  const Segment& seg = read.segments[0];
  return seg.rows == 1 && seg.src_byte == 0 && SavedBytes(ctx, seg) == read.length;
}

// True if the read can go straight into its destination: one run, no
// conversion.
bool ReadsStraightIntoDest(const Context& ctx, const ReadOp& read) {
  return IsSingleRun(ctx, read) &&
         SavedDType(ctx, read.segments[0]) == ctx.dests[read.segments[0].want].dtype;
}

std::string ChunkName(const Context& ctx, const ChunkRef& ref) {
  const SavedChunk& c = ctx.tensors[ref.tensor].chunks[ref.chunk];
  return "tensor \"" + ctx.sources.tensor_keys[ref.tensor] + "\" chunk " +
         SliceToString(c.slice) + " in " + ctx.sources.file_paths[c.file];
}

// Running checksums of the whole chunks of one group. The planner lists
// them in ascending file order and they do not overlap, so a cursor past the
// chunks already complete keeps each Add proportional to the chunks it
// touches (a group may span thousands of small chunks).
class GroupChecksums {
 public:
  GroupChecksums(const Context& ctx, const ReadGroup& group) : ctx_(ctx), group_(group) {
    if (stream()) return;  // the stream keeps the checksums
    crcs_.assign(group.whole_chunks.size(), 0);
    ranges_.reserve(group.whole_chunks.size());
    for (const ChunkRef& ref : group.whole_chunks) ranges_.push_back(ByteRange(ref));
  }
  StreamChecksums* stream() const { return ctx_.counters->stream; }

  // Extends each chunk's checksum with its part of the `length` file bytes
  // at `offset`, which are in `buf`. Calls come in increasing offset order.
  void Add(uint64_t offset, uint64_t length, const char* buf) {
    if (stream()) {
      stream()->Add(group_.reads.front().file, offset, length, buf);
      return;
    }
    while (next_ < ranges_.size() && ranges_[next_].second <= offset) ++next_;
    for (size_t i = next_; i < ranges_.size() && ranges_[i].first < offset + length; ++i) {
      const auto [lo, hi] = ranges_[i];
      const uint64_t a = std::max(lo, offset), b = std::min(hi, offset + length);
      if (a < b) crcs_[i] = Crc32cExtend(crcs_[i], buf + (a - offset), b - a);
    }
  }

  Status Verify() {
    if (stream()) return stream()->status();
    for (size_t i = 0; i < group_.whole_chunks.size(); ++i) {
      const ChunkRef& ref = group_.whole_chunks[i];
      const auto& expected = ctx_.sources.crcs[ref.tensor][ref.chunk];
      if (!expected) continue;
      if (*expected != crcs_[i]) {
        char buf[96];
        std::snprintf(buf, sizeof buf, ": checksum mismatch (recorded %08x, computed %08x)",
                      *expected, crcs_[i]);
        return DataLossError(ChunkName(ctx_, ref) + buf);
      }
      ctx_.counters->chunks_verified++;
    }
    return Status();
  }

 private:
  std::pair<uint64_t, uint64_t> ByteRange(const ChunkRef& ref) const {
    const SavedTensor& t = ctx_.tensors[ref.tensor];
    const SavedChunk& c = t.chunks[ref.chunk];
    return {c.at, c.at + *NumBytes(t.dtype, c.slice.NumElements())};
  }

  const Context& ctx_;
  const ReadGroup& group_;
  std::vector<uint32_t> crcs_;
  std::vector<std::pair<uint64_t, uint64_t>> ranges_;  // file bytes of each whole chunk
  size_t next_ = 0;  // chunks before it end before the next Add's offset
};

// A read of one run into one destination that needs only a dtype
// conversion: done in element-aligned pieces so scratch stays bounded.
Status ConvertInPieces(const Context& ctx, const RandomAccessFile& file, const ReadOp& read,
                       uint64_t max_scratch, GroupChecksums* sums, std::vector<char>* scratch) {
  const Segment& seg = read.segments[0];
  const uint64_t esize = DTypeBits(SavedDType(ctx, seg)) / 8;
  const uint64_t dsize = DTypeBits(ctx.dests[seg.want].dtype) / 8;
  const uint64_t piece = std::max<uint64_t>(esize, max_scratch / esize * esize);
  scratch->resize(std::min(piece, read.length));
  for (uint64_t done = 0; done < read.length; done += piece) {
    const uint64_t n = std::min(piece, read.length - done);
    SS_RETURN_IF_ERROR(file.ReadAt(read.offset + done, scratch->data(), n));
    if (sums) sums->Add(read.offset + done, n, scratch->data());
    ConvertElements(scratch->data(), SavedDType(ctx, seg), DestBytes(ctx, seg) + done / esize * dsize,
                    ctx.dests[seg.want].dtype, n / esize);
  }
  return Status();
}

// How much of `read` to read at a time. Data in the page cache is read in
// steps that fit the CPU cache, each checksummed right after its copy (one
// pass over memory instead of two); other data in one request (the disk
// wants large ones), checksummed after it.
uint64_t CachedStep(const RandomAccessFile& file, const ReadOp& read, const GroupChecksums* sums) {
  constexpr uint64_t kCachedStep = 512 << 10;
  const bool step = sums && read.length > kCachedStep && file.FullyCached(read.offset, read.length);
  return step ? kCachedStep : read.length;
}

// The number of rows of `read`'s segments when each starts after the one
// before it ends (no two overlap), else 0.
uint64_t RowsInOrder(const Context& ctx, const ReadOp& read) {
  uint64_t cursor = 0, rows = 0;
  for (const Segment& seg : read.segments) {
    if (seg.src_byte < cursor) return 0;
    cursor = SpanEnd(ctx, seg);
    rows += seg.rows;
  }
  return rows;
}

// True when `read`'s rows, in order, are best copied out of the read's
// bytes in steps (ReadThroughScratch) rather than scattered into their
// destinations: when the file holds the first step in memory (a
// shared-memory ring slot: RandomAccessFile::View), so only the rows are
// copied and the gaps checksummed where they lie; or when the runs are
// short (a column split: each row a run of a few hundred bytes), where a
// copy through scratch costs less than one iovec and one checksum call per
// run (~300 ns each, against ~10 ns for a memcpy of such a run).
Result<bool> CopiedInSteps(const Context& ctx, const RandomAccessFile& file, const ReadOp& read,
                           uint64_t step) {
  constexpr uint64_t kShortRun = 4 << 10;  // bytes of the read per run, gaps included
  const uint64_t rows = RowsInOrder(ctx, read);
  if (rows < 2) return false;
  if (read.length / rows < kShortRun) return true;
  SS_ASSIGN_OR_RETURN(const char* view, file.View(read.offset, std::min(step, read.length)));
  return view != nullptr;
}

// A position among the rows of a read's segments: row `row` of segment
// `seg`, rows in segment order.
struct RowCursor {
  size_t seg = 0;
  uint64_t row = 0;
};

// Copies `rows` runs of `bytes` bytes, `src_step` and `dst_step` apart.
// Short fixed sizes (a column split's rows: 64 to 512 bytes) are inlined
// copies, not a call per row.
void CopyStrided(char* dst, uint64_t dst_step, const char* src, uint64_t src_step, uint64_t bytes,
                 uint64_t rows) {
  const auto loop = [&]<size_t kBytes>(std::integral_constant<size_t, kBytes>) {
    for (uint64_t r = 0; r < rows; ++r, dst += dst_step, src += src_step) {
      std::memcpy(dst, src, kBytes ? kBytes : bytes);
    }
  };
  switch (bytes) {
    case 64: return loop(std::integral_constant<size_t, 64>());
    case 128: return loop(std::integral_constant<size_t, 128>());
    case 256: return loop(std::integral_constant<size_t, 256>());
    case 512: return loop(std::integral_constant<size_t, 512>());
    default: return loop(std::integral_constant<size_t, 0>());
  }
}

// Copies (converts) rows [from, to) of the read's segments out of `data`,
// which holds the read's bytes from `begin` on.
void CopyRows(const Context& ctx, const std::vector<Segment>& segs, RowCursor from, RowCursor to,
              const char* data, uint64_t begin) {
  for (size_t s = from.seg; s < segs.size() && s <= to.seg; ++s) {
    const Segment& seg = segs[s];
    const uint64_t first = s == from.seg ? from.row : 0;
    const uint64_t last = s == to.seg ? to.row : seg.rows;
    if (first >= last) continue;
    const DType saved = SavedDType(ctx, seg), dest = ctx.dests[seg.want].dtype;
    const char* src = data + (seg.row_src(first) - begin);
    char* dst = DestBytes(ctx, seg, first);
    const uint64_t dst_step = seg.dst_stride * DTypeBits(dest) / 8;
    if (saved == dest) {
      CopyStrided(dst, dst_step, src, seg.src_stride, SavedBytes(ctx, seg), last - first);
      continue;
    }
    for (uint64_t r = first; r < last; ++r, src += seg.src_stride, dst += dst_step) {
      ConvertElements(src, saved, dst, dest, seg.count);
    }
  }
}

// From `next` on, the rows that end at most `limit` bytes into the read
// (at least one row, when one is left): returns the cursor past them and
// raises *end to where the last of them ends. Rows are in order.
RowCursor RowsEndingBy(const Context& ctx, const std::vector<Segment>& segs, RowCursor next,
                       uint64_t limit, uint64_t* end) {
  for (bool first = true; next.seg < segs.size(); first = false) {
    const Segment& seg = segs[next.seg];
    const uint64_t bytes = SavedBytes(ctx, seg);
    uint64_t fit = next.row;  // one past the last row that ends by `limit`
    if (seg.row_src(next.row) + bytes <= limit) {
      fit = seg.rows == 1 ? 1
                          : std::min(seg.rows, (limit - bytes - seg.src_byte) / seg.src_stride + 1);
    }
    if (first && fit == next.row) fit = next.row + 1;
    if (fit == next.row) break;
    *end = std::max(*end, seg.row_src(fit - 1) + bytes);
    if (fit < seg.rows) return RowCursor{next.seg, fit};
    next = RowCursor{next.seg + 1, 0};
  }
  return next;
}

// Reads `read` in steps of about `step` bytes, each ending where a run
// ends (one step: the whole read), into scratch unless the file holds the
// step in memory (RandomAccessFile::View), checksums each step and copies
// (converts) its runs out while it is in the CPU cache. Runs may
// overlap only when the step is the whole read.
Status ReadThroughScratch(const Context& ctx, const RandomAccessFile& file, const ReadOp& read,
                          uint64_t step, GroupChecksums* sums, std::vector<char>* scratch) {
  const std::vector<Segment>& segs = read.segments;
  RowCursor next;  // the first row not copied out yet
  uint64_t begin = 0;
  while (begin < read.length) {
    uint64_t end = begin;
    const RowCursor stop = step >= read.length ? RowCursor{segs.size(), 0}
                                               : RowsEndingBy(ctx, segs, next, begin + step, &end);
    if (stop.seg == segs.size()) end = read.length;
    const uint64_t n = end - begin;
    // Bytes the file holds in memory are used in place (no copy to scratch).
    SS_ASSIGN_OR_RETURN(const char* data, file.View(read.offset + begin, n));
    if (!data) {
      if (scratch->size() < n) scratch->resize(n);
      SS_RETURN_IF_ERROR(file.ReadAt(read.offset + begin, scratch->data(), n));
      data = scratch->data();
    }
    if (sums) sums->Add(read.offset + begin, n, data);
    CopyRows(ctx, segs, next, stop, data, begin);
    next = stop;
    begin = end;
  }
  return Status();
}

// A read of several runs, none converted and none overlapping another: one
// scattered read puts each run straight into its destination (no scratch
// copy); only the bytes between runs land in `scratch`. Runs are read in
// batches of about `step` bytes (CachedStep), each checksummed right after
// it is read. False in *done when the read does not qualify.
Status ScatterIntoDests(const Context& ctx, const RandomAccessFile& file, const ReadOp& read,
                        uint64_t step, GroupChecksums* sums, std::vector<char>* scratch,
                        bool* done) {
  *done = false;
  struct Run {
    uint64_t at;  // within the read
    uint64_t n;
    char* dst;  // nullptr: a gap, into scratch
  };
  std::vector<Run> runs;
  uint64_t cursor = 0, gaps = 0;
  for (const Segment& seg : read.segments) {
    if (SavedDType(ctx, seg) != ctx.dests[seg.want].dtype || seg.src_byte < cursor) return Status();
    const uint64_t n = SavedBytes(ctx, seg);
    for (uint64_t r = 0; r < seg.rows; ++r) {
      const uint64_t at = seg.row_src(r);
      if (at > cursor) runs.push_back({cursor, at - cursor, nullptr});
      runs.push_back({at, n, DestBytes(ctx, seg, r)});
      gaps += at - cursor;
      cursor = at + n;
    }
  }
  if (cursor < read.length) {
    runs.push_back({cursor, read.length - cursor, nullptr});
    gaps += read.length - cursor;
  }
  if (scratch->size() < gaps) scratch->resize(gaps);
  std::vector<RandomAccessFile::Piece> pieces;
  for (uint64_t used = 0; Run& r : runs) {
    if (r.dst == nullptr) {
      r.dst = scratch->data() + used;
      used += r.n;
    }
    pieces.push_back({r.dst, static_cast<size_t>(r.n)});
  }
  for (size_t i = 0, j; i < runs.size(); i = j) {
    uint64_t bytes = runs[i].n;
    for (j = i + 1; j < runs.size() && bytes + runs[j].n <= step; ++j) bytes += runs[j].n;
    SS_RETURN_IF_ERROR(file.ReadScattered(read.offset + runs[i].at,
                                          std::span(pieces).subspan(i, j - i)));
    if (!sums) continue;
    for (size_t k = i; k < j; ++k) sums->Add(read.offset + runs[k].at, runs[k].n, runs[k].dst);
  }
  *done = true;
  return Status();
}

// A read straight into its destination, in CachedStep pieces.
Status ReadIntoDest(const Context& ctx, const RandomAccessFile& file, const ReadOp& read,
                    GroupChecksums* sums) {
  char* dst = DestBytes(ctx, read.segments[0]);
  const uint64_t step = CachedStep(file, read, sums);
  for (uint64_t done = 0; done < read.length; done += step) {
    const uint64_t n = std::min(step, read.length - done);
    SS_RETURN_IF_ERROR(file.ReadAt(read.offset + done, dst + done, n));
    if (sums) sums->Add(read.offset + done, n, dst + done);
  }
  return Status();
}

Status RunRead(const Context& ctx, const RandomAccessFile& file, const ReadOp& read,
               uint64_t max_scratch, GroupChecksums* sums, std::vector<char>* scratch) {
  if (ReadsStraightIntoDest(ctx, read)) return ReadIntoDest(ctx, file, read, sums);
  if (read.length > max_scratch && IsSingleRun(ctx, read)) {
    return ConvertInPieces(ctx, file, read, max_scratch, sums, scratch);
  }
  const uint64_t step = CachedStep(file, read, sums);
  SS_ASSIGN_OR_RETURN(const bool in_steps, CopiedInSteps(ctx, file, read, step));
  if (in_steps) return ReadThroughScratch(ctx, file, read, step, sums, scratch);
  bool scattered = false;
  SS_RETURN_IF_ERROR(ScatterIntoDests(ctx, file, read, step, sums, scratch, &scattered));
  if (scattered) return Status();
  return ReadThroughScratch(ctx, file, read, read.length, sums, scratch);
}

Status RunGroup(const Context& ctx, const ReadGroup& group, const LoadOptions& options,
                std::vector<char>* scratch) {
  GroupChecksums sums(ctx, group);
  GroupChecksums* verify = options.verify_checksums ? &sums : nullptr;
  for (const ReadOp& read : group.reads) {
    SS_ASSIGN_OR_RETURN(const RandomAccessFile* file, ctx.files.Get(read.file));
    Status s = RunRead(ctx, *file, read, options.scratch_bytes, verify, scratch);
    if (!s.ok()) return s.WithContext("reading " + ctx.sources.file_paths[read.file]);
    ctx.counters->bytes_read += read.length;
  }
  return verify ? sums.Verify() : Status();
}

}  // namespace

Status ExecuteLoadPlan(const LoadPlan& plan, const std::vector<SavedTensor>& tensors,
                       const std::vector<Want>& wants,
                       const std::vector<LoadDestination>& dests, const LoadSources& sources,
                       FileSystem& fs, const LoadOptions& options, LoadCounters* counters) {
  FileCache files(fs, sources, options.direct_io);
  Context ctx{tensors, wants, dests, sources, files, counters};
  const size_t threads = std::min<size_t>(std::max(options.io_threads, 1), plan.groups.size());
  ThreadPool pool(threads);
  // One scratch buffer per worker slot; a worker reuses its slot's buffer.
  std::vector<std::vector<char>> scratch(std::max<size_t>(threads, 1));
  std::mutex slots_mu;
  std::vector<size_t> free_slots;
  for (size_t i = 0; i < scratch.size(); ++i) free_slots.push_back(i);
  TaskGroup tasks(&pool);
  // Groups are in file order, rotated to start at sources.first_file; those
  // of ring files run on a thread per ring (not the pool: a ring's readers
  // must all be running for its producer to move on), in file and offset
  // order (engine/shared_reads/ring_reads.h).
  const RingReads* rings = sources.rings;
  std::vector<const ReadGroup*> order;
  const auto first = std::find_if(plan.groups.begin(), plan.groups.end(), [&](const ReadGroup& g) {
    return !g.reads.empty() && g.reads.front().file >= sources.first_file;
  });
  for (auto it = first; it != plan.groups.end(); ++it) order.push_back(&*it);
  for (auto it = plan.groups.begin(); it != first; ++it) order.push_back(&*it);
  std::vector<std::vector<const ReadGroup*>> by_ring(rings ? rings->num_rings() : 0);
  for (const ReadGroup* group : order) {
    const int ring = rings && !group->reads.empty() ? rings->RingOf(group->reads.front().file) : -1;
    if (ring >= 0) {
      by_ring[ring].push_back(group);
      continue;
    }
    tasks.Add([&, group]() -> Status {
      size_t slot;
      {
        std::lock_guard<std::mutex> lock(slots_mu);
        slot = free_slots.back();
        free_slots.pop_back();
      }
      Status s = RunGroup(ctx, *group, options, &scratch[slot]);
      std::lock_guard<std::mutex> lock(slots_mu);
      free_slots.push_back(slot);
      return s;
    });
  }
  Status produced;
  std::thread producer;
  if (rings && rings->produces()) {
    producer = std::thread(
        [&] { produced = rings->Produce(fs, sources.file_paths, sources.within); });
  }
  ThreadPool ring_pool(by_ring.size());
  TaskGroup ring_tasks(&ring_pool);
  for (std::vector<const ReadGroup*>& groups : by_ring) {
    ring_tasks.Add([&]() -> Status {
      std::stable_sort(groups.begin(), groups.end(), [](const ReadGroup* a, const ReadGroup* b) {
        return std::tie(a->reads.front().file, a->reads.front().offset) <
               std::tie(b->reads.front().file, b->reads.front().offset);
      });
      std::vector<char> ring_scratch;
      for (size_t k = 0; k < groups.size(); ++k) {
        SS_RETURN_IF_ERROR(RunGroup(ctx, *groups[k], options, &ring_scratch));
        const uint32_t file = groups[k]->reads.front().file;
        if (k + 1 == groups.size() || groups[k + 1]->reads.front().file != file) {
          rings->FileDone(file);
        }
      }
      return Status();
    });
  }
  // `&`, not `&&`: both groups get their wait.
  while (!(tasks.WaitFor(std::chrono::milliseconds(125)) &
           ring_tasks.WaitFor(std::chrono::milliseconds(125)))) {
    if (options.progress) options.progress({"read", counters->bytes_read.load(), plan.bytes_read});
  }
  Status s = tasks.Wait();
  Status consumed = ring_tasks.Wait();
  // Done, or stopped (a ring task that failed, or one skipped after it):
  // no ring waits for this rank any more.
  for (size_t i = 0; i < by_ring.size(); ++i) rings->Detach(static_cast<int>(i));
  if (producer.joinable()) producer.join();
  if (s.ok()) s = consumed;
  return s.ok() ? produced : s;
}

}  // namespace shardsafe
