// s3://bucket/key URIs: parsing and the bucket-name rules S3 enforces.
#include <algorithm>

#include "s3/s3_client.h"

namespace shardsafe {
namespace {

constexpr std::string_view kScheme = "s3://";

bool IsLowerAlnum(char c) { return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9'); }

// S3's rules for new buckets: 3-63 characters of [a-z0-9.-], starting and
// ending with a letter or digit, no "..".
bool IsValidBucketName(std::string_view b) {
  if (b.size() < 3 || b.size() > 63) return false;
  if (!IsLowerAlnum(b.front()) || !IsLowerAlnum(b.back())) return false;
  if (b.find("..") != std::string_view::npos) return false;
  return std::all_of(b.begin(), b.end(),
                     [](char c) { return IsLowerAlnum(c) || c == '.' || c == '-'; });
}

// Empty, "." and ".." segments would name the same object two ways (or
// none), and servers normalise them differently.
bool HasBadSegment(std::string_view key) {
  size_t start = 0;
  while (start <= key.size()) {
    size_t end = std::min(key.find('/', start), key.size());
    std::string_view segment = key.substr(start, end - start);
    if (segment.empty() || segment == "." || segment == "..") return true;
    start = end + 1;
  }
  return false;
}

}  // namespace

std::string S3Location::uri() const {
  return std::string(kScheme) + bucket + (key.empty() ? "" : "/" + key);
}

bool IsS3Uri(std::string_view path) { return path.starts_with(kScheme); }

Result<S3Location> ParseS3Uri(std::string_view uri) {
  auto bad = [&](std::string_view why) {
    return InvalidArgumentError("\"" + std::string(uri) + "\": " + std::string(why));
  };
  if (!IsS3Uri(uri)) return bad("not an s3:// URI");
  if (uri.find('\0') != std::string_view::npos) return bad("contains a NUL byte");
  std::string_view rest = uri.substr(kScheme.size());
  size_t slash = rest.find('/');
  S3Location at{std::string(rest.substr(0, slash)), ""};
  if (at.bucket.empty()) return bad("no bucket");
  if (!IsValidBucketName(at.bucket)) return bad("not a valid S3 bucket name");
  if (slash == std::string_view::npos) return at;
  std::string_view key = rest.substr(slash + 1);
  if (key.ends_with('/')) key.remove_suffix(1);
  if (!key.empty() && HasBadSegment(key)) return bad("empty, \".\" or \"..\" path segment");
  at.key = std::string(key);
  return at;
}

}  // namespace shardsafe
