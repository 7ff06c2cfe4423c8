// Request URLs: path-style (ENDPOINT/bucket/key) or virtual-hosted
// (bucket.HOST/key), with the key and query encoded by the SigV4 rules and
// the query sorted by name, so that the URL is already in the canonical
// form SigV4 signs (curl 7.88 signs the path and query as sent). Pure.
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "s3/s3_client.h"

namespace shardsafe {

using QueryParams = std::vector<std::pair<std::string, std::string>>;

// The URL of `key` in `bucket` ("" for the bucket itself) with `query`
// ("uploads" with an empty value becomes "uploads=", SigV4's form).
std::string S3Url(const S3Config& config, std::string_view bucket, std::string_view key,
                  QueryParams query);

}  // namespace shardsafe
