// ExportHf: plan, stream every shard into a temporary directory next to
// OUT, verify what the streaming could not, write the index and saved
// files, then publish the directory with one rename.
//
// Steps and what a crash between them leaves behind:
//  1. Plan (no I/O beyond reading the source's index).
//  2. Create PARENT/.tmp-export-BASE.NONCE (after removing leftovers of
//     earlier exports to the same OUT).
//  3. Write the shards, io_threads at a time, each fdatasync'ed.
//  4. Verify the source chunks the batches did not verify whole.
//  5. Write the index (sharded exports) and the saved files, fdatasync'ed;
//     fsync the temporary directory.
//  6. Rename it to OUT (or swap it with an existing OUT under overwrite, and
//     remove the old one); fsync PARENT.
// A crash before 6 leaves only the hidden temporary directory (removed by
// the next export to the same OUT); OUT is untouched. An error removes it.
#include <chrono>
#include <cstring>
#include <random>
#include <set>

#include "base/thread_pool.h"
#include "engine/checkpoint_dir.h"
#include "engine/load_internal.h"
#include "engine/source.h"
#include "format/safetensors.h"
#include "hf/export_plan.h"
#include "hf/source_reader.h"
#include "shardsafe/hf.h"
#include "storage/aligned_buffer.h"

namespace shardsafe {
namespace {

constexpr std::string_view kExportTmpPrefix = ".tmp-export-";
constexpr uint64_t kMaxCopiedFileBytes = uint64_t{1} << 30;

const std::map<std::string, std::string> kHfMetadata = {{"format", "pt"}};

std::string Nonce() {
  std::random_device rd;
  char buf[17];
  std::snprintf(buf, sizeof buf, "%08x%08x", rd(), rd());
  return buf;
}

struct Job {
  const ExportHfOptions& options;
  const CheckpointSource& src;
  const ExportPlan& plan;
  FileSystem& fs;
  SourceReader& reader;
  std::string dir;  // the temporary directory
  std::atomic<uint64_t> written{0};
};

// The pieces of one batch and where they land in its buffer.
struct Batch {
  std::vector<SourcePiece> pieces;
  uint64_t used = 0;
};

Status WriteBytes(FileSystem& fs, const std::string& path, std::string_view data) {
  SS_ASSIGN_OR_RETURN(auto file, fs.NewWritableFile(path, WriteOptions{}));
  SS_RETURN_IF_ERROR(file->Append(data.data(), data.size()));
  SS_RETURN_IF_ERROR(file->Sync());
  return file->Close();
}

Status Flush(Job& job, Batch* batch, const char* buf, WritableFile& out) {
  if (batch->used == 0) return Status();
  SS_RETURN_IF_ERROR(job.reader.Read(batch->pieces, job.options.batch_bytes));
  SS_RETURN_IF_ERROR(out.Append(buf, batch->used));
  job.written += batch->used;
  batch->pieces.clear();
  batch->used = 0;
  return Status();
}

// Streams one shard: its header, then each entry's bytes in batches of at
// most batch_bytes (an entry is cut at element boundaries across batches;
// sub-byte dtypes are not cut and may take a batch of their own size).
Status WriteShard(Job& job, const ExportShard& shard) {
  std::vector<EntrySpec> specs;
  for (uint32_t e : shard.entries) {
    const ExportEntry& entry = job.plan.entries[e];
    specs.push_back({entry.name, entry.dtype, entry.shape, entry.bytes});
  }
  SS_ASSIGN_OR_RETURN(SafetensorsLayout layout, BuildSafetensorsHeader(specs, kHfMetadata));
  const std::string path = JoinPath(job.dir, shard.file);
  WriteOptions wo;
  wo.direct = job.options.direct_io;
  wo.size_hint = layout.file_size;
  wo.buffer_bytes = job.options.io_buffer_bytes;
  wo.queue_depth = std::max(job.options.io_depth, 1);
  SS_ASSIGN_OR_RETURN(auto out, job.fs.NewWritableFile(path, wo));
  SS_RETURN_IF_ERROR(out->Append(layout.header.data(), layout.header.size()));

  const uint64_t cap = std::max<uint64_t>(job.options.batch_bytes, 1 << 20);
  // Pre-faulted and recycled across shards (fresh pages cost a fault each).
  AlignedBuffer buf = AcquireAlignedBuffer(std::min(cap, std::max<uint64_t>(shard.bytes, 1)));
  Batch batch;
  for (uint32_t i : layout.order) {
    const ExportEntry& entry = job.plan.entries[shard.entries[i]];
    const std::string* key = &job.src.index.tensors.find(entry.key)->first;
    const uint64_t n = *NumElements(entry.shape);
    const bool whole_only = IsSubByte(entry.dtype) || IsSubByte(entry.src_dtype);
    const uint64_t esize = whole_only ? 1 : DTypeBits(entry.dtype) / 8;
    for (uint64_t done = 0; done < n;) {
      uint64_t room = (cap - batch.used) / esize;
      if (whole_only) room = cap - batch.used >= entry.bytes ? n : 0;
      if (room == 0 && batch.used > 0) {
        SS_RETURN_IF_ERROR(Flush(job, &batch, buf.data(), *out));
        continue;
      }
      const uint64_t take = whole_only ? n : std::min(n - done, room);
      const uint64_t bytes = whole_only ? entry.bytes : take * esize;
      if (buf.capacity() < batch.used + bytes) {  // a sub-byte entry larger than a batch
        AlignedBuffer bigger = AcquireAlignedBuffer(batch.used + bytes);
        std::memcpy(bigger.data(), buf.data(), batch.used);
        for (SourcePiece& p : batch.pieces) {
          p.dst = bigger.data() + (static_cast<char*>(p.dst) - buf.data());
        }
        buf = std::move(bigger);
      }
      Slice slice{entry.box, std::nullopt};
      if (take < n) slice.flat = FlatRange{done, done + take};
      batch.pieces.push_back({key, std::move(slice), buf.data() + batch.used, entry.dtype});
      batch.used += bytes;
      done += take;
    }
  }
  SS_RETURN_IF_ERROR(Flush(job, &batch, buf.data(), *out));
  SS_RETURN_IF_ERROR(out->Sync());
  SS_RETURN_IF_ERROR(out->Close());
  return Status();
}

Status WriteShards(Job& job) {
  const auto& shards = job.plan.shards;
  ThreadPool pool(std::min<size_t>(std::max(job.options.io_threads, 1), shards.size()));
  TaskGroup group(&pool);
  for (const ExportShard& shard : shards) {
    group.Add([&job, &shard] {
      return WriteShard(job, shard).WithContext("writing " + shard.file);
    });
  }
  auto report = [&job] {
    if (job.options.progress) {
      job.options.progress({"write", job.written.load(), job.plan.total_bytes});
    }
  };
  while (!group.WaitFor(std::chrono::milliseconds(250))) report();
  SS_RETURN_IF_ERROR(group.Wait());
  report();
  return Status();
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
                        ReadFileToString(fs, JoinPath(src.path, e.name), kMaxCopiedFileBytes));
  }
  return files;
}

