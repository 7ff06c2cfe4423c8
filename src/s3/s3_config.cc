// S3Config from the AWS_* environment variables, and its secret-free text.
#include <cstdlib>

#include "s3/s3_client.h"

namespace shardsafe {
namespace {

std::string Env(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr ? "" : v;
}

std::string FirstEnv(const char* a, const char* b) {
  std::string v = Env(a);
  return v.empty() ? Env(b) : v;
}

// The region becomes part of curl's "aws:amz:REGION:s3" and of host names.
bool IsValidRegion(std::string_view r) {
  if (r.empty()) return false;
  for (char c : r) {
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-')) return false;
  }
  return true;
}

bool IsHttpUrl(std::string_view url) {
  size_t host = url.starts_with("http://") ? 7 : url.starts_with("https://") ? 8 : 0;
  return host != 0 && url.size() > host && url[host] != '/';
}

}  // namespace

Result<S3Config> S3Config::FromEnvironment() {
  S3Config c;
  c.access_key_id = Env("AWS_ACCESS_KEY_ID");
  c.secret_access_key = Env("AWS_SECRET_ACCESS_KEY");
  c.session_token = Env("AWS_SESSION_TOKEN");
  std::string region = FirstEnv("AWS_REGION", "AWS_DEFAULT_REGION");
  if (!region.empty()) c.region = region;
  c.endpoint = FirstEnv("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL");
  while (c.endpoint.ends_with('/')) c.endpoint.pop_back();
  c.path_style = !c.endpoint.empty();
  SS_RETURN_IF_ERROR(c.Validate());
  return c;
}

Status S3Config::Validate() const {
  if (access_key_id.empty() || secret_access_key.empty()) {
    return InvalidArgumentError(
        "S3 credentials missing: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY");
  }
  if (!IsValidRegion(region)) {
    return InvalidArgumentError("S3 region \"" + region + "\" (AWS_REGION) is not a region name");
  }
  if (!endpoint.empty() && !IsHttpUrl(endpoint)) {
    return InvalidArgumentError("S3 endpoint \"" + endpoint +
                                "\" (AWS_ENDPOINT_URL_S3 / AWS_ENDPOINT_URL) is not an "
                                "http:// or https:// URL");
  }
  return Status::Ok();
}

std::string S3Config::ToString() const {
  std::string s = "S3 endpoint ";
  s += endpoint.empty() ? "AWS" : endpoint;
  s += path_style ? " (path-style)" : " (virtual-hosted)";
  s += ", region " + region;
  s += access_key_id.empty() || secret_access_key.empty() ? ", no credentials"
                                                          : ", credentials set";
  if (!session_token.empty()) s += ", session token set";
  return s;
}

}  // namespace shardsafe
