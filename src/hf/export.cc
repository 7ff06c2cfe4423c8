// ExportHf: plan, stream every shard into a temporary directory next to
// OUT, verify what the streaming could not, write the index and saved
// files, then publish the directory with one rename. A collective export
// runs the same steps split over processes: ExportHfStaging::Create is
// steps 1-2, ExportHfPart steps 3-4 for one process's files, and
// ExportHfStaging::Finish steps 5-6 after checking every file is there.
//
// Steps and what a crash between them leaves behind:
//  1. Plan (no I/O beyond reading the source's index).
//  2. Create PARENT/.tmp-export-BASE.NONCE, locked while the export runs
//     (after removing unlocked leftovers of earlier exports to the same OUT).
//  3. Write the shards, io_threads at a time, each fdatasync'ed.
//  4. Verify the source chunks the batches did not verify whole.
//  5. Check each shard's size and header against the plan; write the index
//     (sharded exports) and the saved files, fdatasync'ed; fsync the
//     temporary directory.
//  6. Rename it to OUT (or swap it with an existing OUT under overwrite, and
//     remove the old one); fsync PARENT.
// A crash before 6 leaves only the hidden temporary directory (removed by
// the next export to the same OUT); OUT is untouched. An error removes it.
//
// The source and OUT may lie on different file systems (FileSystemFor: a
// checkpoint in a bucket exported to a local directory, or the reverse).
// OUT in an object store, which has no rename, is written in place: step 2
// creates nothing, the files go straight to OUT, the index last (what
// makes a sharded export loadable), and step 6 is empty; an error removes
// what was written. An existing OUT there is not replaced (overwrite is
// refused): the old and the new files would mix while it runs.
#include <chrono>
#include <cstring>
#include <set>

#include "base/thread_pool.h"
#include "format/safetensors.h"
#include "hf/export_plan.h"
#include "hf/piece_batch.h"
#include "shardsafe/hf.h"
#include "shardsafe/source.h"
#include "storage/aligned_buffer.h"

namespace shardsafe {
namespace {

constexpr std::string_view kExportTmpPrefix = ".tmp-export-";
constexpr uint64_t kMaxCopiedFileBytes = uint64_t{1} << 30;

const std::map<std::string, std::string> kHfMetadata = {{"format", "pt"}};

struct Job {
  const ExportHfOptions& options;
  const CheckpointSource& src;  // its tensors packed
  const ExportPlan& plan;
  FileSystem& fs;
  SourceReader& reader;
  std::string dir;  // the temporary directory
  std::atomic<uint64_t> written{0};

  const PackedTensors& tensors() const { return *src.packed; }
};

Status WriteBytes(FileSystem& fs, const std::string& path, std::string_view data) {
  SS_ASSIGN_OR_RETURN(auto file, fs.NewWritableFile(path, WriteOptions{}));
  SS_RETURN_IF_ERROR(file->Append(data.data(), data.size()));
  SS_RETURN_IF_ERROR(file->Sync());
  return file->Close();
}

// Streams one shard file in aligned windows of its bytes: the engine reads
// each window's pieces of entries straight into a pre-faulted buffer, which
// is then written in place with O_DIRECT while the next window is read into
// the other buffer (two buffers per shard, no staging copy). Entries are cut
// at window boundaries on element boundaries (safetensors keeps every entry
// aligned to its element size and windows are 4 KiB multiples); a sub-byte
// entry that straddles a boundary is read whole into a side buffer once.
class ShardWriter {
 public:
  ShardWriter(Job& job, const ExportShard& shard, const SafetensorsLayout& layout,
              WritableFile& out)
      : job_(job), shard_(shard), layout_(layout), out_(out),
        window_(AlignUp(std::max<uint64_t>(job.options.batch_bytes, 1 << 20))) {}