Status RemoveStaleExports(FileSystem& fs, const std::string& parent, const std::string& base) {
  SS_ASSIGN_OR_RETURN(auto entries, fs.ListDir(parent));
  const std::string prefix = std::string(kExportTmpPrefix) + base + ".";
  for (const DirEntry& e : entries) {
    if (e.is_dir && e.name.starts_with(prefix)) {
      SS_RETURN_IF_ERROR(fs.RemoveAll(JoinPath(parent, e.name)));
    }
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

// Steps 3-5 into `tmp`.
Status WriteAll(Job& job, const std::map<std::string, std::string>& files, ExportHfStats* stats) {
  SS_RETURN_IF_ERROR(WriteShards(job));
  std::set<std::string> keys;
  for (const ExportEntry& e : job.plan.entries) keys.insert(e.key);
  if (job.options.progress) job.options.progress({"verify", 0, 0});
  SS_RETURN_IF_ERROR(job.reader.VerifyRest(keys, job.options.io_threads));
  if (!job.plan.index_file.empty()) {
    const std::string index = JoinPath(job.dir, job.plan.index_file);
    SS_RETURN_IF_ERROR(WriteBytes(job.fs, index, job.plan.index_json));
  }
  for (const auto& [name, data] : files) {
    SS_RETURN_IF_ERROR(WriteBytes(job.fs, JoinPath(job.dir, name), data));
    stats->copied.push_back(name);
  }
  return Status();
}

}  // namespace

Result<ExportHfStats> ExportHf(const std::string& source, const std::string& out,
                               const ExportHfOptions& options) {
  const auto start = std::chrono::steady_clock::now();
  FileSystem& fs = options.fs ? *options.fs : *DefaultFileSystem();
  SS_RETURN_IF_ERROR(ValidateSavedFileName(options.weights_name + ".safetensors")
                         .WithContext("weights name"));
  if (options.progress) options.progress({"plan", 0, 0});
  SS_ASSIGN_OR_RETURN(CheckpointSource src, OpenSource(fs, source));
  SS_ASSIGN_OR_RETURN(ExportPlan plan, PlanExport(src.index.tensors, options));
  ExportHfStats stats;
  stats.source = src.path;
  SS_ASSIGN_OR_RETURN(auto files, SavedFiles(fs, src, plan, &stats.warnings));

  const bool exists = fs.Stat(out).ok();
  if (exists && !options.overwrite) return AlreadyExistsError(out + " already exists");
  const std::string parent = ParentDir(out), base = BaseName(out);
  if (base.empty() || base == "." || base == "..") {
    return InvalidArgumentError("bad output directory \"" + out + "\"");
  }
  SS_RETURN_IF_ERROR(CreateDirs(fs, parent));
  RemoveStaleExports(fs, parent, base).IgnoreError();  // harmless if it fails
  const std::string tmp = JoinPath(parent, std::string(kExportTmpPrefix) + base + "." + Nonce());
  SS_RETURN_IF_ERROR(fs.CreateDir(tmp));

  SourceReader reader(src, fs, options.verify_checksums);
  Job job{options, src, plan, fs, reader, tmp};
  Status s = WriteAll(job, files, &stats);
  if (s.ok()) s = Publish(fs, tmp, out, exists, &stats.warnings);
  if (!s.ok()) {
    fs.RemoveAll(tmp).IgnoreError();
    return s.WithContext("exporting " + src.path + " to " + out);
  }
  for (const ExportShard& shard : plan.shards) stats.files.push_back(shard.file);
  if (!plan.index_file.empty()) stats.files.push_back(plan.index_file);
  stats.tensors = plan.entries.size();
  stats.bytes = plan.total_bytes;
  stats.total_parameters = plan.total_parameters;
  stats.bytes_read = reader.bytes_read();
  stats.chunks_verified = reader.chunks_verified();
  stats.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return stats;
}

Status ValidateSavedFileName(std::string_view name) {
  if (name.empty() || name.size() > 255 || name == "." || name == ".." ||
      name.find_first_of(std::string_view("/\\\0", 3)) != std::string_view::npos) {
    return InvalidArgumentError("\"" + std::string(name) +
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
