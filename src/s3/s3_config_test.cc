// s3:// URIs, S3Config from the environment, URLs and header encodings:
// everything of the S3 client that needs no server.
#include <cstdlib>

#include "base/crc32c.h"
#include "gtest/gtest.h"
#include "s3/s3_client.h"
#include "s3/s3_encoding.h"
#include "s3/s3_url.h"
#include "testing/s3_test_util.h"

namespace shardsafe {
namespace {

using testing::IsOk;

TEST(ParseS3UriTest, SplitsBucketAndKey) {
  Result<S3Location> at = ParseS3Uri("s3://my-bucket/run/step-1/");
  ASSERT_TRUE(IsOk(at));
  EXPECT_EQ(at->bucket, "my-bucket");
  EXPECT_EQ(at->key, "run/step-1");
  EXPECT_EQ(at->uri(), "s3://my-bucket/run/step-1");
  Result<S3Location> root = ParseS3Uri("s3://b.with.dots");
  ASSERT_TRUE(IsOk(root));
  EXPECT_EQ(root->key, "");
  EXPECT_EQ(root->uri(), "s3://b.with.dots");
  EXPECT_EQ(ParseS3Uri("s3://abc/")->key, "");
  EXPECT_EQ(ParseS3Uri("s3://abc/ünï cödé/a+b=c")->key, "ünï cödé/a+b=c");
}

TEST(ParseS3UriTest, RejectsMalformedUris) {
  for (const char* bad :
       {"s3://", "s3:///key", "s3://ab/k", "s3://Upper/k", "s3://under_score/k", "s3://-ab/k",
        "s3://ab-/k", "s3://a..b/k", "s3://bucket//k", "s3://bucket/a//b", "s3://bucket/./k",
        "s3://bucket/a/../k", "s3://bucket/a/..", "http://bucket/k", "/local/path",
        "s3://bucket/a//"}) {
    Result<S3Location> at = ParseS3Uri(bad);
    EXPECT_EQ(at.status().code(), StatusCode::kInvalidArgument) << bad;
  }
  std::string with_nul("s3://bucket/a\0b", 15);
  EXPECT_EQ(ParseS3Uri(with_nul).status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(IsS3Uri("s3://x"));
  EXPECT_FALSE(IsS3Uri("S3://x"));
  EXPECT_FALSE(IsS3Uri("/s3://x"));
}

// Sets (or, for nullptr, unsets) the AWS_* variables of one test.
class AwsEnvTest : public ::testing::Test {
 protected:
  static constexpr const char* kNames[] = {
      "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_REGION",
      "AWS_DEFAULT_REGION", "AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL"};
  void SetUp() override {
    for (const char* name : kNames) unsetenv(name);
  }
  void TearDown() override { SetUp(); }
  static void SetCredentials() {
    setenv("AWS_ACCESS_KEY_ID", "AKID", 1);
    setenv("AWS_SECRET_ACCESS_KEY", "topsecret", 1);
  }
};

TEST_F(AwsEnvTest, ReadsTheStandardVariables) {
  SetCredentials();
  setenv("AWS_SESSION_TOKEN", "tokentoken", 1);
  setenv("AWS_DEFAULT_REGION", "eu-west-3", 1);
  setenv("AWS_ENDPOINT_URL", "http://other:1", 1);
  setenv("AWS_ENDPOINT_URL_S3", "http://127.0.0.1:9000/", 1);
  Result<S3Config> c = S3Config::FromEnvironment();
  ASSERT_TRUE(IsOk(c));
  EXPECT_EQ(c->access_key_id, "AKID");
  EXPECT_EQ(c->secret_access_key, "topsecret");
  EXPECT_EQ(c->session_token, "tokentoken");
  EXPECT_EQ(c->region, "eu-west-3");
  EXPECT_EQ(c->endpoint, "http://127.0.0.1:9000");  // the S3-specific one wins
  EXPECT_TRUE(c->path_style);
  std::string text = c->ToString();
  EXPECT_NE(text.find("http://127.0.0.1:9000"), std::string::npos) << text;
  EXPECT_NE(text.find("eu-west-3"), std::string::npos) << text;
  EXPECT_EQ(text.find("topsecret"), std::string::npos) << text;
  EXPECT_EQ(text.find("tokentoken"), std::string::npos) << text;

  setenv("AWS_REGION", "us-west-2", 1);  // wins over AWS_DEFAULT_REGION
  unsetenv("AWS_ENDPOINT_URL_S3");
  c = S3Config::FromEnvironment();
  ASSERT_TRUE(IsOk(c));
  EXPECT_EQ(c->region, "us-west-2");
  EXPECT_EQ(c->endpoint, "http://other:1");
}

TEST_F(AwsEnvTest, DefaultsToAwsInUsEast1) {
  SetCredentials();
  Result<S3Config> c = S3Config::FromEnvironment();
  ASSERT_TRUE(IsOk(c));
  EXPECT_EQ(c->region, "us-east-1");
  EXPECT_EQ(c->endpoint, "");
  EXPECT_FALSE(c->path_style);
  EXPECT_EQ(c->session_token, "");
}

TEST_F(AwsEnvTest, RefusesMissingCredentials) {
  Result<S3Config> c = S3Config::FromEnvironment();
  EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(c.status().message().find("AWS_ACCESS_KEY_ID"), std::string::npos);
  setenv("AWS_ACCESS_KEY_ID", "AKID", 1);
  EXPECT_EQ(S3Config::FromEnvironment().status().code(), StatusCode::kInvalidArgument);
  setenv("AWS_SECRET_ACCESS_KEY", "", 1);
  EXPECT_EQ(S3Config::FromEnvironment().status().code(), StatusCode::kInvalidArgument);
}

TEST_F(AwsEnvTest, RefusesBadEndpointsAndRegions) {
  SetCredentials();
  for (const char* bad : {"localhost:9000", "ftp://host", "http://", "https:///path"}) {
    setenv("AWS_ENDPOINT_URL", bad, 1);
    Result<S3Config> c = S3Config::FromEnvironment();
    EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument) << bad;
    EXPECT_EQ(c.status().message().find("topsecret"), std::string::npos);
  }
  unsetenv("AWS_ENDPOINT_URL");
  setenv("AWS_REGION", "us-east-1:evil", 1);
  EXPECT_EQ(S3Config::FromEnvironment().status().code(), StatusCode::kInvalidArgument);
}

TEST(S3ClientCreateTest, RefusesAConfigWithoutCredentials) {
  S3Config c;
  EXPECT_EQ(S3Client::Create(c).status().code(), StatusCode::kInvalidArgument);
}

TEST(S3UrlTest, PathStyleEncodesKeysBySigV4Rules) {
  S3Config c;
  c.endpoint = "http://127.0.0.1:9000";
  c.path_style = true;
  EXPECT_EQ(S3Url(c, "b", "dir/a b+c~d_e-f.g/ü=?&#%", {}),
            "http://127.0.0.1:9000/b/dir/a%20b%2Bc~d_e-f.g/%C3%BC%3D%3F%26%23%25");
  // Sorted by name, values encoded ('/' too), an empty value kept as "name=".
  EXPECT_EQ(S3Url(c, "b", "", {{"prefix", "a/b c"}, {"list-type", "2"}, {"uploads", ""}}),
            "http://127.0.0.1:9000/b/?list-type=2&prefix=a%2Fb%20c&uploads=");
}

TEST(S3UrlTest, VirtualHostedOnAwsAndCustomEndpoints) {
  S3Config c;
  c.region = "eu-west-1";
  EXPECT_EQ(S3Url(c, "bucket", "k", {}), "https://bucket.s3.eu-west-1.amazonaws.com/k");
  // A dotted bucket would not match the wildcard certificate.
  EXPECT_EQ(S3Url(c, "b.c", "k", {}), "https://s3.eu-west-1.amazonaws.com/b.c/k");
  c.path_style = true;
  EXPECT_EQ(S3Url(c, "bucket", "k", {}), "https://s3.eu-west-1.amazonaws.com/bucket/k");
  c.path_style = false;
  c.endpoint = "http://minio.local:9000";
  EXPECT_EQ(S3Url(c, "bucket", "k", {}), "http://bucket.minio.local:9000/k");
}

TEST(S3EncodingTest, Crc32cHeaderIsBase64OfTheBigEndianCrc) {
  // CRC-32C("123456789") = 0xE3069283 -> bytes E3 06 92 83 -> "4waSgw==".
  EXPECT_EQ(Crc32cHeaderValue(Crc32c("123456789", 9)), "4waSgw==");
  EXPECT_EQ(Crc32cHeaderValue(0), "AAAAAA==");
}

TEST(S3EncodingTest, DecodesUrlsAndDates) {
  EXPECT_EQ(UriDecode("a%20b%2Fc+d%C3%BC"), "a b/c+dü");
  EXPECT_EQ(ParseIso8601("2024-05-01T12:34:56.000Z"), 1714566896);
  EXPECT_EQ(ParseHttpDate("Wed, 01 May 2024 12:34:56 GMT"), 1714566896);
  EXPECT_EQ(ParseIso8601("garbage"), 0);
}

}  // namespace
}  // namespace shardsafe
