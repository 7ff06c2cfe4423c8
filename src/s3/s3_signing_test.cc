// SigV4 signing by curl, checked three ways: moto started with --auth
// verifies every call's signature for an IAM user's keys and for a role
// session's temporary keys with x-amz-security-token; the proxy's own
// check (fault_proxy.py --secret, botocore's S3 signer over the raw
// request, as S3 canonicalises it) is on in every other S3 test, keys of
// any UTF-8 included, and refuses a wrong secret; and the proxy's log shows
// that every request declares x-amz-content-sha256: UNSIGNED-PAYLOAD and
// signs every x-amz-* and conditional header it sends (S3 refuses unsigned
// x-amz-* headers; moto does not check that).
//
// moto's check decodes and re-quotes the path first, and so refuses
// correctly signed keys and prefixes holding '+', '=', '!', '(' , a '/' in
// a query value or non-ASCII (boto3's requests too): the calls here use
// plain keys and prefixes without '/'.
#include <set>
#include <sstream>

#include "base/crc32c.h"
#include "gtest/gtest.h"
#include "testing/s3_test_util.h"

namespace shardsafe {
namespace {

using testing::IsOk;
using testing::RandomBytes;

class S3SigningTest : public testing::S3ServerTest {
 protected:
  void SetUp() override { StartServers({"--auth"}); }

  // A client of the proxy with other credentials.
  std::unique_ptr<S3Client> ClientWith(const std::string& key, const std::string& secret,
                                       const std::string& token) {
    S3Config c = config_;
    c.access_key_id = key;
    c.secret_access_key = secret;
    c.session_token = token;
    Result<std::unique_ptr<S3Client>> client = S3Client::Create(c);
    EXPECT_TRUE(IsOk(client));
    return client.ok() ? std::move(*client) : nullptr;
  }

