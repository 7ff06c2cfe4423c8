// S3 request URLs in SigV4's canonical form.
#include "s3/s3_url.h"

#include <algorithm>

#include "s3/s3_encoding.h"

namespace shardsafe {
namespace {

// "https://bucket.s3.REGION.amazonaws.com", "http://host:port/bucket", ...
std::string BaseUrl(const S3Config& config, std::string_view bucket) {
  if (bucket.empty()) return config.endpoint;
  if (config.endpoint.empty()) {
    std::string aws = "s3." + config.region + ".amazonaws.com";
    // Dotted bucket names do not match the wildcard TLS certificate.
    if (config.path_style || bucket.find('.') != std::string_view::npos) {
      return "https://" + aws + "/" + std::string(bucket);
    }
    return "https://" + std::string(bucket) + "." + aws;
  }
  if (config.path_style) return config.endpoint + "/" + std::string(bucket);
  size_t host = config.endpoint.find("://") + 3;
  return config.endpoint.substr(0, host) + std::string(bucket) + "." +
         config.endpoint.substr(host);
}

std::string QueryString(QueryParams query) {
  for (auto& [name, value] : query) {
    name = UriEncode(name);
    value = UriEncode(value);
  }
  std::sort(query.begin(), query.end());
  std::string out;
  for (const auto& [name, value] : query) {
    out += (out.empty() ? "?" : "&") + name + "=" + value;
  }
  return out;
}

}  // namespace

std::string S3Url(const S3Config& config, std::string_view bucket, std::string_view key,
                  QueryParams query) {
  // The bucket itself is "/" under its base ("http://host/bucket/").
  return BaseUrl(config, bucket) + "/" + UriEncodePath(key) + QueryString(std::move(query));
}

}  // namespace shardsafe
