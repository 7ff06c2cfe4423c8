// Round trips of the object calls against moto (through the fault proxy,
// injecting nothing here): Put, Get, GetRange, Head, List, Delete,
// conditional writes, keys of any UTF-8, connection reuse, many threads.
#include <set>
#include <thread>

#include "gtest/gtest.h"
#include "testing/s3_test_util.h"

namespace shardsafe {
namespace {

using testing::IsOk;
using testing::RandomBytes;

class S3ClientTest : public testing::S3ServerTest {
 protected:
  // Puts `data` at `key`; returns the ETag.
  std::string PutBytes(const std::string& key, const std::string& data,
                       const PutOptions& options = {}) {
    Result<std::string> etag = client_->Put(At(key), data, options);
    EXPECT_TRUE(IsOk(etag)) << key;
    return etag.ok() ? *etag : "";
  }
};

std::vector<std::string> Keys(const Listing& l) {
  std::vector<std::string> keys;
  for (const ObjectInfo& o : l.objects) keys.push_back(o.key);
  return keys;
}

TEST_F(S3ClientTest, PutGetHeadRoundTrip) {
  std::string data = RandomBytes(300000, 1);  // binary, NULs included
  std::string etag = PutBytes("dir/obj", data);
  EXPECT_FALSE(etag.empty());
  std::string got_etag;
  Result<std::string> got = client_->Get(At("dir/obj"), data.size(), &got_etag);
  S3_ASSERT_OK(got);
  EXPECT_TRUE(*got == data);
  EXPECT_EQ(got_etag, etag);
  Result<ObjectInfo> info = client_->Head(At("dir/obj"));
  S3_ASSERT_OK(info);
  EXPECT_EQ(info->size, data.size());
  EXPECT_EQ(info->etag, etag);
  EXPECT_GT(info->mtime_seconds, 1700000000);
  PutBytes("empty", "");
  Result<std::string> empty = client_->Get(At("empty"), 0, nullptr);
  S3_ASSERT_OK(empty);
  EXPECT_EQ(*empty, "");
}

TEST_F(S3ClientTest, GetRefusesObjectsAboveTheLimit) {
  PutBytes("big", RandomBytes(1000, 2));
  Result<std::string> got = client_->Get(At("big"), 999, nullptr);
  EXPECT_EQ(got.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(got.status().message().find("s3://shardsafe-test/big"), std::string::npos);
}

TEST_F(S3ClientTest, GetRangeReadsExactlyTheRange) {
  std::string data = RandomBytes(100000, 3);
  PutBytes("ranged", data);
  std::string dst(4096, '\0');
  S3_ASSERT_OK(client_->GetRange(At("ranged"), 12345, dst.data(), dst.size()));
  EXPECT_TRUE(dst == data.substr(12345, 4096));
  S3_ASSERT_OK(client_->GetRange(At("ranged"), data.size() - 1, dst.data(), 1));
  EXPECT_EQ(dst[0], data.back());
  // The object ends inside the range, or before it.
  Status past = client_->GetRange(At("ranged"), data.size() - 10, dst.data(), 20);
  EXPECT_EQ(past.code(), StatusCode::kDataLoss) << past.ToString();
  EXPECT_NE(past.message().find("s3://shardsafe-test/ranged"), std::string::npos);
  past = client_->GetRange(At("ranged"), data.size() + 10, dst.data(), 20);
  EXPECT_EQ(past.code(), StatusCode::kDataLoss) << past.ToString();
}

TEST_F(S3ClientTest, MissingObjectsAreNotFoundNamingThem) {
  Result<std::string> got = client_->Get(At("no/such"), 100, nullptr);
  EXPECT_EQ(got.status().code(), StatusCode::kNotFound);
  EXPECT_EQ(got.status().message(), "s3://shardsafe-test/no/such: no such object");
  Result<ObjectInfo> head = client_->Head(At("no/such"));
  EXPECT_EQ(head.status().code(), StatusCode::kNotFound);
  EXPECT_NE(head.status().message().find("s3://shardsafe-test/no/such"), std::string::npos);
  char byte;
  EXPECT_EQ(client_->GetRange(At("no/such"), 0, &byte, 1).code(), StatusCode::kNotFound);
}

TEST_F(S3ClientTest, MissingBucketIsNotFoundNamingTheBucket) {
  S3Location at{"no-such-bucket", "k"};
  Result<std::string> put = client_->Put(at, std::string("x"), {});
  const std::string expected = "s3://no-such-bucket: no such bucket at " + config_.endpoint;
  EXPECT_EQ(put.status().code(), StatusCode::kNotFound);
  EXPECT_EQ(put.status().message(), expected);
  EXPECT_EQ(put.status().detail(), ErrorDetail::kNoSuchBucket);
  Result<Listing> list = client_->List("no-such-bucket", "", "");
  EXPECT_EQ(list.status().code(), StatusCode::kNotFound);
  EXPECT_EQ(list.status().message(), expected);
  EXPECT_EQ(list.status().detail(), ErrorDetail::kNoSuchBucket);
  EXPECT_EQ(client_->Delete(at).code(), StatusCode::kNotFound);
}

TEST_F(S3ClientTest, DeleteRemovesAndToleratesMissingKeys) {
  PutBytes("gone", "bytes");
  S3_ASSERT_OK(client_->Delete(At("gone")));
  EXPECT_EQ(client_->Head(At("gone")).status().code(), StatusCode::kNotFound);
  S3_EXPECT_OK(client_->Delete(At("gone")));
  S3_EXPECT_OK(client_->Delete(At("never/was")));
}

TEST_F(S3ClientTest, KeysOfAnyUtf8RoundTrip) {
  const std::vector<std::string> keys = {
      "odd/a b+c=d&e?f#g%h;i,j:k@l$m!n'o(p)q*r~s",
      "odd/ünïcödé/日本語/κλειδί",
      "odd/tab\tand\x01" "control",
      "odd/trailing space ",
  };
  for (size_t i = 0; i < keys.size(); ++i) PutBytes(keys[i], "value " + std::to_string(i));
  for (size_t i = 0; i < keys.size(); ++i) {
    Result<std::string> got = client_->Get(At(keys[i]), 100, nullptr);
    S3_ASSERT_OK(got);
    EXPECT_EQ(*got, "value " + std::to_string(i)) << keys[i];
  }
  Result<Listing> listed = client_->List(kBucket, "odd/", "");
  S3_ASSERT_OK(listed);
  std::vector<std::string> listed_keys = Keys(*listed);
  EXPECT_EQ(std::set<std::string>(keys.begin(), keys.end()),
            std::set<std::string>(listed_keys.begin(), listed_keys.end()));
}

TEST_F(S3ClientTest, ListWithDelimiterSplitsObjectsAndPrefixes) {
  for (const char* key : {"root/a", "root/b", "root/sub1/x", "root/sub1/y", "root/sub2/z",
                          "rootless", "other/c"}) {
    PutBytes(key, key);
  }
  Result<Listing> l = client_->List(kBucket, "root/", "/");
  S3_ASSERT_OK(l);
  EXPECT_EQ(Keys(*l), (std::vector<std::string>{"root/a", "root/b"}));
  EXPECT_EQ(l->common_prefixes, (std::vector<std::string>{"root/sub1/", "root/sub2/"}));
  EXPECT_EQ(l->objects[0].size, 6u);
  EXPECT_FALSE(l->objects[0].etag.empty());
  EXPECT_GT(l->objects[0].mtime_seconds, 1700000000);
  Result<Listing> all = client_->List(kBucket, "root", "");
  S3_ASSERT_OK(all);
  EXPECT_EQ(all->objects.size(), 6u);
  EXPECT_TRUE(all->common_prefixes.empty());
}

TEST_F(S3ClientTest, ListFollowsContinuationTokensAcrossPages) {
  config_.list_page_size = 7;
  Result<std::unique_ptr<S3Client>> paged = S3Client::Create(config_);
  S3_ASSERT_OK(paged);
  std::vector<std::string> expected;
  for (int i = 0; i < 25; ++i) {
    char key[32];
    std::snprintf(key, sizeof(key), "paged/k%03d", i);
    expected.push_back(key);
    PutBytes(key, key);
  }
  Result<Listing> l = (*paged)->List(kBucket, "paged/", "");
  S3_ASSERT_OK(l);
  EXPECT_EQ(Keys(*l), expected);
  // 25 keys at 7 a page: 4 pages, the last three following a token.
  EXPECT_EQ(CountRequests("GET", "list-type=2"), 4u);
  EXPECT_EQ(CountRequests("GET", "continuation-token="), 3u);
}

TEST_F(S3ClientTest, IfNoneMatchCreatesOnlyOnce) {
  PutOptions create;
  create.if_none_match = true;
  PutBytes("once", "first", create);
  Result<std::string> again = client_->Put(At("once"), std::string("second"), create);
  EXPECT_EQ(again.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(again.status().message().find("s3://shardsafe-test/once"), std::string::npos);
  EXPECT_NE(again.status().message().find("PreconditionFailed"), std::string::npos);
  EXPECT_EQ(*client_->Get(At("once"), 100, nullptr), "first");
}

TEST_F(S3ClientTest, IfMatchSwapsOnlyTheExpectedVersion) {
  std::string v1 = PutBytes("latest", "step-1");
  std::string v2 = PutBytes("latest", "step-2");
  ASSERT_NE(v1, v2);
  PutOptions stale;
  stale.if_match = v1;
  Result<std::string> lost = client_->Put(At("latest"), std::string("step-3"), stale);
  EXPECT_EQ(lost.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(*client_->Get(At("latest"), 100, nullptr), "step-2");
  PutOptions current;
  current.if_match = v2;
  PutBytes("latest", "step-3", current);
  EXPECT_EQ(*client_->Get(At("latest"), 100, nullptr), "step-3");
}

TEST_F(S3ClientTest, ReusesOneConnectionForSequentialRequests) {
  for (int i = 0; i < 10; ++i) PutBytes("reuse/" + std::to_string(i), "x");
  for (int i = 0; i < 10; ++i) S3_ASSERT_OK(client_->Head(At("reuse/" + std::to_string(i))));
  std::set<std::string> connections;
  for (const testing::ProxyRequest& r : ProxyLog()) connections.insert(r.client_port);
  EXPECT_EQ(connections.size(), 1u) << "every request should reuse the first connection";
}

TEST_F(S3ClientTest, ManyThreadsAtOnce) {
  constexpr int kThreads = 8, kEach = 6;
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kEach; ++i) {
        std::string key = "mt/" + std::to_string(t) + "/" + std::to_string(i);
        std::string data = RandomBytes(20000 + i, t * 100 + i);
        Result<std::string> got = client_->Put(At(key), data, {}).ok()
                                      ? client_->Get(At(key), data.size(), nullptr)
                                      : Result<std::string>(InternalError("put failed"));
        if (!got.ok() || *got != data) ++failures;
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0);
  Result<Listing> l = client_->List(kBucket, "mt/", "");
  S3_ASSERT_OK(l);
  EXPECT_EQ(l->objects.size(), size_t{kThreads * kEach});
}

}  // namespace
}  // namespace shardsafe