  // Every call, with every optional header, through `client`.
  void ExerciseEveryCall(S3Client& client, const std::string& prefix) {
    std::string data = "signed bytes";
    uint32_t crc = Crc32c(data.data(), data.size());
    PutOptions create;
    create.if_none_match = true;
    create.crc32c = crc;
    Result<std::string> etag = client.Put(At(prefix + "key 1"), data, create);
    S3_ASSERT_OK(etag);
    PutOptions swap;
    swap.if_match = *etag;
    S3_ASSERT_OK(client.Put(At(prefix + "key 1"), data, swap));
    S3_ASSERT_OK(client.Head(At(prefix + "key 1")));
    char dst[4];
    S3_ASSERT_OK(client.GetRange(At(prefix + "key 1"), 2, dst, sizeof(dst)));
    S3_ASSERT_OK(client.Get(At(prefix + "key 1"), 100, nullptr));
    S3_ASSERT_OK(client.List(kBucket, prefix + "key", ""));
    Result<std::string> id = client.CreateMultipartUpload(At(prefix + "multi"), true);
    S3_ASSERT_OK(id);
    Result<std::string> part = client.UploadPart(At(prefix + "multi"), *id, 1, data, crc);
    S3_ASSERT_OK(part);
    S3_ASSERT_OK(client.ListMultipartUploads(kBucket, prefix));
    std::vector<CompletedPart> parts = {{1, *part, crc}};
    S3_ASSERT_OK(client.CompleteMultipartUpload(At(prefix + "multi"), *id, parts, true));
    Result<std::string> aborted = client.CreateMultipartUpload(At(prefix + "aborted"), false);
    S3_ASSERT_OK(aborted);
    S3_ASSERT_OK(client.AbortMultipartUpload(At(prefix + "aborted"), *aborted));
    S3_ASSERT_OK(client.Delete(At(prefix + "multi")));
  }
};

std::set<std::string> Split(const std::string& s) {
  std::set<std::string> out;
  std::istringstream in(s);
  for (std::string part; std::getline(in, part, ';');) out.insert(part);
  return out;
}

TEST_F(S3SigningTest, MotoVerifiesTheSignatureOfEveryCall) {
  ASSERT_EQ(moto_fields_.size(), 6u) << "moto_server.py --auth prints port and 5 credentials";
  ExerciseEveryCall(*client_, "user-");
}

TEST_F(S3SigningTest, SessionTokenIsSentAndSigned) {
  ASSERT_EQ(moto_fields_.size(), 6u);
  std::unique_ptr<S3Client> session = ClientWith(moto_fields_[3], moto_fields_[4], moto_fields_[5]);
  ASSERT_NE(session, nullptr);
  ExerciseEveryCall(*session, "session-");
  size_t with_token = 0;
  for (const testing::ProxyRequest& r : ProxyLog()) {
    if (r.target.find("/session-") == std::string::npos) continue;
    EXPECT_TRUE(Split(r.signed_headers).count("x-amz-security-token")) << r.target;
    ++with_token;
  }
  EXPECT_GT(with_token, 0u);
  // Without its token the session's keys are refused.
  std::unique_ptr<S3Client> no_token = ClientWith(moto_fields_[3], moto_fields_[4], "");
  Result<ObjectInfo> head = no_token->Head(At("session-key 1"));
  EXPECT_EQ(head.status().code(), StatusCode::kInvalidArgument) << head.status().ToString();
}

TEST_F(S3SigningTest, EveryAmzAndConditionalHeaderIsSigned) {
  ExerciseEveryCall(*client_, "headers-");
  std::vector<testing::ProxyRequest> log = ProxyLog();
  ASSERT_GT(log.size(), 10u);
  std::set<std::string> seen;
  for (const testing::ProxyRequest& r : log) {
    EXPECT_EQ(r.content_sha256, "UNSIGNED-PAYLOAD") << r.method << " " << r.target;
    std::set<std::string> signed_headers = Split(r.signed_headers);
    EXPECT_TRUE(signed_headers.count("host")) << r.target;
    for (const std::string& name : Split(r.header_names)) {
      if (name.starts_with("x-amz-") || name.starts_with("if-") || name == "range" ||
          name == "content-type") {
        EXPECT_TRUE(signed_headers.count(name)) << name << " unsigned in " << r.target;
        seen.insert(name);
      }
    }
  }
  for (const char* name : {"x-amz-date", "x-amz-content-sha256", "x-amz-checksum-crc32c",
                           "x-amz-checksum-algorithm", "if-none-match", "if-match", "range"}) {
    EXPECT_TRUE(seen.count(name)) << name << " was never sent";
  }
}

TEST_F(S3SigningTest, WrongSecretIsRefusedWithoutShowingIt) {
  std::unique_ptr<S3Client> wrong = ClientWith(config_.access_key_id, "not/the+secret", "");
  Result<std::string> put = wrong->Put(At("k"), std::string("x"), {});
  EXPECT_EQ(put.status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(put.status().message().starts_with(
      "s3://shardsafe-test/k: access denied (SignatureDoesNotMatch"))
      << put.status().message();
  EXPECT_EQ(put.status().message().find("not/the+secret"), std::string::npos);
  EXPECT_EQ(put.status().message().find(config_.secret_access_key), std::string::npos);
  EXPECT_EQ(CountRequests("PUT", "/k"), 1u) << "a refusal is not retried";
}

TEST_F(S3SigningTest, UnknownKeyIsRefusedNamingTheObject) {
  std::unique_ptr<S3Client> bogus = ClientWith("AKIDBOGUSBOGUSBOGUS", "bogus/secret", "");
  Result<std::string> got = bogus->Get(At("dir/k"), 100, nullptr);  // no query: '/' is fine
  EXPECT_EQ(got.status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(got.status().message().starts_with(
      "s3://shardsafe-test/dir/k: access denied (InvalidAccessKeyId"))
      << got.status().message();
  EXPECT_EQ(got.status().message().find("bogus/secret"), std::string::npos);
}

// The proxy's signature check, on in the other tests, is not a no-op.
using S3ProxySignatureCheckTest = testing::S3ServerTest;

TEST_F(S3ProxySignatureCheckTest, RefusesAWrongSecret) {
  S3Config c = config_;
  c.secret_access_key = "not/the+secret";
  Result<std::unique_ptr<S3Client>> wrong = S3Client::Create(c);
  S3_ASSERT_OK(wrong);
  Result<std::string> put = (*wrong)->Put(At("k"), std::string("x"), {});
  EXPECT_EQ(put.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(put.status().message().find("SignatureDoesNotMatch"), std::string::npos);
  std::vector<testing::ProxyRequest> log = ProxyLog();
  ASSERT_FALSE(log.empty());
  EXPECT_EQ(log.back().action, "badsig");
  EXPECT_EQ(log.front().action, "forward");  // CreateBucket, rightly signed
}

}  // namespace
}  // namespace shardsafe
