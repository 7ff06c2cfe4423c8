// The encodings S3 requests and responses use: SigV4 URI encoding of keys
// and query values, the URL decoding of ListObjectsV2 with
// encoding-type=url, S3 and HTTP dates, and checksum header values. Each
// delegates to a library (libcurl, OpenSSL, libc). Thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace shardsafe {

// Percent-encodes every byte but the unreserved A-Z a-z 0-9 - . _ ~ (the
// SigV4 rule, uppercase hex); UriEncodePath keeps '/' too, as SigV4 does
// for an S3 object's path.
std::string UriEncode(std::string_view s);
std::string UriEncodePath(std::string_view key);

// Percent-decodes (encoding-type=url responses); "+" stays "+".
std::string UriDecode(std::string_view s);

// Seconds since the epoch of "2024-05-01T12:34:56.000Z" (ListObjectsV2,
// ListMultipartUploads) or of an HTTP date (Last-Modified); 0 when it does
// not parse.
int64_t ParseIso8601(std::string_view text);
int64_t ParseHttpDate(const std::string& text);

}  // namespace shardsafe
