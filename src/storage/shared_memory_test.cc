#include "storage/shared_memory.h"

#include <climits>
#include <cstring>
#include <filesystem>
#include <vector>

#include "gtest/gtest.h"
#include "storage/storage_test_util.h"

namespace shardsafe {
namespace {

using testing::ScratchDir;
using testing::TmpfsParent;

constexpr uint64_t kHeader = 4096;

TEST(SharedMemoryTest, BytesWrittenThroughARangeAreReadByAnotherOpener) {
  ScratchDir dir(TmpfsParent());
  ASSERT_TRUE(dir.ok());
  const uint64_t size = kHeader + (1 << 20);
  auto a = SharedMemory::Create(dir.path(), "m", size, kHeader);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  auto b = SharedMemory::Open(dir.path(), "m", size, kHeader);
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  ASSERT_TRUE((*a)->Unlink().ok());
  EXPECT_TRUE(std::filesystem::is_empty(dir.path()));

  (*a)->mapped()[7] = 42;  // the header is shared
  EXPECT_EQ((*b)->mapped()[7], 42);

  const std::string data = testing::RandomBytes(1 << 20, 5);
  auto range = (*a)->MapRange(kHeader, data.size());
  ASSERT_TRUE(range.ok()) << range.status().ToString();
  std::memcpy(*range, data.data(), data.size());
  SharedMemory::UnmapRange(*range, data.size());

  std::string got(1000, '\0');
  ASSERT_TRUE((*b)->Read(kHeader + 12345, got.data(), got.size()).ok());
  EXPECT_EQ(got, data.substr(12345, 1000));
  // More pieces than one preadv takes, of uneven sizes.
  std::vector<std::string> bufs;
  std::vector<RandomAccessFile::Piece> pieces;
  for (size_t i = 0, total = 0; total + 700 < data.size(); ++i) {
    bufs.emplace_back(i % 3 == 0 ? 0 : 1 + i % 700, '\0');
    total += bufs.back().size();
  }
  ASSERT_GT(bufs.size(), size_t{IOV_MAX});
  for (std::string& s : bufs) pieces.push_back({s.data(), s.size()});
  ASSERT_TRUE((*b)->ReadScattered(kHeader + 3, pieces).ok());
  std::string joined;
  for (const std::string& s : bufs) joined += s;
  EXPECT_EQ(joined, data.substr(3, joined.size()));
}

TEST(SharedMemoryTest, ErrorsNameThePath) {
  ScratchDir dir(TmpfsParent());
  ASSERT_TRUE(dir.ok());
  auto a = SharedMemory::Create(dir.path(), "m", kHeader * 2, kHeader);
  ASSERT_TRUE(a.ok());
  auto again = SharedMemory::Create(dir.path(), "m", kHeader * 2, kHeader);
  ASSERT_FALSE(again.ok());
  EXPECT_NE(again.status().ToString().find(dir.File("m")), std::string::npos);
  auto wrong = SharedMemory::Open(dir.path(), "m", kHeader * 3, kHeader);
  EXPECT_EQ(wrong.status().code(), StatusCode::kFailedPrecondition);
  auto missing = SharedMemory::Open(dir.path(), "nope", kHeader, kHeader);
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  char buf[16];
  EXPECT_EQ((*a)->Read(kHeader * 2 - 8, buf, sizeof buf).code(), StatusCode::kDataLoss);
}

}  // namespace
}  // namespace shardsafe
