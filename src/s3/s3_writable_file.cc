#include "s3/s3_writable_file.h"

#include <algorithm>

#include "base/crc32c.h"

namespace shardsafe {

S3WritableFile::S3WritableFile(S3Client& client, S3Location at, size_t part_bytes, int in_flight,
                               ThreadPool& pool)
    : client_(client),
      at_(std::move(at)),
      part_bytes_(part_bytes),
      max_in_flight_(std::max(in_flight, 1)),
      pool_(pool) {}

S3WritableFile::~S3WritableFile() { Close().IgnoreError(); }

Status S3WritableFile::Append(const void* data, size_t n) {
  return Fill(static_cast<const char*>(data), n, nullptr);
}

Status S3WritableFile::AppendChecksummed(const void* data, size_t n, uint32_t* crc) {
  return Fill(static_cast<const char*>(data), n, crc);
}

Status S3WritableFile::Fill(const char* data, size_t n, uint32_t* crc) {
  if (closed_ || synced_) {
    return FailedPreconditionError(at_.uri() + ": " +
                                   (closed_ ? "append after close"
                                            : "append after sync (an object cannot be extended)"));
  }
  SS_RETURN_IF_ERROR(FirstError());
  uint32_t appended = crc ? *crc : 0;
  while (n > 0) {
    if (part_.bytes.capacity() < part_bytes_) part_.bytes.reserve(part_bytes_);
    const size_t take = std::min(n, part_bytes_ - part_.bytes.size());
    const size_t at = part_.bytes.size();
    part_.bytes.resize(at + take);
    const uint32_t piece = CopyWithCrc32c(part_.bytes.data() + at, data, take, 0);
    part_.crc = Crc32cCombine(part_.crc, piece, take);
    appended = Crc32cCombine(appended, piece, take);
    data += take;
    n -= take;
    size_ += take;
    if (part_.bytes.size() == part_bytes_) SS_RETURN_IF_ERROR(ShipPart());
  }
  if (crc) *crc = appended;
  return Status();
}

Status S3WritableFile::FirstError() {
  std::lock_guard<std::mutex> lock(mu_);
  return error_;
}

Status S3WritableFile::ShipPart() {
  if (!upload_id_) {
    SS_ASSIGN_OR_RETURN(std::string id, client_.CreateMultipartUpload(at_, /*crc32c_parts=*/true));
    upload_id_ = std::move(id);
  }
  {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return in_flight_ < max_in_flight_; });
    if (!error_.ok()) return error_;
    ++in_flight_;
  }
  auto part = std::make_shared<Part>(std::move(part_));
  part_ = Part();
  const int number = next_part_++;
  pool_.Schedule([this, part, number] {
    Result<std::string> etag =
        client_.UploadPart(at_, *upload_id_, number, part->bytes, part->crc);
    std::lock_guard<std::mutex> lock(mu_);
    if (etag.ok()) {
      done_.push_back(CompletedPart{number, *etag, part->crc});
    } else if (error_.ok()) {
      error_ = etag.status();
    }
    --in_flight_;
    cv_.notify_all();
  });
  return Status();
}

Status S3WritableFile::WaitForUploads() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return in_flight_ == 0; });
  return error_;
}

Status S3WritableFile::Sync() {
  if (closed_) return FailedPreconditionError(at_.uri() + ": sync after close");
  if (synced_) return Status();
  Status s;
  if (!upload_id_) {  // under one part: one PUT
    PutOptions put;
    put.crc32c = part_.crc;
    s = client_.Put(at_, part_.bytes, put).status();
  } else {
    if (!part_.bytes.empty()) s = ShipPart();
    Status waited = WaitForUploads();
    if (s.ok()) s = waited;
    if (s.ok()) {
      std::sort(done_.begin(), done_.end(),
                [](const CompletedPart& a, const CompletedPart& b) { return a.number < b.number; });
      s = client_.CompleteMultipartUpload(at_, *upload_id_, done_, false).status();
      // A retried completion whose first try completed the upload (its
      // reply lost) finds the upload gone. The client accepts the object
      // whose ETag the parts make; where a store's ETags are not MD5s of
      // the data (SSE-C, SSE-KMS), the object's size, whole, is the proof
      // (the key holds this save's nonce, so no other writer's object).
      if (s.code() == StatusCode::kNotFound) {
        Result<ObjectInfo> object = client_.Head(at_);
        if (object.ok() && object->size == size_) s = Status();
      }
    }
  }
  if (!s.ok()) {
    Abandon();
    closed_ = true;
    return s;
  }
  synced_ = true;
  part_ = Part();
  return Status();
}

void S3WritableFile::Abandon() {
  WaitForUploads().IgnoreError();
  if (upload_id_) client_.AbortMultipartUpload(at_, *upload_id_).IgnoreError();
  upload_id_.reset();
}

Status S3WritableFile::Close() {
  if (closed_) return Status();
  closed_ = true;
  if (!synced_) Abandon();
  part_ = Part();
  return Status();
}

}  // namespace shardsafe
