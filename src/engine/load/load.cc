// Load: rank 0 resolves the path and reads the index once; every rank
// receives it, matches its targets against it, plans its own reads and runs
// them; finally the ranks agree so that all succeed or all fail.
#include <algorithm>
#include <chrono>
#include <unordered_map>

#include "base/crc32c.h"
#include "comm/agree.h"
#include "engine/catalog/checkpoint_dir.h"
#include "engine/load/convert.h"
#include "engine/load/device_load.h"
#include "engine/load/load_executor.h"
#include "engine/load/load_internal.h"
#include "engine/shared_reads/ring_reads.h"
#include "engine/shared_reads/shared_reads.h"
#include "engine/load/source.h"
#include "engine/load/table_reads.h"

namespace shardsafe {
namespace {

// Chunks a batch of a one-rank load plans and reads at most (bounding the
// planner's memory, ~0.4 KB a chunk, whatever the size of the load); the
// targets of one tensor are never split.
constexpr uint64_t kBatchChunks = 1 << 14;

Status CheckTarget(const TensorTarget& t, DType saved_dtype, const Shape& saved_shape,
                   const LoadOptions& options) {
  // Built only for a message: a load checks every target (20,000 and more).
  auto who = [&t] { return "tensor \"" + t.key + "\""; };
  if (t.on_device && !options.device) {
    return InvalidArgumentError(who() + ": the target is on a device, but LoadOptions::device is "
                                "not set");
  }
  if (t.shape != saved_shape) {
    return InvalidArgumentError(who() + ": shape mismatch: checkpoint has " +
                                ShapeToString(saved_shape) + ", target has " +
                                ShapeToString(t.shape))
        .WithDetail(ErrorDetail::kShapeMismatch);
  }
  if (t.dtype != saved_dtype) {
    if (!options.convert_dtypes) {
      return InvalidArgumentError(who() + ": dtype mismatch: checkpoint has " +
                                  std::string(DTypeName(saved_dtype)) + ", target has " +
                                  std::string(DTypeName(t.dtype)) +
                                  " (allow conversion with convert_dtypes)")
          .WithDetail(ErrorDetail::kDTypeMismatch);
    }
    if (!CanConvert(saved_dtype, t.dtype)) {
      return InvalidArgumentError(who() + ": cannot convert " +
                                  std::string(DTypeName(saved_dtype)) + " to " +
                                  std::string(DTypeName(t.dtype)))
          .WithDetail(ErrorDetail::kDTypeMismatch);
    }
  }
  Status s = ValidateSlice(t.slice, t.shape, t.dtype);
  if (s.ok() && t.dtype != saved_dtype) s = ValidateSlice(t.slice, t.shape, saved_dtype);
  if (!s.ok()) return s.WithContext(who());
  if (t.data == nullptr && t.slice.NumElements() > 0) {
    return InvalidArgumentError(who() + ": null destination");
  }
  return Status();
}

std::string ListKeys(const std::vector<std::string>& keys, size_t total) {
  std::string s;
  for (size_t i = 0; i < keys.size() && i < 20; ++i) s += (i ? ", " : "") + keys[i];
  if (total > 20) s += ", ... (" + std::to_string(total) + " in all)";
  return s;
}

// Finds a load's tensors in a packed index: targets in key order (as the
// keys of many state dicts are) are found without a search, the tensor
// after the previous one found tried first.
class PackedFinder {
 public:
  explicit PackedFinder(const PackedTensors& tensors) : tensors_(tensors) {}
  std::optional<size_t> Find(std::string_view key) {
    std::optional<size_t> t;
    if (next_ < tensors_.size() && tensors_.key(next_) == key) {
      t = next_;
    } else {
      t = tensors_.Find(key);
    }
    if (t) next_ = *t + 1;
    return t;
  }

