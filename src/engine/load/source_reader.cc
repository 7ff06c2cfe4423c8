// SourceReader (shardsafe/source.h): each batch planned by the load planner
// and run by the load executor; checksums checked across batches by
// StreamChecksums.
#include <atomic>
#include <cstdio>
#include <map>

#include "base/crc32c.h"
#include "base/thread_pool.h"
#include "engine/load/load_executor.h"
#include "engine/load/load_internal.h"
#include "engine/load/source.h"
#include "engine/load/stream_checksums.h"
#include "shardsafe/source.h"

namespace shardsafe {
namespace {

constexpr uint64_t kVerifyPieceBytes = uint64_t{8} << 20;
constexpr uint64_t kWindowAlign = 4096;  // a multiple of every whole-byte element size

// Appends `read` to `plan` as groups of one read each (the stream checks
// checksums in any order, so each may run on a thread of its own). A read
// that goes whole into one destination run, which the planner leaves uncut
// (it needs no scratch), is cut into windows of at most `window` bytes
// (whole elements, a multiple of 4 KiB): otherwise one thread would read a
// batch that is one large chunk alone.
void AppendInWindows(ReadOp read, uint64_t window, std::span<const SavedTensor> tensors,
                     std::span<const Want> wants, LoadPlan* plan) {
  const Segment seg = read.segments.size() == 1 ? read.segments[0] : Segment{};
  const DType dtype = tensors[wants[seg.want].tensor].dtype;
  const uint64_t esize = DTypeBits(dtype) / 8;
  window = std::max(window / kWindowAlign * kWindowAlign, kWindowAlign);
  if (read.segments.size() != 1 || read.length <= window || IsSubByte(dtype) || seg.rows != 1 ||
      seg.src_byte != 0 || seg.count * esize != read.length) {
    plan->groups.push_back({{std::move(read)}, {}});
    return;
  }
  for (uint64_t done = 0; done < read.length; done += window) {
    const uint64_t n = std::min(window, read.length - done);
    Segment part = seg;
    part.dst_elem = seg.dst_elem + done / esize;
    part.count = n / esize;
    plan->groups.push_back({{ReadOp{read.file, read.offset + done, n, {part}}}, {}});
  }
}

// `src` with its tensors packed: itself, or a packed copy in `*copy`.
const CheckpointSource& PackedSource(const CheckpointSource& src,
                                     std::unique_ptr<CheckpointSource>* copy) {
  if (src.packed) return src;
  *copy = std::make_unique<CheckpointSource>(src);
  Repack(copy->get(), /*packed=*/true);
  return **copy;
}

}  // namespace

struct SourceReader::Impl {
  Impl(const CheckpointSource& src, FileSystem& fs, bool verify, SourceReadTuning tuning)
      : src_(PackedSource(src, &copy_)), tensors_(*src_.packed), fs_(fs), verify_(verify),
        tuning_(tuning), files_(FileSources(src_)), stream_(tensors_, files_.file_paths) {}

  Status Read(std::span<const SourcePiece> pieces, uint64_t max_read_bytes);
  Status VerifyChunk(const std::string& key, uint32_t chunk);
  Status VerifyRest(const std::function<bool(std::string_view)>& of, int threads);
  // The tensor of key `key` (of a piece: one the caller found in the index).
  size_t TensorOf(const std::string& key) const;

