// FileSystem: every byte shardsafe reads or writes goes through this
// interface. It knows nothing of tensors.
//
// The POSIX implementation (DefaultFileSystem) does durable I/O: Sync() is
// fdatasync, SyncDir() fsyncs a directory so a create or rename in it is
// durable, Rename() is rename(2) and atomic. With WriteOptions::direct the
// file is written with O_DIRECT from internal 4 KiB-aligned buffers (the
// caller's buffers need no alignment); where the file system refuses O_DIRECT
// (open fails with EINVAL: tmpfs before Linux 6.6, some devices) the file
// silently falls back to buffered I/O. Tests wrap a
// FileSystem to inject faults (src/testing/fault_injection.h).
//
// Thread-safety: FileSystem methods may be called concurrently. A file object
// is used by one thread at a time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "shardsafe/status.h"

namespace shardsafe {

struct WriteOptions {
  // Write with O_DIRECT through aligned internal buffers.
  bool direct = false;
  // Expected final size in bytes; the file is preallocated (fallocate) when
  // non-zero, so a full disk is reported before the data is written.
  uint64_t size_hint = 0;
  // Size of each internal buffer handed to the kernel in one write (direct
  // mode; rounded up to 4 KiB, and down to the size hint when that is
  // smaller). Buffered mode writes from the caller's memory and ignores it.
  size_t buffer_bytes = 8 << 20;
  // Direct mode: writes in flight at once for this file (>= 1). Full buffers
  // are written by queue_depth internal I/O threads while the caller fills
  // the next one, so a file holds up to queue_depth + 1 buffers. Buffers are
  // pre-faulted and recycled across files through a process-wide cache.
  int queue_depth = 2;
};

// A file being written from start to end. Created empty (an existing file is
// truncated). Not durable until Sync() returns OK.
class WritableFile {
 public:
  virtual ~WritableFile() = default;
  // Appends `n` bytes. The data is copied or written before returning, so the
  // caller may reuse `data` at once. Errors: ResourceExhausted (disk full),
  // Unavailable (I/O error). In direct mode a background write may fail
  // after its Append returned; the error is reported by the next Append,
  // Sync or Close, and every call after a failure returns it again.
  virtual Status Append(const void* data, size_t n) = 0;
  // Like Append, but the caller promises that `data` stays valid and
  // unchanged until the next Sync or Close, so the file may write it
  // without copying (O_DIRECT straight from 4 KiB-aligned memory, several
  // requests in flight). The default copies like Append.
  virtual Status AppendStable(const void* data, size_t n) { return Append(data, n); }
  // Like Append, and extends `*crc` with the CRC-32C of the bytes (the
  // value of Crc32cExtend(*crc, data, n), src/base/crc32c.h). A file that
  // copies what it is given checksums each block as it copies it, so the
  // caller's memory is read once. `*crc` is updated only on success. The
  // default checksums, then calls Append.
  virtual Status AppendChecksummed(const void* data, size_t n, uint32_t* crc);
  // Writes the next `bytes` bytes of the file into memory it provides:
  // fill(dst, offset, n) must put bytes [offset, offset + n) of the `bytes`
  // into dst (host memory), and is called for consecutive ranges until all
  // are filled; its error is returned as is. Extends `*crc` like
  // AppendChecksummed (only on success). For data that must be copied from
  // elsewhere anyway (a device): the direct file fills its own buffers, so
  // no other memory is needed. The default fills a bounce buffer of at most
  // kFillBounceBytes and appends it.
  using Filler = std::function<Status(char* dst, uint64_t offset, size_t n)>;
  static constexpr size_t kFillBounceBytes = size_t{4} << 20;
  virtual Status AppendFilled(uint64_t bytes, const Filler& fill, uint32_t* crc);
  // Waits until no write still reads memory passed to AppendStable, so the
  // caller may reuse it before Sync (double buffering). Reports a failed
  // write like Append. The default returns OK (its AppendStable copies).
  virtual Status WaitStable() { return Status(); }
  // Writes out everything appended so far and makes it durable (fdatasync).
  virtual Status Sync() = 0;
  // Writes out what is buffered and closes. Does not sync. Idempotent. The
  // destructor closes the same way. Append or Sync after Close:
  // FailedPrecondition.
  virtual Status Close() = 0;
  // Bytes appended so far.
  virtual uint64_t size() const = 0;
};

struct ReadOptions {
  // Read with O_DIRECT where the request is aligned (offset, length and
  // destination on 4 KiB); other requests use buffered reads.
  bool direct = false;
  // When not empty, a directory the file must lie inside once every
  // symbolic link on its path is resolved: a link leading out of it is
  // InvalidArgument, naming the path and where it leads. Readers of a
  // checkpoint or model directory set it, so a planted link cannot make
  // them read (or copy out) a file from elsewhere.
  std::string within;
  // The size the caller knows the file has (a checkpoint's index records
  // its data files' sizes). An object store then skips the request that
  // would learn it (a HEAD); a read past the object's real end still fails
  // (DataLoss), and the checksums catch other bytes. A local file system
  // ignores it (its size costs no request).
  std::optional<uint64_t> size = std::nullopt;
};

// A file read at arbitrary offsets. ReadAt may be called concurrently from
// several threads on one object.
class RandomAccessFile {
 public:
  virtual ~RandomAccessFile() = default;
  // Reads exactly `n` bytes at `offset` into `dst`. DataLoss if the file ends
  // first (truncated), Unavailable on I/O errors.
  virtual Status ReadAt(uint64_t offset, void* dst, size_t n) const = 0;
  virtual uint64_t size() const = 0;

