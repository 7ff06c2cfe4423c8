#include "engine/tier/persister.h"

#include <algorithm>

#include "engine/catalog/checkpoint_dir.h"
#include "engine/save/commit.h"
#include "shardsafe/index.h"
#include "shardsafe/tools.h"

namespace shardsafe {
namespace {

constexpr size_t kCopyBlock = size_t{16} << 20;

// Copies one file, synced.
Status CopyFile(FileSystem& fs, const std::string& from, const std::string& to,
                const std::string& within) {
  ReadOptions read;
  read.within = within;
  SS_ASSIGN_OR_RETURN(auto in, fs.NewRandomAccessFile(from, read));
  WriteOptions write;
  write.size_hint = in->size();
  SS_ASSIGN_OR_RETURN(auto out, fs.NewWritableFile(to, write));
  std::string block(std::min<uint64_t>(kCopyBlock, in->size()), '\0');
  for (uint64_t at = 0; at < in->size();) {
    const size_t n = std::min<uint64_t>(block.size(), in->size() - at);
    SS_RETURN_IF_ERROR(in->ReadAt(at, block.data(), n));
    SS_RETURN_IF_ERROR(out->Append(block.data(), n));
    at += n;
  }
  SS_RETURN_IF_ERROR(out->Sync());
  return out->Close();
}

// Copies every file of `from` but its commit record into `to`, folders
// included.
Status CopyFiles(FileSystem& fs, const std::string& from, const std::string& to,
                 const std::string& within) {
  SS_ASSIGN_OR_RETURN(std::vector<DirEntry> entries, fs.ListDir(from));
  for (const DirEntry& e : entries) {
    const std::string src = JoinPath(from, e.name), dst = JoinPath(to, e.name);
    if (e.is_dir) {
      SS_RETURN_IF_ERROR(fs.CreateDir(dst));
      SS_RETURN_IF_ERROR(CopyFiles(fs, src, dst, within));
      SS_RETURN_IF_ERROR(fs.SyncDir(dst));
    } else if (from != within || e.name != kCommitFileName) {
      SS_RETURN_IF_ERROR(CopyFile(fs, src, dst, within).WithContext("copying " + src));
    }
  }
  return Status();
}

// The bytes of the files under `dir`.
Result<uint64_t> DirBytes(FileSystem& fs, const std::string& dir) {
  SS_ASSIGN_OR_RETURN(std::vector<DirEntry> entries, fs.ListDir(dir));
  uint64_t total = 0;
  for (const DirEntry& e : entries) {
    const std::string path = JoinPath(dir, e.name);
    if (e.is_dir) {
      SS_ASSIGN_OR_RETURN(uint64_t below, DirBytes(fs, path));
      total += below;
    } else {
      SS_ASSIGN_OR_RETURN(FileInfo info, fs.Stat(path));
      total += info.size;
    }
  }
  return total;
}

// Locks `dir`'s index shared, as a load pins what it reads (null where the
// file system has no locks).
Result<std::unique_ptr<FileLock>> Pin(FileSystem& fs, const std::string& dir) {
  auto lock = fs.TryLock(JoinPath(dir, kIndexFileName), LockMode::kShared);
  if (lock.ok() || lock.status().code() != StatusCode::kUnimplemented) return lock;
  return std::unique_ptr<FileLock>();
}

// Every chunk of the copy checked against its checksum before it is
// committed: a copy of a corrupt memory checkpoint (or a copy gone wrong)
// never reaches the root.
Status VerifyCopy(FileSystem& fs, const std::string& dir) {
  VerifyReport report = VerifyCheckpoint(dir, &fs);
  if (report.ok()) return Status();
  return DataLossError(report.faults.front() +
                       (report.faults.size() > 1
                            ? " (and " + std::to_string(report.faults.size() - 1) + " more faults)"
                            : ""));
}

}  // namespace

Status CopyCheckpoint(FileSystem* given, const std::string& src, const std::string& root,
                      const std::string& tag, const CommitOptions& commit,
                      std::vector<std::string>* warnings) {
  SS_ASSIGN_OR_RETURN(FileSystem * on, FileSystemFor(root, given));
  FileSystem& fs = *on;
  if (fs.IsObjectStore()) {
    return UnimplementedError("copying checkpoint " + src + " to " + root +
                              ": an object store root is not supported");
  }
  SS_ASSIGN_OR_RETURN(auto pin, Pin(fs, src));
  SS_ASSIGN_OR_RETURN(uint64_t bytes, DirBytes(fs, src));
  SS_RETURN_IF_ERROR(CheckFreeSpace(fs, root, bytes).WithContext("persisting " + src));
  SS_ASSIGN_OR_RETURN(std::string text,
                      ReadFileToString(fs, JoinPath(src, kIndexFileName), kMaxIndexBytes));
  SS_ASSIGN_OR_RETURN(TmpDir tmp, PrepareSave(fs, root, tag, commit.overwrite));
  CheckpointIndex index;
  index.tag = tag;  // what CommitSave publishes under; the text's own tag is the same
  Status s = CopyFiles(fs, src, tmp.dirs.tmp, src);
  if (s.ok()) s = VerifyCopy(fs, tmp.dirs.tmp);
  if (s.ok()) s = CommitSave(fs, tmp.dirs, root, index, CommitIndex{std::move(text), nullptr},
                             commit, warnings);
  if (!s.ok()) AbandonSave(fs, tmp.dirs);
  return s.WithContext("persisting " + src + " to " + root);
}

Persister::~Persister() { Wait().IgnoreError(); }

void Persister::Start(FileSystem* fs, std::string src, std::string root, std::string tag,
                      CommitOptions commit, std::shared_ptr<AsyncSaveHandle> after) {
  if (thread_.joinable()) thread_.join();
  thread_ = std::thread([this, fs, src = std::move(src), root = std::move(root),
                         tag = std::move(tag), commit, after = std::move(after)] {
    if (after && !after->Wait().ok()) return;
    std::vector<std::string> warnings;
    Status s = CopyCheckpoint(fs, src, root, tag, commit, &warnings);
    std::lock_guard<std::mutex> lock(mu_);
    if (failure_.ok()) failure_ = s;
  });
}

Status Persister::Wait() {
  if (thread_.joinable()) thread_.join();
  std::lock_guard<std::mutex> lock(mu_);
  return std::exchange(failure_, Status());
}

}  // namespace shardsafe
