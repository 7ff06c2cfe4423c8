// FaultInjectingFileSystem: a FileSystem wrapper for tests that counts every
// mutating operation and can make chosen ones fail.
//
// Counted operations, by kind: NewWritableFile, CreateFileExclusive and
// ReplaceFileIfVersion (kCreate), Append, Sync and Close on the files it
// returns (kAppend, kSync, kClose), Rename and RenameExchange (kRename),
// SyncDir, CreateDir, RemoveFile and RemoveAll (kRemove). Reads
// (NewRandomAccessFile, Stat, ListDir, ReadFileVersioned) pass through
// uncounted and never fail.
//
// Two ways to arm it:
// - FailNth(kind, n, error): the n-th operation of `kind` (0-based, counted
//   from the call) fails once with `error`, as a transient fault.
// - FailAfter(n, error): the first n operations of any kind (from the call)
//   succeed and every later one fails: the process "dies" between operation
//   n - 1 and n. Iterating n over 0..total_count() of an unarmed run visits
//   every crash point of a protocol. This simulates process death, not power
//   loss: bytes written before the "crash" stay in the base file system even
//   if they were never synced.
// A failed operation does not reach the base file system (a failed Append
// writes nothing).
//
// Thread-safe: the wrapper and its files may be used from several threads
// (each file by one thread at a time, as for any FileSystem).
#pragma once

#include <array>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string_view>

#include "shardsafe/filesystem.h"

namespace shardsafe {

enum class OpKind { kCreate, kAppend, kSync, kClose, kRename, kSyncDir, kCreateDir, kRemove };
inline constexpr int kNumOpKinds = 8;

std::string_view OpKindName(OpKind kind);

class FaultInjectingFileSystem final : public FileSystem {
 public:
  // `base` is not owned and must outlive this object and its files.
  explicit FaultInjectingFileSystem(FileSystem* base) : base_(base) {}

  // Operations of `kind` (or of all kinds) since construction or Reset().
  int64_t count(OpKind kind) const;
  int64_t total_count() const;
  // Operations that were failed on purpose.
  int64_t injected_failures() const;

  // Arms a one-off failure; replaces an earlier FailNth for the same kind.
  void FailNth(OpKind kind, int64_t n, Status error);
  // Arms a "crash" after n more operations; replaces an earlier FailAfter.
  void FailAfter(int64_t n, Status error);
  // Disarms everything; counters are kept.
  void ClearFaults();
  // Disarms everything and zeroes the counters.
  void Reset();
  // What FreeBytes reports from now on (nullopt: the base's answer).
  void SetFreeBytes(std::optional<uint64_t> bytes) {
    std::lock_guard<std::mutex> lock(mu_);
    free_bytes_ = bytes;
  }

  // Called by the wrapper and its files before each counted operation:
  // counts it and returns the injected error, or OK to go ahead.
  Status BeforeOp(OpKind kind);

  Result<std::unique_ptr<WritableFile>> NewWritableFile(const std::string& path,
                                                        const WriteOptions& options) override;
  Result<std::unique_ptr<RandomAccessFile>> NewRandomAccessFile(
      const std::string& path, const ReadOptions& options) override {
    return base_->NewRandomAccessFile(path, options);
  }
  Result<FileInfo> Stat(const std::string& path) override { return base_->Stat(path); }
  Result<std::vector<DirEntry>> ListDir(const std::string& path) override {
    return base_->ListDir(path);
  }
  Status CreateDir(const std::string& path) override;
  Status RemoveFile(const std::string& path) override;
  Status RemoveAll(const std::string& path) override;
  Status Rename(const std::string& from, const std::string& to) override;
  Status RenameExchange(const std::string& a, const std::string& b) override;
  Status SyncDir(const std::string& path) override;
  Result<std::unique_ptr<FileLock>> TryLock(const std::string& path, LockMode mode) override {
    return base_->TryLock(path, mode);
  }
  bool IsObjectStore() const override { return base_->IsObjectStore(); }
  Result<uint64_t> FreeBytes(const std::string& dir) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (free_bytes_) return *free_bytes_;
    }
    return base_->FreeBytes(dir);
  }
  Status CreateFileExclusive(const std::string& path, std::string_view data) override;
  Result<std::string> ReadFileVersioned(const std::string& path, uint64_t max_bytes,
                                        std::string* version) override {
    return base_->ReadFileVersioned(path, max_bytes, version);
  }
  Status ReplaceFileIfVersion(const std::string& path, std::string_view data,
                              const std::optional<std::string>& version) override;
  Status AbortUploadsBefore(const std::string& dir, int64_t before) override {
    return base_->AbortUploadsBefore(dir, before);
  }

 private:
  struct Armed {
    int64_t at;  // fail when this many more ops have been seen
    Status error;
  };

  FileSystem* const base_;
  mutable std::mutex mu_;
  std::array<int64_t, kNumOpKinds> counts_{};            // guarded by mu_
  int64_t total_ = 0;                                    // guarded by mu_
  int64_t injected_ = 0;                                 // guarded by mu_
  std::array<std::optional<Armed>, kNumOpKinds> nth_{};  // guarded by mu_; `at` per kind
  std::optional<Armed> after_;                           // guarded by mu_; `at` in total
  std::optional<uint64_t> free_bytes_;                   // guarded by mu_
};

}  // namespace shardsafe
