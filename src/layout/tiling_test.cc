#include "layout/tiling.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "testing/layout/layout_testing.h"

namespace shardsafe {
namespace {

using ::testing::HasSubstr;

Slice S(Shape offset, Shape size) { return Slice{Box{std::move(offset), std::move(size)}, {}}; }
Slice F(Shape offset, Shape size, uint64_t b, uint64_t e) {
  return Slice{Box{std::move(offset), std::move(size)}, FlatRange{b, e}};
}

TEST(TilingTest, AcceptsRowAndColumnSplits) {
  const Shape shape = {4, 6};
  std::vector<Slice> s = {S({0, 0}, {2, 6}), S({2, 0}, {2, 3}), S({2, 3}, {2, 3})};
  EXPECT_TRUE(CheckTiling("w", shape, s).ok());
}

TEST(TilingTest, AcceptsFlatShardsOfBoxes) {
  std::vector<Slice> s = {F({0, 0}, {2, 6}, 0, 5), F({0, 0}, {2, 6}, 5, 12), S({2, 0}, {2, 6})};
  EXPECT_TRUE(CheckTiling("w", {4, 6}, s).ok());
}

TEST(TilingTest, NoOverlapAcceptsGapsAndFindsOverlaps) {
  // Some chunks of a tensor: gaps are expected, overlaps are not.
  std::vector<Slice> s = {F({0, 0}, {2, 6}, 0, 5), F({0, 0}, {2, 6}, 7, 9), S({3, 0}, {1, 6})};
  EXPECT_TRUE(CheckNoOverlap("w", s).ok());
  s.push_back(F({0, 0}, {2, 6}, 8, 12));
  Status st = CheckNoOverlap("w", s);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(st.message(), HasSubstr("overlap between"));
  s.pop_back();
  s.push_back(S({1, 2}, {3, 1}));  // crosses the box of rows 0-1 and row 3
  EXPECT_THAT(CheckNoOverlap("w", s).message(), HasSubstr("tensor \"w\": overlap between"));
}

TEST(TilingTest, ReportsGapWithKeyAndCount) {
  std::vector<Slice> s = {S({0, 0}, {2, 6}), S({2, 0}, {1, 6})};
  Status st = CheckTiling("layers.0.w", {4, 6}, s);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(st.message(), HasSubstr("layers.0.w"));
  EXPECT_THAT(st.message(), HasSubstr("gap: 6 of 24 elements"));
}

TEST(TilingTest, ReportsOverlapNamingBothSlices) {
  std::vector<Slice> s = {S({0, 0}, {3, 6}), S({2, 0}, {2, 6})};
  Status st = CheckTiling("w", {4, 6}, s);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(st.message(), HasSubstr("overlap between [0:3, 0:6] and [2:4, 0:6]"));
}

TEST(TilingTest, ReportsFlatGapAndFlatOverlap) {
  std::vector<Slice> gap = {F({0}, {10}, 0, 4), F({0}, {10}, 5, 10)};
  Status st = CheckTiling("w", {10}, gap);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(st.message(), HasSubstr("elements [4:5) of box [0:10]"));
  std::vector<Slice> overlap = {F({0}, {10}, 0, 6), F({0}, {10}, 5, 10)};
  st = CheckTiling("w", {10}, overlap);
  EXPECT_THAT(st.message(), HasSubstr("overlap between [0:10].flat[0:6] and [0:10].flat[5:10]"));
}

TEST(TilingTest, WholeBoxAndFlatShardOfItOverlap) {
  std::vector<Slice> s = {S({0}, {10}), F({0}, {10}, 0, 10)};
  EXPECT_EQ(CheckTiling("w", {10}, s).code(), StatusCode::kInvalidArgument);
}

TEST(TilingTest, DuplicateSliceIsOverlap) {
  std::vector<Slice> s = {S({0}, {10}), S({0}, {10})};
  EXPECT_THAT(CheckTiling("w", {10}, s).message(), HasSubstr("overlap"));
}

TEST(TilingTest, EmptySlicesAndEmptyTensors) {
  std::vector<Slice> s = {S({0}, {10}), F({0}, {10}, 3, 3), S({4}, {0})};
  EXPECT_TRUE(CheckTiling("w", {10}, s).ok());
  EXPECT_TRUE(CheckTiling("e", {0, 5}, std::vector<Slice>{}).ok());
  EXPECT_TRUE(CheckTiling("scalar", {}, std::vector<Slice>{S({}, {})}).ok());
  EXPECT_EQ(CheckTiling("scalar", {}, std::vector<Slice>{}).code(), StatusCode::kInvalidArgument);
}

TEST(TilingTest, ManyColumnShardsSweepAlongSplitDimension) {
  std::vector<Slice> s;
  for (uint64_t c = 0; c < 4096; ++c) s.push_back(S({0, c * 2}, {1000, 2}));
  EXPECT_TRUE(CheckTiling("w", {1000, 8192}, s).ok());
  s.push_back(S({999, 8191}, {1, 1}));
  EXPECT_THAT(CheckTiling("w", {1000, 8192}, s).message(), HasSubstr("overlap"));
}

// Element counting decides exact cover; CheckTiling must agree on random
// tilings and on tilings damaged by dropping or adding a slice.
TEST(TilingTest, RandomTilingsAgreeWithElementCount) {
  testing::Rng rng(7);
  int damaged = 0;
  for (int iter = 0; iter < 3000; ++iter) {
    const DType dtype = testing::RandomDType(rng);
    const Shape shape = testing::RandomShape(rng, dtype);
    std::vector<Slice> slices = testing::RandomTiling(rng, shape, dtype);
    if (iter % 3 == 1 && !slices.empty()) {
      slices.erase(slices.begin() + testing::Uniform(rng, 0, slices.size() - 1));
    }
    if (iter % 3 == 2) slices.push_back(testing::RandomSlice(rng, shape, dtype));
    std::vector<int> count(*NumElements(shape), 0);
    for (const Slice& s : slices) {
      for (uint64_t g : testing::GlobalIndices(s, shape)) count[g]++;
    }
    const bool exact = std::all_of(count.begin(), count.end(), [](int c) { return c == 1; });
    Status st = CheckTiling("t", shape, slices);
    ASSERT_EQ(st.ok(), exact) << ShapeToString(shape) << " " << st.ToString();
    if (exact) continue;
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
    ++damaged;
  }
  EXPECT_GT(damaged, 1000);
}

}  // namespace
}  // namespace shardsafe