 private:
  const PackedTensors& tensors_;
  size_t next_ = 0;
};

// A host target matched: request.tensors[target], of tensor `tensor` of the
// source's PackedTensors (chunks from `chunks_of` in a load's own tensors
// where its chunk table was read for it).
struct HostTarget {
  uint32_t target;
  uint32_t tensor;
};

// A load's targets: `request`'s, then the whole-tensor ones (numbered
// after them in HostTarget::target).
struct Targets {
  const LoadRequest& request;
  std::span<const WholeTensorTarget> whole;
};

// The targets matched against the index, in batches for the planner.
struct Matched {
  std::vector<HostTarget> host;      // grouped by tensor
  std::vector<DeviceTarget> device;  // loaded apart (engine/load/device_load.h)
};

// Matches every target against `all` (the source's tensors: missing and
// unexpected keys, dtypes and shapes), before anything is read.
Result<Matched> MatchTargets(const Targets& targets, const CheckpointSource& src,
                             const LoadOptions& options, LoadResult* result) {
  const LoadRequest& request = targets.request;
  const PackedTensors& all = *src.packed;
  Matched m;
  std::vector<bool> wanted(all.size());
  PackedFinder finder(all);
  for (size_t i = 0; i < request.tensors.size(); ++i) {
    const TensorTarget& t = request.tensors[i];
    const std::optional<size_t> found = finder.Find(t.key);
    if (!found) {
      result->missing.push_back(t.key);
      continue;
    }
    SS_RETURN_IF_ERROR(CheckTarget(t, all.dtype(*found), all.shape(*found), options));
    wanted[*found] = true;
    if (t.on_device) {
      m.device.push_back({&t, &t.key});
    } else {
      m.host.push_back({static_cast<uint32_t>(i), static_cast<uint32_t>(*found)});
    }
  }
  for (size_t j = 0; j < targets.whole.size(); ++j) {
    const WholeTensorTarget& w = targets.whole[j];
    if (w.tensor >= all.size()) {
      return InvalidArgumentError("whole-tensor target " + std::to_string(j) + " names tensor " +
                                  std::to_string(w.tensor) + " of " + std::to_string(all.size()));
    }
    const Shape shape = all.shape(w.tensor);
    if (w.data == nullptr && *NumElements(shape) > 0) {  // the index checked the count
      return InvalidArgumentError("tensor \"" + std::string(all.key(w.tensor)) +
                                  "\": null destination");
    }
    wanted[w.tensor] = true;
    m.host.push_back({static_cast<uint32_t>(request.tensors.size() + j), w.tensor});
  }
  for (size_t t = 0; t < all.size(); ++t) {  // saved tensors no target wants
    if (!wanted[t]) result->unexpected.emplace_back(all.key(t));
  }
  std::sort(result->missing.begin(), result->missing.end());
  result->missing.erase(std::unique(result->missing.begin(), result->missing.end()),
                        result->missing.end());
  if (!result->missing.empty() && !options.allow_partial) {
    return NotFoundError("keys missing from checkpoint " + src.path + ": " +
                         ListKeys(result->missing, result->missing.size()));
  }
  std::stable_sort(m.host.begin(), m.host.end(),
                   [](const HostTarget& a, const HostTarget& b) { return a.tensor < b.tensor; });
  return m;
}

// Ends of the batches of `host` (grouped by tensor): consecutive targets
// whose tensors hold at most kBatchChunks chunks together (or one tensor
// with more).
std::vector<size_t> BatchEnds(const std::vector<HostTarget>& host, const PackedTensors& chunks,
                              const std::function<std::optional<size_t>(size_t)>& chunks_of) {
  std::vector<size_t> ends;
  uint64_t in_batch = 0;
  for (size_t i = 0; i < host.size(); ++i) {
    if (i > 0 && host[i].tensor == host[i - 1].tensor) continue;
    const std::optional<size_t> t = chunks_of(host[i].tensor);
    const uint64_t n = t ? chunks.chunk_count(*t) : 0;
    if (in_batch > 0 && in_batch + n > kBatchChunks) {
      ends.push_back(i);
      in_batch = 0;
    }
    in_batch += n;
  }
  ends.push_back(host.size());
  return ends;
}

// The planner's input for targets host[first, last).
struct BatchInput {
  std::vector<SavedTensor> tensors;
  std::vector<Want> wants;
  std::vector<LoadDestination> dests;
  LoadSources sources;
};

// `src`: where the chunks are read (its data files); `all`: the source's
// tensors (host targets' numbers); `chunks`: where their chunks are.
BatchInput MakeBatch(const Targets& targets, const CheckpointSource& src,
                     std::span<const HostTarget> host, const PackedTensors& all,
                     const PackedTensors& chunks,
                     const std::function<std::optional<size_t>(size_t)>& chunks_of) {
  const LoadRequest& request = targets.request;
  BatchInput in;
  in.sources = FileSources(src);
  for (size_t i = 0; i < host.size(); ++i) {
    const uint32_t tensor = host[i].tensor;
    if (i == 0 || tensor != host[i - 1].tensor) {
      in.tensors.push_back(SavedTensor{all.dtype(tensor), all.shape(tensor), {}});
      std::vector<std::optional<uint32_t>> crcs;
      if (const std::optional<size_t> c = chunks_of(tensor)) {
        AddSavedChunks(chunks, *c, &in.tensors.back(), &crcs);
      }
      in.sources.tensor_keys.emplace_back(all.key(tensor));
      in.sources.crcs.push_back(std::move(crcs));
    }
    const uint32_t want = static_cast<uint32_t>(in.tensors.size() - 1);
    if (host[i].target < request.tensors.size()) {
      const TensorTarget& t = request.tensors[host[i].target];
      in.wants.push_back({want, t.slice});
      in.dests.push_back({t.data, t.dtype});
    } else {
      const WholeTensorTarget& w = targets.whole[host[i].target - request.tensors.size()];
      in.wants.push_back({want, Slice{Box::Whole(in.tensors.back().shape), std::nullopt}});
      in.dests.push_back({w.data, all.dtype(tensor)});
    }
  }
  return in;
}

}  // namespace

void AddSavedChunks(const PackedTensors& tensors, size_t t, SavedTensor* saved,
                    std::vector<std::optional<uint32_t>>* crcs) {
  const uint64_t first = tensors.first_chunk(t), n = tensors.chunk_count(t);
  saved->chunks.reserve(saved->chunks.size() + n);
  crcs->reserve(crcs->size() + n);
  for (uint64_t c = first; c < first + n; ++c) {
    saved->chunks.push_back({tensors.slice(t, c), tensors.file(c), tensors.at(c)});
    crcs->push_back(tensors.crc32c(c));
  }
}

namespace {

Status ReadBlobs(FileSystem& fs, const CheckpointSource& src, int rank, LoadResult* result) {
  for (const auto& [name, blob] : src.index.blobs) {
    for (const IndexBlobChunk& c : blob.chunks) {
      if (blob.per_rank && c.rank != rank) continue;
      SS_RETURN_IF_ERROR(ReadBlob(fs, src, name, c, &result->blobs[name]));
    }
  }
  return Status();
}


}  // namespace

Status ReadBlob(FileSystem& fs, const CheckpointSource& src, const std::string& name,
                const IndexBlobChunk& chunk, std::string* out) {
  const std::string path = JoinPath(src.data_dir, src.index.files[chunk.file].name);
  SS_ASSIGN_OR_RETURN(auto file, fs.NewRandomAccessFile(path, SourceReadOptions(src)));
  // The index's sizes are claims: checked against the file before any
  // memory is taken for them (a hostile index could ask for terabytes).
  uint64_t end = 0;
  if (__builtin_add_overflow(chunk.at, chunk.bytes, &end) || end > file->size()) {
    return DataLossError("blob \"" + name + "\" in " + path + ": bytes [" +
                         std::to_string(chunk.at) + ", +" + std::to_string(chunk.bytes) +
                         ") claimed by the index, but the file has " +
                         std::to_string(file->size()) + " bytes");
  }
  out->resize(chunk.bytes);
  SS_RETURN_IF_ERROR(file->ReadAt(chunk.at, out->data(), chunk.bytes));
  if (chunk.crc32c && Crc32c(out->data(), out->size()) != *chunk.crc32c) {
    return DataLossError("blob \"" + name + "\" in " + path + ": checksum mismatch");
  }
  return Status();
}

namespace {

// The tensors a load reads the chunks of: the source's own, or where its
// chunk table was not read, those read from it for this load (`read`,
// numbered apart: chunks_of maps the source's tensor numbers to them).
struct LoadTensors {
  const CheckpointSource* src = nullptr;  // a packed source (its tensors, all of them)
  CheckpointSource view;                  // `src` whose tensors are `read` (table reads)
  const PackedTensors* chunks = nullptr;  // where the chunks are
  std::function<std::optional<size_t>(size_t)> chunks_of;
  const CheckpointSource& reading() const { return chunks == src->packed.get() ? *src : view; }
};

Result<std::unique_ptr<LoadTensors>> ReadLoadTensors(FileSystem& fs, const CheckpointSource& src,
                                                     const Targets& targets) {
  auto out = std::make_unique<LoadTensors>();
  out->src = &src;
  out->chunks = src.packed.get();
  out->chunks_of = [](size_t t) { return std::optional<size_t>(t); };
  if (!src.chunks_pending) return out;
  SS_ASSIGN_OR_RETURN(PackedTensors read,
                      ReadTableChunks(fs, src, targets.request, targets.whole));
  out->view.path = src.path;
  out->view.data_dir = src.data_dir;
  out->view.native = src.native;
  out->view.index = src.index;  // no tensors: they are packed
  out->view.packed = std::make_shared<const PackedTensors>(std::move(read));
  out->chunks = out->view.packed.get();
  const PackedTensors* all = src.packed.get();
  const PackedTensors* chunks = out->chunks;
  out->chunks_of = [all, chunks](size_t t) { return chunks->Find(all->key(t)); };
  return out;
}

// Keys of the tensors whose targets a load began to fill, for its error:
// the first 20 and how many.
struct Touched {
  std::vector<std::string> first;
  size_t count = 0;
  void Add(const std::vector<std::string>& keys) {
    for (size_t i = 0; i < keys.size() && first.size() < 20; ++i) first.push_back(keys[i]);
    count += keys.size();
  }
};

// Plans and reads host targets m.host[first, last) (one batch).
Status ReadBatch(const Targets& targets, const LoadTensors& lt, const Matched& m,
                 size_t first, size_t last, FileSystem& fs, const LoadOptions& options,
                 LoadResult* result, Touched* touched) {
  BatchInput in = MakeBatch(targets, lt.reading(), std::span(m.host).subspan(first, last - first),
                            *lt.src->packed, *lt.chunks, lt.chunks_of);
  LoadPlanOptions popts;
  popts.max_read_bytes = std::max<uint64_t>(options.scratch_bytes, 1 << 20);
  SS_ASSIGN_OR_RETURN(LoadPlan plan, PlanLoad(in.tensors, in.wants, popts));
  result->bytes_needed += plan.bytes_needed;
  touched->Add(in.sources.tensor_keys);
  LoadCounters counters;
  Status s = ExecuteLoadPlan(plan, in.tensors, in.wants, in.dests, in.sources, fs, options,
                             &counters);
  result->bytes_read += counters.bytes_read.load();
  result->chunks_verified += counters.chunks_verified.load();
  return s;
}

// The device targets, then the blobs.
Status FinishLoad(const Matched& m, const LoadTensors& lt, std::optional<int> blobs_of_rank,
                  FileSystem& fs, const LoadOptions& options, LoadResult* result,
                  Touched* touched) {
  if (!m.device.empty()) {
    std::vector<std::string> keys;
    for (const DeviceTarget& d : m.device) {
      if (keys.empty() || keys.back() != *d.key) keys.push_back(*d.key);
    }
    touched->Add(keys);
    SS_ASSIGN_OR_RETURN(DeviceLoadStats device,
                        LoadIntoDevice(m.device, lt.reading(), fs, options));
    result->bytes_read += device.bytes_read;
    result->chunks_verified += device.chunks_verified;
  }
  return blobs_of_rank ? ReadBlobs(fs, *lt.src, *blobs_of_rank, result) : Status();
}

// Loads `request` from the packed `src` on this process alone, batch by
// batch.
Status LoadAlone(const Targets& targets, const CheckpointSource& src,
                 std::optional<int> blobs_of_rank, FileSystem& fs, const LoadOptions& options,
                 LoadResult* result, Touched* touched) {
  SS_ASSIGN_OR_RETURN(std::unique_ptr<LoadTensors> lt, ReadLoadTensors(fs, src, targets));
  SS_ASSIGN_OR_RETURN(Matched m, MatchTargets(targets, src, options, result));
  const std::vector<size_t> ends = BatchEnds(m.host, *lt->chunks, lt->chunks_of);
  for (size_t b = 0, first = 0; b < ends.size(); first = ends[b++]) {
    SS_RETURN_IF_ERROR(
        ReadBatch(targets, *lt, m, first, ends[b], fs, options, result, touched));
  }
  return FinishLoad(m, *lt, blobs_of_rank, fs, options, result, touched);
}

// How long a shared read waits for another rank's progress before it
// decides that rank is gone (engine/shared_reads/shared_ring.h).
constexpr std::chrono::milliseconds kRingStallTimeout = std::chrono::minutes(5);

// Runs this rank's part of a collective load that shares reads: the
// shared-reads collective over the whole plan (one batch, the same on
// every rank), then the local load.
Status LoadShared(const Targets& targets, const CheckpointSource& src, Comm& comm,
                  FileSystem& fs, const LoadOptions& options, LoadResult* result,
                  Touched* touched) {
  Result<std::unique_ptr<LoadTensors>> lt = ReadLoadTensors(fs, src, targets);
  Result<Matched> m = lt.ok() ? MatchTargets(targets, src, options, result)
                              : Result<Matched>(lt.status());
  Result<BatchInput> in = m.ok() ? Result<BatchInput>(MakeBatch(
                                       targets, (*lt)->reading(), m->host, *src.packed,
                                       *(*lt)->chunks, (*lt)->chunks_of))
                                 : Result<BatchInput>(m.status());
  LoadPlanOptions popts;
  popts.max_read_bytes = std::max<uint64_t>(options.scratch_bytes, 1 << 20);
  Result<LoadPlan> plan = in.ok() ? PlanLoad(in->tensors, in->wants, popts)
                                  : Result<LoadPlan>(in.status());
  SharedReadsOptions share;
  share.enabled = options.direct_io;  // buffered reads share the page cache already
  share.rings = options.shared_memory;
  std::vector<uint64_t> file_sizes;
  for (const IndexFile& f : src.index.files) file_sizes.push_back(f.bytes);
  SS_ASSIGN_OR_RETURN(SharedReadPlan shared,
                      PlanSharedReads(comm, plan.ok() ? &*plan : nullptr, file_sizes, share));
  SS_ASSIGN_OR_RETURN(std::unique_ptr<RingReads> rings,
                      SetUpRings(comm, shared, file_sizes, kRingStallTimeout));
  result->bytes_shared = shared.bytes_shared;
  if (!plan.ok()) return plan.status();
  in->sources.rings = rings.get();
  if (shared.bytes_shared > 0) {
    in->sources.buffered = std::move(shared.buffered);
    // Spread the ranks' starting points over the files (LoadSources::first_file).
    in->sources.first_file = static_cast<uint32_t>(
        uint64_t{static_cast<uint32_t>(comm.rank())} * src.index.files.size() / comm.size());
  }
  result->bytes_needed = plan->bytes_needed;
  touched->Add(in->sources.tensor_keys);
  LoadCounters counters;
  Status s = ExecuteLoadPlan(*plan, in->tensors, in->wants, in->dests, in->sources, fs, options,
                             &counters);
  result->bytes_read = counters.bytes_read.load();
  result->chunks_verified = counters.chunks_verified.load();
  SS_RETURN_IF_ERROR(s);
  return FinishLoad(*m, **lt, comm.rank(), fs, options, result, touched);
}

// A failed load says which of this rank's targets it may have changed.
Status NameTouchedTargets(const Status& s, const Touched& touched) {
  if (s.ok() || touched.count == 0) return s;
  return Status(s.code(), s.message() + "; this rank's targets may be partly overwritten: " +
                              ListKeys(touched.first, touched.count))
      .WithDetail(s.detail());
}

// `src` with its tensors packed: itself, or a packed copy in `*copy`.
const CheckpointSource& Packed(const CheckpointSource& src, CheckpointSource* copy) {
  if (src.packed) return src;
  *copy = src;
  Repack(copy, /*packed=*/true);
  return *copy;
}

}  // namespace

Status LoadFromSource(const LoadRequest& request, const CheckpointSource& src,
                      std::optional<int> blobs_of_rank, FileSystem& fs,
                      const LoadOptions& options, LoadResult* result) {
  CheckpointSource copy;
  Touched ignored;
  return LoadAlone(Targets{request, {}}, Packed(src, &copy), blobs_of_rank, fs, options, result,
                   &ignored);
}

namespace {

// OpenSourceCollective with rank 0's file system (or why it has none);
// `other_format` as OpenSourceCollectivePacked's.
Result<CheckpointSource> OpenOnRankZero(const Result<FileSystem*>& fs, const std::string& path,
                                        Comm& comm, std::string_view other_format = {}) {
  // Rank 0 opens and validates; the others parse the index bytes it read.
  Result<CheckpointSource> local_src = CheckpointSource();
  Result<std::string> opened = std::string();
  if (comm.rank() == 0 && !other_format.empty()) {
    local_src->path = path;
    local_src->other_format = other_format;
    if (comm.size() > 1) opened = EncodeSource(*local_src, {});
  } else if (comm.rank() == 0) {
    std::string text;
    local_src = fs.ok() ? OpenSource(**fs, path, OpenHow{comm.size() > 1 ? &text : nullptr,
                                                         /*whole=*/false, /*packed=*/true})
                        : Result<CheckpointSource>(fs.status());
    opened = !local_src.ok()     ? Result<std::string>(local_src.status())
             : comm.size() > 1 ? Result<std::string>(EncodeSource(*local_src, text))
                               : Result<std::string>(std::string());
  }
  SS_ASSIGN_OR_RETURN(std::string msg, BroadcastOrFail(comm, 0, opened));
  if (comm.rank() != 0) local_src = DecodeSource(msg);
  return local_src;
}

// OpenOnRankZero on the file system `path` lies on (FileSystemFor), or
// `fs` when set. Only rank 0 reads; a rank that cannot reach the store
// fails later, in LoadOpenedSource's agreement.
Result<CheckpointSource> OpenOnRankZero(FileSystem* fs, const std::string& path, Comm& comm,
                                        std::string_view other_format = {}) {
  if (fs != nullptr) return OpenOnRankZero(Result<FileSystem*>(fs), path, comm, other_format);
  const bool opens = comm.rank() == 0 && other_format.empty();
  return OpenOnRankZero(opens ? FileSystemFor(path) : Result<FileSystem*>(nullptr), path, comm,
                        other_format);
}

Result<CheckpointSource> Unpacked(Result<CheckpointSource> src) {
  if (src.ok()) Repack(&*src, /*packed=*/false);
  return src;
}

}  // namespace

Result<CheckpointSource> OpenSourceCollective(FileSystem& fs, const std::string& path,
                                              Comm& comm) {
  return Unpacked(OpenOnRankZero(&fs, path, comm));
}

Result<CheckpointSource> OpenSourceCollective(const std::string& path, Comm& comm) {
  return Unpacked(OpenOnRankZero(nullptr, path, comm));
}

Result<CheckpointSource> OpenSourceCollectivePacked(const std::string& path, Comm& comm,
                                                    std::string_view other_format) {
  return OpenOnRankZero(nullptr, path, comm, other_format);
}

Result<LoadResult> LoadOpenedSource(const LoadRequest& request, const CheckpointSource& src,
                                    Comm& comm, const LoadOptions& options) {
  return LoadOpenedSource(request, {}, src, comm, options);
}

Result<LoadResult> LoadOpenedSource(const LoadRequest& request,
                                    std::span<const WholeTensorTarget> whole,
                                    const CheckpointSource& src, Comm& comm,
                                    const LoadOptions& options) {
  const auto start = std::chrono::steady_clock::now();
  Result<FileSystem*> fs = FileSystemFor(src.path, options.fs);
  LoadResult result;
  result.path = src.path;
  result.tag = src.index.tag;
  result.values = src.index.values;
  result.metadata = src.index.metadata;
  result.layout = src.index.layout;
  result.saved_world_size = src.index.world_size;
  Touched touched;
  CheckpointSource copy;
  const CheckpointSource& packed = Packed(src, &copy);
  if (options.check_reports) {  // the load's first collective: reports, before any read
    SS_ASSIGN_OR_RETURN(std::vector<std::string> reports,
                        AllGatherOrFail(comm, options.local_failure, options.report));
    SS_RETURN_IF_ERROR(options.check_reports(reports).WithContext("loading " + src.path));
  }
  Status local = fs.status();
  if (!whole.empty() && !src.packed) {
    local = InvalidArgumentError("whole-tensor targets name tensors of a packed source only");
  }
  const Targets targets{request, whole};
  if (local.ok() && options.share_reads && comm.size() > 1) {
    local = LoadShared(targets, packed, comm, **fs, options, &result, &touched);
  } else if (local.ok()) {
    local = LoadAlone(targets, packed, comm.rank(), **fs, options, &result, &touched);
  }
  if ((local.code() == StatusCode::kNotFound || local.code() == StatusCode::kDataLoss) &&
      src.native && (*fs)->IsObjectStore() && !IsCommitted(**fs, src.path)) {
    // No read lease on an object store: retention or prune got there first
    // (a data object gone is otherwise the checkpoint's loss: DataLoss).
    local = NotFoundError("checkpoint " + src.path +
                          " was removed (by retention or prune) while it was being loaded: " +
                          local.message());
  }
  SS_RETURN_IF_ERROR(
      NameTouchedTargets(AgreeOnStatus(comm, local).WithContext("loading " + src.path), touched));
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return result;
}

Result<LoadResult> Load(const LoadRequest& request, const std::string& path, Comm& comm,
                        const LoadOptions& options) {
  const auto start = std::chrono::steady_clock::now();
  SS_ASSIGN_OR_RETURN(CheckpointSource src, OpenOnRankZero(options.fs, path, comm));
  SS_ASSIGN_OR_RETURN(LoadResult result, LoadOpenedSource(request, src, comm, options));
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return result;
}

}  // namespace shardsafe
