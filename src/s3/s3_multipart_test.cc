// Multipart uploads against moto: three parts (moto, like S3, refuses
// non-last parts under 5 MiB), completion with If-None-Match, abort,
// listing of uploads in progress, and the CRC-32C header of every PUT and
// part checked against the bytes the proxy received.
#include <fstream>
#include <set>
#include <iterator>

#include "base/crc32c.h"
#include "gtest/gtest.h"
#include "testing/s3_test_util.h"

namespace shardsafe {
namespace {

using testing::IsOk;
using testing::RandomBytes;

constexpr size_t kMiB = size_t{1} << 20;

class S3MultipartTest : public testing::S3ServerTest {
 protected:
  // Uploads `parts` as parts 1..N of a new upload of `key`; returns the
  // upload id and fills `completed`.
  std::string UploadParts(const std::string& key, const std::vector<std::string>& parts,
                          std::vector<CompletedPart>* completed) {
    Result<std::string> id = client_->CreateMultipartUpload(At(key), /*crc32c_parts=*/true);
    EXPECT_TRUE(IsOk(id));
    if (!id.ok()) return "";
    for (size_t i = 0; i < parts.size(); ++i) {
      uint32_t crc = Crc32c(parts[i].data(), parts[i].size());
      int number = static_cast<int>(i) + 1;
      Result<std::string> etag = client_->UploadPart(At(key), *id, number, parts[i], crc);
      EXPECT_TRUE(IsOk(etag));
      completed->push_back({number, etag.ok() ? *etag : "", crc});
    }
    return *id;
  }

  static std::vector<std::string> ThreeParts(uint64_t seed) {
    return {RandomBytes(5 * kMiB, seed), RandomBytes(5 * kMiB, seed + 1),
            RandomBytes(kMiB + 17, seed + 2)};
  }

