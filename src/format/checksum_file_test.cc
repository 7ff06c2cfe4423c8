// Checksum files (format/checksum_file.h): round trip, lookup, and every
// damage refused with a DataLoss naming the file.
#include "format/checksum_file.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace shardsafe {
namespace {

using ::testing::HasSubstr;

const std::vector<ChunkChecksum> kEntries = {
    {1, 4096, 0xdeadbeef}, {0, 8192, 7}, {0, 4096, 1}, {1, 16384, 0}};

TEST(ChecksumFileTest, RoundTripsSortedAndFindsEachChunk) {
  const std::string bytes = EncodeChecksumFile(kEntries);
  EXPECT_EQ(bytes.size(), ChecksumFileBytes(kEntries.size()));
  EXPECT_TRUE(bytes.starts_with("SSCRC32C"));
  auto got = DecodeChecksumFile(bytes, "c");
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  ASSERT_EQ(got->size(), kEntries.size());
  for (size_t i = 1; i < got->size(); ++i) {
    const auto& [a, b] = std::pair((*got)[i - 1], (*got)[i]);
    EXPECT_TRUE(a.file < b.file || (a.file == b.file && a.at < b.at)) << i;
  }
  for (const ChunkChecksum& e : kEntries) {
    EXPECT_EQ(FindChecksum(*got, e.file, e.at), std::optional<uint32_t>(e.crc32c));
  }
  EXPECT_EQ(FindChecksum(*got, 0, 4097), std::nullopt);
  EXPECT_EQ(FindChecksum(*got, 2, 4096), std::nullopt);
  auto empty = DecodeChecksumFile(EncodeChecksumFile({}), "c");
  ASSERT_TRUE(empty.ok());
  EXPECT_TRUE(empty->empty());
}

TEST(ChecksumFileTest, DamageIsDataLossNamingTheFile) {
  const std::string good = EncodeChecksumFile(kEntries);
  auto loss = [](const std::string& bytes, const std::string& what) {
    auto got = DecodeChecksumFile(bytes, "ck/checksums-00001.crc32c");
    EXPECT_EQ(got.status().code(), StatusCode::kDataLoss) << what;
    EXPECT_THAT(got.status().message(), HasSubstr("ck/checksums-00001.crc32c: checksum file"))
        << what;
  };
  loss("", "empty");
  loss("SSCRC32X" + good.substr(8), "magic");
  loss(good.substr(0, good.size() - 1), "cut short");
  loss(good + "x", "trailing byte");
  std::string flipped = good;
  flipped[20] ^= 1;
  loss(flipped, "an entry's bit");
  std::string huge = good;
  huge[15] = '\x7f';  // a count near 2^63
  loss(huge, "a count larger than the file");
}

// Earlier writers listed empty chunks too (checksum 0), at the place of the
// chunk after them: a repeat of which one entry is 0 reads as the other;
// two different checksums at one place are loss.
TEST(ChecksumFileTest, AnEmptyChunksEntryAtTheSamePlaceReadsAsTheOther) {
  const std::vector<ChunkChecksum> earlier = {{0, 64, 0}, {0, 64, 0xabcd}, {0, 64, 0},
                                              {1, 8, 0},  {1, 8, 0},       {1, 16, 7}};
  auto read = DecodeChecksumFile(EncodeChecksumFile(earlier), "c");
  ASSERT_TRUE(read.ok()) << read.status().ToString();
  ASSERT_EQ(read->size(), 3u);
  EXPECT_EQ(FindChecksum(*read, 0, 64), 0xabcdu);
  EXPECT_EQ(FindChecksum(*read, 1, 8), 0u);
  EXPECT_EQ(FindChecksum(*read, 1, 16), 7u);
  auto clash = DecodeChecksumFile(EncodeChecksumFile({{0, 64, 5}, {0, 64, 6}}), "c");
  EXPECT_EQ(clash.status().code(), StatusCode::kDataLoss);
  EXPECT_THAT(clash.status().message(), HasSubstr("out of order or repeats one"));
}

}  // namespace
}  // namespace shardsafe
