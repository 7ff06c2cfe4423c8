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

// The targets matched against the index, as planner input.
struct Matched {
  std::vector<SavedTensor> tensors;
  std::vector<Want> wants;
  std::vector<LoadDestination> dests;
  LoadSources sources;
  std::vector<DeviceTarget> device;  // loaded apart (engine/load/device_load.h)
};

Status CheckTarget(const TensorTarget& t, const IndexTensor& saved, const LoadOptions& options) {
  // Built only for a message: a load checks every target (20,000 and more).
  auto who = [&t] { return "tensor \"" + t.key + "\""; };
  if (t.on_device && !options.device) {
    return InvalidArgumentError(who() + ": the target is on a device, but LoadOptions::device is "
                                "not set");
  }
  if (t.shape != saved.shape) {
    return InvalidArgumentError(who() + ": shape mismatch: checkpoint has " +
                                ShapeToString(saved.shape) + ", target has " +
                                ShapeToString(t.shape))
        .WithDetail(ErrorDetail::kShapeMismatch);
  }
  if (t.dtype != saved.dtype) {
    if (!options.convert_dtypes) {
      return InvalidArgumentError(who() + ": dtype mismatch: checkpoint has " +
                                  std::string(DTypeName(saved.dtype)) + ", target has " +
                                  std::string(DTypeName(t.dtype)) +
                                  " (allow conversion with convert_dtypes)")
          .WithDetail(ErrorDetail::kDTypeMismatch);
    }
    if (!CanConvert(saved.dtype, t.dtype)) {
      return InvalidArgumentError(who() + ": cannot convert " +
                                  std::string(DTypeName(saved.dtype)) + " to " +
                                  std::string(DTypeName(t.dtype)))
          .WithDetail(ErrorDetail::kDTypeMismatch);
    }
  }
  Status s = ValidateSlice(t.slice, t.shape, t.dtype);
  if (s.ok() && t.dtype != saved.dtype) s = ValidateSlice(t.slice, t.shape, saved.dtype);
  if (!s.ok()) return s.WithContext(who());
  if (t.data == nullptr && t.slice.NumElements() > 0) {
    return InvalidArgumentError(who() + ": null destination");
  }
  return Status();
}

std::string ListKeys(const std::vector<std::string>& keys) {
  std::string s;
  for (size_t i = 0; i < keys.size() && i < 20; ++i) s += (i ? ", " : "") + keys[i];
  if (keys.size() > 20) s += ", ... (" + std::to_string(keys.size()) + " in all)";
  return s;
}

Result<Matched> MatchTargets(const LoadRequest& request, const CheckpointSource& src,
                             const LoadOptions& options, LoadResult* result) {
  Matched m;
  m.sources = FileSources(src);
  // Saved tensor -> its index in m.tensors (keys point into the index).
  std::unordered_map<std::string_view, uint32_t> tensor_ids;
  tensor_ids.reserve(request.tensors.size());
  TensorFinder finder(src.index);
  for (const TensorTarget& t : request.tensors) {
    auto it = finder.Find(t.key);
    if (it == finder.end()) {
      result->missing.push_back(t.key);
      continue;
    }
    SS_RETURN_IF_ERROR(CheckTarget(t, it->second, options));
    auto [pos, added] = tensor_ids.emplace(it->first, static_cast<uint32_t>(m.tensors.size()));
    if (added) {
      SavedTensor saved{it->second.dtype, it->second.shape, {}};
      std::vector<std::optional<uint32_t>> crcs;
      saved.chunks.reserve(it->second.chunks.size());
      crcs.reserve(it->second.chunks.size());
      for (const IndexChunk& c : it->second.chunks) {
        saved.chunks.push_back({c.slice, c.file, c.at});
        crcs.push_back(c.crc32c);
      }
      m.tensors.push_back(std::move(saved));
      m.sources.tensor_keys.push_back(t.key);
      m.sources.crcs.push_back(std::move(crcs));
    }
    if (t.on_device) {
      m.device.push_back({&t, &it->first});
      continue;
    }
    m.wants.push_back({pos->second, t.slice});
    m.dests.push_back({t.data, t.dtype});
  }
  if (tensor_ids.size() < src.index.tensors.size()) {  // some saved tensor no target wants
    for (const auto& [key, tensor] : src.index.tensors) {
      if (!tensor_ids.count(key)) result->unexpected.push_back(key);
    }
  }
  std::sort(result->missing.begin(), result->missing.end());
  result->missing.erase(std::unique(result->missing.begin(), result->missing.end()),
                        result->missing.end());
  if (!result->missing.empty() && !options.allow_partial) {
    return NotFoundError("keys missing from checkpoint " + src.path + ": " +
                         ListKeys(result->missing));
  }
  return m;
}

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