  std::vector<std::string> UploadIds(const std::string& prefix) {
    Result<std::vector<MultipartUpload>> uploads = client_->ListMultipartUploads(kBucket, prefix);
    EXPECT_TRUE(IsOk(uploads));
    std::vector<std::string> ids;
    if (uploads.ok()) {
      for (const MultipartUpload& u : *uploads) ids.push_back(u.upload_id);
    }
    return ids;
  }
};

TEST_F(S3MultipartTest, ThreePartsRoundTrip) {
  std::vector<std::string> parts = ThreeParts(10);
  std::vector<CompletedPart> completed;
  std::string id = UploadParts("mp/data", parts, &completed);
  ASSERT_FALSE(id.empty());
  EXPECT_EQ(UploadIds("mp/"), std::vector<std::string>{id});
  Result<std::string> etag = client_->CompleteMultipartUpload(At("mp/data"), id, completed, true);
  S3_ASSERT_OK(etag);
  EXPECT_EQ(*etag, MultipartETag(completed));  // the server's own: MD5 of the MD5s, "-3"
  Result<std::string> got = client_->Get(At("mp/data"), 20 * kMiB, nullptr);
  S3_ASSERT_OK(got);
  EXPECT_TRUE(*got == parts[0] + parts[1] + parts[2]);
  EXPECT_TRUE(UploadIds("mp/").empty());
  // A range across the boundary of parts 1 and 2.
  std::string dst(100, '\0');
  S3_ASSERT_OK(client_->GetRange(At("mp/data"), 5 * kMiB - 50, dst.data(), dst.size()));
  EXPECT_TRUE(dst == (parts[0] + parts[1]).substr(5 * kMiB - 50, 100));
}

TEST_F(S3MultipartTest, CompleteWithIfNoneMatchOnAnExistingKeyFails) {
  S3_ASSERT_OK(client_->Put(At("mp/taken"), std::string("already here"), {}));
  std::vector<CompletedPart> completed;
  std::string id = UploadParts("mp/taken", ThreeParts(20), &completed);
  Result<std::string> etag = client_->CompleteMultipartUpload(At("mp/taken"), id, completed, true);
  EXPECT_EQ(etag.status().code(), StatusCode::kFailedPrecondition) << etag.status().ToString();
  EXPECT_NE(etag.status().message().find("s3://shardsafe-test/mp/taken"), std::string::npos);
  EXPECT_EQ(*client_->Get(At("mp/taken"), 100, nullptr), "already here");
  S3_EXPECT_OK(client_->AbortMultipartUpload(At("mp/taken"), id));
}

TEST_F(S3MultipartTest, AbortRemovesTheUpload) {
  std::vector<CompletedPart> completed;
  std::string id = UploadParts("mp/abandoned", {RandomBytes(1000, 30)}, &completed);
  std::string other = UploadParts("elsewhere/x", {RandomBytes(10, 31)}, &completed);
  EXPECT_EQ(UploadIds("mp/"), std::vector<std::string>{id});
  S3_ASSERT_OK(client_->AbortMultipartUpload(At("mp/abandoned"), id));
  EXPECT_TRUE(UploadIds("mp/").empty());
  EXPECT_EQ(UploadIds(""), std::vector<std::string>{other});
  S3_EXPECT_OK(client_->AbortMultipartUpload(At("mp/abandoned"), id));  // already gone
  // S3 answers 404 NoSuchUpload to a call on an aborted upload; moto fails
  // with a 500, so the proxy answers for it.
  Proxy("fail 404 NoSuchUpload 1 POST");
  Result<std::string> late =
      client_->CompleteMultipartUpload(At("mp/abandoned"), id, completed, false);
  EXPECT_EQ(late.status().code(), StatusCode::kNotFound);
  EXPECT_EQ(late.status().message(),
            "s3://shardsafe-test/mp/abandoned (upload " + id + "): no such upload");
  EXPECT_EQ(client_->Head(At("mp/abandoned")).status().code(), StatusCode::kNotFound);
}

// A completion the server did but whose answer was lost is retried; S3
// answers the retry NoSuchUpload (moto a 500, so the proxy answers for it).
// The object at the key has the ETag the parts make, so the completion
// succeeds; where the key holds another object, it does not.
TEST_F(S3MultipartTest, ACompletionWhoseAnswerWasLostSucceedsOnItsRetry) {
  std::vector<std::string> parts = ThreeParts(40);
  std::vector<CompletedPart> completed;
  std::string id = UploadParts("mp/lost", parts, &completed);
  ASSERT_FALSE(id.empty());
  Proxy("lose 1 POST uploadId=");
  Proxy("fail 404 NoSuchUpload 1 POST uploadId=");
  Result<std::string> etag = client_->CompleteMultipartUpload(At("mp/lost"), id, completed, false);
  S3_ASSERT_OK(etag);
  Result<ObjectInfo> head = client_->Head(At("mp/lost"));
  S3_ASSERT_OK(head);
  EXPECT_EQ(*etag, head->etag);
  Result<std::string> got = client_->Get(At("mp/lost"), 20 * kMiB, nullptr);
  S3_ASSERT_OK(got);
  EXPECT_TRUE(*got == parts[0] + parts[1] + parts[2]);

  std::vector<CompletedPart> other;
  std::string other_id = UploadParts("mp/lost", {RandomBytes(5 * kMiB, 50)}, &other);
  Proxy("fail 404 NoSuchUpload 1 POST uploadId=");
  Result<std::string> late =
      client_->CompleteMultipartUpload(At("mp/lost"), other_id, other, false);
  EXPECT_EQ(late.status().code(), StatusCode::kNotFound) << late.status().ToString();
  S3_EXPECT_OK(client_->AbortMultipartUpload(At("mp/lost"), other_id));
}

// moto ignores max-uploads (one page always), so this checks the listing,
// not its paging.
TEST_F(S3MultipartTest, ListsEveryUploadUnderThePrefix) {
  std::set<std::string> ids;
  for (int i = 0; i < 5; ++i) {
    Result<std::string> id =
        client_->CreateMultipartUpload(At("pages/k" + std::to_string(i)), false);
    S3_ASSERT_OK(id);
    ids.insert(*id);
  }
  S3_ASSERT_OK(client_->CreateMultipartUpload(At("pagesnot/k"), false));
  Result<std::vector<MultipartUpload>> uploads = client_->ListMultipartUploads(kBucket, "pages/");
  S3_ASSERT_OK(uploads);
  std::set<std::string> listed;
  for (const MultipartUpload& u : *uploads) {
    listed.insert(u.upload_id);
    EXPECT_TRUE(u.key.starts_with("pages/k")) << u.key;
    EXPECT_GT(u.initiated_seconds, 0);  // moto reports a fixed date in 2010
  }
  EXPECT_EQ(listed, ids);
}

TEST_F(S3MultipartTest, Crc32cHeaderOfEveryPutAndPartMatchesTheBodyReceived) {
  std::vector<CompletedPart> completed;
  std::string id = UploadParts("crc/multi", ThreeParts(40), &completed);
  S3_ASSERT_OK(client_->CompleteMultipartUpload(At("crc/multi"), id, completed, false));
  for (int i = 0; i < 3; ++i) {
    std::string data = RandomBytes(1000 + i, 50 + i);
    PutOptions options;
    options.crc32c = Crc32c(data.data(), data.size());
    S3_ASSERT_OK(client_->Put(At("crc/single" + std::to_string(i)), data, options));
  }
  size_t checked = 0;
  for (const testing::ProxyRequest& r : ProxyLog()) {
    if (r.method != "PUT" || r.body_bytes == 0 || r.target.find("/crc/") == std::string::npos) {
      continue;
    }
    std::ifstream in(r.body_file, std::ios::binary);
    std::string body((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    ASSERT_EQ(body.size(), r.body_bytes) << r.target;
    EXPECT_EQ(r.crc32c, Crc32cHeaderValue(Crc32c(body.data(), body.size()))) << r.target;
    ++checked;
  }
  EXPECT_EQ(checked, 6u);  // three parts, three objects
}

}  // namespace
}  // namespace shardsafe
