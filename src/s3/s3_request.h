// One S3 request with retries, and the Status of an S3 error response.
//
// Retried, with exponential backoff and full jitter (a delay drawn
// uniformly from [0, min(max_delay, base_delay * 2^(try-1)))): HTTP 500,
// 502, 503 and 504, 409 ConditionalRequestConflict / OperationAborted, an
// <Error> InternalError inside a 200 answer to CompleteMultipartUpload, and
// curl's transport failures (connection refused or reset, timeouts, a body
// cut short, nothing received). Never retried: every other answer, and a
// body that overflowed its sink. Thread-safe.
#pragma once

#include <string>

#include "s3/curl_transport.h"
#include "s3/s3_client.h"

namespace shardsafe {

// What a request is about, for messages.
struct S3Target {
  explicit S3Target(S3Location at, std::string upload_id = "")
      : at(std::move(at)), upload_id(std::move(upload_id)) {}
  S3Location at;
  std::string upload_id;  // multipart requests
  // "s3://bucket/key", with " (upload ID)" for a multipart request.
  std::string Describe() const;
};

// The final response (any status) of `request` tried under `policy`;
// Unavailable naming the target and the last failure when every try failed
// with a retried cause; InvalidArgument for a transport failure not worth
// retrying (a malformed URL, a TLS certificate refused).
Result<HttpResponse> SendWithRetries(CurlPool& pool, const RetryPolicy& policy,
                                     const S3Target& target, const HttpRequest& request,
                                     const BodySink& sink);

// The Status of a non-2xx response (or a 200 carrying an <Error>), by the
// mapping in s3_client.h.
// `endpoint` (the service's URL) is named when the bucket does not exist.
Status ResponseError(const S3Target& target, const HttpResponse& response,
                     std::string_view endpoint);

}  // namespace shardsafe