struct Prepared {
  Matched m;
  LoadPlan plan;
};

Result<Prepared> Prepare(const LoadRequest& request, const CheckpointSource& src,
                         const LoadOptions& options, LoadResult* result) {
  SS_ASSIGN_OR_RETURN(Matched m, MatchTargets(request, src, options, result));
  LoadPlanOptions popts;
  popts.max_read_bytes = std::max<uint64_t>(options.scratch_bytes, 1 << 20);
  SS_ASSIGN_OR_RETURN(LoadPlan plan, PlanLoad(m.tensors, m.wants, popts));
  result->bytes_needed = plan.bytes_needed;
  return Prepared{std::move(m), std::move(plan)};
}

Status Execute(Prepared& p, const CheckpointSource& src, std::optional<int> blobs_of_rank,
               FileSystem& fs, const LoadOptions& options, LoadResult* result) {
  LoadCounters counters;
  Status s = ExecuteLoadPlan(p.plan, p.m.tensors, p.m.wants, p.m.dests, p.m.sources, fs, options,
                             &counters);
  result->bytes_read = counters.bytes_read.load();
  result->chunks_verified = counters.chunks_verified.load();
  SS_RETURN_IF_ERROR(s);
  if (!p.m.device.empty()) {
    SS_ASSIGN_OR_RETURN(DeviceLoadStats device, LoadIntoDevice(p.m.device, src, fs, options));
    result->bytes_read += device.bytes_read;
    result->chunks_verified += device.chunks_verified;
  }
  return blobs_of_rank ? ReadBlobs(fs, src, *blobs_of_rank, result) : Status();
}

// How long a shared read waits for another rank's progress before it
// decides that rank is gone (engine/shared_reads/shared_ring.h).
constexpr std::chrono::milliseconds kRingStallTimeout = std::chrono::minutes(5);

// Runs this rank's part of a collective load: the shared-reads collective,
// then the local load. `*written` receives the keys of the checkpoint
// tensors whose targets the load began to fill (empty if it never read).
Status LoadLocal(const LoadRequest& request, const CheckpointSource& opened, Comm& comm,
                 FileSystem& fs, const LoadOptions& options, LoadResult* result,
                 std::vector<std::string>* written) {
  Result<CheckpointSource> filled = CheckpointSource();
  if (opened.chunks_pending) filled = ReadChunksFor(fs, opened, request);
  const CheckpointSource& src = opened.chunks_pending && filled.ok() ? *filled : opened;
  Result<Prepared> prepared =
      filled.ok() ? Prepare(request, src, options, result) : Result<Prepared>(filled.status());
  std::unique_ptr<RingReads> rings;
  if (options.share_reads) {  // the same on every rank: the plan is collective
    SharedReadsOptions share;
    share.enabled = options.direct_io;  // buffered reads share the page cache already
    share.rings = options.shared_memory;
    std::vector<uint64_t> file_sizes;
    for (const IndexFile& f : src.index.files) file_sizes.push_back(f.bytes);
    SS_ASSIGN_OR_RETURN(SharedReadPlan shared,
                        PlanSharedReads(comm, prepared.ok() ? &prepared->plan : nullptr,
                                        file_sizes, share));
    SS_ASSIGN_OR_RETURN(rings, SetUpRings(comm, shared, file_sizes, kRingStallTimeout));
    if (prepared.ok()) prepared->m.sources.rings = rings.get();
    if (prepared.ok() && shared.bytes_shared > 0) {
      prepared->m.sources.buffered = std::move(shared.buffered);
      // Spread the ranks' starting points over the files (LoadSources::first_file).
      prepared->m.sources.first_file = static_cast<uint32_t>(
          uint64_t{static_cast<uint32_t>(comm.rank())} * src.index.files.size() / comm.size());
    }
    result->bytes_shared = shared.bytes_shared;
  }
  if (!prepared.ok()) return prepared.status();
  *written = prepared->m.sources.tensor_keys;
  return Execute(*prepared, src, comm.rank(), fs, options, result);
}

