// S3FileSystem: the FileSystem interface over an S3 bucket, so that the
// engine reads (and writes) a checkpoint under s3://BUCKET/PREFIX with the
// code that reads a directory. Paths are URIs; a "directory" is a key
// prefix ending in '/', and a file is an object.
//
// What an object store cannot do, and what this implementation does
// instead:
//   - Files: a WritableFile is a multipart upload of parts of
//     S3FileOptions::part_bytes, uploaded in the background while the next
//     part fills (at most uploads_in_flight per file), each with
//     x-amz-checksum-crc32c. The object exists once Sync() returns OK (the
//     upload is completed; a file smaller than one part is one PUT). Close()
//     without Sync() aborts the upload: nothing appears. Append after Sync
//     is FailedPrecondition (an object cannot be extended).
//   - Directories exist while an object lies under them: CreateDir and
//     SyncDir do nothing; ListDir of a prefix with nothing under it is
//     NotFound.
//   - Rename and RenameExchange are Unimplemented (S3 has no rename; the
//     commit protocol for object stores, docs/design.md "Object storage",
//     commits with conditional writes instead). TryLock is Unimplemented.
//   - Conditional writes: CreateFileExclusive is a PUT with If-None-Match: *
//     (a 412 is AlreadyExists), ReplaceFileIfVersion one with If-Match:
//     ETAG (a 412 is FailedPrecondition); versions are ETags.
//   - ReadOptions (direct, within) do not apply: an object store has no
//     page cache and no symbolic links.
// Errors carry the client's messages, which name s3://bucket/key.
//
// Thread-safety: as FileSystem. Part uploads run on a pool owned by the
// file system.
#pragma once

#include <memory>
#include <string>

#include "base/thread_pool.h"
#include "s3/s3_client.h"
#include "shardsafe/filesystem.h"

namespace shardsafe {

struct S3FileOptions {
  // Part size of a multipart upload (S3: 5 MiB to 5 GiB), and parts of one
  // file in flight at once.
  size_t part_bytes = size_t{16} << 20;
  int uploads_in_flight = 4;
  // Threads uploading and deleting for all files of this file system.
  int threads = 16;

  // The defaults, changed by SHARDSAFE_S3_PART_BYTES,
  // SHARDSAFE_S3_UPLOADS_PER_FILE and SHARDSAFE_S3_THREADS (decimal
  // integers). InvalidArgument naming the variable for a value that is not
  // a number or out of range.
  static Result<S3FileOptions> FromEnvironment();
  std::string ToString() const;
};

class S3FileSystem : public FileSystem {
 public:
  S3FileSystem(std::unique_ptr<S3Client> client, const S3FileOptions& options);

  S3Client& client() { return *client_; }

  Result<std::unique_ptr<WritableFile>> NewWritableFile(const std::string& path,
                                                        const WriteOptions& options) override;
  Result<std::unique_ptr<RandomAccessFile>> NewRandomAccessFile(
      const std::string& path, const ReadOptions& options) override;
  Result<FileInfo> Stat(const std::string& path) override;
  Result<std::vector<DirEntry>> ListDir(const std::string& path) override;
  Status CreateDir(const std::string& path) override { return Status(); }
  Status RemoveFile(const std::string& path) override;
  Status RemoveAll(const std::string& path) override;
  Status Rename(const std::string& from, const std::string& to) override;
  Status SyncDir(const std::string& path) override { return Status(); }

  bool IsObjectStore() const override { return true; }
  Status CreateFileExclusive(const std::string& path, std::string_view data) override;
  Result<std::string> ReadFileVersioned(const std::string& path, uint64_t max_bytes,
                                        std::string* version) override;
  Status ReplaceFileIfVersion(const std::string& path, std::string_view data,
                              const std::optional<std::string>& version) override;
  Status AbortUploadsBefore(const std::string& dir, int64_t before_unix_seconds) override;

 private:
  std::unique_ptr<S3Client> client_;
  S3FileOptions options_;
  ThreadPool pool_;
};

}  // namespace shardsafe