  Status Run() {
    const uint64_t size = layout_.file_size;
    const uint64_t cap = std::min(window_, AlignUp(size));
    AlignedBuffer bufs[2] = {AcquireAlignedBuffer(cap), AcquireAlignedBuffer(cap)};
    int k = 0;
    for (uint64_t start = 0; start < size; start += window_, k ^= 1) {
      const uint64_t len = std::min(window_, size - start);
      SS_RETURN_IF_ERROR(Fill(start, len, bufs[k].data()));
      SS_RETURN_IF_ERROR(out_.WaitStable());  // the other buffer is free again
      SS_RETURN_IF_ERROR(out_.AppendStable(bufs[k].data(), len));
      const uint64_t header = layout_.header.size();
      job_.written += len - (start < header ? std::min(len, header - start) : 0);
    }
    return out_.WaitStable();
  }

 private:
  // Fills buf with file bytes [start, start + len).
  Status Fill(uint64_t start, uint64_t len, char* buf) {
    const std::string& header = layout_.header;
    if (start < header.size()) {
      std::memcpy(buf, header.data() + start, std::min<uint64_t>(len, header.size() - start));
    }
    PieceBatch pieces(job_.reader, job_.tensors(), window_);
    const uint64_t end = start + len;
    for (size_t j = next_; j < layout_.order.size(); ++j) {
      const uint32_t i = layout_.order[j];
      const ExportEntry& e = job_.plan.entries[shard_.entries[i]];
      const uint64_t off = layout_.offsets[i], e_end = off + e.bytes;
      if (off >= end) break;
      if (e_end <= end) next_ = j + 1;  // done after this window
      if (e.bytes == 0) continue;
      const uint64_t a = std::max(off, start), b = std::min(e_end, end);
      char* dst = buf + (a - start);
      if (IsSubByte(e.dtype) || IsSubByte(e.src_dtype)) {
        if (off >= start && e_end <= end) {
          SS_RETURN_IF_ERROR(pieces.Add(e.tensor, Slice{BoxOf(e), std::nullopt}, dst, e.dtype));
        } else {
          SS_RETURN_IF_ERROR(CopyStaged(i, e, a - off, b - a, dst));
        }
        continue;
      }
      const uint64_t es = DTypeBits(e.dtype) / 8;
      Slice slice{BoxOf(e), std::nullopt};
      if (a > off || b < e_end) slice.flat = FlatRange{(a - off) / es, (b - off) / es};
      SS_RETURN_IF_ERROR(pieces.Add(e.tensor, std::move(slice), dst, e.dtype));
    }
    return pieces.Flush();
  }

  // Bytes [at, at + n) of a sub-byte entry, read whole into a side buffer
  // the first time.
  Status CopyStaged(uint32_t i, const ExportEntry& e, uint64_t at, uint64_t n, char* dst) {
    if (staged_entry_ != static_cast<int64_t>(i)) {
      staged_ = AcquireAlignedBuffer(e.bytes);
      const std::string key(job_.plan.Key(e, job_.tensors()));
      SourcePiece whole{&key, Slice{BoxOf(e), std::nullopt}, staged_.data(), e.dtype};
      SS_RETURN_IF_ERROR(job_.reader.Read({&whole, 1}, window_));
      staged_entry_ = i;
    }
    std::memcpy(dst, staged_.data() + at, n);
    return Status();
  }

  Box BoxOf(const ExportEntry& e) const { return job_.plan.BoxOf(e, job_.tensors()); }

