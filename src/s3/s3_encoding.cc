// The encodings S3 uses, by libcurl (escaping, HTTP dates), OpenSSL
// (base64, MD5, hex) and libc (ISO 8601 dates).
#include "s3/s3_encoding.h"

#include <curl/curl.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>

#include <algorithm>
#include <cctype>
#include <ctime>
#include <memory>

#include "s3/s3_client.h"

namespace shardsafe {
namespace {

struct CurlFree {
  void operator()(char* p) const { curl_free(p); }
};

}  // namespace

std::string UriEncode(std::string_view s) {
  if (s.empty()) return "";  // curl_easy_escape takes length 0 for strlen()
  // libcurl >= 7.82 ignores the handle; it keeps exactly the unreserved set.
  std::unique_ptr<char, CurlFree> out(
      curl_easy_escape(nullptr, s.data(), static_cast<int>(s.size())));
  return out ? std::string(out.get()) : std::string();
}

std::string UriEncodePath(std::string_view key) {
  std::string out;
  size_t start = 0;
  while (true) {
    size_t slash = key.find('/', start);
    out += UriEncode(key.substr(start, slash - start));
    if (slash == std::string_view::npos) return out;
    out += '/';
    start = slash + 1;
  }
}

std::string UriDecode(std::string_view s) {
  if (s.empty()) return "";
  int n = 0;
  std::unique_ptr<char, CurlFree> out(
      curl_easy_unescape(nullptr, s.data(), static_cast<int>(s.size()), &n));
  return out ? std::string(out.get(), static_cast<size_t>(n)) : std::string();
}

int64_t ParseIso8601(std::string_view text) {
  std::tm tm{};
  std::string s(text.substr(0, 19));  // fractional seconds and 'Z' ignored: UTC
  if (strptime(s.c_str(), "%Y-%m-%dT%H:%M:%S", &tm) == nullptr) return 0;
  return static_cast<int64_t>(timegm(&tm));
}

int64_t ParseHttpDate(const std::string& text) {
  time_t t = curl_getdate(text.c_str(), nullptr);
  return t < 0 ? 0 : static_cast<int64_t>(t);
}

std::string Crc32cHeaderValue(uint32_t crc) {
  const unsigned char be[4] = {static_cast<unsigned char>(crc >> 24),
                               static_cast<unsigned char>(crc >> 16),
                               static_cast<unsigned char>(crc >> 8),
                               static_cast<unsigned char>(crc)};
  unsigned char out[9];  // 4 bytes -> 8 characters and a NUL
  int n = EVP_EncodeBlock(out, be, sizeof(be));
  return std::string(reinterpret_cast<char*>(out), static_cast<size_t>(n));
}

std::string MultipartETag(std::span<const CompletedPart> parts) {
  constexpr size_t kMd5 = 16;
  std::string md5s(parts.size() * kMd5, '\0');
  for (size_t i = 0; i < parts.size(); ++i) {
    std::string hex = parts[i].etag;
    if (hex.size() == 2 * kMd5 + 2 && hex.front() == '"' && hex.back() == '"') {
      hex = hex.substr(1, 2 * kMd5);
    }
    size_t n = 0;
    auto* dst = reinterpret_cast<unsigned char*>(md5s.data() + i * kMd5);
    if (hex.size() != 2 * kMd5 || OPENSSL_hexstr2buf_ex(dst, kMd5, &n, hex.c_str(), '\0') != 1) {
      return "";
    }
  }
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int n = 0;
  if (EVP_Digest(md5s.data(), md5s.size(), digest, &n, EVP_md5(), nullptr) != 1) return "";
  char hex[2 * EVP_MAX_MD_SIZE + 1];
  size_t written = 0;
  if (OPENSSL_buf2hexstr_ex(hex, sizeof hex, &written, digest, n, '\0') != 1) return "";
  std::string out(hex);  // uppercase; S3 writes ETags in lowercase
  std::transform(out.begin(), out.end(), out.begin(), [](unsigned char c) { return std::tolower(c); });
  return "\"" + out + "-" + std::to_string(parts.size()) + "\"";
}

}  // namespace shardsafe