  // One piece of a scattered read: the next `n` bytes go to `dst`.
  struct Piece {
    void* dst;
    size_t n;
  };
  // Reads consecutive file bytes from `offset` into the pieces in order (one
  // preadv where the implementation can). Errors as ReadAt. The default
  // reads piece by piece with ReadAt.
  virtual Status ReadScattered(uint64_t offset, std::span<const Piece> pieces) const;

  // True when every byte of [offset, offset + n) is in the page cache, so a
  // read of it is a memory copy (callers then read in cache-sized steps and
  // checksum each step while it is still in the CPU cache). False when some
  // is not, or the implementation cannot tell (the default).
  virtual bool FullyCached(uint64_t offset, size_t n) const { return false; }

  // The bytes [offset, offset + n) where the file already holds them in
  // memory, valid until the next call on this file, so a caller can
  // checksum and copy them out without a copy of its own; null when it
  // holds them nowhere (the default; read them with ReadAt). Errors as
  // ReadAt.
  virtual Result<const char*> View(uint64_t offset, size_t n) const {
    return static_cast<const char*>(nullptr);
  }
};

// An advisory lock on a path, held while the object lives. Other processes
// and other TryLock calls in this one see it; it is released when the
// object is destroyed or the process dies (flock on POSIX).
class FileLock {
 public:
  virtual ~FileLock() = default;
};

// An exclusive lock excludes every other lock; shared locks exclude only
// exclusive ones.
enum class LockMode { kExclusive, kShared };

struct FileInfo {
  uint64_t size = 0;
  bool is_dir = false;
  int64_t mtime_seconds = 0;  // seconds since the epoch
  int64_t mtime_ns = 0;       // nanoseconds since the epoch (at the file system's resolution)
};

struct DirEntry {
  std::string name;  // no path
  bool is_dir = false;
};

class FileSystem {
 public:
  virtual ~FileSystem() = default;

  virtual Result<std::unique_ptr<WritableFile>> NewWritableFile(
      const std::string& path, const WriteOptions& options) = 0;
  // NotFound if the file does not exist.
  virtual Result<std::unique_ptr<RandomAccessFile>> NewRandomAccessFile(
      const std::string& path, const ReadOptions& options) = 0;

  // NotFound if missing.
  virtual Result<FileInfo> Stat(const std::string& path) = 0;
  // Entries of a directory, without "." and "..", in no particular order.
  virtual Result<std::vector<DirEntry>> ListDir(const std::string& path) = 0;
  // Creates one directory. AlreadyExists if it exists.
  virtual Status CreateDir(const std::string& path) = 0;
  virtual Status RemoveFile(const std::string& path) = 0;
  // Removes a directory and everything below it. OK if it does not exist,
  // or if another process removes some of it at the same time.
  virtual Status RemoveAll(const std::string& path) = 0;
  // Atomically renames `from` to `to`. A file target is replaced; a directory
  // target must not exist (AlreadyExists).
  virtual Status Rename(const std::string& from, const std::string& to) = 0;
  // Atomically swaps two existing paths (renameat2 RENAME_EXCHANGE), so
  // that replacing a directory never leaves a moment with neither in place.
  // Unimplemented where the file system cannot do it.
  virtual Status RenameExchange(const std::string& a, const std::string& b) {
    return UnimplementedError("atomic exchange of " + a + " and " + b + " is not supported");
  }
  // Makes the entries of directory `path` (creates, renames) durable.
  virtual Status SyncDir(const std::string& path) = 0;
  // Takes an advisory lock on the existing file or directory `path` without
  // waiting: FailedPrecondition if a conflicting lock is held, NotFound if
  // the path is missing, or no longer names what was locked once the lock
  // is held (it was renamed or removed meanwhile), Unimplemented where the
  // file system has no locks. Uses (docs/design.md, "Locks"): a save holds
  // its temporary directory exclusively, so that another save's cleanup
  // never removes a save in progress; a root's directory operations hold
  // the root exclusively; a load holds the index it reads shared, so that
  // retention never removes a checkpoint being loaded.
  virtual Result<std::unique_ptr<FileLock>> TryLock(const std::string& path, LockMode mode) {
    return UnimplementedError("locking " + path + " is not supported");
  }

