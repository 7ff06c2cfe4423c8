// CurlS3Client's object calls: Put, Head, GetRange, Get, List, Delete.
#include "s3/curl_s3_client.h"

#include <cinttypes>
#include <cstdio>

#include "s3/s3_encoding.h"
#include "s3/s3_xml.h"

namespace shardsafe {
namespace {

constexpr char kOctetStream[] = "Content-Type: application/octet-stream";

// Checks "Content-Range: bytes FIRST-LAST/TOTAL" against the range asked for.
Status CheckContentRange(const S3Target& target, const HttpResponse& r, uint64_t offset,
                         size_t n) {
  uint64_t first = 0, last = 0, total = 0;
  std::string header = r.Header("content-range");
  if (std::sscanf(header.c_str(), "bytes %" SCNu64 "-%" SCNu64 "/%" SCNu64, &first, &last,
                  &total) != 3) {
    return DataLossError(target.Describe() + ": bad Content-Range \"" + header + "\"");
  }
  if (first != offset || last < first) {
    return DataLossError(target.Describe() + ": asked for bytes from " + std::to_string(offset) +
                         ", got Content-Range \"" + header + "\"");
  }
  if (last != offset + n - 1) {
    return DataLossError(target.Describe() + ": object ends at byte " + std::to_string(total) +
                         ", before " + std::to_string(offset + n));
  }
  return Status::Ok();
}

}  // namespace

Result<std::unique_ptr<S3Client>> S3Client::Create(const S3Config& config) {
  SS_RETURN_IF_ERROR(config.Validate());
  return std::unique_ptr<S3Client>(new CurlS3Client(config));
}

Result<std::string> ResponseETag(const S3Target& target, const HttpResponse& r) {
  std::string etag = r.Header("etag");
  if (etag.empty()) return DataLossError(target.Describe() + ": response without an ETag");
  return etag;
}

Result<HttpResponse> CurlS3Client::Send(const S3Target& target, const HttpRequest& request,
                                        const BodySink& sink) {
  SS_ASSIGN_OR_RETURN(HttpResponse r, SendRaw(target, request, sink));
  if (!r.ok()) return ResponseError(target, r, Endpoint());
  return r;
}

Result<std::string> CurlS3Client::Put(const S3Location& at, std::span<const char> data,
                                      const PutOptions& options) {
  HttpRequest req{"PUT", Url(at), {kOctetStream}, data};
  if (options.if_none_match) req.headers.push_back("If-None-Match: *");
  if (options.if_match) req.headers.push_back("If-Match: " + *options.if_match);
  if (options.crc32c) {
    req.headers.push_back("x-amz-checksum-crc32c: " + Crc32cHeaderValue(*options.crc32c));
  }
  S3Target target{at};
  SS_ASSIGN_OR_RETURN(HttpResponse r, Send(target, req));
  return ResponseETag(target, r);
}

Result<ObjectInfo> CurlS3Client::Head(const S3Location& at) {
  S3Target target{at};
  SS_ASSIGN_OR_RETURN(HttpResponse r, Send(target, {"HEAD", Url(at)}));
  std::string length = r.Header("content-length");
  if (length.empty()) return DataLossError(at.uri() + ": HEAD without a Content-Length");
  ObjectInfo info{at.key, std::stoull(length), r.Header("etag"),
                  ParseHttpDate(r.Header("last-modified"))};
  return info;
}

Status CurlS3Client::GetRange(const S3Location& at, uint64_t offset, void* dst, size_t n) {
  if (n == 0) return Status::Ok();
  S3Target target{at};
  std::string range = std::to_string(offset) + "-" + std::to_string(offset + n - 1);
  HttpRequest req{"GET", Url(at), {"Range: bytes=" + range}};
  SS_ASSIGN_OR_RETURN(HttpResponse r, SendRaw(target, req, {static_cast<char*>(dst), n}));
  if (r.status == 416) {
    return DataLossError(at.uri() + ": object ends before byte " + std::to_string(offset + n));
  }
  if (!r.ok()) return ResponseError(target, r, Endpoint());
  if (r.overflow) {
    return DataLossError(at.uri() + ": more than the " + std::to_string(n) + " bytes asked for");
  }
  if (r.status != 206) {
    return DataLossError(at.uri() + ": HTTP " + std::to_string(r.status) +
                         " to a range request, not 206");
  }
  SS_RETURN_IF_ERROR(CheckContentRange(target, r, offset, n));
  if (r.body_bytes != n) {
    return DataLossError(at.uri() + ": " + std::to_string(r.body_bytes) + " bytes of the " +
                         std::to_string(n) + " asked for");
  }
  return Status::Ok();
}

Result<std::string> CurlS3Client::Get(const S3Location& at, uint64_t max_bytes,
                                      std::string* etag) {
  S3Target target{at};
  SS_ASSIGN_OR_RETURN(HttpResponse r, Send(target, {"GET", Url(at)}, {nullptr, 0, max_bytes}));
  if (r.overflow) {
    return ResourceExhaustedError(at.uri() + ": object larger than the limit of " +
                                  std::to_string(max_bytes) + " bytes");
  }
  if (etag != nullptr) *etag = r.Header("etag");
  return std::move(r.body);
}

Result<Listing> CurlS3Client::List(const std::string& bucket, const std::string& prefix,
                                   std::string_view delimiter) {
  S3Target target{{bucket, prefix}};
  Listing out;
  std::string token;
  do {
    QueryParams query{{"list-type", "2"},
                      {"encoding-type", "url"},
                      {"max-keys", std::to_string(config().list_page_size)},
                      {"prefix", prefix}};
    if (!delimiter.empty()) query.emplace_back("delimiter", std::string(delimiter));
    if (!token.empty()) query.emplace_back("continuation-token", token);
    SS_ASSIGN_OR_RETURN(HttpResponse r, Send(target, {"GET", Url({bucket, ""}, query)}));
    Result<ObjectsPage> page = ParseListObjectsV2(r.body);
    if (!page.ok()) return page.status().WithContext("listing " + target.Describe());
    for (ObjectInfo& o : page->objects) out.objects.push_back(std::move(o));
    for (std::string& p : page->common_prefixes) out.common_prefixes.push_back(std::move(p));
    token = page->truncated ? page->next_continuation_token : "";
  } while (!token.empty());
  return out;
}

Status CurlS3Client::Delete(const S3Location& at) {
  S3Target target{at};
  SS_ASSIGN_OR_RETURN(HttpResponse r, SendRaw(target, {"DELETE", Url(at)}));
  if (r.ok() || (r.status == 404 && ParseErrorBody(r.body).code == "NoSuchKey")) {
    return Status::Ok();
  }
  return ResponseError(target, r, Endpoint());
}

}  // namespace shardsafe
