// One HTTP exchange with an S3 endpoint over libcurl, signed with SigV4 by
// curl itself (CURLOPT_AWS_SIGV4 "aws:amz:REGION:s3"), on easy handles kept
// in a pool so that connections are reused across requests.
//
// Every request carries x-amz-content-sha256: UNSIGNED-PAYLOAD. S3 refuses a
// SigV4 request without that header; curl 7.88 adds it itself only where it
// guesses the service is S3 and takes a value already set instead, so it is
// set here, once, for every method. Payload integrity comes from
// x-amz-checksum-crc32c, which callers add. curl signs every header passed
// to it (x-amz-*, If-Match, Range, ...), as S3 requires of x-amz-* headers.
// curl 7.88 also signs a header given as "Name:" to suppress one of its own
// (such as "Expect:") and then does not send it, which breaks the
// signature: so none is given, and uploads over 1 MiB go with curl's
// Expect: 100-continue, which S3 answers (a refused upload then costs no
// body).
//
// No verbose output and no URL or credential in any error text: curl's own
// messages name host and port only.
//
// Thread-safe: Perform may be called from many threads; each call takes a
// handle from the pool (or makes one) and gives it back.
#pragma once

#include <curl/curl.h>

#include <cstdint>
#include <map>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "s3/s3_client.h"

namespace shardsafe {

struct HttpRequest {
  HttpRequest(const char* method, std::string url, std::vector<std::string> headers = {},
              std::span<const char> body = {})
      : method(method), url(std::move(url)), headers(std::move(headers)), body(body) {}
  const char* method;  // GET, HEAD, PUT, POST, DELETE
  std::string url;             // absolute, already encoded
  std::vector<std::string> headers;  // "Name: value"
  std::span<const char> body;        // PUT and POST; the caller keeps it alive
  // CompleteMultipartUpload may fail after a 200 header with an <Error> body.
  bool error_in_200 = false;
};

// Where the body of a 2xx response goes: into `buffer` (at most `capacity`
// bytes) or, when `buffer` is null, into HttpResponse::body (at most
// `limit` bytes). Past either the transfer stops with overflow set.
struct BodySink {
  char* buffer = nullptr;
  size_t capacity = 0;
  uint64_t limit = uint64_t{64} << 20;
};

struct HttpResponse {
  long status = 0;
  std::map<std::string, std::string> headers;  // lowercase names
  std::string body;  // a 2xx body sent to no buffer, or a non-2xx one (first 64 KiB)
  uint64_t body_bytes = 0;  // 2xx body bytes received
  bool overflow = false;    // a 2xx body exceeded its sink
  bool ok() const { return status >= 200 && status < 300; }
  // The value of header `name` (lowercase), "" when absent.
  std::string Header(const std::string& name) const;
};

// The outcome of one try: `code` is CURLE_OK when `response` came in whole
// (whatever its status), else curl's code and description.
struct HttpAttempt {
  CURLcode code = CURLE_OK;
  std::string error;
  HttpResponse response;
};

class CurlPool {
 public:
  explicit CurlPool(const S3Config& config);  // `config` outlives the pool
  ~CurlPool();
  CurlPool(const CurlPool&) = delete;
  CurlPool& operator=(const CurlPool&) = delete;

  HttpAttempt Perform(const HttpRequest& request, const BodySink& sink);

 private:
  CURL* Acquire();
  void Release(CURL* handle);

  const S3Config& config_;
  std::string sigv4_;  // "aws:amz:REGION:s3"
  std::mutex mu_;
  std::vector<CURL*> idle_;
};

}  // namespace shardsafe