// A failed load says which of this rank's targets it may have changed.
Status NameTouchedTargets(const Status& s, const std::vector<std::string>& written) {
  if (s.ok() || written.empty()) return s;
  return Status(s.code(), s.message() + "; this rank's targets may be partly overwritten: " +
                              ListKeys(written))
      .WithDetail(s.detail());
}

}  // namespace

Status LoadFromSource(const LoadRequest& request, const CheckpointSource& src,
                      std::optional<int> blobs_of_rank, FileSystem& fs,
                      const LoadOptions& options, LoadResult* result) {
  if (src.chunks_pending) {
    SS_ASSIGN_OR_RETURN(CheckpointSource filled, ReadChunksFor(fs, src, request));
    return LoadFromSource(request, filled, blobs_of_rank, fs, options, result);
  }
  SS_ASSIGN_OR_RETURN(Prepared p, Prepare(request, src, options, result));
  return Execute(p, src, blobs_of_rank, fs, options, result);
}

namespace {

// OpenSourceCollective with rank 0's file system (or why it has none).
Result<CheckpointSource> OpenOnRankZero(const Result<FileSystem*>& fs, const std::string& path,
                                        Comm& comm) {
  // Rank 0 opens and validates; the others parse the index bytes it read.
  Result<CheckpointSource> local_src = CheckpointSource();
  Result<std::string> opened = std::string();
  if (comm.rank() == 0) {
    std::string text;
    local_src = fs.ok() ? OpenSource(**fs, path, comm.size() > 1 ? &text : nullptr,
                                     /*whole=*/false)
                        : Result<CheckpointSource>(fs.status());
    opened = !local_src.ok()     ? Result<std::string>(local_src.status())
             : comm.size() > 1 ? Result<std::string>(EncodeSource(*local_src, text))
                               : Result<std::string>(std::string());
  }
  SS_ASSIGN_OR_RETURN(std::string msg, BroadcastOrFail(comm, 0, opened));
  if (comm.rank() != 0) local_src = DecodeSource(msg);
  return local_src;
}

}  // namespace

Result<CheckpointSource> OpenSourceCollective(FileSystem& fs, const std::string& path,
                                              Comm& comm) {
  return OpenOnRankZero(&fs, path, comm);
}

Result<CheckpointSource> OpenSourceCollective(const std::string& path, Comm& comm) {
  // Only rank 0 reads here; a rank that cannot reach the store fails later,
  // in LoadOpenedSource's agreement.
  return OpenOnRankZero(comm.rank() == 0 ? FileSystemFor(path) : Result<FileSystem*>(nullptr),
                        path, comm);
}

Result<LoadResult> LoadOpenedSource(const LoadRequest& request, const CheckpointSource& src,
                                    Comm& comm, const LoadOptions& options) {
  const auto start = std::chrono::steady_clock::now();
  Result<FileSystem*> fs = FileSystemFor(src.path, options.fs);
  LoadResult result;
  result.path = src.path;
  result.tag = src.index.tag;
  result.values = src.index.values;
  result.metadata = src.index.metadata;
  result.layout = src.index.layout;
  result.saved_world_size = src.index.world_size;
  std::vector<std::string> written;
  Status local = fs.status();
  if (local.ok()) local = LoadLocal(request, src, comm, **fs, options, &result, &written);
  if (local.code() == StatusCode::kNotFound && src.native && (*fs)->IsObjectStore() &&
      !IsCommitted(**fs, src.path)) {
    // No read lease on an object store: retention or prune got there first.
    local = NotFoundError("checkpoint " + src.path +
                          " was removed (by retention or prune) while it was being loaded: " +
                          local.message());
  }
  SS_RETURN_IF_ERROR(
      NameTouchedTargets(AgreeOnStatus(comm, local).WithContext("loading " + src.path), written));
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return result;
}

Result<LoadResult> Load(const LoadRequest& request, const std::string& path, Comm& comm,
                        const LoadOptions& options) {
  const auto start = std::chrono::steady_clock::now();
  Result<CheckpointSource> opened = options.fs ? OpenSourceCollective(*options.fs, path, comm)
                                                : OpenSourceCollective(path, comm);
  SS_ASSIGN_OR_RETURN(CheckpointSource src, std::move(opened));
  SS_ASSIGN_OR_RETURN(LoadResult result, LoadOpenedSource(request, src, comm, options));
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return result;
}

}  // namespace shardsafe