  // Bytes this process may still write in the existing directory `dir`
  // (POSIX: statvfs's f_bavail x f_frsize): what a save checks its data
  // files against before it writes any. Unimplemented where the file
  // system does not know (object stores).
  virtual Result<uint64_t> FreeBytes(const std::string& dir) {
    return UnimplementedError("free space of " + dir + " is not known");
  }

  // An object store (S3): no rename, no directories, no locks; a file
  // appears whole once written (WritableFile::Sync). Saves commit there
  // with the conditional writes below instead of a rename
  // (docs/design.md, "Object storage").
  virtual bool IsObjectStore() const { return false; }
  // Creates `path` holding `data` in one step unless it exists:
  // AlreadyExists if it does (S3: If-None-Match: *), unless it holds
  // exactly `data` (a retried request that found its own first try).
  virtual Status CreateFileExclusive(const std::string& path, std::string_view data) {
    return UnimplementedError("conditional writes of " + path + " are not supported");
  }
  // A whole small file (ResourceExhausted above `max_bytes`) and, in
  // `*version`, a token that changes whenever the file does (S3: the ETag).
  virtual Result<std::string> ReadFileVersioned(const std::string& path, uint64_t max_bytes,
                                                std::string* version) {
    return UnimplementedError("versioned reads of " + path + " are not supported");
  }
  // Replaces `path` with `data` if it still has `version` (nullopt: if it
  // does not exist), in one step: FailedPrecondition if it changed (S3:
  // If-Match: ETAG, or If-None-Match: *).
  virtual Status ReplaceFileIfVersion(const std::string& path, std::string_view data,
                                      const std::optional<std::string>& version) {
    return UnimplementedError("conditional writes of " + path + " are not supported");
  }
  // Object stores: aborts the unfinished uploads under `dir` that began
  // before `before_unix_seconds` (a killed writer's; such an upload holds
  // storage but is no file). OK where there are none (the default).
  virtual Status AbortUploadsBefore(const std::string& dir, int64_t before_unix_seconds) {
    return Status();
  }
};

// The POSIX file system. Lives for the whole process.
FileSystem* DefaultFileSystem();

// The file system `path` lies on: `given` when not null; for an s3:// URI
// the object store (src/s3/s3_file_system.h), one per configuration, made
// from the AWS_* variables on first use and kept for the process
// (InvalidArgument naming `path` and the variable when they are missing or
// malformed); else DefaultFileSystem().
Result<FileSystem*> FileSystemFor(std::string_view path, FileSystem* given = nullptr);

// What DefaultFileSystem() refuses before any system call: a path with a
// NUL byte (InvalidArgument: it would name another file as a C string) and
// a URI such as "s3://bucket/run" (Unimplemented: POSIX would take it for
// the local directory "s3:/bucket/run"). Callers that rewrite a path first
// (make it absolute) check it with this.
Status CheckLocalPath(std::string_view path);

// Writes `data` to `path` so that readers see the old content or the new,
// never a mix: write to a temporary sibling, Sync, Rename over `path`,
// SyncDir of the parent. The temporary is removed on failure. On an object
// store, one write (an object appears whole).
Status WriteFileAtomically(FileSystem& fs, const std::string& path, std::string_view data);

// Reads a whole file. ResourceExhausted if it is larger than `max_bytes`.
// On an object store, one GET (FileSystem::ReadFileVersioned).
Result<std::string> ReadFileToString(FileSystem& fs, const std::string& path,
                                     uint64_t max_bytes, const ReadOptions& options = {});

// "a/b" + "c" -> "a/b/c"; the parent of "a/b/c" is "a/b" ("." for "c");
// the base name of "a/b/c/" is "c".
std::string JoinPath(std::string_view dir, std::string_view name);
std::string ParentDir(std::string_view path);
std::string BaseName(std::string_view path);

// Creates `path` and its missing parents. FailedPrecondition if it (or a
// parent) exists and is not a directory.
Status CreateDirs(FileSystem& fs, const std::string& path);

// 16 random hex digits from the OS (fork-safe): the suffix of a temporary
// name, so that concurrent writers never share one.
std::string RandomSuffix();

}  // namespace shardsafe