  std::unique_ptr<CheckpointSource> copy_;  // of a source given unpacked
  const CheckpointSource& src_;
  const PackedTensors& tensors_;
  FileSystem& fs_;
  const bool verify_;
  const SourceReadTuning tuning_;
  const LoadSources files_;  // what every batch reads from
  StreamChecksums stream_;
  std::atomic<uint64_t> bytes_read_{0};
  std::atomic<uint64_t> chunks_verified_again_{0};  // by VerifyRest
};

SourceReader::SourceReader(const CheckpointSource& src, FileSystem& fs, bool verify_checksums,
                           SourceReadTuning tuning)
    : impl_(std::make_unique<Impl>(src, fs, verify_checksums, tuning)) {}
SourceReader::~SourceReader() = default;

Status SourceReader::Read(std::span<const SourcePiece> pieces, uint64_t max_read_bytes) {
  return impl_->Read(pieces, max_read_bytes);
}

Status SourceReader::VerifyRest(const std::set<std::string>& keys, int threads) {
  return impl_->VerifyRest(
      [&](std::string_view key) { return keys.count(std::string(key)) > 0; }, threads);
}

Status SourceReader::VerifyRest(const std::function<bool(std::string_view)>& of, int threads) {
  return impl_->VerifyRest(of, threads);
}

size_t SourceReader::Impl::TensorOf(const std::string& key) const {
  const std::optional<size_t> t = tensors_.Find(key);
  if (!t) throw std::out_of_range("SourceReader: no tensor \"" + key + "\"");  // a caller's bug
  return *t;
}

uint64_t SourceReader::bytes_read() const { return impl_->bytes_read_.load(); }

uint64_t SourceReader::chunks_verified() const {
  return impl_->stream_.verified_count() + impl_->chunks_verified_again_.load();
}

Status SourceReader::Impl::Read(std::span<const SourcePiece> pieces, uint64_t max_read_bytes) {
  std::vector<SavedTensor> tensors;
  std::vector<Want> wants;
  std::vector<LoadDestination> dests;
  LoadSources sources = files_;
  std::map<const std::string*, uint32_t> ids;
  for (const SourcePiece& p : pieces) {
    auto [it, added] = ids.emplace(p.key, static_cast<uint32_t>(tensors.size()));
    if (added) {
      const size_t t = TensorOf(*p.key);
      SavedTensor saved{tensors_.dtype(t), tensors_.shape(t), {}};
      std::vector<std::optional<uint32_t>> crcs;
      AddSavedChunks(tensors_, t, &saved, &crcs);
      tensors.push_back(std::move(saved));
      sources.tensor_keys.push_back(*p.key);
      sources.crcs.push_back(std::move(crcs));
    }
    wants.push_back({it->second, p.slice});
    dests.push_back({p.dst, p.dtype});
  }
  LoadPlanOptions popts;
  popts.max_read_bytes = std::max<uint64_t>(max_read_bytes, 1 << 20);
  SS_ASSIGN_OR_RETURN(LoadPlan planned, PlanLoad(tensors, wants, popts));
  // A group's reads run in order on one thread; these run on any.
  LoadPlan plan;
  plan.bytes_needed = planned.bytes_needed;
  plan.bytes_read = planned.bytes_read;
  for (ReadGroup& group : planned.groups) {
    for (ReadOp& read : group.reads) {
      AppendInWindows(std::move(read), popts.max_read_bytes, tensors, wants, &plan);
    }
  }
  LoadOptions options;
  options.verify_checksums = verify_;
  options.io_threads = tuning_.threads;
  options.scratch_bytes = tuning_.scratch_bytes;
  options.direct_io = tuning_.direct_io;
  LoadCounters counters;
  counters.stream = &stream_;
  Status s = ExecuteLoadPlan(plan, tensors, wants, dests, sources, fs_, options, &counters);
  bytes_read_ += counters.bytes_read.load();
  return s;
}

Status SourceReader::Impl::VerifyChunk(const std::string& key, uint32_t chunk) {
  const size_t t = TensorOf(key);
  const IndexChunk c = tensors_.chunk(t, tensors_.first_chunk(t) + chunk);
  const std::string& path = files_.file_paths[c.file];
  SS_ASSIGN_OR_RETURN(auto file, fs_.NewRandomAccessFile(path, SourceReadOptions(src_)));
  std::vector<char> buf(std::min(c.bytes, kVerifyPieceBytes));
  uint32_t crc = 0;
  for (uint64_t done = 0; done < c.bytes; done += buf.size()) {
    const uint64_t n = std::min<uint64_t>(buf.size(), c.bytes - done);
    SS_RETURN_IF_ERROR(file->ReadAt(c.at + done, buf.data(), n).WithContext("reading " + path));
    crc = Crc32cExtend(crc, buf.data(), n);
  }
  bytes_read_ += c.bytes;
  if (crc != *c.crc32c) {
    char msg[96];
    std::snprintf(msg, sizeof msg, ": checksum mismatch (recorded %08x, computed %08x)",
                  *c.crc32c, crc);
    return DataLossError("tensor \"" + key + "\" chunk " + SliceToString(c.slice) + " in " +
                         path + msg);
  }
  chunks_verified_again_++;
  return Status();
}

Status SourceReader::Impl::VerifyRest(const std::function<bool(std::string_view)>& of,
                                      int threads) {
  if (!verify_) return Status();
  SS_RETURN_IF_ERROR(stream_.status());
  const auto todo = stream_.Unverified(of);
  ThreadPool pool(std::min<size_t>(std::max(threads, 1), todo.size()));
  TaskGroup group(&pool);
  for (const auto& [key, chunk] : todo) {
    group.Add([this, &key, chunk] { return VerifyChunk(key, chunk); });
  }
  return group.Wait();
}

}  // namespace shardsafe
