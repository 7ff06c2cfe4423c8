// CurlPool: libcurl easy handles, reset and reused per request (a reset
// keeps the handle's live connections), and the callbacks that move bytes.
#include "s3/curl_transport.h"

#include <algorithm>
#include <cctype>
#include <cstring>
#include <memory>

namespace shardsafe {
namespace {

constexpr size_t kMaxErrorBody = 64 << 10;

// The state of one transfer, shared with curl's callbacks.
struct Transfer {
  CURL* curl;
  const BodySink& sink;
  std::span<const char> upload;
  size_t upload_pos = 0;
  HttpResponse response;
};

size_t OnHeader(char* data, size_t size, size_t n, void* user) {
  auto* t = static_cast<Transfer*>(user);
  std::string_view line(data, size * n);
  if (line.starts_with("HTTP/")) {  // a new response (after a 100 or a redirect)
    t->response.headers.clear();
    return size * n;
  }
  size_t colon = line.find(':');
  if (colon == std::string_view::npos) return size * n;
  std::string name(line.substr(0, colon));
  std::transform(name.begin(), name.end(), name.begin(),
                 [](unsigned char c) { return std::tolower(c); });
  std::string_view value = line.substr(colon + 1);
  auto space = [](char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n'; };
  while (!value.empty() && space(value.front())) value.remove_prefix(1);
  while (!value.empty() && space(value.back())) value.remove_suffix(1);
  t->response.headers[name] = std::string(value);
  return size * n;
}

size_t OnBody(char* data, size_t size, size_t n, void* user) {
  auto* t = static_cast<Transfer*>(user);
  size_t bytes = size * n;
  HttpResponse& r = t->response;
  curl_easy_getinfo(t->curl, CURLINFO_RESPONSE_CODE, &r.status);
  if (!r.ok()) {  // an error document: keep its start
    r.body.append(data, std::min(bytes, kMaxErrorBody - std::min(kMaxErrorBody, r.body.size())));
    return bytes;
  }
  const BodySink& sink = t->sink;
  uint64_t room = sink.buffer != nullptr ? sink.capacity : sink.limit;
  if (r.body_bytes + bytes > room) {
    r.overflow = true;
    return 0;  // stops the transfer (CURLE_WRITE_ERROR)
  }
  if (sink.buffer != nullptr) {
    std::memcpy(sink.buffer + r.body_bytes, data, bytes);
  } else {
    r.body.append(data, bytes);
  }
  r.body_bytes += bytes;
  return bytes;
}

size_t OnRead(char* dst, size_t size, size_t n, void* user) {
  auto* t = static_cast<Transfer*>(user);
  size_t bytes = std::min(size * n, t->upload.size() - t->upload_pos);
  std::memcpy(dst, t->upload.data() + t->upload_pos, bytes);
  t->upload_pos += bytes;
  return bytes;
}

// curl rewinds the upload to resend it (a reused connection found closed).
int OnSeek(void* user, curl_off_t offset, int origin) {
  auto* t = static_cast<Transfer*>(user);
  if (origin != SEEK_SET || offset < 0 || static_cast<size_t>(offset) > t->upload.size()) {
    return CURL_SEEKFUNC_CANTSEEK;
  }
  t->upload_pos = static_cast<size_t>(offset);
  return CURL_SEEKFUNC_OK;
}

void SetMethod(CURL* h, const HttpRequest& req, Transfer* t) {
  std::string_view m = req.method;
  if (m == "HEAD") {
    curl_easy_setopt(h, CURLOPT_NOBODY, 1L);
  } else if (m == "PUT") {
    curl_easy_setopt(h, CURLOPT_UPLOAD, 1L);
    curl_easy_setopt(h, CURLOPT_READFUNCTION, OnRead);
    curl_easy_setopt(h, CURLOPT_READDATA, t);
    curl_easy_setopt(h, CURLOPT_SEEKFUNCTION, OnSeek);
    curl_easy_setopt(h, CURLOPT_SEEKDATA, t);
    curl_easy_setopt(h, CURLOPT_INFILESIZE_LARGE, static_cast<curl_off_t>(req.body.size()));
  } else if (m == "POST") {
    curl_easy_setopt(h, CURLOPT_POST, 1L);
    curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(req.body.size()));
    curl_easy_setopt(h, CURLOPT_POSTFIELDS, req.body.empty() ? "" : req.body.data());
  } else if (m != "GET") {
    curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, req.method);
  }
}

curl_slist* RequestHeaders(const S3Config& config, const HttpRequest& request) {
  curl_slist* list = curl_slist_append(nullptr, "x-amz-content-sha256: UNSIGNED-PAYLOAD");
  if (!config.session_token.empty()) {
    list = curl_slist_append(list, ("x-amz-security-token: " + config.session_token).c_str());
  }
  for (const std::string& h : request.headers) list = curl_slist_append(list, h.c_str());
  return list;
}

// Every option of one transfer (a reset handle has none).
void Configure(CURL* h, const S3Config& config, const std::string& sigv4,
               const HttpRequest& request, Transfer* t, curl_slist* headers, char* error) {
  curl_easy_setopt(h, CURLOPT_URL, request.url.c_str());
  curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);    // many threads; no SIGALRM for timeouts
  curl_easy_setopt(h, CURLOPT_PATH_AS_IS, 1L);  // a key's "./" and "../" are literal
  curl_easy_setopt(h, CURLOPT_TCP_KEEPALIVE, 1L);
  curl_easy_setopt(h, CURLOPT_AWS_SIGV4, sigv4.c_str());
  curl_easy_setopt(h, CURLOPT_USERNAME, config.access_key_id.c_str());
  curl_easy_setopt(h, CURLOPT_PASSWORD, config.secret_access_key.c_str());
  curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS,
                   static_cast<long>(std::chrono::milliseconds(config.connect_timeout).count()));
  curl_easy_setopt(h, CURLOPT_LOW_SPEED_LIMIT, 1024L);
  curl_easy_setopt(h, CURLOPT_LOW_SPEED_TIME, static_cast<long>(config.low_speed_timeout.count()));
  SetMethod(h, request, t);
  curl_easy_setopt(h, CURLOPT_HTTPHEADER, headers);
  curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, OnHeader);
  curl_easy_setopt(h, CURLOPT_HEADERDATA, t);
  curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, OnBody);
  curl_easy_setopt(h, CURLOPT_WRITEDATA, t);
  curl_easy_setopt(h, CURLOPT_ERRORBUFFER, error);
}

