// CurlS3Client's multipart upload and bucket calls.
#include <string>

#include "s3/curl_s3_client.h"
#include "s3/s3_encoding.h"
#include "s3/s3_xml.h"

namespace shardsafe {

Result<std::string> CurlS3Client::CreateMultipartUpload(const S3Location& at,
                                                        bool crc32c_parts) {
  HttpRequest req{"POST", Url(at, {{"uploads", ""}}),
                  {"Content-Type: application/octet-stream"}};
  if (crc32c_parts) req.headers.push_back("x-amz-checksum-algorithm: CRC32C");
  S3Target target{at};
  SS_ASSIGN_OR_RETURN(HttpResponse r, Send(target, req));
  Result<std::string> id = ParseUploadId(r.body);
  if (!id.ok()) return id.status().WithContext(target.Describe());
  return id;
}

Result<std::string> CurlS3Client::UploadPart(const S3Location& at, const std::string& upload_id,
                                             int part_number, std::span<const char> data,
                                             std::optional<uint32_t> crc32c) {
  HttpRequest req{"PUT",
                  Url(at, {{"partNumber", std::to_string(part_number)}, {"uploadId", upload_id}}),
                  {},
                  data};
  if (crc32c) req.headers.push_back("x-amz-checksum-crc32c: " + Crc32cHeaderValue(*crc32c));
  S3Target target{at, upload_id};
  SS_ASSIGN_OR_RETURN(HttpResponse r, Send(target, req));
  return ResponseETag(target, r);
}

Result<std::string> CurlS3Client::CompleteMultipartUpload(const S3Location& at,
                                                          const std::string& upload_id,
                                                          std::span<const CompletedPart> parts,
                                                          bool if_none_match) {
  std::string body = CompleteMultipartUploadBody(parts);
  HttpRequest req{"POST", Url(at, {{"uploadId", upload_id}}),
                  {"Content-Type: application/xml"}, body};
  req.error_in_200 = true;
  if (if_none_match) req.headers.push_back("If-None-Match: *");
  S3Target target{at, upload_id};
  SS_ASSIGN_OR_RETURN(HttpResponse r, SendRaw(target, req));
  if (r.status == 404 && ParseErrorBody(r.body).code == "NoSuchUpload") {
    // A completion whose answer was lost (the connection dropped after
    // the server completed) is retried, and the retry finds the upload
    // gone. The object at the key is ours if its ETag is the one these
    // parts make.
    const std::string ours = MultipartETag(parts);
    Result<ObjectInfo> now = Head(at);
    if (!ours.empty() && now.ok() && now->etag == ours) return ours;
    if (!now.ok() && now.status().code() != StatusCode::kNotFound) {
      return now.status().WithContext("checking the object of a completed upload " + upload_id);
    }
    return ResponseError(target, r, Endpoint());
  }
  if (!r.ok() || !ParseErrorBody(r.body).code.empty()) return ResponseError(target, r, Endpoint());
  Result<std::string> etag = ParseCompletedETag(r.body);
  if (!etag.ok()) return etag.status().WithContext(target.Describe());
  return etag;
}

Status CurlS3Client::AbortMultipartUpload(const S3Location& at, const std::string& upload_id) {
  S3Target target{at, upload_id};
  SS_ASSIGN_OR_RETURN(HttpResponse r,
                      SendRaw(target, {"DELETE", Url(at, {{"uploadId", upload_id}})}));
  if (r.ok() || (r.status == 404 && ParseErrorBody(r.body).code == "NoSuchUpload")) {
    return Status::Ok();
  }
  return ResponseError(target, r, Endpoint());
}

Result<std::vector<MultipartUpload>> CurlS3Client::ListMultipartUploads(
    const std::string& bucket, const std::string& prefix) {
  S3Target target{{bucket, prefix}};
  std::vector<MultipartUpload> out;
  std::string key_marker, id_marker;
  while (true) {
    QueryParams query{{"uploads", ""},
                      {"encoding-type", "url"},
                      {"max-uploads", std::to_string(config().list_page_size)},
                      {"prefix", prefix}};
    if (!key_marker.empty()) query.emplace_back("key-marker", key_marker);
    if (!id_marker.empty()) query.emplace_back("upload-id-marker", id_marker);
    SS_ASSIGN_OR_RETURN(HttpResponse r, Send(target, {"GET", Url({bucket, ""}, query)}));
    Result<UploadsPage> page = ParseListMultipartUploads(r.body);
    if (!page.ok()) return page.status().WithContext("listing uploads of " + target.Describe());
    for (MultipartUpload& u : page->uploads) out.push_back(std::move(u));
    if (!page->truncated) return out;
    key_marker = page->next_key_marker;
    id_marker = page->next_upload_id_marker;
  }
}

Status CurlS3Client::CreateBucket(const std::string& bucket) {
  std::string body = CreateBucketBody(config().region);
  S3Target target{{bucket, ""}};
  SS_ASSIGN_OR_RETURN(HttpResponse r, SendRaw(target, {"PUT", Url({bucket, ""}), {}, body}));
  if (r.ok() || ParseErrorBody(r.body).code == "BucketAlreadyOwnedByYou") return Status::Ok();
  return ResponseError(target, r, Endpoint());
}

}  // namespace shardsafe
