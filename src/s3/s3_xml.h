// The XML documents of the S3 API, read and written with pugixml: error
// bodies, ListObjectsV2 and ListMultipartUploads pages, the results of
// CreateMultipartUpload and CompleteMultipartUpload, and the request bodies
// of CompleteMultipartUpload and CreateBucket.
//
// The parsers return DataLoss ("malformed ... response: why") for a body
// that is not the document expected; callers add the object's name.
// Pure functions; thread-safe.
#pragma once

#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "s3/s3_client.h"

namespace shardsafe {

// <Error><Code>..</Code><Message>..</Message></Error>; both empty when the
// body is not one (a HEAD response, a proxy's HTML page).
struct S3ErrorBody {
  std::string code;
  std::string message;
};
S3ErrorBody ParseErrorBody(std::string_view body);

// One ListObjectsV2 page. Keys and prefixes are decoded when the response
// says EncodingType url.
struct ObjectsPage {
  std::vector<ObjectInfo> objects;
  std::vector<std::string> common_prefixes;
  bool truncated = false;
  std::string next_continuation_token;
};
Result<ObjectsPage> ParseListObjectsV2(std::string_view body);

struct UploadsPage {
  std::vector<MultipartUpload> uploads;
  bool truncated = false;
  std::string next_key_marker;
  std::string next_upload_id_marker;
};
Result<UploadsPage> ParseListMultipartUploads(std::string_view body);

// InitiateMultipartUploadResult's UploadId.
Result<std::string> ParseUploadId(std::string_view body);
// CompleteMultipartUploadResult's ETag.
Result<std::string> ParseCompletedETag(std::string_view body);

// <CompleteMultipartUpload> listing each part's number, ETag and, when
// given, ChecksumCRC32C.
std::string CompleteMultipartUploadBody(std::span<const CompletedPart> parts);
// <CreateBucketConfiguration> with the region; "" for us-east-1, which
// takes no location constraint.
std::string CreateBucketBody(const std::string& region);

}  // namespace shardsafe
