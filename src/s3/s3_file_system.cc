#include "s3/s3_file_system.h"

#include <cstring>

#include "base/crc32c.h"
#include "base/env.h"
#include "s3/s3_writable_file.h"

namespace shardsafe {
namespace {

// An object read with ranged GETs; its size is the one HEAD saw at open,
// or the one the caller knew (ReadOptions::size).
class S3ReadFile : public RandomAccessFile {
 public:
  S3ReadFile(S3Client& client, S3Location at, uint64_t size)
      : client_(client), at_(std::move(at)), size_(size) {}

  Status ReadAt(uint64_t offset, void* dst, size_t n) const override {
    if (n == 0) return Status();
    if (offset > size_ || n > size_ - offset) {
      return DataLossError(at_.uri() + ": truncated: reading [" + std::to_string(offset) + ", " +
                           std::to_string(offset + n) + ") of a " + std::to_string(size_) +
                           "-byte object");
    }
    return client_.GetRange(at_, offset, dst, n);
  }
  // One ranged GET for the whole run, scattered from a buffer: a request
  // per piece (the default) would be a request per row of a column split.
  Status ReadScattered(uint64_t offset, std::span<const Piece> pieces) const override {
    size_t total = 0;
    for (const Piece& p : pieces) total += p.n;
    if (pieces.size() <= 1) return pieces.empty() ? Status() : ReadAt(offset, pieces[0].dst, total);
    std::vector<char> buffer(total);
    SS_RETURN_IF_ERROR(ReadAt(offset, buffer.data(), total));
    size_t at = 0;
    for (const Piece& p : pieces) {
      std::memcpy(p.dst, buffer.data() + at, p.n);
      at += p.n;
    }
    return Status();
  }
  uint64_t size() const override { return size_; }

