// S3Client: the S3 API calls shardsafe makes, over libcurl, which signs
// every request with AWS Signature Version 4 (CURLOPT_AWS_SIGV4). Nothing in
// this file knows about checkpoints; the object-store file system and the
// commit protocol (docs/design.md, "Object storage") are built on it.
//
// Configuration (S3Config::FromEnvironment) follows the AWS conventions:
// AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN,
// AWS_REGION / AWS_DEFAULT_REGION, AWS_ENDPOINT_URL_S3 / AWS_ENDPOINT_URL.
// A custom endpoint from the environment is addressed path-style
// (http://host:port/bucket/key), AWS itself virtual-hosted
// (https://bucket.s3.REGION.amazonaws.com/key; path-style for a bucket name
// with dots, which the wildcard certificate does not cover).
// Secrets never appear in a Status message, a log line or ToString().
//
// Requests: keys are URI-encoded by the SigV4 rules (any UTF-8; '/' kept);
// every request declares x-amz-content-sha256: UNSIGNED-PAYLOAD, so the
// payload's integrity rests on x-amz-checksum-crc32c where the caller gives
// a CRC (PutOptions::crc32c, UploadPart, CompletedPart).
//
// Errors name the object as "s3://bucket/key" (with " (upload ID)" for a
// multipart call) and the S3 error code and message:
//   NotFound            404: NoSuchKey "s3://b/k: no such object";
//                        NoSuchBucket "s3://b: no such bucket at ENDPOINT"
//                        (detail kNoSuchBucket); NoSuchUpload
//                        "s3://b/k (upload ID): no such upload"; a HEAD, whose
//                        404 has no body, "s3://b/k: not found (HTTP 404)"
//   InvalidArgument     403 (AccessDenied, SignatureDoesNotMatch,
//                        InvalidAccessKeyId, ...): "s3://b/k: access denied
//                        (AccessDenied: Access Denied)"; any other 4xx
//                        ("request refused (Code: message)"); a transport
//                        failure not worth retrying (TLS certificate refused)
//   FailedPrecondition  412 PreconditionFailed from a conditional write
//                        (If-None-Match: * on an existing key, If-Match on a
//                        changed ETag), and 409s other than those retried;
//                        callers turn it into CheckpointExistsError or a retry
//   AlreadyExists       CreateBucket of a bucket another account owns
//   Unavailable         what stayed failing after the retries:
//                        "s3://b/k: PUT failed after 8 attempts: HTTP 503
//                        SlowDown: ..."
//   DataLoss            a body longer or shorter than asked for, a range
//                        past the object's end, a bad Content-Range, a
//                        response that does not parse
//   ResourceExhausted   Get of an object above its max_bytes
// Retries (RetryPolicy, exponential backoff with full jitter): 500, 502,
// 503 (SlowDown), 504; 409 ConditionalRequestConflict and OperationAborted;
// an InternalError inside a 200 answer to CompleteMultipartUpload;
// connection refused or reset, timeouts, bodies cut short. Never any other
// 4xx. A retried PUT or UploadPart resends the same bytes. A retried
// conditional write may find its own earlier try landed (its answer lost):
// Put with If-None-Match then fails with FailedPrecondition and
// CompleteMultipartUpload with NotFound (NoSuchUpload); callers that need
// to tell this from a lost race compare the object's ETag or checksum.
//
// Thread-safety: every method may be called from many threads at once; each
// call runs on one pooled curl handle (connections are reused across calls).
// Many requests are in flight when many threads call.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "shardsafe/status.h"

namespace shardsafe {

// "s3://bucket/some/prefix" -> {"bucket", "some/prefix"} (no leading or
// trailing '/' kept in the prefix; "" for the bucket's root).
struct S3Location {
  std::string bucket;
  std::string key;
  std::string uri() const;  // "s3://bucket/key"
};
bool IsS3Uri(std::string_view path);
// InvalidArgument for a malformed URI (no bucket, a bucket name S3 refuses,
// a NUL byte, "." or ".." segments, "//").
Result<S3Location> ParseS3Uri(std::string_view uri);

struct RetryPolicy {
  int max_attempts = 8;  // total tries of one request, >= 1
  std::chrono::milliseconds base_delay{100};
  std::chrono::milliseconds max_delay{10000};
};

struct S3Config {
  std::string access_key_id;
  std::string secret_access_key;  // never printed
  std::string session_token;      // never printed; sent as x-amz-security-token
  std::string region = "us-east-1";
  // "http://127.0.0.1:5000" or "" for AWS (https://s3.REGION.amazonaws.com).
  std::string endpoint;
  // http://host/bucket/key rather than http://bucket.host/key;
  // FromEnvironment sets it with a custom endpoint.
  bool path_style = false;
  RetryPolicy retry;
  std::chrono::seconds connect_timeout{10};
  // A request that moves fewer than 1 KiB/s for this long is a timeout.
  std::chrono::seconds low_speed_timeout{30};
  // max-keys of one ListObjectsV2 / ListMultipartUploads page (S3 caps it
  // at 1,000); tests make it small to exercise paging.
  int list_page_size = 1000;

