#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <string>
#include <vector>

#include "base/crc32c.h"
#include "base/env.h"
#include "base/thread_pool.h"
#include "shardsafe/status.h"
#include "shardsafe/types.h"
#include "testing/status_matchers.h"

namespace shardsafe {
namespace {

Result<int> Half(int x) {
  if (x % 2) return InvalidArgumentError("odd");
  return x / 2;
}

Status Quarter(int x, int* out) {
  SS_ASSIGN_OR_RETURN(int h, Half(x));
  SS_ASSIGN_OR_RETURN(*out, Half(h));
  return Status();
}

TEST(EnvIntegerTest, UnsetGivesTheFallbackAndBadTextOrRangeIsNamed) {
  unsetenv("SHARDSAFE_TEST_INT");
  EXPECT_EQ(*EnvInteger("SHARDSAFE_TEST_INT", 7, 0, 10), 7);
  setenv("SHARDSAFE_TEST_INT", "10", 1);
  EXPECT_EQ(*EnvInteger("SHARDSAFE_TEST_INT", 7, 0, 10), 10);
  for (const char* bad : {"11", "-1", "3s", "", "0x3"}) {
    setenv("SHARDSAFE_TEST_INT", bad, 1);
    Result<int64_t> got = EnvInteger("SHARDSAFE_TEST_INT", 7, 0, 10);
    EXPECT_EQ(got.status().code(), StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(got.status().message().find("SHARDSAFE_TEST_INT=\"" + std::string(bad) + "\""),
              std::string::npos)
        << got.status().ToString();
  }
  unsetenv("SHARDSAFE_TEST_INT");
}

TEST(StatusTest, ContextIsPrependedAndCodeKept) {
  Status s = DataLossError("checksum mismatch").WithContext("file a").WithContext("loading x");
  EXPECT_EQ(s.code(), StatusCode::kDataLoss);
  EXPECT_EQ(s.message(), "loading x: file a: checksum mismatch");
  EXPECT_EQ(s.ToString(), "DATA_LOSS: loading x: file a: checksum mismatch");
  EXPECT_TRUE(Status().WithContext("ignored").ok());
}

TEST(StatusTest, DetailSurvivesContext) {
  Status s = InvalidArgumentError("shape mismatch")
                 .WithDetail(ErrorDetail::kShapeMismatch)
                 .WithContext("loading x");
  EXPECT_EQ(s.detail(), ErrorDetail::kShapeMismatch);
  EXPECT_EQ(ErrorDetailName(s.detail()), "SHAPE_MISMATCH");
  EXPECT_EQ(InvalidArgumentError("other").detail(), ErrorDetail::kNone);
  EXPECT_TRUE(Status().WithDetail(ErrorDetail::kDTypeMismatch).ok());
}

TEST(StatusTest, MacrosPropagateFirstFailure) {
  int out = 0;
  EXPECT_TRUE(Quarter(8, &out).ok());
  EXPECT_EQ(out, 2);
  EXPECT_EQ(Quarter(6, &out).code(), StatusCode::kInvalidArgument);
}

TEST(StatusTest, ErrnoMapsDiskFullToResourceExhausted) {
  EXPECT_EQ(ErrnoError(ENOSPC, "write", "/x").code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(ErrnoError(ENOENT, "open", "/x").code(), StatusCode::kNotFound);
  EXPECT_NE(ErrnoError(EIO, "write", "/x").message().find("/x"), std::string::npos);
}

TEST(Crc32cTest, StandardCheckValue) {
  EXPECT_EQ(Crc32c("123456789", 9), 0xE3069283u);
  EXPECT_EQ(Crc32c("", 0), 0u);
}

TEST(Crc32cTest, ExtendEqualsWhole) {
  std::string data(100000, '\0');
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>(i * 131 + 7);
  const uint32_t whole = Crc32c(data.data(), data.size());
  for (size_t cut : {0ul, 1ul, 4095ul, 50000ul, 99999ul}) {
    uint32_t c = Crc32cExtend(0, data.data(), cut);
    c = Crc32cExtend(c, data.data() + cut, data.size() - cut);
    EXPECT_EQ(c, whole) << cut;
  }
}

TEST(Crc32cTest, CombineEqualsWhole) {
  std::vector<unsigned char> data(100000);
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<unsigned char>(i * 131 + 7);
  const uint32_t whole = Crc32c(data.data(), data.size());
  for (size_t cut : {size_t{0}, size_t{1}, size_t{4096}, size_t{65537}, data.size()}) {
    const uint32_t a = Crc32c(data.data(), cut);
    const uint32_t b = Crc32c(data.data() + cut, data.size() - cut);
    EXPECT_EQ(Crc32cCombine(a, b, data.size() - cut), whole) << "cut at " << cut;
  }
  EXPECT_EQ(Crc32cCombine(Crc32c("1234", 4), Crc32c("56789", 5), 5), 0xE3069283u);
}

TEST(Crc32cTest, CopyWithCrcCopiesAndChecksums) {
  std::vector<char> src(1 << 20), dst(1 << 20);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<char>(i ^ (i >> 8));
  EXPECT_EQ(CopyWithCrc32c(dst.data(), src.data(), src.size(), 0), Crc32c(src.data(), src.size()));
  EXPECT_EQ(std::memcmp(src.data(), dst.data(), src.size()), 0);
  // Every alignment of the destination and sizes around the 64-byte stores
  // and the 64 KiB blocks; bytes around the copy stay untouched.
  for (size_t at : {0, 1, 7, 15, 16, 17, 31, 33}) {
    for (size_t n : {0, 1, 15, 16, 63, 64, 65, 127, 65535, 65536, 65537, 200003}) {
      std::fill(dst.begin(), dst.end(), '\x11');
      const uint32_t crc = CopyWithCrc32c(dst.data() + at, src.data() + 3, n, 0x1234);
      EXPECT_EQ(crc, Crc32cExtend(0x1234, src.data() + 3, n)) << at << " " << n;
      EXPECT_EQ(std::memcmp(dst.data() + at, src.data() + 3, n), 0) << at << " " << n;
      if (at > 0) {
        EXPECT_EQ(dst[at - 1], '\x11') << at << " " << n;
      }
      EXPECT_EQ(dst[at + n], '\x11') << at << " " << n;
    }
  }
}

TEST(ThreadPoolTest, TaskGroupRunsAllAndReportsFirstError) {
  for (size_t threads : {0, 1, 3}) {
    ThreadPool pool(threads);
    std::atomic<int> ran{0};
    TaskGroup group(&pool);
    for (int i = 0; i < 50; ++i) {
      group.Add([&ran] {
        ran++;
        return Status();
      });
    }
    EXPECT_TRUE(group.Wait().ok());
    EXPECT_EQ(ran.load(), 50);

    TaskGroup failing(&pool);
    failing.Add([] { return UnavailableError("boom"); });
    EXPECT_EQ(failing.Wait().code(), StatusCode::kUnavailable);
  }
}

TEST(TypesTest, DTypeNamesRoundTrip) {
  for (int i = 0; i < kNumDTypes; ++i) {
    auto d = static_cast<DType>(i);
    auto parsed = ParseDType(DTypeName(d));
    ASSERT_TRUE(parsed.ok());
    EXPECT_EQ(*parsed, d);
  }
  EXPECT_EQ(ParseDType("f32").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(DTypeBits(DType::kF4), 4);
  EXPECT_EQ(DTypeBits(DType::kBF16), 16);
}

TEST(TypesTest, NumBytesRejectsPartialBytesAndOverflow) {
  EXPECT_EQ(*NumBytes(DType::kF4, 4), 2u);
  EXPECT_EQ(*NumBytes(DType::kF6E2M3, 4), 3u);
  EXPECT_EQ(NumBytes(DType::kF4, 3).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(NumBytes(DType::kF64, ~uint64_t{0}).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(NumElements({~uint64_t{0}, 2}).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(*NumElements({}), 1u);
  EXPECT_EQ(*NumElements({3, 0}), 0u);
}

TEST(TypesTest, ValidateSliceChecksBoundsAndSubByteCuts) {
  Shape shape{8, 6};
  EXPECT_TRUE(ValidateSlice({Box{{0, 0}, {8, 6}}, std::nullopt}, shape, DType::kF32).ok());
  EXPECT_TRUE(IsError(ValidateSlice({Box{{4, 0}, {5, 6}}, std::nullopt}, shape, DType::kF32),
                      StatusCode::kInvalidArgument, "exceeds shape [8, 6] in dimension 0"));
  EXPECT_TRUE(IsError(ValidateSlice({Box{{0}, {8}}, std::nullopt}, shape, DType::kF32),
                      StatusCode::kInvalidArgument, "has rank 1 but the tensor [8, 6] has rank 2"));
  EXPECT_TRUE(IsError(ValidateSlice({Box{{0, 0}, {8, 6}}, FlatRange{10, 49}}, shape, DType::kF32),
                      StatusCode::kInvalidArgument, "exceeds the box's 48 elements"));
  EXPECT_TRUE(ValidateSlice({Box{{0, 0}, {8, 6}}, FlatRange{10, 48}}, shape, DType::kF32).ok());
  // F4: cuts at multiples of 2 elements.
  EXPECT_TRUE(ValidateSlice({Box{{0, 2}, {8, 4}}, std::nullopt}, shape, DType::kF4).ok());
  EXPECT_TRUE(IsError(ValidateSlice({Box{{0, 1}, {8, 4}}, std::nullopt}, shape, DType::kF4),
                      StatusCode::kInvalidArgument, "off a byte boundary (cut at multiples of 2"));
  EXPECT_TRUE(IsError(ValidateSlice({Box{{0, 0}, {8, 6}}, FlatRange{1, 4}}, shape, DType::kF4),
                      StatusCode::kInvalidArgument, "off a byte boundary (cut at multiples of 2"));
  EXPECT_EQ(SliceToString({Box{{0, 2}, {8, 4}}, FlatRange{1, 3}}), "[0:8, 2:6].flat[1:3]");
  // Malformed boxes are described, not read out of bounds.
  EXPECT_EQ(SliceToString({Box{{1}, {2, 3}}, std::nullopt}), "[1:3, ?:?]");
  EXPECT_TRUE(IsError(ValidateSlice({Box{{0}, {8, 6}}, std::nullopt}, shape, DType::kF32),
                      StatusCode::kInvalidArgument, "slice [0:8, ?:?] has rank"));
}

}  // namespace
}  // namespace shardsafe
