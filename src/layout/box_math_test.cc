#include "layout/box_math.h"

#include <gtest/gtest.h>

#include <chrono>
#include <map>

#include "testing/layout/layout_testing.h"

namespace shardsafe {
namespace {

using testing::GlobalIndices;

// Brute force: (src index, dst index) of every element both slices hold.
std::vector<std::pair<uint64_t, uint64_t>> CommonPairs(const Slice& src, const Slice& dst,
                                                       const Shape& shape) {
  std::map<uint64_t, uint64_t> dst_pos;
  const std::vector<uint64_t> d = GlobalIndices(dst, shape);
  for (uint64_t i = 0; i < d.size(); ++i) dst_pos[d[i]] = i;
  std::vector<std::pair<uint64_t, uint64_t>> out;
  const std::vector<uint64_t> s = GlobalIndices(src, shape);
  for (uint64_t i = 0; i < s.size(); ++i) {
    auto it = dst_pos.find(s[i]);
    if (it != dst_pos.end()) out.push_back({i, it->second});
  }
  return out;
}

// Every row of `runs` as a run of its own.
std::vector<ElementRun> Rows(const std::vector<ElementRun>& runs) {
  std::vector<ElementRun> out;
  for (const ElementRun& r : runs) {
    for (uint64_t i = 0; i < r.rows; ++i) {
      out.push_back({r.src + i * r.src_stride, r.dst + i * r.dst_stride, r.count});
    }
  }
  return out;
}

std::vector<std::pair<uint64_t, uint64_t>> Expand(const std::vector<ElementRun>& runs) {
  std::vector<std::pair<uint64_t, uint64_t>> out;
  for (const ElementRun& r : Rows(runs)) {
    for (uint64_t k = 0; k < r.count; ++k) out.push_back({r.src + k, r.dst + k});
  }
  return out;
}

TEST(BoxMathTest, IntersectAndOverlap) {
  const Box a{{0, 2}, {4, 4}}, b{{2, 0}, {4, 3}};
  EXPECT_EQ(Intersect(a, b), (Box{{2, 2}, {2, 1}}));
  EXPECT_TRUE(Overlaps(a, b));
  EXPECT_FALSE(Intersect(a, Box{{4, 0}, {1, 9}}));
  EXPECT_FALSE(Overlaps(a, Box{{0, 2}, {0, 4}}));  // empty box
  EXPECT_EQ(Intersect(Box{}, Box{}), Box{});         // 0-d boxes hold one element
  EXPECT_EQ(Volume(Box{}), 1u);
}

TEST(BoxMathTest, SliceOrderIsRowMajorThenFlat) {
  const Slice whole{Box{{0, 4}, {2, 4}}, {}};
  const Slice flat{Box{{0, 4}, {2, 4}}, FlatRange{0, 3}};
  const Slice later{Box{{1, 0}, {1, 4}}, {}};
  EXPECT_TRUE(SliceLess(whole, flat));
  EXPECT_TRUE(SliceLess(flat, later));
  EXPECT_FALSE(SliceLess(later, whole));
}

TEST(BoxMathTest, FullTrailingDimsMergeIntoOneRun) {
  std::vector<ElementRun> runs;
  CommonRuns(Slice{Box{{0, 0, 0}, {4, 3, 5}}, {}}, Slice{Box{{1, 0, 0}, {2, 3, 5}}, {}}, &runs);
  EXPECT_EQ(runs, (std::vector<ElementRun>{{15, 0, 30}}));
}

TEST(BoxMathTest, ColumnSplitGivesOneRunOfManyRows) {
  std::vector<ElementRun> runs;
  CommonRuns(Slice{Box{{0, 0}, {3, 8}}, {}}, Slice{Box{{0, 4}, {3, 4}}, {}}, &runs);
  EXPECT_EQ(runs, (std::vector<ElementRun>{{4, 0, 4, 3, 8, 4}}));
}

TEST(BoxMathTest, ManyRowsTakeNoStepPerRow) {
  const uint64_t rows = uint64_t{1} << 40;
  std::vector<ElementRun> runs;
  CommonRuns(Slice{Box{{0, 0}, {rows, 64}}, {}}, Slice{Box{{0, 32}, {rows, 32}}, {}}, &runs);
  EXPECT_EQ(runs, (std::vector<ElementRun>{{32, 0, 32, rows, 64, 32}}));
}

TEST(BoxMathTest, EachLineOfA3dSplitIsOneRun) {
  std::vector<ElementRun> runs;
  // [2, 3, 4]: columns 1..2 of every row, lines along dimension 1.
  CommonRuns(Slice{Box{{0, 0, 0}, {2, 3, 4}}, {}}, Slice{Box{{0, 0, 1}, {2, 3, 2}}, {}}, &runs);
  EXPECT_EQ(runs, (std::vector<ElementRun>{{1, 0, 2, 3, 4, 2}, {13, 6, 2, 3, 4, 2}}));
}

TEST(BoxMathTest, FlatToBoxClipsFirstAndLastRow) {
  std::vector<ElementRun> runs;
  // Source: elements 5..17 of a [4, 6] box; destination: columns 2..4.
  CommonRuns(Slice{Box{{0, 0}, {4, 6}}, FlatRange{5, 17}}, Slice{Box{{0, 2}, {4, 3}}, {}}, &runs);
  EXPECT_EQ(runs, (std::vector<ElementRun>{{3, 3, 3, 2, 6, 3}}));
}

TEST(BoxMathTest, TinyFlatRangeOfHugeBoxSkipsRows) {
  const uint64_t rows = uint64_t{1} << 40;
  const uint64_t mid = 1024 * (rows / 2);
  const Slice src{Box{{0, 0}, {rows, 1024}}, FlatRange{mid + 10, mid + 2000}};
  const Slice dst{Box{{0, 0}, {rows, 8}}, {}};
  std::vector<ElementRun> runs;
  CommonRuns(src, dst, &runs);  // a walk over every one of the 2^40 rows would never return
  ASSERT_EQ(runs.size(), 1u);  // row rows/2 gives nothing (starts at col 10); next row 8 elems
  EXPECT_EQ(runs[0], (ElementRun{1014, (rows / 2 + 1) * 8, 8}));
}

TEST(BoxMathTest, ZeroDimAndEmptyBoxes) {
  std::vector<ElementRun> runs;
  CommonRuns(Slice{Box{}, {}}, Slice{Box{}, {}}, &runs);
  EXPECT_EQ(runs, (std::vector<ElementRun>{{0, 0, 1}}));
  runs.clear();
  CommonRuns(Slice{Box{{0}, {0}}, {}}, Slice{Box{{0}, {0}}, {}}, &runs);
  EXPECT_TRUE(runs.empty());
  CommonRuns(Slice{Box{}, FlatRange{0, 0}}, Slice{Box{}, {}}, &runs);
  EXPECT_TRUE(runs.empty());
}

// Every pair of random slices of random small shapes, against brute force;
// runs must also be maximal (no two consecutive rows could merge).
TEST(BoxMathTest, RandomSlicesMatchBruteForce) {
  testing::Rng rng(42);
  size_t compared = 0;
  for (int iter = 0; iter < 20000; ++iter) {
    const DType dtype = iter % 3 ? DType::kF32 : DType::kF4;
    const Shape shape = testing::RandomShape(rng, dtype);
    const Slice src = testing::RandomSlice(rng, shape, dtype);
    const Slice dst = testing::RandomSlice(rng, shape, dtype);
    std::vector<ElementRun> runs;
    CommonRuns(src, dst, &runs);
    ASSERT_EQ(Expand(runs), CommonPairs(src, dst, shape))
        << ShapeToString(shape) << " " << SliceToString(src) << " " << SliceToString(dst);
    const std::vector<ElementRun> rows = Rows(runs);
    for (size_t i = 1; i < rows.size(); ++i) {
      const ElementRun &a = rows[i - 1], &b = rows[i];
      EXPECT_FALSE(a.src + a.count == b.src && a.dst + a.count == b.dst);
    }
    for (const ElementRun& r : runs) {
      EXPECT_GT(r.count, 0u);
      EXPECT_EQ(r.rows > 1, r.src_stride > 0 && r.dst_stride > 0);
      compared += r.count * r.rows;
    }
  }
  EXPECT_GT(compared, 40000u);
}

}  // namespace
}  // namespace shardsafe
