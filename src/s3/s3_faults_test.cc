// Faults injected by the proxy in front of moto: 5xx answers and dropped
// connections retried to success (the proxy's log counts the tries),
// retries running out, errors never retried, and no secret in any message.
#include <map>

#include "gtest/gtest.h"
#include "testing/s3_test_util.h"

namespace shardsafe {
namespace {

using testing::RandomBytes;

class S3FaultTest : public testing::S3ServerTest {
 protected:
  // Tries of `method` on a target containing `part`, by what the proxy did.
  std::map<std::string, int> Tries(const std::string& method, const std::string& part) {
    std::map<std::string, int> by_action;
    for (const testing::ProxyRequest& r : ProxyLog()) {
      if (r.method == method && r.target.find(part) != std::string::npos) ++by_action[r.action];
    }
    return by_action;
  }

  void ExpectNoSecret(const Status& s) {
    EXPECT_EQ(s.ToString().find(config_.secret_access_key), std::string::npos) << s.ToString();
  }
};

using Counts = std::map<std::string, int>;

TEST_F(S3FaultTest, SlowDownIsRetriedToSuccess) {
  Proxy("fail 503 SlowDown 3 PUT");
  S3_ASSERT_OK(client_->Put(At("retried"), std::string("payload"), {}));
  EXPECT_EQ(Tries("PUT", "/retried"), (Counts{{"fail", 3}, {"forward", 1}}));
  EXPECT_EQ(*client_->Get(At("retried"), 100, nullptr), "payload");
}

TEST_F(S3FaultTest, ServerErrorsAndConflictsAreRetriedToSuccess) {
  S3_ASSERT_OK(client_->Put(At("obj"), std::string("payload"), {}));
  Proxy("fail 500 InternalError 1 GET");
  Proxy("fail 502 BadGateway 1 GET");
  Proxy("fail 504 GatewayTimeout 1 GET");
  Result<std::string> got = client_->Get(At("obj"), 100, nullptr);
  S3_ASSERT_OK(got);
  EXPECT_EQ(*got, "payload");
  EXPECT_EQ(Tries("GET", "/obj"), (Counts{{"fail", 3}, {"forward", 1}}));
  Proxy("fail 409 ConditionalRequestConflict 2 PUT");
  PutOptions create;
  create.if_none_match = true;
  S3_ASSERT_OK(client_->Put(At("raced"), std::string("mine"), create));
  EXPECT_EQ(Tries("PUT", "/raced"), (Counts{{"fail", 2}, {"forward", 1}}));
}

TEST_F(S3FaultTest, DroppedConnectionsAreRetriedToSuccess) {
  std::string data = RandomBytes(200000, 7);
  Proxy("drop 2 PUT");
  S3_ASSERT_OK(client_->Put(At("dropped"), data, {}));
  EXPECT_EQ(Tries("PUT", "/dropped"), (Counts{{"drop", 2}, {"forward", 1}}));
  Proxy("drop 2 GET");  // each cut off after half the body
  Result<std::string> got = client_->Get(At("dropped"), data.size(), nullptr);
  S3_ASSERT_OK(got);
  EXPECT_TRUE(*got == data);
  Proxy("drop 1 GET");
  std::string dst(50000, '\0');
  S3_ASSERT_OK(client_->GetRange(At("dropped"), 1000, dst.data(), dst.size()));
  EXPECT_TRUE(dst == data.substr(1000, dst.size()));
  EXPECT_EQ(Tries("GET", "/dropped"), (Counts{{"drop", 3}, {"forward", 2}}));
}

TEST_F(S3FaultTest, RetriesRunningOutIsUnavailableNamingTheObject) {
  Proxy("fail 503 SlowDown 100 PUT");
  Result<std::string> put = client_->Put(At("never/lands"), std::string("x"), {});
  EXPECT_EQ(put.status().code(), StatusCode::kUnavailable);
  std::string m = put.status().message();
  EXPECT_TRUE(m.starts_with("s3://shardsafe-test/never/lands: PUT failed after 4 attempts"))
      << m;
  EXPECT_NE(m.find("SlowDown"), std::string::npos) << m;
  EXPECT_EQ(Tries("PUT", "/never/lands"), (Counts{{"fail", 4}}));
  ExpectNoSecret(put.status());

  Proxy("drop 100 GET");
  Result<std::string> get = client_->Get(At("anything"), 100, nullptr);
  EXPECT_EQ(get.status().code(), StatusCode::kUnavailable);
  EXPECT_TRUE(get.status().message().starts_with("s3://shardsafe-test/anything: GET failed"))
      << get.status().message();
}

TEST_F(S3FaultTest, AccessDeniedIsNotRetriedAndNamesTheObject) {
  Proxy("fail 403 AccessDenied 1 GET");
  Result<std::string> got = client_->Get(At("secret/obj"), 100, nullptr);
  EXPECT_EQ(got.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(got.status().message(),
            "s3://shardsafe-test/secret/obj: access denied (AccessDenied: injected by "
            "fault_proxy)");
  EXPECT_EQ(Tries("GET", "/secret/obj"), (Counts{{"fail", 1}}));
  ExpectNoSecret(got.status());
  Proxy("fail 403 AccessDenied 1 HEAD");  // a HEAD answer has no body: no code
  Result<ObjectInfo> head = client_->Head(At("secret/obj"));
  EXPECT_EQ(head.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(head.status().message(), "s3://shardsafe-test/secret/obj: access denied (HTTP 403)");
}

TEST_F(S3FaultTest, ErrorInsideA200CompletionIsRetried) {
  std::string part = RandomBytes(1000, 9);
  Result<std::string> id = client_->CreateMultipartUpload(At("late-error"), false);
  S3_ASSERT_OK(id);
  Result<std::string> etag = client_->UploadPart(At("late-error"), *id, 1, part, {});
  S3_ASSERT_OK(etag);
  Proxy("fail 200 InternalError 1 POST");
  std::vector<CompletedPart> parts = {{1, *etag, {}}};
  S3_ASSERT_OK(client_->CompleteMultipartUpload(At("late-error"), *id, parts, false));
  EXPECT_EQ(Tries("POST", "uploadId="), (Counts{{"fail", 1}, {"forward", 1}}));
  EXPECT_TRUE(*client_->Get(At("late-error"), 2000, nullptr) == part);
}

TEST_F(S3FaultTest, RefusedConnectionsAreUnavailable) {
  // Nothing listens on port 1 of loopback.
  S3Config c = TestConfig("http://127.0.0.1:1");
  c.retry.max_attempts = 2;
  Result<std::unique_ptr<S3Client>> client = S3Client::Create(c);
  S3_ASSERT_OK(client);
  Result<ObjectInfo> head = (*client)->Head({"bucket", "key"});
  EXPECT_EQ(head.status().code(), StatusCode::kUnavailable);
  EXPECT_TRUE(head.status().message().starts_with("s3://bucket/key: HEAD failed after 2 attempts"))
      << head.status().message();
  ExpectNoSecret(head.status());
}

}  // namespace
}  // namespace shardsafe