  // From the AWS_* variables above. InvalidArgument when credentials are
  // missing or the endpoint is not an http(s) URL.
  static Result<S3Config> FromEnvironment();
  // InvalidArgument when credentials are missing, the region is not a
  // region name or the endpoint is neither "" nor an http(s) URL.
  Status Validate() const;
  // Endpoint, region, addressing and whether credentials are set; no secret.
  std::string ToString() const;
};

struct ObjectInfo {
  std::string key;
  uint64_t size = 0;
  std::string etag;            // as S3 returns it, quotes included
  int64_t mtime_seconds = 0;   // Last-Modified
};

struct PutOptions {
  bool if_none_match = false;         // If-None-Match: * (create only)
  std::optional<std::string> if_match;  // If-Match: ETAG (compare and swap)
  std::optional<uint32_t> crc32c;     // sent as x-amz-checksum-crc32c
};

struct CompletedPart {
  int number = 0;  // 1-based
  std::string etag;
  std::optional<uint32_t> crc32c;
};

struct MultipartUpload {
  std::string key;
  std::string upload_id;
  int64_t initiated_seconds = 0;
};

struct Listing {
  std::vector<ObjectInfo> objects;          // keys under the prefix
  std::vector<std::string> common_prefixes; // with a delimiter: "prefix/sub/"
};

class S3Client {
 public:
  // The libcurl client; InvalidArgument when `config` fails Validate().
  // Tests wrap it to inject faults.
  static Result<std::unique_ptr<S3Client>> Create(const S3Config& config);
  virtual ~S3Client() = default;

  const S3Config& config() const { return config_; }

  // PutObject of `data`; returns the new ETag.
  virtual Result<std::string> Put(const S3Location& at, std::span<const char> data,
                                  const PutOptions& options) = 0;
  // HeadObject.
  virtual Result<ObjectInfo> Head(const S3Location& at) = 0;
  // GetObject of exactly [offset, offset + n) into `dst` (Range: bytes=...);
  // DataLoss if the object ends first. n == 0 sends nothing.
  virtual Status GetRange(const S3Location& at, uint64_t offset, void* dst, size_t n) = 0;
  // The whole object, ResourceExhausted above `max_bytes`; `etag` receives
  // its ETag when not null (the If-Match value for a later Put).
  virtual Result<std::string> Get(const S3Location& at, uint64_t max_bytes,
                                  std::string* etag) = 0;
  // ListObjectsV2 of every key starting with `prefix` (all pages), with
  // `delimiter` ("/" or "" for none).
  virtual Result<Listing> List(const std::string& bucket, const std::string& prefix,
                               std::string_view delimiter) = 0;
  // DeleteObject; OK when the key does not exist.
  virtual Status Delete(const S3Location& at) = 0;

  // Returns the upload id. `crc32c_parts`: the upload is created with
  // x-amz-checksum-algorithm: CRC32C, and S3 then requires every part's
  // UploadPart and CompletedPart to carry its CRC-32C (AWS refuses a part
  // checksum on an upload created without an algorithm, and a completion
  // that omits one on an upload created with it).
  virtual Result<std::string> CreateMultipartUpload(const S3Location& at,
                                                    bool crc32c_parts) = 0;
  // Returns the part's ETag. `crc32c`, when given, is sent as
  // x-amz-checksum-crc32c.
  virtual Result<std::string> UploadPart(const S3Location& at, const std::string& upload_id,
                                         int part_number, std::span<const char> data,
                                         std::optional<uint32_t> crc32c) = 0;
  // Returns the object's ETag. `if_none_match`: If-None-Match: * (412 when
  // the key exists: FailedPrecondition). When the upload is gone
  // (NoSuchUpload: a retry after the server completed it and its answer was
  // lost), succeeds if the object at the key has the ETag `parts` make
  // (MultipartETag), else NotFound.
  virtual Result<std::string> CompleteMultipartUpload(const S3Location& at,
                                                      const std::string& upload_id,
                                                      std::span<const CompletedPart> parts,
                                                      bool if_none_match) = 0;
  // OK when the upload is already gone.
  virtual Status AbortMultipartUpload(const S3Location& at, const std::string& upload_id) = 0;
  // Uploads under `prefix` not yet completed or aborted (all pages).
  virtual Result<std::vector<MultipartUpload>> ListMultipartUploads(const std::string& bucket,
                                                                    const std::string& prefix) = 0;

  // CreateBucket in the configured region; OK when this account already
  // owns it (BucketAlreadyOwnedByYou), AlreadyExists when another does.
  virtual Status CreateBucket(const std::string& bucket) = 0;

 protected:
  explicit S3Client(S3Config config) : config_(std::move(config)) {}

 private:
  S3Config config_;
};

// Base64 of the big-endian CRC-32C, as x-amz-checksum-crc32c carries it.
std::string Crc32cHeaderValue(uint32_t crc);

// The ETag S3 gives the object a multipart upload of `parts` completes:
// the hex MD5 of the parts' binary MD5s (their ETags), "-" and the number
// of parts, quoted. Empty when a part's ETag is not a 32-digit hex MD5
// (quoted or not). Where a store's ETags are not MD5s of the data (SSE-C,
// SSE-KMS, some S3-compatible stores), an object's ETag will not match.
std::string MultipartETag(std::span<const CompletedPart> parts);

}  // namespace shardsafe
