// Tests of the POSIX WritableFile and RandomAccessFile: round trips in
// direct and buffered mode, on the project disk (O_DIRECT honoured) and on
// tmpfs (O_DIRECT refused before Linux 6.6, so the buffered fallback; taken
// since), plus error reporting. /dev/full always refuses O_DIRECT, so the
// fallback is exercised there whatever the kernel.
#include "storage/aligned_buffer.h"
#include "storage/posix_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <thread>
#include <tuple>

#include "base/crc32c.h"
#include "gtest/gtest.h"
#include "testing/storage_test_util.h"

namespace shardsafe {
namespace {

using ::shardsafe::testing::DiskParent;
using ::shardsafe::testing::RandomBytes;
using ::shardsafe::testing::ScratchDir;
using ::shardsafe::testing::TmpfsParent;

enum class Where { kDisk, kTmpfs };

struct Mode {
  Where where;
  bool direct;
};

std::string ModeName(const ::testing::TestParamInfo<Mode>& info) {
  return std::string(info.param.where == Where::kDisk ? "Disk" : "Tmpfs") +
         (info.param.direct ? "Direct" : "Buffered");
}

class PosixFileRoundTripTest : public ::testing::TestWithParam<Mode> {
 protected:
  PosixFileRoundTripTest()
      : dir_(GetParam().where == Where::kDisk ? DiskParent() : TmpfsParent()) {}
  void SetUp() override { ASSERT_TRUE(dir_.ok()) << "cannot create a scratch directory"; }

  WriteOptions Options(size_t buffer_bytes = 1 << 20, int queue_depth = 2) const {
    WriteOptions o;
    o.direct = GetParam().direct;
    o.buffer_bytes = buffer_bytes;
    o.queue_depth = queue_depth;
    return o;
  }

  // Writes `data` in appends of the given sizes (cycled), then closes.
  void WriteInPieces(const std::string& path, const std::string& data, const WriteOptions& o,
                     const std::vector<size_t>& pieces) {
    auto file = DefaultFileSystem()->NewWritableFile(path, o);
    ASSERT_TRUE(file.ok()) << file.status().ToString();
    // tmpfs takes O_DIRECT since Linux 6.6; before that the file falls back.
    if (GetParam().where == Where::kDisk) {
      EXPECT_EQ(IsDirectWritableFile(**file), o.direct);
    }
    if (!o.direct) {
      EXPECT_FALSE(IsDirectWritableFile(**file));
    }
    size_t done = 0;
    for (size_t i = 0; done < data.size(); ++i) {
      size_t n = std::min(pieces[i % pieces.size()], data.size() - done);
      ASSERT_TRUE((*file)->Append(data.data() + done, n).ok());
      done += n;
      ASSERT_EQ((*file)->size(), done);
    }
    ASSERT_TRUE((*file)->Sync().ok());
    ASSERT_TRUE((*file)->Close().ok());
  }

  void ExpectContent(const std::string& path, const std::string& expected) {
    auto info = DefaultFileSystem()->Stat(path);
    ASSERT_TRUE(info.ok());
    EXPECT_EQ(info->size, expected.size());
    auto read = ReadFileToString(*DefaultFileSystem(), path, expected.size());
    ASSERT_TRUE(read.ok()) << read.status().ToString();
    EXPECT_TRUE(*read == expected) << "content differs for " << path;
  }

  // `path` opened for reading as this mode reads (direct or buffered).
  std::unique_ptr<RandomAccessFile> OpenReader(const std::string& path) {
    const ReadOptions options{.direct = GetParam().direct, .within = ""};
    auto file = DefaultFileSystem()->NewRandomAccessFile(path, options);
    EXPECT_TRUE(file.ok()) << file.status().ToString();
    return file.ok() ? std::move(*file) : nullptr;
  }

