// Retries and error mapping of S3 requests.
#include "s3/s3_request.h"

#include <algorithm>
#include <cmath>
#include <random>
#include <thread>

#include "s3/s3_xml.h"

namespace shardsafe {
namespace {

bool IsRetriedCurlError(CURLcode code) {
  switch (code) {
    case CURLE_COULDNT_RESOLVE_HOST:
    case CURLE_COULDNT_CONNECT:
    case CURLE_OPERATION_TIMEDOUT:
    case CURLE_SEND_ERROR:
    case CURLE_RECV_ERROR:
    case CURLE_PARTIAL_FILE:
    case CURLE_GOT_NOTHING:
    case CURLE_SSL_CONNECT_ERROR:
    case CURLE_HTTP2:
    case CURLE_HTTP2_STREAM:
    case CURLE_SEND_FAIL_REWIND:
      return true;
    default:
      return false;
  }
}

std::string DescribeError(const HttpResponse& r) {
  S3ErrorBody e = ParseErrorBody(r.body);
  std::string detail = e.code.empty() ? "HTTP " + std::to_string(r.status) : e.code;
  if (!e.message.empty()) detail += ": " + e.message;
  return detail;
}

// "HTTP 503 SlowDown: Please reduce your request rate."
std::string DescribeRetried(const HttpResponse& r) {
  std::string s = "HTTP " + std::to_string(r.status);
  return ParseErrorBody(r.body).code.empty() ? s : s + " " + DescribeError(r);
}

// Why `a` is worth another try; "" when it is final.
std::string RetryReason(const HttpAttempt& a, const HttpRequest& request) {
  const HttpResponse& r = a.response;
  if (a.code != CURLE_OK) return r.overflow || !IsRetriedCurlError(a.code) ? "" : a.error;
  if (r.status == 500 || r.status == 502 || r.status == 503 || r.status == 504) {
    return DescribeRetried(r);
  }
  if (r.status == 409 || (r.status == 200 && request.error_in_200)) {
    std::string code = ParseErrorBody(r.body).code;
    if (code == "ConditionalRequestConflict" || code == "OperationAborted" ||
        code == "InternalError" || code == "SlowDown") {
      return DescribeRetried(r);
    }
  }
  return "";
}

std::chrono::milliseconds Backoff(const RetryPolicy& policy, int attempt) {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  double cap = static_cast<double>(policy.base_delay.count()) * std::pow(2.0, attempt - 1);
  cap = std::min(cap, static_cast<double>(policy.max_delay.count()));
  std::uniform_real_distribution<double> full_jitter(0.0, cap);
  return std::chrono::milliseconds(static_cast<int64_t>(full_jitter(rng)));
}

}  // namespace

std::string S3Target::Describe() const {
  return upload_id.empty() ? at.uri() : at.uri() + " (upload " + upload_id + ")";
}

Result<HttpResponse> SendWithRetries(CurlPool& pool, const RetryPolicy& policy,
                                     const S3Target& target, const HttpRequest& request,
                                     const BodySink& sink) {
  int attempts = std::max(1, policy.max_attempts);
  std::string last;
  for (int attempt = 1; attempt <= attempts; ++attempt) {
    if (attempt > 1) std::this_thread::sleep_for(Backoff(policy, attempt - 1));
    HttpAttempt a = pool.Perform(request, sink);
    last = RetryReason(a, request);
    if (!last.empty()) continue;
    if (a.code != CURLE_OK && !a.response.overflow) {
      return InvalidArgumentError(target.Describe() + ": " + request.method + ": " + a.error);
    }
    return std::move(a.response);
  }
  return UnavailableError(target.Describe() + ": " + request.method + " failed after " +
                          std::to_string(attempts) + " attempts: " + last);
}

Status ResponseError(const S3Target& target, const HttpResponse& r, std::string_view endpoint) {
  S3ErrorBody e = ParseErrorBody(r.body);
  std::string what = target.Describe();
  std::string detail = " (" + DescribeError(r) + ")";
  if (e.code == "NoSuchBucket") {
    return NotFoundError(S3Location{target.at.bucket, ""}.uri() + ": no such bucket at " +
                         std::string(endpoint))
        .WithDetail(ErrorDetail::kNoSuchBucket);
  }
  if (e.code == "NoSuchKey") return NotFoundError(what + ": no such object");
  if (e.code == "NoSuchUpload") return NotFoundError(what + ": no such upload");
  switch (r.status) {
    case 404:  // HEAD: no body, so no telling a missing key from a missing bucket
      return NotFoundError(what + ": not found" + detail);
    case 403:
      return InvalidArgumentError(what + ": access denied" + detail);
    case 412:
      return FailedPreconditionError(what + ": precondition failed" + detail);
    case 409:
      if (e.code == "BucketAlreadyExists") return AlreadyExistsError(what + ": bucket" + detail);
      return FailedPreconditionError(what + ": conflict" + detail);
    case 501:
      return UnimplementedError(what + ": not implemented by the server" + detail);
    default:
      if (r.status >= 500) return UnavailableError(what + ": server error" + detail);
      return InvalidArgumentError(what + ": request refused" + detail);
  }
}

}  // namespace shardsafe
