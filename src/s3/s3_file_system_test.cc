// S3FileSystem against moto behind the fault proxy (s3_test_util.h): the
// conditional writes the object-store commit protocol relies on, and what
// a lost reply does to them.
#include <gtest/gtest.h>

#include "base/crc32c.h"
#include "s3/s3_file_system.h"
#include "testing/s3_test_util.h"

namespace shardsafe::testing {
namespace {

class S3FileSystemTest : public S3ServerTest {
 protected:
  void SetUp() override {
    S3ServerTest::SetUp();
    auto client = S3Client::Create(config_);
    S3_ASSERT_OK(client);
    fs_ = std::make_unique<S3FileSystem>(std::move(*client), S3FileOptions{});
  }
  std::string Uri(const std::string& key) const {
    return "s3://" + std::string(kBucket) + "/" + key;
  }
  std::unique_ptr<S3FileSystem> fs_;
};

TEST_F(S3FileSystemTest, CreateFileExclusiveCreatesOnceAndRefusesAnother) {
  S3_ASSERT_OK(fs_->CreateFileExclusive(Uri("run/t/shardsafe.json"), "mine"));
  Status again = fs_->CreateFileExclusive(Uri("run/t/shardsafe.json"), "theirs");
  EXPECT_EQ(again.code(), StatusCode::kAlreadyExists) << again.ToString();
  EXPECT_NE(again.message().find(Uri("run/t/shardsafe.json")), std::string::npos);
  auto text = ReadFileToString(*fs_, Uri("run/t/shardsafe.json"), 100);
  S3_ASSERT_OK(text);
  EXPECT_EQ(*text, "mine");
}

TEST_F(S3FileSystemTest, ACreateWhoseReplyIsLostIsStillItsOwnSuccess) {
  // The server stores the object but the client never hears so; its retry
  // then meets its own object (412), which must not read as a lost race:
  // the engine would take a committed index for someone else's.
  Proxy("lose 1 PUT");
  S3_ASSERT_OK(fs_->CreateFileExclusive(Uri("run/t/commit.json"), "record"));
  EXPECT_EQ(CountRequests("PUT", "commit.json"), 2u) << "the lost try and the retry";
  // Someone else's bytes there are still a lost race.
  Proxy("lose 1 PUT");
  EXPECT_EQ(fs_->CreateFileExclusive(Uri("run/t/commit.json"), "other").code(),
            StatusCode::kAlreadyExists);
}

TEST_F(S3FileSystemTest, ReplaceIfVersionIsACompareAndSwap) {
  const std::string latest = Uri("run/latest");
  S3_ASSERT_OK(fs_->ReplaceFileIfVersion(latest, "a\n", std::nullopt));  // absent: created
  EXPECT_EQ(fs_->ReplaceFileIfVersion(latest, "b\n", std::nullopt).code(),
            StatusCode::kFailedPrecondition) << "it exists now";
  std::string version;
  auto text = fs_->ReadFileVersioned(latest, 100, &version);
  S3_ASSERT_OK(text);
  EXPECT_EQ(*text, "a\n");
  S3_ASSERT_OK(fs_->ReplaceFileIfVersion(latest, "c\n", version));
  EXPECT_EQ(fs_->ReplaceFileIfVersion(latest, "d\n", version).code(),
            StatusCode::kFailedPrecondition) << "the version moved on";
  auto now = ReadFileToString(*fs_, latest, 100);
  S3_ASSERT_OK(now);
  EXPECT_EQ(*now, "c\n");
}

TEST_F(S3FileSystemTest, FilesOfSeveralPartsAndDirectories) {
  S3FileOptions options;
  options.part_bytes = size_t{5} << 20;  // S3's smallest
  auto client = S3Client::Create(config_);
  S3_ASSERT_OK(client);
  S3FileSystem fs(std::move(*client), options);
  std::string data(options.part_bytes * 2 + 1234, '\0');
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>(i * 131 + i / 7);
  auto file = fs.NewWritableFile(Uri("d/sub/big"), {});
  S3_ASSERT_OK(file);
  uint32_t crc = 0;
  S3_ASSERT_OK((*file)->AppendChecksummed(data.data(), data.size(), &crc));
  EXPECT_EQ(crc, Crc32c(data.data(), data.size()));
  EXPECT_EQ(fs.Stat(Uri("d/sub/big")).status().code(), StatusCode::kNotFound)
      << "an object appears only when its upload completes";
  S3_ASSERT_OK((*file)->Sync());
  S3_ASSERT_OK((*file)->Close());
  EXPECT_EQ(CountRequests("PUT", "partNumber="), 3u);
  auto back = ReadFileToString(fs, Uri("d/sub/big"), data.size());
  S3_ASSERT_OK(back);
  EXPECT_TRUE(*back == data);
  auto listed = fs.ListDir(Uri("d"));
  S3_ASSERT_OK(listed);
  ASSERT_EQ(listed->size(), 1u);
  EXPECT_EQ((*listed)[0].name, "sub");
  EXPECT_TRUE((*listed)[0].is_dir);
  auto dir = fs.Stat(Uri("d/sub"));
  S3_ASSERT_OK(dir);
  EXPECT_TRUE(dir->is_dir);
  // An abandoned file (closed without Sync) leaves no object and no upload.
  auto dropped = fs.NewWritableFile(Uri("d/gone"), {});
  S3_ASSERT_OK(dropped);
  S3_ASSERT_OK((*dropped)->Append(data.data(), data.size()));
  S3_ASSERT_OK((*dropped)->Close());
  EXPECT_EQ(fs.Stat(Uri("d/gone")).status().code(), StatusCode::kNotFound);
  auto uploads = client_->ListMultipartUploads(kBucket, "d/");
  S3_ASSERT_OK(uploads);
  EXPECT_TRUE(uploads->empty());
  S3_ASSERT_OK(fs.RemoveAll(Uri("d")));
  EXPECT_EQ(fs.ListDir(Uri("d")).status().code(), StatusCode::kNotFound);
}

TEST_F(S3FileSystemTest, UploadsBegunBeforeATimeAreAborted) {
  auto upload = client_->CreateMultipartUpload(At("root/step-9/data"), true);
  S3_ASSERT_OK(upload);
  auto open = [&] { return client_->ListMultipartUploads(kBucket, "root/"); };
  // Begun after the epoch (moto dates every upload in 2010): kept.
  S3_ASSERT_OK(fs_->AbortUploadsBefore(Uri("root"), 0));
  ASSERT_TRUE(open().ok());
  EXPECT_EQ(open()->size(), 1u);
  // Begun before now: aborted, with the key holding no object at all.
  S3_ASSERT_OK(fs_->AbortUploadsBefore(Uri("root"), int64_t{1} << 40));
  ASSERT_TRUE(open().ok());
  EXPECT_TRUE(open()->empty());
}

TEST_F(S3FileSystemTest, AScatteredReadIsOneRequest) {
  S3_ASSERT_OK(fs_->CreateFileExclusive(Uri("rows"), "0123456789abcdef"));
  auto file = fs_->NewRandomAccessFile(Uri("rows"), {});
  S3_ASSERT_OK(file);
  const size_t gets_before = CountRequests("GET", "/rows");
  char a[3], b[5], c[2];
  const RandomAccessFile::Piece pieces[] = {{a, 3}, {b, 5}, {c, 2}};
  S3_ASSERT_OK((*file)->ReadScattered(4, pieces));
  EXPECT_EQ(std::string(a, 3) + "|" + std::string(b, 5) + "|" + std::string(c, 2),
            "456|789ab|cd");
  EXPECT_EQ(CountRequests("GET", "/rows"), gets_before + 1);
}

}  // namespace
}  // namespace shardsafe::testing