std::once_flag curl_init_once;

}  // namespace

std::string HttpResponse::Header(const std::string& name) const {
  auto it = headers.find(name);
  return it == headers.end() ? "" : it->second;
}

CurlPool::CurlPool(const S3Config& config)
    : config_(config), sigv4_("aws:amz:" + config.region + ":s3") {
  std::call_once(curl_init_once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
}

CurlPool::~CurlPool() {
  for (CURL* h : idle_) curl_easy_cleanup(h);
}

CURL* CurlPool::Acquire() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!idle_.empty()) {
      CURL* h = idle_.back();
      idle_.pop_back();
      return h;
    }
  }
  return curl_easy_init();
}

void CurlPool::Release(CURL* handle) {
  std::lock_guard<std::mutex> lock(mu_);
  idle_.push_back(handle);
}

HttpAttempt CurlPool::Perform(const HttpRequest& request, const BodySink& sink) {
  HttpAttempt out;
  CURL* h = Acquire();
  if (h == nullptr) {
    out.code = CURLE_OUT_OF_MEMORY;
    out.error = "curl_easy_init failed";
    return out;
  }
  curl_easy_reset(h);
  Transfer t{h, sink, request.body, 0, {}};
  char error[CURL_ERROR_SIZE] = "";
  std::unique_ptr<curl_slist, decltype(&curl_slist_free_all)> headers(
      RequestHeaders(config_, request), curl_slist_free_all);
  Configure(h, config_, sigv4_, request, &t, headers.get(), error);
  out.code = curl_easy_perform(h);
  curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &t.response.status);
  // The handle must not point at this frame's buffers once it is back in the pool.
  curl_easy_setopt(h, CURLOPT_ERRORBUFFER, nullptr);
  curl_easy_setopt(h, CURLOPT_HTTPHEADER, nullptr);
  Release(h);
  if (out.code != CURLE_OK) {
    out.error = curl_easy_strerror(out.code);
    if (error[0] != '\0') out.error += std::string(": ") + error;
  }
  out.response = std::move(t.response);
  return out;
}

}  // namespace shardsafe