  ScratchDir dir_;
};

// Drops the pages of `path` from the page cache (clean pages only: write
// and sync first).
void DropFromPageCache(const std::string& path) {
  int fd = open(path.c_str(), O_RDONLY);
  ASSERT_GE(fd, 0) << path;
  posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  close(fd);
}

TEST_P(PosixFileRoundTripTest, OddSizesInOneAppend) {
  for (size_t n : {size_t{0}, size_t{1}, size_t{4095}, size_t{4096}, size_t{4097},
                   size_t{(10 << 20) + 3}}) {
    SCOPED_TRACE(n);
    const std::string path = dir_.File("odd" + std::to_string(n));
    const std::string data = RandomBytes(n, n);
    WriteInPieces(path, data, Options(), {n + 1});
    ExpectContent(path, data);
  }
}

TEST_P(PosixFileRoundTripTest, ManySmallAppendsThroughSmallBuffers) {
  const std::string data = RandomBytes((3 << 20) + 777, 7);
  for (int depth : {1, 2, 4}) {
    SCOPED_TRACE(depth);
    const std::string path = dir_.File("small" + std::to_string(depth));
    WriteInPieces(path, data, Options(64 << 10, depth), {1, 13, 4096, 5000, 65536, 100000, 7});
    ExpectContent(path, data);
  }
}

TEST_P(PosixFileRoundTripTest, SyncMidStreamThenKeepAppending) {
  const std::string path = dir_.File("midsync");
  const std::string data = RandomBytes(200000, 3);
  auto file = DefaultFileSystem()->NewWritableFile(path, Options(64 << 10));
  ASSERT_TRUE(file.ok());
  ASSERT_TRUE((*file)->Append(data.data(), 70001).ok());
  ASSERT_TRUE((*file)->Sync().ok());
  ExpectContent(path, data.substr(0, 70001));
  ASSERT_TRUE((*file)->Append(data.data() + 70001, data.size() - 70001).ok());
  ASSERT_TRUE((*file)->Sync().ok());
  ASSERT_TRUE((*file)->Close().ok());
  ExpectContent(path, data);
}

// Sync, then Close: the file is synced, then untouched (commit.h relies on
// it). A change made behind the file's back after Sync stays.
TEST_P(PosixFileRoundTripTest, CloseAfterSyncWritesNothing) {
  const std::string path = dir_.File("synced");
  const std::string data = RandomBytes(70001, 4);
  auto file = DefaultFileSystem()->NewWritableFile(path, Options(64 << 10));
  ASSERT_TRUE(file.ok());
  ASSERT_TRUE((*file)->Append(data.data(), data.size()).ok());
  ASSERT_TRUE((*file)->Sync().ok());
  std::string marked = data;
  marked.back() ^= 0x5a;
  {
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(data.size() - 1));
    f.put(marked.back());
  }
  ASSERT_TRUE((*file)->Close().ok());
  ExpectContent(path, marked);
}

TEST_P(PosixFileRoundTripTest, SizeHintLargerThanDataLeavesTrueSize) {
  const std::string path = dir_.File("hinted");
  const std::string data = RandomBytes(12345, 4);
  WriteOptions o = Options();
  o.size_hint = 1 << 20;
  WriteInPieces(path, data, o, {1000});
  ExpectContent(path, data);
}

TEST_P(PosixFileRoundTripTest, SizeHintSmallerThanDataStillWritesEverything) {
  const std::string path = dir_.File("underhinted");
  const std::string data = RandomBytes(100003, 6);
  WriteOptions o = Options();
  o.size_hint = 5000;  // direct mode sizes its buffers from the hint: 8 KiB
  WriteInPieces(path, data, o, {3000, 9000});
  ExpectContent(path, data);
}

TEST_P(PosixFileRoundTripTest, DestructorWritesOutBufferedBytes) {
  const std::string path = dir_.File("unclosed");
  const std::string data = RandomBytes(5000, 5);
  {
    auto file = DefaultFileSystem()->NewWritableFile(path, Options());
    ASSERT_TRUE(file.ok());
    ASSERT_TRUE((*file)->Append(data.data(), data.size()).ok());
  }
  ExpectContent(path, data);
}

TEST_P(PosixFileRoundTripTest, CloseIsIdempotentAndAppendAfterCloseFails) {
  auto file = DefaultFileSystem()->NewWritableFile(dir_.File("closed"), Options());
  ASSERT_TRUE(file.ok());
  ASSERT_TRUE((*file)->Append("abc", 3).ok());
  EXPECT_TRUE((*file)->Close().ok());
  EXPECT_TRUE((*file)->Close().ok());
  EXPECT_EQ((*file)->Append("d", 1).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ((*file)->Sync().code(), StatusCode::kFailedPrecondition);
}

TEST_P(PosixFileRoundTripTest, ExistingFileIsTruncated) {
  const std::string path = dir_.File("again");
  WriteInPieces(path, RandomBytes(100000, 1), Options(), {100000});
  const std::string shorter = RandomBytes(10, 2);
  WriteInPieces(path, shorter, Options(), {10});
  ExpectContent(path, shorter);
}

TEST_P(PosixFileRoundTripTest, ReadsAlignedAndUnalignedRanges) {
  const std::string path = dir_.File("ranges");
  const std::string data = RandomBytes((1 << 20) + 100, 9);
  WriteInPieces(path, data, Options(), {data.size()});
  auto file = OpenReader(path);
  ASSERT_NE(file, nullptr);
  EXPECT_EQ(file->size(), data.size());
  if (GetParam().where == Where::kDisk) {
    EXPECT_EQ(IsDirectRandomAccessFile(*file), GetParam().direct);
  }
  alignas(4096) static char aligned[1 << 20];
  const std::pair<uint64_t, size_t> ranges[] = {
      {0, 4096}, {4096, 65536}, {1, 4095}, {12345, 99999}, {0, 1 << 20}, {1 << 20, 100}};
  for (auto [offset, n] : ranges) {
    SCOPED_TRACE(offset);
    ASSERT_TRUE(file->ReadAt(offset, aligned, n).ok());
    EXPECT_EQ(std::string(aligned, n), data.substr(offset, n));
  }
}

TEST_P(PosixFileRoundTripTest, AppendStableWritesAlignedMemoryInPlaceAndTailsThroughBuffers) {
  const std::string path = dir_.File("stable");
  const std::string data = RandomBytes((5 << 20) + 123, 3);
  // Aligned copy of the data, kept unchanged until Sync as promised.
  std::unique_ptr<char, decltype(&std::free)> aligned(
      static_cast<char*>(std::aligned_alloc(4096, AlignUp(data.size()))), &std::free);
  std::memcpy(aligned.get(), data.data(), data.size());
  auto file = DefaultFileSystem()->NewWritableFile(path, Options(1 << 20, 3));
  ASSERT_TRUE(file.ok());
  // Header-like unaligned start, then aligned memory at an unaligned offset
  // (copied), then a stable append at an aligned offset (in place).
  ASSERT_TRUE((*file)->AppendStable(aligned.get(), 100).ok());
  ASSERT_TRUE((*file)->Append(aligned.get() + 100, 4096 - 100).ok());
  ASSERT_TRUE((*file)->Sync().ok());
  ASSERT_TRUE((*file)->AppendStable(aligned.get() + 4096, data.size() - 4096).ok());
  EXPECT_EQ((*file)->size(), data.size());
  ASSERT_TRUE((*file)->Sync().ok());
  ASSERT_TRUE((*file)->Close().ok());
  ExpectContent(path, data);
}

TEST_P(PosixFileRoundTripTest, AppendChecksummedWritesTheBytesAndExtendsTheirChecksum) {
  const std::string data = RandomBytes((3 << 20) + 4321, 11);
  const std::string path = dir_.File("checksummed");
  auto file = DefaultFileSystem()->NewWritableFile(path, Options(64 << 10, 2));
  ASSERT_TRUE(file.ok());
  // Pieces that start and end anywhere in a buffer and span several; the
  // checksum runs on across them, from a nonzero start.
  const uint32_t start = 0x5eed;
  uint32_t crc = start;
  size_t done = 0;
  for (size_t i = 0; done < data.size(); ++i) {
    const size_t n = std::min<size_t>(size_t{1} + i * 37'123 % 300'001, data.size() - done);
    ASSERT_TRUE((*file)->AppendChecksummed(data.data() + done, n, &crc).ok());
    done += n;
    ASSERT_EQ((*file)->size(), done);
  }
  EXPECT_EQ(crc, Crc32cExtend(start, data.data(), data.size()));
  ASSERT_TRUE((*file)->Sync().ok());
  ASSERT_TRUE((*file)->Close().ok());
  ExpectContent(path, data);
}

TEST_P(PosixFileRoundTripTest, AppendFilledWritesWhatTheFillerPutsAndExtendsTheChecksum) {
  const std::string data = RandomBytes((9 << 20) + 4321, 12);
  const std::string path = dir_.File("filled");
  auto file = DefaultFileSystem()->NewWritableFile(path, Options(64 << 10, 2));
  ASSERT_TRUE(file.ok());
  // Appends of any size after an unaligned start; the filler is asked for
  // consecutive ranges that cover each append exactly, none larger than
  // the default's bounce buffer.
  ASSERT_TRUE((*file)->Append(data.data(), 777).ok());
  const uint32_t start = 0x5eed;
  uint32_t crc = start;
  size_t done = 777;
  for (size_t i = 0; done < data.size(); ++i) {
    const size_t n = std::min<size_t>(size_t{1} + i * 1'237'123 % 5'000'001, data.size() - done);
    uint64_t next = 0;
    auto fill = [&](char* dst, uint64_t offset, size_t len) {
      EXPECT_EQ(offset, next);
      EXPECT_LE(len, WritableFile::kFillBounceBytes);
      std::memcpy(dst, data.data() + done + offset, len);
      next = offset + len;
      return Status();
    };
    ASSERT_TRUE((*file)->AppendFilled(n, fill, &crc).ok());
    EXPECT_EQ(next, n);
    done += n;
    ASSERT_EQ((*file)->size(), done);
  }
  EXPECT_EQ(crc, Crc32cExtend(start, data.data() + 777, data.size() - 777));
  // A filler's failure comes back as it is and leaves the checksum alone.
  const uint32_t before = crc;
  Status failed = (*file)->AppendFilled(
      3 << 20, [](char*, uint64_t, size_t) { return UnavailableError("device lost (injected)"); },
      &crc);
  EXPECT_EQ(failed.message(), "device lost (injected)");
  EXPECT_EQ(crc, before);
  ASSERT_EQ((*file)->size(), data.size()) << "a failed fill appended something";
  ASSERT_TRUE((*file)->Sync().ok());
  ASSERT_TRUE((*file)->Close().ok());
  ExpectContent(path, data);
}

TEST_P(PosixFileRoundTripTest, LargeUnalignedReadsGoThroughTheBounceBuffer) {
  // Over 8 MiB, so the bounced path needs several pieces, and an odd size.
  const std::string path = dir_.File("bounce");
  const std::string data = RandomBytes((19 << 20) + 777, 5);
  WriteInPieces(path, data, Options(), {data.size()});
  auto file = OpenReader(path);
  ASSERT_NE(file, nullptr);
  std::vector<char> buf(data.size() + 1);
  const std::pair<uint64_t, size_t> ranges[] = {
      {1, 300000}, {4095, 9 << 20}, {777, data.size() - 777}, {0, data.size()},
      {data.size() - 300001, 300001}};
  for (auto [offset, n] : ranges) {
    SCOPED_TRACE(offset);
    ASSERT_TRUE(file->ReadAt(offset, buf.data() + 1, n).ok());
    EXPECT_TRUE(std::string(buf.data() + 1, n) == data.substr(offset, n));
  }
  Status s = file->ReadAt(data.size() - 300000, buf.data() + 1, 300001);
  EXPECT_EQ(s.code(), StatusCode::kDataLoss) << s.ToString();
}

// Pages of the file at `path` in the page cache (mincore of a mapping).
size_t ResidentPages(const std::string& path) {
  int fd = open(path.c_str(), O_RDONLY);
  if (fd < 0) return SIZE_MAX;
  const off_t size = lseek(fd, 0, SEEK_END);
  void* map = mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
  close(fd);
  if (map == MAP_FAILED) return SIZE_MAX;
  const size_t page = sysconf(_SC_PAGESIZE);
  std::vector<unsigned char> vec((size + page - 1) / page);
  size_t resident = SIZE_MAX;
  if (mincore(map, size, vec.data()) == 0) {
    resident = 0;
    for (unsigned char v : vec) resident += v & 1;
  }
  munmap(map, size);
  return resident;
}

TEST_P(PosixFileRoundTripTest, LargeScatteredReadsOfUncachedDataAreCopiedOutRight) {
  // With O_DIRECT, a large scattered read of uncached bytes is one bounced
  // read copied out piece by piece: pieces of odd sizes (and empty ones)
  // straddling the 8 MiB bounce pieces must each get their bytes.
  const std::string path = dir_.File("scatter");
  const std::string data = RandomBytes((21 << 20) + 333, 9);
  WriteInPieces(path, data, Options(), {data.size()});
  DropFromPageCache(path);  // what the write left cached
  auto file = OpenReader(path);
  ASSERT_NE(file, nullptr);
  const uint64_t at = 12345;
  const size_t sizes[] = {1, 0, 8 << 20, 4093, 0, (3 << 20) + 5, 7, (8 << 20) - 2, 99999};
  std::vector<std::string> bufs;
  std::vector<RandomAccessFile::Piece> pieces;
  for (size_t n : sizes) bufs.emplace_back(n, '\0');
  for (std::string& b : bufs) pieces.push_back({b.data(), b.size()});
  ASSERT_TRUE(file->ReadScattered(at, pieces).ok());
  uint64_t pos = at;
  for (size_t i = 0; i < bufs.size(); ++i) {
    EXPECT_TRUE(bufs[i] == data.substr(pos, bufs[i].size())) << "piece " << i;
    pos += bufs[i].size();
  }
  if (GetParam().direct && GetParam().where == Where::kDisk) {
    // It was the bounced O_DIRECT read: the page cache still holds none of it.
    EXPECT_EQ(ResidentPages(path), 0u);
  }
  std::string tail(2 << 20, '\0');
  const RandomAccessFile::Piece past[] = {{tail.data(), tail.size()}};
  EXPECT_EQ(file->ReadScattered(data.size() - (1 << 20), past).code(), StatusCode::kDataLoss);
}

TEST_P(PosixFileRoundTripTest, FullyCachedTellsWhetherEveryPageIsInThePageCache) {
  const std::string path = dir_.File("cached");
  const std::string data = RandomBytes((3 << 20) + 77, 12);
  WriteInPieces(path, data, Options(), {data.size()});
  auto file = OpenReader(path);
  ASSERT_NE(file, nullptr);
  std::string buf(data.size(), '\0');
  {  // a buffered read fills the page cache
    auto buffered = DefaultFileSystem()->NewRandomAccessFile(path, ReadOptions{});
    ASSERT_TRUE(buffered.ok());
    ASSERT_TRUE((*buffered)->ReadAt(0, buf.data(), buf.size()).ok());
  }
  EXPECT_TRUE(file->FullyCached(0, data.size()));
  EXPECT_TRUE(file->FullyCached(4095, 2));  // across a page boundary
  EXPECT_TRUE(file->FullyCached(5, 0));
  if (GetParam().where == Where::kTmpfs) return;  // tmpfs pages cannot be dropped
  DropFromPageCache(path);  // then cache the first MiB, and no more (no readahead)
  int fd = open(path.c_str(), O_RDONLY);
  ASSERT_GE(fd, 0);
  posix_fadvise(fd, 0, 0, POSIX_FADV_RANDOM);
  ASSERT_EQ(pread(fd, buf.data(), 1 << 20, 0), 1 << 20);
  close(fd);
  EXPECT_TRUE(file->FullyCached(0, 1 << 20));
  EXPECT_FALSE(file->FullyCached(0, data.size()));
  EXPECT_FALSE(file->FullyCached((1 << 20) + 4096, 10));
}

TEST_P(PosixFileRoundTripTest, ScatteredReadOfPartlyCachedDataTakesThePageCache) {
  // Only the last MiB is cached, so the range's first page is not: the
  // probe must still see the cached pages further on and read through the
  // page cache (the bounced O_DIRECT read is for ranges with nothing cached).
  if (GetParam().where == Where::kTmpfs) return;  // tmpfs pages cannot be dropped
  const std::string path = dir_.File("partly");
  const std::string data = RandomBytes(3 << 20, 13);
  WriteInPieces(path, data, Options(), {data.size()});
  DropFromPageCache(path);
  int fd = open(path.c_str(), O_RDONLY);
  ASSERT_GE(fd, 0);
  posix_fadvise(fd, 0, 0, POSIX_FADV_RANDOM);
  std::string buf(1 << 20, '\0');
  ASSERT_EQ(pread(fd, buf.data(), buf.size(), 2 << 20), 1 << 20);
  close(fd);
  // Resident page counts are checked loosely: on a busy machine the kernel
  // may evict a page at any moment.
  const size_t mib_pages = (1u << 20) / sysconf(_SC_PAGESIZE);
  ASSERT_LE(ResidentPages(path), mib_pages) << "only the last MiB is cached";
  auto file = OpenReader(path);
  ASSERT_NE(file, nullptr);
  std::string first(5 << 19, '\0'), second((1 << 19) - 1, '\0');
  const RandomAccessFile::Piece pieces[] = {{first.data(), first.size()},
                                            {second.data(), second.size()}};
  ASSERT_TRUE(file->ReadScattered(1, pieces).ok());
  EXPECT_TRUE(first + second == data.substr(1, first.size() + second.size()));
  // Read through the page cache: the first two MiB are resident now too
  // (a bounced O_DIRECT read leaves at most the last MiB).
  EXPECT_GT(ResidentPages(path), 2 * mib_pages);
}

TEST_P(PosixFileRoundTripTest, ReadPastEndIsDataLoss) {
  const std::string path = dir_.File("short");
  WriteInPieces(path, RandomBytes(10000, 1), Options(), {10000});
  auto file = OpenReader(path);
  ASSERT_NE(file, nullptr);
  alignas(4096) static char buf[16384];
  Status s = file->ReadAt(8192, buf, 8192);
  EXPECT_EQ(s.code(), StatusCode::kDataLoss);
  EXPECT_NE(s.message().find("file truncated: wanted 8192 bytes at offset 8192, file has 10000"),
            std::string::npos)
      << s.message();
  EXPECT_NE(s.message().find(path), std::string::npos);
  EXPECT_EQ(file->ReadAt(10001, buf, 1).code(), StatusCode::kDataLoss);
  EXPECT_TRUE(file->ReadAt(10000, buf, 0).ok());
}

TEST_P(PosixFileRoundTripTest, ScatteredReadFillsPiecesInOrder) {
  const std::string path = dir_.File("scatter");
  const std::string data = RandomBytes(3000 * 1100 + 17, 4);
  WriteInPieces(path, data, Options(), {data.size()});
  auto file = OpenReader(path);
  ASSERT_NE(file, nullptr);
  // More pieces than one preadv takes (IOV_MAX), of uneven sizes, some empty.
  std::vector<std::string> bufs;
  std::vector<RandomAccessFile::Piece> pieces;
  for (size_t i = 0; i < 3000; ++i) bufs.emplace_back(i % 7 == 0 ? 0 : 1000 + i % 200, '\0');
  for (std::string& b : bufs) pieces.push_back({b.data(), b.size()});
  ASSERT_TRUE(file->ReadScattered(17, pieces).ok());
  uint64_t at = 17;
  for (const std::string& b : bufs) {
    ASSERT_EQ(b, data.substr(at, b.size())) << "piece at " << at;
    at += b.size();
  }
  std::string tail(data.size() - at + 1, '\0');
  RandomAccessFile::Piece past[] = {{tail.data(), tail.size()}};
  EXPECT_EQ(file->ReadScattered(at, past).code(), StatusCode::kDataLoss);
}

TEST_P(PosixFileRoundTripTest, ConcurrentReadsSeeTheirOwnRanges) {
  const std::string path = dir_.File("concurrent");
  const std::string data = RandomBytes(4 << 20, 11);
  WriteInPieces(path, data, Options(), {data.size()});
  auto file = OpenReader(path);
  ASSERT_NE(file, nullptr);
  std::vector<std::thread> threads;
  std::vector<int> failures(4, 0);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      std::vector<char> buf(65536 + 4096);
      char* aligned = buf.data() + (4096 - reinterpret_cast<uintptr_t>(buf.data()) % 4096) % 4096;
      for (int i = 0; i < 64; ++i) {
        const uint64_t offset = (static_cast<uint64_t>(t * 64 + i) * 16384) % (data.size() - 65536);
        if (!file->ReadAt(offset, aligned, 65536).ok() ||
            memcmp(aligned, data.data() + offset, 65536) != 0) {
          ++failures[t];
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(failures, std::vector<int>(4, 0));
}

INSTANTIATE_TEST_SUITE_P(AllModes, PosixFileRoundTripTest,
                         ::testing::Values(Mode{Where::kDisk, true}, Mode{Where::kDisk, false},
                                           Mode{Where::kTmpfs, true},
                                           Mode{Where::kTmpfs, false}),
                         ModeName);

TEST(PosixFileTest, MissingFileIsNotFound) {
  auto file = DefaultFileSystem()->NewRandomAccessFile("/nonexistent/ss/file", ReadOptions{});
  EXPECT_EQ(file.status().code(), StatusCode::kNotFound);
  auto out = DefaultFileSystem()->NewWritableFile("/nonexistent/ss/file", WriteOptions{});
  EXPECT_EQ(out.status().code(), StatusCode::kNotFound);
}

TEST(PosixFileTest, AFifoIsRefusedWithoutWaitingForAWriter) {
  ScratchDir dir(DiskParent());
  ASSERT_TRUE(dir.ok());
  ASSERT_EQ(mkfifo(dir.File("fifo").c_str(), 0644), 0);
  for (bool direct : {false, true}) {
    auto file = DefaultFileSystem()->NewRandomAccessFile(dir.File("fifo"), {.direct = direct});
    ASSERT_FALSE(file.ok());
    EXPECT_EQ(file.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(file.status().message().find("is not a regular file"), std::string::npos)
        << file.status().message();
  }
}

// What the hook of the checked open swaps in at the path it opened.
struct Swap {
  std::string path;     // the file opened
  std::string outside;  // a file elsewhere, for a link to lead to
  bool fifo = false;    // else a symbolic link to `outside`
  int calls = 0;
};
Swap* swap_in = nullptr;

void SwapPath(const std::string& path) {
  if (!swap_in || path != swap_in->path) return;
  ++swap_in->calls;
  ASSERT_EQ(unlink(path.c_str()), 0);  // the open descriptor keeps the file
  if (swap_in->fifo) {
    ASSERT_EQ(mkfifo(path.c_str(), 0644), 0);
  } else {
    ASSERT_EQ(symlink(swap_in->outside.c_str(), path.c_str()), 0);
  }
}

class SwapAfterCheckedOpenTest : public ::testing::TestWithParam<bool> {};

// The checked open hands its own descriptor on: a FIFO (which would block
// an open) or a link leading outside swapped in at the path right after it
// is neither opened nor followed by the O_DIRECT descriptor opened beside
// it; every read returns the checked file's bytes.
TEST_P(SwapAfterCheckedOpenTest, TheDirectDescriptorIsOfTheCheckedFile) {
  ScratchDir dir(DiskParent()), elsewhere(DiskParent());
  ASSERT_TRUE(dir.ok() && elsewhere.ok());
  const std::string inside = RandomBytes(3 * 4096, 1), outside = RandomBytes(3 * 4096, 2);
  ASSERT_TRUE(WriteFileAtomically(*DefaultFileSystem(), dir.File("data"), inside).ok());
  ASSERT_TRUE(WriteFileAtomically(*DefaultFileSystem(), elsewhere.File("x"), outside).ok());
  Swap swap{dir.File("data"), elsewhere.File("x"), GetParam()};
  swap_in = &swap;
  SetCheckedOpenHookForTest(&SwapPath);
  auto file = DefaultFileSystem()->NewRandomAccessFile(
      dir.File("data"), {.direct = true, .within = dir.path()});
  SetCheckedOpenHookForTest(nullptr);
  swap_in = nullptr;
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  EXPECT_EQ(swap.calls, 1);
  EXPECT_TRUE(IsDirectRandomAccessFile(**file)) << "O_DIRECT is honoured on the project disk";
  AlignedBuffer aligned = AcquireAlignedBuffer(inside.size());
  ASSERT_TRUE((*file)->ReadAt(0, aligned.data(), inside.size()).ok());  // through O_DIRECT
  EXPECT_EQ(std::string(aligned.data(), inside.size()), inside);
  std::string unaligned(100, '\0');
  ASSERT_TRUE((*file)->ReadAt(5, unaligned.data(), unaligned.size()).ok());  // buffered
  EXPECT_EQ(unaligned, inside.substr(5, 100));
}

INSTANTIATE_TEST_SUITE_P(FifoOrLink, SwapAfterCheckedOpenTest, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "Fifo" : "Symlink"; });

TEST(PosixFileTest, DiskFullOnAppendIsResourceExhausted) {
  // /dev/full fails every write with ENOSPC (and refuses O_DIRECT, so the
  // direct request takes the buffered fallback).
  for (bool direct : {false, true}) {
    WriteOptions o;
    o.direct = direct;
    auto file = DefaultFileSystem()->NewWritableFile("/dev/full", o);
    ASSERT_TRUE(file.ok()) << file.status().ToString();
    EXPECT_FALSE(IsDirectWritableFile(**file)) << "O_DIRECT refused: buffered fallback";
    Status s = (*file)->Append("hello", 5);
    EXPECT_EQ(s.code(), StatusCode::kResourceExhausted) << s.ToString();
    EXPECT_NE(s.message().find("/dev/full"), std::string::npos);
    uint32_t crc = 7;
    EXPECT_EQ((*file)->AppendChecksummed("hello", 5, &crc).code(),
              StatusCode::kResourceExhausted);
    EXPECT_EQ(crc, 7u) << "a failed append leaves the checksum as it was";
    EXPECT_EQ((*file)->Sync().code(), StatusCode::kResourceExhausted) << "error must stick";
    EXPECT_EQ((*file)->Close().code(), StatusCode::kResourceExhausted);
  }
}

TEST(PosixFileTest, PreallocationBeyondFreeSpaceIsResourceExhausted) {
  ScratchDir dir(TmpfsParent());
  ASSERT_TRUE(dir.ok());
  WriteOptions o;
  o.size_hint = uint64_t{1} << 40;  // 1 TiB: more than tmpfs may hold
  auto file = DefaultFileSystem()->NewWritableFile(dir.File("huge"), o);
  EXPECT_EQ(file.status().code(), StatusCode::kResourceExhausted) << file.status().ToString();
}

// A 1 MiB tmpfs really fills up. Needs root (mount); skipped otherwise.
class FullTmpfsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(parent_.ok());
    mount_point_ = parent_.File("mnt");
    ASSERT_TRUE(DefaultFileSystem()->CreateDir(mount_point_).ok());
    if (mount("tmpfs", mount_point_.c_str(), "tmpfs", 0, "size=1m") != 0) {
      GTEST_SKIP() << "cannot mount a small tmpfs (not root?): " << strerror(errno);
    }
    mounted_ = true;
  }
  void TearDown() override {
    if (mounted_) umount(mount_point_.c_str());
  }

  ScratchDir parent_{TmpfsParent()};
  std::string mount_point_;
  bool mounted_ = false;
};

TEST_F(FullTmpfsTest, WritingPastCapacityIsResourceExhausted) {
  const std::string data = RandomBytes(2 << 20, 1);
  for (bool direct : {false, true}) {
    WriteOptions o;
    o.direct = direct;
    o.buffer_bytes = 64 << 10;
    auto file = DefaultFileSystem()->NewWritableFile(JoinPath(mount_point_, "f"), o);
    ASSERT_TRUE(file.ok());
    Status s = (*file)->Append(data.data(), data.size());
    if (s.ok()) s = (*file)->Sync();
    EXPECT_EQ(s.code(), StatusCode::kResourceExhausted) << s.ToString();
    EXPECT_EQ((*file)->Close().code(), StatusCode::kResourceExhausted);
  }
}

TEST_F(FullTmpfsTest, SizeHintPastCapacityIsResourceExhausted) {
  WriteOptions o;
  o.size_hint = 2 << 20;
  auto file = DefaultFileSystem()->NewWritableFile(JoinPath(mount_point_, "g"), o);
  EXPECT_EQ(file.status().code(), StatusCode::kResourceExhausted) << file.status().ToString();
}

}  // namespace
}  // namespace shardsafe