  Job& job_;
  const ExportShard& shard_;
  const SafetensorsLayout& layout_;
  WritableFile& out_;
  const uint64_t window_;
  size_t next_ = 0;  // first entry of layout_.order not yet fully written
  AlignedBuffer staged_;
  int64_t staged_entry_ = -1;
};

// The shard's header, from the plan's entries as they are (no copy of
// their names and shapes: a shard of many tensors has a large header).
Result<SafetensorsLayout> LayoutOf(const ExportPlan& plan, const ExportShard& shard,
                                   const PackedTensors& tensors) {
  return BuildSafetensorsHeader(
      shard.entries.size(),
      [&](size_t i) {
        const ExportEntry& e = plan.entries[shard.entries[i]];
        return EntryRef{plan.Name(e, tensors), e.dtype, plan.Dims(e, tensors), e.bytes};
      },
      kHfMetadata);
}

Status WriteShard(Job& job, const ExportShard& shard) {
  SS_ASSIGN_OR_RETURN(SafetensorsLayout layout, LayoutOf(job.plan, shard, job.tensors()));
  WriteOptions wo;
  wo.direct = job.options.direct_io;
  wo.size_hint = layout.file_size;
  wo.buffer_bytes = job.options.io_buffer_bytes;
  wo.queue_depth = std::max(job.options.io_depth, 1);
  SS_ASSIGN_OR_RETURN(auto out, job.fs.NewWritableFile(JoinPath(job.dir, shard.file), wo));
  SS_RETURN_IF_ERROR(ShardWriter(job, shard, layout, *out).Run());
  SS_RETURN_IF_ERROR(out->Sync());
  return out->Close();
}

using Shards = std::vector<const ExportShard*>;

// The plan's shards i with i % count == index.
Shards ShareOf(const ExportPlan& plan, int index, int count) {
  Shards share;
  for (size_t i = index; i < plan.shards.size(); i += count) share.push_back(&plan.shards[i]);
  return share;
}

// Steps 3-4 for `shards`: written io_threads at a time, then every source
// chunk of their tensors verified.
Status WriteShards(Job& job, const Shards& shards) {
  if (shards.empty()) return Status();
  uint64_t total = 0;
  std::vector<bool> sources(job.tensors().size());  // the source tensors written
  for (const ExportShard* shard : shards) {
    total += shard->bytes;
    for (uint32_t e : shard->entries) sources[job.plan.entries[e].tensor] = true;
  }
  {
    ThreadPool pool(std::min<size_t>(std::max(job.options.io_threads, 1), shards.size()));
    TaskGroup group(&pool);
    for (const ExportShard* shard : shards) {
      group.Add([&job, shard] {
        return WriteShard(job, *shard).WithContext("writing " + shard->file);
      });
    }
    auto report = [&job, total] {
      if (job.options.progress) job.options.progress({"write", job.written.load(), total});
    };
    while (!group.WaitFor(std::chrono::milliseconds(250))) report();
    SS_RETURN_IF_ERROR(group.Wait());
    report();
  }
  if (job.options.progress) job.options.progress({"verify", 0, 0});
  const PackedTensors& tensors = job.tensors();
  return job.reader.VerifyRest(
      [&](std::string_view key) {
        const std::optional<size_t> t = tensors.Find(key);
        return t && sources[*t];
      },
      job.options.io_threads);
}

// The weight files of `shards` and what they hold, into `stats`.
void CountShards(const ExportPlan& plan, const PackedTensors& tensors, const Shards& shards,
                 ExportHfStats* stats) {
  for (const ExportShard* shard : shards) {
    stats->files.push_back(shard->file);
    stats->tensors += shard->entries.size();
    stats->bytes += shard->bytes;
    for (uint32_t e : shard->entries) {
      stats->total_parameters += *NumElements(plan.ShapeOf(plan.entries[e], tensors));
    }
  }
}

bool IsCopiedExtension(std::string_view name) {
  for (std::string_view ext : {".json", ".txt", ".model", ".tiktoken", ".jinja"}) {
    if (name.ends_with(ext)) return true;
  }
  return false;
}

// The files to write next to the weights: `file/NAME` blobs of a native
// checkpoint; config and tokenizer files of a Hugging Face directory.
Result<std::map<std::string, std::string>> SavedFiles(FileSystem& fs, const CheckpointSource& src,
                                                      const ExportPlan& plan,
                                                      std::vector<std::string>* warnings) {
  std::set<std::string> reserved{plan.index_file};
  for (const ExportShard& s : plan.shards) reserved.insert(s.file);
  std::map<std::string, std::string> files;
  auto keep = [&](const std::string& name, std::string origin) {
    if (reserved.count(name) || name.ends_with(".safetensors") ||
        name.ends_with(".safetensors.index.json")) {
      warnings->push_back("not copied: " + origin +
                          " (the export writes its own weights and index)");
      return false;
    }
    return true;
  };
  if (src.native) {
    for (const auto& [blob_name, blob] : src.index.blobs) {
      if (!blob_name.starts_with(kSavedFilePrefix) || blob.per_rank) continue;
      const std::string name = blob_name.substr(kSavedFilePrefix.size());
      if (!ValidateSavedFileName(name).ok()) {
        warnings->push_back("not copied: saved file with unsafe name \"" + name + "\"");
        continue;
      }
      if (!keep(name, "saved file " + name) || blob.chunks.size() != 1) continue;
      SS_RETURN_IF_ERROR(ReadBlob(fs, src, blob_name, blob.chunks[0], &files[name]));
    }
    return files;
  }
  SS_ASSIGN_OR_RETURN(FileInfo info, fs.Stat(src.path));
  if (!info.is_dir) return files;
  SS_ASSIGN_OR_RETURN(auto entries, fs.ListDir(src.path));
  for (const DirEntry& e : entries) {
    if (e.is_dir || !IsCopiedExtension(e.name) || !keep(e.name, JoinPath(src.path, e.name))) {
      continue;
    }
    SS_ASSIGN_OR_RETURN(files[e.name],
                        ReadFileToString(fs, JoinPath(src.path, e.name), kMaxCopiedFileBytes,
                                         SourceReadOptions(src)));
  }
  return files;
}

Status RemoveStaleExports(FileSystem& fs, const std::string& parent, const std::string& base) {
  SS_ASSIGN_OR_RETURN(auto entries, fs.ListDir(parent));
  const std::string prefix = std::string(kExportTmpPrefix) + base + ".";
  for (const DirEntry& e : entries) {
    if (!e.is_dir || !e.name.starts_with(prefix)) continue;
    const std::string path = JoinPath(parent, e.name);
    auto lock = fs.TryLock(path, LockMode::kExclusive);  // an export in progress holds it
    if (!lock.ok() && lock.status().code() == StatusCode::kFailedPrecondition) continue;
    SS_RETURN_IF_ERROR(fs.RemoveAll(path));
  }
  return Status();
}

Status Publish(FileSystem& fs, const std::string& tmp, const std::string& out, bool replace,
               std::vector<std::string>* warnings) {
  SS_RETURN_IF_ERROR(fs.SyncDir(tmp));
  const std::string parent = ParentDir(out);
  if (replace) {
    SS_RETURN_IF_ERROR(fs.RenameExchange(tmp, out));
    Status s = fs.SyncDir(parent);
    if (s.ok()) s = fs.RemoveAll(tmp);  // now holds the old directory
    if (!s.ok()) warnings->push_back("after replacing " + out + ": " + s.message());
    return Status();
  }
  SS_RETURN_IF_ERROR(fs.Rename(tmp, out));
  Status s = fs.SyncDir(parent);
  if (!s.ok()) warnings->push_back("after publishing " + out + ": " + s.message());
  return Status();
}

// Whether `file` starts with `header`, read a piece at a time (a shard of
// many tensors has a header of tens of megabytes).
Result<bool> StartsWith(const RandomAccessFile& file, std::string_view header) {
  constexpr size_t kPiece = size_t{1} << 20;
  std::string piece;
  for (size_t at = 0; at < header.size(); at += kPiece) {
    piece.resize(std::min(kPiece, header.size() - at));
    SS_RETURN_IF_ERROR(file.ReadAt(at, piece.data(), piece.size()));
    if (header.substr(at, piece.size()) != piece) return false;
  }
  return true;
}

// Step 5's check: every shard in `dir` with the plan's size and header
// (another process wrote it from its own plan).
Status CheckShards(FileSystem& fs, const ExportPlan& plan, const PackedTensors& tensors,
                   const std::string& dir) {
  for (const ExportShard& shard : plan.shards) {
    SS_ASSIGN_OR_RETURN(SafetensorsLayout layout, LayoutOf(plan, shard, tensors));
    const std::string path = JoinPath(dir, shard.file);
    Result<FileInfo> info = fs.Stat(path);
    if (!info.ok() && info.status().code() == StatusCode::kNotFound) {
      return FailedPreconditionError(shard.file + " was not written: the process whose share "
                                     "it is did not write it here (a file system not shared?)");
    }
    SS_RETURN_IF_ERROR(info.status());
    bool same = info->size == layout.file_size;
    if (same) {
      SS_ASSIGN_OR_RETURN(auto file, fs.NewRandomAccessFile(path, ReadOptions{}));
      SS_ASSIGN_OR_RETURN(same, StartsWith(*file, layout.header));
    }
    if (!same) {
      return FailedPreconditionError(
          shard.file + " differs from this process's plan (" + std::to_string(info->size) +
          " bytes, planned " + std::to_string(layout.file_size) +
          "): every process must export the same source with the same options");
    }
  }
  return Status();
}

}  // namespace

struct ExportHfStaging::State {
  FileSystem* src_fs = nullptr;  // where the source lies
  FileSystem* fs = nullptr;      // where `out` lies
  CheckpointSource src;
  ExportPlan plan;
  std::map<std::string, std::string> files;  // saved files to copy
  std::string out, tmp;
  bool exists = false;  // `out` existed at Create (replaced under overwrite)
  std::unique_ptr<FileLock> lock;  // on tmp, where the file system has locks
  std::vector<std::string> warnings;
  bool finished = false;   // Finish was called
  bool published = false;  // tmp is `out` now
};

ExportHfStaging::ExportHfStaging(std::unique_ptr<State> state) : state_(std::move(state)) {}

namespace {

// What a failed export leaves of its output: the temporary directory, or
// on an object store the files it wrote into `out`.
void RemoveUnpublished(FileSystem& fs, const std::string& tmp, const ExportPlan& plan,
                       const std::map<std::string, std::string>& files) {
  if (!fs.IsObjectStore()) {
    fs.RemoveAll(tmp).IgnoreError();
    return;
  }
  for (const ExportShard& shard : plan.shards) {
    fs.RemoveFile(JoinPath(tmp, shard.file)).IgnoreError();
  }
  if (!plan.index_file.empty()) fs.RemoveFile(JoinPath(tmp, plan.index_file)).IgnoreError();
  for (const auto& [name, bytes] : files) fs.RemoveFile(JoinPath(tmp, name)).IgnoreError();
}

}  // namespace

ExportHfStaging::~ExportHfStaging() {
  const State& s = *state_;
  if (!s.published && !s.tmp.empty()) RemoveUnpublished(*s.fs, s.tmp, s.plan, s.files);
}

const std::string& ExportHfStaging::source() const { return state_->src.path; }
const std::string& ExportHfStaging::dir() const { return state_->tmp; }
size_t ExportHfStaging::num_files() const { return state_->plan.shards.size(); }

Result<std::unique_ptr<ExportHfStaging>> ExportHfStaging::Create(const std::string& source,
                                                                 const std::string& out,
                                                                 const ExportHfOptions& options) {
  auto s = std::make_unique<State>();
  SS_ASSIGN_OR_RETURN(s->src_fs, FileSystemFor(source, options.fs));
  SS_ASSIGN_OR_RETURN(s->fs, FileSystemFor(out, options.fs));
  FileSystem& fs = *s->fs;
  SS_RETURN_IF_ERROR(ValidateSavedFileName(options.weights_name + ".safetensors")
                         .WithContext("weights name"));
  if (options.progress) options.progress({"plan", 0, 0});
  SS_ASSIGN_OR_RETURN(s->src, OpenSourcePacked(*s->src_fs, source));
  SS_ASSIGN_OR_RETURN(s->plan, PlanExport(*s->src.packed, options));
  SS_ASSIGN_OR_RETURN(s->files, SavedFiles(*s->src_fs, s->src, s->plan, &s->warnings));

  s->exists = fs.Stat(out).ok();
  if (s->exists && !options.overwrite) return AlreadyExistsError(out + " already exists");
  const std::string parent = ParentDir(out), base = BaseName(out);
  if (base.empty() || base == "." || base == "..") {
    return InvalidArgumentError("bad output directory \"" + out + "\"");
  }
  s->out = out;
  if (fs.IsObjectStore()) {  // written in place (above)
    if (s->exists) {
      return FailedPreconditionError(out + " exists: an export into object storage does not "
                                           "replace one (remove it first)");
    }
    s->tmp = out;
    return std::unique_ptr<ExportHfStaging>(new ExportHfStaging(std::move(s)));
  }
  SS_RETURN_IF_ERROR(CreateDirs(fs, parent));
  RemoveStaleExports(fs, parent, base).IgnoreError();  // harmless if it fails
  s->tmp = JoinPath(parent, std::string(kExportTmpPrefix) + base + "." + RandomSuffix());
  SS_RETURN_IF_ERROR(fs.CreateDir(s->tmp));
  auto lock = fs.TryLock(s->tmp, LockMode::kExclusive);  // held until published or removed
  if (lock.ok()) s->lock = std::move(*lock);
  return std::unique_ptr<ExportHfStaging>(new ExportHfStaging(std::move(s)));
}

Result<ExportHfStats> ExportHfStaging::Finish() {
  State& s = *state_;
  if (s.finished) return FailedPreconditionError("the export to " + s.out + " was finished");
  s.finished = true;
  FileSystem& fs = *s.fs;
  ExportHfStats stats;
  Status st = CheckShards(fs, s.plan, *s.src.packed, s.tmp);
  for (auto it = s.files.begin(); st.ok() && it != s.files.end(); ++it) {
    st = WriteBytes(fs, JoinPath(s.tmp, it->first), it->second);
    stats.copied.push_back(it->first);
  }
  if (st.ok() && !s.plan.index_file.empty()) {  // last: in place, it makes OUT loadable
    st = WriteBytes(fs, JoinPath(s.tmp, s.plan.index_file), IndexJson(s.plan, *s.src.packed));
  }
  if (st.ok() && !fs.IsObjectStore()) st = Publish(fs, s.tmp, s.out, s.exists, &s.warnings);
  if (!st.ok()) {
    RemoveUnpublished(fs, s.tmp, s.plan, s.files);
    s.tmp.clear();
    return st.WithContext("exporting " + s.src.path + " to " + s.out);
  }
  s.published = true;
  stats.source = s.src.path;
  Shards all;
  for (const ExportShard& shard : s.plan.shards) all.push_back(&shard);
  CountShards(s.plan, *s.src.packed, all, &stats);
  if (!s.plan.index_file.empty()) stats.files.push_back(s.plan.index_file);
  stats.warnings = s.warnings;
  return stats;
}

Result<ExportHfStats> ExportHf(const std::string& source, const std::string& out,
                               const ExportHfOptions& options) {
  const auto start = std::chrono::steady_clock::now();
  SS_ASSIGN_OR_RETURN(auto staging, ExportHfStaging::Create(source, out, options));
  ExportHfStaging::State& s = *staging->state_;
  SourceReader reader(s.src, *s.src_fs, options.verify_checksums);
  Job job{options, s.src, s.plan, *s.fs, reader, s.tmp};
  Status st = WriteShards(job, ShareOf(s.plan, 0, 1));
  if (!st.ok()) return st.WithContext("exporting " + s.src.path + " to " + out);
  SS_ASSIGN_OR_RETURN(ExportHfStats stats, staging->Finish());
  stats.bytes_read = reader.bytes_read();
  stats.chunks_verified = reader.chunks_verified();
  stats.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return stats;
}

Result<ExportHfStats> ExportHfPart(const std::string& source, const std::string& dir,
                                   const ExportHfOptions& options, int index, int count) {
  const auto start = std::chrono::steady_clock::now();
  if (count < 1 || index < 0 || index >= count) {
    return InvalidArgumentError("export part " + std::to_string(index) + " of " +
                                std::to_string(count) + ": not 0 <= part < count");
  }
  SS_ASSIGN_OR_RETURN(FileSystem * src_fs, FileSystemFor(source, options.fs));
  SS_ASSIGN_OR_RETURN(FileSystem * out_fs, FileSystemFor(dir, options.fs));
  FileSystem& fs = *out_fs;
  SS_RETURN_IF_ERROR(ValidateSavedFileName(options.weights_name + ".safetensors")
                         .WithContext("weights name"));
  if (options.progress) options.progress({"plan", 0, 0});
  SS_ASSIGN_OR_RETURN(CheckpointSource src, OpenSourcePacked(*src_fs, source));
  SS_ASSIGN_OR_RETURN(ExportPlan plan, PlanExport(*src.packed, options));
  Result<FileInfo> info = fs.Stat(dir);
  // An object store's OUT exists once something is in it (ExportHfStaging).
  if (!fs.IsObjectStore() && (!info.ok() || !info->is_dir)) {
    return FailedPreconditionError(
        "the export's temporary directory " + dir + " is not a directory on this process's "
        "file system: the output must be on a file system every process shares");
  }
  SourceReader reader(src, *src_fs, options.verify_checksums);
  Job job{options, src, plan, fs, reader, dir};
  const Shards share = ShareOf(plan, index, count);
  SS_RETURN_IF_ERROR(WriteShards(job, share).WithContext(
      "exporting part " + std::to_string(index) + " of " + std::to_string(count) + " of " +
      src.path + " into " + dir));
  ExportHfStats stats;
  stats.source = src.path;
  CountShards(plan, *src.packed, share, &stats);
  stats.bytes_read = reader.bytes_read();
  stats.chunks_verified = reader.chunks_verified();
  stats.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return stats;
}

Status ValidateSavedFileName(std::string_view name) {
  if (name.empty() || name.size() > 255 || name == "." || name == ".." ||
      name.find_first_of(std::string_view("/\\\0", 3)) != std::string_view::npos) {
    return InvalidArgumentError(std::string("\"").append(name) +
                                "\" is not a plain file name (1-255 bytes, no '/', '\\' or NUL, "
                                "not '.' or '..')");
  }
  return Status();
}

Result<uint64_t> ParseByteSize(std::string_view text) {
  const std::string s(text);
  size_t pos = 0;
  double value = 0;
  try {
    value = std::stod(s, &pos);
  } catch (...) {
    pos = 0;
  }
  std::string unit = s.substr(pos);
  while (!unit.empty() && unit.front() == ' ') unit.erase(0, 1);
  for (char& c : unit) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  static const std::map<std::string, double> kUnits = {
      {"", 1},      {"B", 1},          {"KB", 1e3},       {"MB", 1e6},           {"GB", 1e9},
      {"TB", 1e12}, {"KIB", 1024.0},   {"MIB", 1048576.0}, {"GIB", 1073741824.0},
      {"TIB", 1099511627776.0}};
  auto it = kUnits.find(unit);
  if (pos == 0 || it == kUnits.end() || !(value > 0) || value * it->second >= 1.8e19) {
    return InvalidArgumentError("bad size \"" + s + "\" (e.g. 5GB, 500MB, 2GiB, 4096)");
  }
  return static_cast<uint64_t>(value * it->second);
}

}  // namespace shardsafe
