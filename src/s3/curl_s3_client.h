// CurlS3Client: S3Client over libcurl (CurlPool) with the retries and error
// mapping of s3_request.h. Object calls live in curl_s3_client.cc, the
// multipart upload and bucket calls in curl_s3_multipart.cc.
#pragma once

#include <string>

#include "s3/curl_transport.h"
#include "s3/s3_client.h"
#include "s3/s3_request.h"
#include "s3/s3_url.h"

namespace shardsafe {

class CurlS3Client final : public S3Client {
 public:
  explicit CurlS3Client(S3Config config) : S3Client(std::move(config)), pool_(this->config()) {}

  Result<std::string> Put(const S3Location& at, std::span<const char> data,
                          const PutOptions& options) override;
  Result<ObjectInfo> Head(const S3Location& at) override;
  Status GetRange(const S3Location& at, uint64_t offset, void* dst, size_t n) override;
  Result<std::string> Get(const S3Location& at, uint64_t max_bytes, std::string* etag) override;
  Result<Listing> List(const std::string& bucket, const std::string& prefix,
                       std::string_view delimiter) override;
  Status Delete(const S3Location& at) override;

  Result<std::string> CreateMultipartUpload(const S3Location& at, bool crc32c_parts) override;
  Result<std::string> UploadPart(const S3Location& at, const std::string& upload_id,
                                 int part_number, std::span<const char> data,
                                 std::optional<uint32_t> crc32c) override;
  Result<std::string> CompleteMultipartUpload(const S3Location& at, const std::string& upload_id,
                                              std::span<const CompletedPart> parts,
                                              bool if_none_match) override;
  Status AbortMultipartUpload(const S3Location& at, const std::string& upload_id) override;
  Result<std::vector<MultipartUpload>> ListMultipartUploads(const std::string& bucket,
                                                            const std::string& prefix) override;
  Status CreateBucket(const std::string& bucket) override;

 private:
  // The service's URL for messages: the configured endpoint, else AWS's for the region.
  std::string Endpoint() const {
    const S3Config& c = config();
    return c.endpoint.empty() ? "https://s3." + c.region + ".amazonaws.com" : c.endpoint;
  }
  std::string Url(const S3Location& at, QueryParams query = {}) const {
    return S3Url(config(), at.bucket, at.key, std::move(query));
  }
  // Any final response, after the retries.
  Result<HttpResponse> SendRaw(const S3Target& target, const HttpRequest& request,
                               const BodySink& sink = {}) {
    return SendWithRetries(pool_, config().retry, target, request, sink);
  }
  // A 2xx response, or the error of any other.
  Result<HttpResponse> Send(const S3Target& target, const HttpRequest& request,
                            const BodySink& sink = {});

  CurlPool pool_;
};

// The ETag header of a 2xx response; DataLoss naming `target` when absent.
Result<std::string> ResponseETag(const S3Target& target, const HttpResponse& r);

}  // namespace shardsafe