 private:
  S3Client& client_;
  const S3Location at_;
  const uint64_t size_;
};

// The prefix that lists what lies under `dir` ("" for a bucket's root).
std::string DirPrefix(const S3Location& dir) { return dir.key.empty() ? "" : dir.key + "/"; }

}  // namespace

Result<S3FileOptions> S3FileOptions::FromEnvironment() {
  S3FileOptions o;
  SS_ASSIGN_OR_RETURN(int64_t part, EnvInteger("SHARDSAFE_S3_PART_BYTES", o.part_bytes,
                                               int64_t{5} << 20, int64_t{5} << 30));
  SS_ASSIGN_OR_RETURN(int64_t per_file,
                      EnvInteger("SHARDSAFE_S3_UPLOADS_PER_FILE", o.uploads_in_flight, 1, 1024));
  SS_ASSIGN_OR_RETURN(int64_t threads, EnvInteger("SHARDSAFE_S3_THREADS", o.threads, 1, 1024));
  o.part_bytes = static_cast<size_t>(part);
  o.uploads_in_flight = static_cast<int>(per_file);
  o.threads = static_cast<int>(threads);
  return o;
}

std::string S3FileOptions::ToString() const {
  return "part_bytes=" + std::to_string(part_bytes) +
         " uploads_per_file=" + std::to_string(uploads_in_flight) +
         " threads=" + std::to_string(threads);
}

S3FileSystem::S3FileSystem(std::unique_ptr<S3Client> client, const S3FileOptions& options)
    : client_(std::move(client)), options_(options), pool_(std::max(options.threads, 1)) {}

Result<std::unique_ptr<WritableFile>> S3FileSystem::NewWritableFile(const std::string& path,
                                                                     const WriteOptions&) {
  SS_ASSIGN_OR_RETURN(S3Location at, ParseS3Uri(path));
  return std::unique_ptr<WritableFile>(new S3WritableFile(
      *client_, std::move(at), options_.part_bytes, options_.uploads_in_flight, pool_));
}

Result<std::unique_ptr<RandomAccessFile>> S3FileSystem::NewRandomAccessFile(
    const std::string& path, const ReadOptions& options) {
  SS_ASSIGN_OR_RETURN(S3Location at, ParseS3Uri(path));
  uint64_t size = 0;
  if (options.size) {
    size = *options.size;  // known: no HEAD
  } else {
    SS_ASSIGN_OR_RETURN(ObjectInfo info, client_->Head(at));
    size = info.size;
  }
  return std::unique_ptr<RandomAccessFile>(new S3ReadFile(*client_, std::move(at), size));
}

Result<FileInfo> S3FileSystem::Stat(const std::string& path) {
  SS_ASSIGN_OR_RETURN(S3Location at, ParseS3Uri(path));
  if (!at.key.empty()) {
    Result<ObjectInfo> object = client_->Head(at);
    if (object.ok()) {
      return FileInfo{object->size, false, object->mtime_seconds,
                      object->mtime_seconds * int64_t{1000000000}};
    }
    if (object.status().code() != StatusCode::kNotFound) return object.status();
  }
  SS_ASSIGN_OR_RETURN(Listing under, client_->List(at.bucket, DirPrefix(at), "/"));
  if (under.objects.empty() && under.common_prefixes.empty() && !at.key.empty()) {
    return NotFoundError(at.uri() + ": no such object or prefix");
  }
  return FileInfo{0, true, 0, 0};
}

Result<std::vector<DirEntry>> S3FileSystem::ListDir(const std::string& path) {
  SS_ASSIGN_OR_RETURN(S3Location at, ParseS3Uri(path));
  const std::string prefix = DirPrefix(at);
  SS_ASSIGN_OR_RETURN(Listing under, client_->List(at.bucket, prefix, "/"));
  std::vector<DirEntry> out;
  for (const ObjectInfo& o : under.objects) {
    if (o.key.size() > prefix.size()) out.push_back({o.key.substr(prefix.size()), false});
  }
  for (const std::string& p : under.common_prefixes) {
    // "prefix/name/" -> "name"
    if (p.size() > prefix.size() + 1) {
      out.push_back({p.substr(prefix.size(), p.size() - prefix.size() - 1), true});
    }
  }
  if (out.empty() && !at.key.empty()) return NotFoundError(at.uri() + ": nothing under this prefix");
  return out;
}

Status S3FileSystem::RemoveFile(const std::string& path) {
  SS_ASSIGN_OR_RETURN(S3Location at, ParseS3Uri(path));
  return client_->Delete(at);
}

Status S3FileSystem::RemoveAll(const std::string& path) {
  SS_ASSIGN_OR_RETURN(S3Location at, ParseS3Uri(path));
  const std::string prefix = DirPrefix(at);
  SS_ASSIGN_OR_RETURN(std::vector<MultipartUpload> uploads,
                      client_->ListMultipartUploads(at.bucket, prefix));
  SS_ASSIGN_OR_RETURN(Listing under, client_->List(at.bucket, prefix, ""));
  TaskGroup group(&pool_);
  for (const MultipartUpload& u : uploads) {
    group.Add([&, u] { return client_->AbortMultipartUpload({at.bucket, u.key}, u.upload_id); });
  }
  for (const ObjectInfo& o : under.objects) {
    group.Add([&, key = o.key] { return client_->Delete({at.bucket, key}); });
  }
  SS_RETURN_IF_ERROR(group.Wait());
  if (at.key.empty()) return Status();
  return client_->Delete(at);
}

Status S3FileSystem::CreateFileExclusive(const std::string& path, std::string_view data) {
  SS_ASSIGN_OR_RETURN(S3Location at, ParseS3Uri(path));
  PutOptions put;
  put.if_none_match = true;
  put.crc32c = Crc32c(data.data(), data.size());
  Status s = client_->Put(at, data, put).status();
  if (s.code() != StatusCode::kFailedPrecondition) return s;
  // A retried PUT whose first try was written but not answered finds its
  // own object: that is a success, not a lost race.
  Result<std::string> there = client_->Get(at, data.size(), nullptr);
  if (there.ok() && *there == data) return Status();
  return AlreadyExistsError(at.uri() + " exists");
}

Result<std::string> S3FileSystem::ReadFileVersioned(const std::string& path, uint64_t max_bytes,
                                                    std::string* version) {
  SS_ASSIGN_OR_RETURN(S3Location at, ParseS3Uri(path));
  return client_->Get(at, max_bytes, version);
}

Status S3FileSystem::ReplaceFileIfVersion(const std::string& path, std::string_view data,
                                          const std::optional<std::string>& version) {
  SS_ASSIGN_OR_RETURN(S3Location at, ParseS3Uri(path));
  PutOptions put;
  put.if_none_match = !version.has_value();
  put.if_match = version;
  put.crc32c = Crc32c(data.data(), data.size());
  return client_->Put(at, data, put).status();
}

Status S3FileSystem::AbortUploadsBefore(const std::string& dir, int64_t before_unix_seconds) {
  SS_ASSIGN_OR_RETURN(S3Location at, ParseS3Uri(dir));
  SS_ASSIGN_OR_RETURN(std::vector<MultipartUpload> uploads,
                      client_->ListMultipartUploads(at.bucket, DirPrefix(at)));
  Status first;
  for (const MultipartUpload& u : uploads) {
    if (u.initiated_seconds >= before_unix_seconds) continue;
    Status s = client_->AbortMultipartUpload({at.bucket, u.key}, u.upload_id);
    if (first.ok()) first = s;
  }
  return first;
}

Status S3FileSystem::Rename(const std::string& from, const std::string& to) {
  return UnimplementedError("renaming " + from + " to " + to +
                            ": object storage has no rename");
}

}  // namespace shardsafe
