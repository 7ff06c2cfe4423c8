#include "layout/load_planner.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <set>

#include "testing/layout/layout_testing.h"

namespace shardsafe {
namespace {

using ::testing::HasSubstr;
using testing::Rng;
using testing::Uniform;

// A simulated checkpoint: the saved tensors and the bytes of their files.
struct Checkpoint {
  std::vector<SavedTensor> tensors;
  std::vector<std::vector<uint8_t>> files;
};

// Lays the chunks out in random order over `num_files` files, with random
// filler between some of them.
Checkpoint Lay(Rng& rng, std::vector<SavedTensor> tensors, uint32_t num_files,
               double gap_chance) {
  Checkpoint ck{std::move(tensors), std::vector<std::vector<uint8_t>>(num_files)};
  std::vector<std::pair<uint32_t, uint32_t>> order;
  for (uint32_t t = 0; t < ck.tensors.size(); ++t) {
    for (uint32_t c = 0; c < ck.tensors[t].chunks.size(); ++c) order.push_back({t, c});
  }
  std::shuffle(order.begin(), order.end(), rng);
  for (const auto& [t, c] : order) {
    SavedTensor& tensor = ck.tensors[t];
    SavedChunk& chunk = tensor.chunks[c];
    chunk.file = static_cast<uint32_t>(Uniform(rng, 0, num_files - 1));
    std::vector<uint8_t>& file = ck.files[chunk.file];
    if (testing::Chance(rng, gap_chance)) file.resize(file.size() + Uniform(rng, 1, 40), 0xEE);
    chunk.at = file.size();
    const auto bytes = testing::SliceBytes(t, chunk.slice, tensor.shape, tensor.dtype);
    file.insert(file.end(), bytes.begin(), bytes.end());
  }
  return ck;
}

SavedTensor Tensor(DType dtype, Shape shape, const std::vector<Slice>& slices) {
  SavedTensor t{dtype, std::move(shape), {}};
  for (const Slice& s : slices) t.chunks.push_back(SavedChunk{s, 0, 0});
  return t;
}

uint64_t Bytes(DType dtype, uint64_t elems) { return *NumBytes(dtype, elems); }

// Executes `plan` against `ck` as the engine would (read, then scatter each
// segment) and checks every guarantee of load_planner.h against brute force.
void CheckPlan(const Checkpoint& ck, const std::vector<Want>& wants, const LoadPlan& plan,
               const LoadPlanOptions& options) {
  std::vector<std::vector<uint8_t>> dest(wants.size());
  std::vector<std::vector<int>> cover(wants.size());
  uint64_t needed = 0, read_total = 0;
  for (size_t w = 0; w < wants.size(); ++w) {
    const SavedTensor& t = ck.tensors[wants[w].tensor];
    const uint64_t n = wants[w].slice.NumElements();
    dest[w].assign(Bytes(t.dtype, n), 0x5A);
    cover[w].assign(n, 0);
    needed += Bytes(t.dtype, n);
  }
  std::vector<std::vector<std::pair<uint64_t, uint64_t>>> all_reads(ck.files.size());
  std::vector<std::vector<std::pair<uint64_t, uint64_t>>> needed_ranges(ck.files.size());
  for (const ReadGroup& group : plan.groups) {
    ASSERT_FALSE(group.reads.empty());
    std::vector<std::pair<uint64_t, uint64_t>> covered;  // group's read ranges
    for (size_t r = 0; r < group.reads.size(); ++r) {
      const ReadOp& read = group.reads[r];
      ASSERT_EQ(read.file, group.reads[0].file);
      ASSERT_GT(read.length, 0u);
      if (r > 0) {
        const ReadOp& prev = group.reads[r - 1];
        ASSERT_LE(prev.offset + prev.length, read.offset) << "reads overlap or go backwards";
      }
      ASSERT_LE(read.offset + read.length, ck.files[read.file].size());
      covered.push_back({read.offset, read.offset + read.length});
      all_reads[read.file].push_back(covered.back());
      read_total += read.length;
      const uint8_t* buf = ck.files[read.file].data() + read.offset;
      // A read is at least one element group (unit) long; past that and the
      // cap, it must go straight into one destination. A read without
      // segments is a window of a chunk read in windows: it touches the
      // window before it or after it.
      if (read.segments.empty()) {
        const bool after =
            r > 0 && group.reads[r - 1].offset + group.reads[r - 1].length == read.offset;
        const bool before = r + 1 < group.reads.size() &&
                            read.offset + read.length == group.reads[r + 1].offset;
        ASSERT_TRUE(after || before) << "a read of nothing needed";
        continue;
      }
      const DType dtype0 = ck.tensors[wants[read.segments[0].want].tensor].dtype;
      const uint64_t unit = Bytes(dtype0, testing::Quantum(dtype0));
      const bool long_read = read.length > std::max(options.max_read_bytes, unit);
      if (long_read) {
        ASSERT_EQ(read.segments.size(), 1u) << "long read must go straight into one destination";
        ASSERT_EQ(read.segments[0].src_byte, 0u);
        ASSERT_EQ(read.segments[0].rows, 1u);
      }
      for (size_t s = 0; s < read.segments.size(); ++s) {
        const Segment& seg = read.segments[s];
        if (s > 0) {
          ASSERT_LE(read.segments[s - 1].src_byte, seg.src_byte);
        }
        ASSERT_LT(seg.want, wants.size());
        const DType dtype = ck.tensors[wants[seg.want].tensor].dtype;
        const uint64_t bytes = Bytes(dtype, seg.count);
        ASSERT_GT(seg.count, 0u);
        ASSERT_GE(seg.rows, 1u);
        if (seg.rows > 1) {  // rows do not overlap in the buffer or the destination
          ASSERT_GE(seg.src_stride, bytes);
          ASSERT_GE(seg.dst_stride, seg.count);
        }
        const uint64_t last = seg.rows - 1;
        ASSERT_LE(seg.row_src(last) + bytes, read.length);
        ASSERT_LE(seg.row_dst(last) + seg.count, cover[seg.want].size());
        if (long_read) {
          ASSERT_EQ(bytes, read.length);
        }
        for (uint64_t row = 0; row < seg.rows; ++row) {
          const uint64_t src = seg.row_src(row), dst = seg.row_dst(row);
          std::memcpy(dest[seg.want].data() + Bytes(dtype, dst), buf + src, bytes);
          needed_ranges[read.file].push_back({read.offset + src, read.offset + src + bytes});
          for (uint64_t e = 0; e < seg.count; ++e) cover[seg.want][dst + e]++;
        }
      }
    }
    // whole_chunks: exactly the non-empty chunks inside the group's reads.
    std::set<std::pair<uint32_t, uint32_t>> expected, actual;
    for (uint32_t t = 0; t < ck.tensors.size(); ++t) {
      for (uint32_t c = 0; c < ck.tensors[t].chunks.size(); ++c) {
        const SavedChunk& chunk = ck.tensors[t].chunks[c];
        const uint64_t bytes = Bytes(ck.tensors[t].dtype, chunk.slice.NumElements());
        if (bytes == 0 || chunk.file != group.reads[0].file) continue;
        uint64_t inside = 0;
        for (const auto& [lo, hi] : covered) {
          const uint64_t a = std::max(lo, chunk.at), b = std::min(hi, chunk.at + bytes);
          if (a < b) inside += b - a;
        }
        if (inside == bytes) expected.insert({t, c});
      }
    }
    uint64_t previous_at = 0;
    for (const ChunkRef& ref : group.whole_chunks) {
      actual.insert({ref.tensor, ref.chunk});
      const uint64_t at = ck.tensors[ref.tensor].chunks[ref.chunk].at;
      ASSERT_GE(at, previous_at) << "whole chunks out of file order";
      previous_at = at;
    }
    ASSERT_EQ(actual.size(), group.whole_chunks.size()) << "a whole chunk listed twice";
    ASSERT_EQ(actual, expected);
  }
  for (auto& reads : all_reads) {
    std::sort(reads.begin(), reads.end());
    for (size_t i = 1; i < reads.size(); ++i) ASSERT_LE(reads[i - 1].second, reads[i].first);
    // Reads that touch (windows of one chunk) are one span for the hole checks.
    std::vector<std::pair<uint64_t, uint64_t>> spans;
    for (const auto& read : reads) {
      if (!spans.empty() && spans.back().second == read.first) {
        spans.back().second = read.second;
      } else {
        spans.push_back(read);
      }
    }
    reads = std::move(spans);
  }
  EXPECT_EQ(plan.bytes_needed, needed);
  EXPECT_EQ(plan.bytes_read, read_total);
  // Over-read: bytes inside reads that no segment needs form holes: a gap
  // between pieces, plus the chunk edges beside it read so a chunk is
  // whole (each at most join_gap_bytes J). Gaps wider than J stay within
  // the budget; a hole of h > 3J holds such a gap of at least h - 2J.
  const uint64_t J = options.join_gap_bytes;
  uint64_t wide_holes = 0;
  for (size_t f = 0; f < all_reads.size(); ++f) {
    auto& need = needed_ranges[f];
    std::sort(need.begin(), need.end());
    for (const auto& [lo, hi] : all_reads[f]) {
      uint64_t at = lo;
      for (const auto& [a, b] : need) {
        if (b <= at || a >= hi) continue;
        if (at == lo) {
          ASSERT_LE(a - at, options.join_gap_bytes) << "a read starts in a wide hole";
        } else if (a > at && a - at > 3 * J) {
          wide_holes += a - at - 2 * J;
        }
        at = std::max(at, b);
      }
      ASSERT_GT(at, lo) << "a read of nothing needed";
      ASSERT_LE(hi - at, options.join_gap_bytes) << "a read ends in a wide hole";
    }
  }
  EXPECT_LE(static_cast<double>(wide_holes),
            static_cast<double>(needed) * options.max_overread_fraction);
  for (size_t w = 0; w < wants.size(); ++w) {
    const SavedTensor& t = ck.tensors[wants[w].tensor];
    for (size_t e = 0; e < cover[w].size(); ++e) {
      ASSERT_EQ(cover[w][e], 1) << "want " << w << " element " << e;
    }
    ASSERT_EQ(dest[w], testing::SliceBytes(wants[w].tensor, wants[w].slice, t.shape, t.dtype))
        << "want " << w << " " << SliceToString(wants[w].slice);
  }
}

LoadPlan PlanOk(const Checkpoint& ck, const std::vector<Want>& wants,
                const LoadPlanOptions& options = {}) {
  auto plan = PlanLoad(ck.tensors, wants, options);
  EXPECT_TRUE(plan.ok()) << plan.status().ToString();
  if (!plan.ok()) return {};
  CheckPlan(ck, wants, *plan, options);
  return *plan;
}

Slice Box2(uint64_t r0, uint64_t r1, uint64_t c0, uint64_t c1) {
  return Slice{Box{{r0, c0}, {r1 - r0, c1 - c0}}, {}};
}

TEST(LoadPlannerTest, FlatToBoxAcrossSplitDims) {
  Rng rng(1);
  const Box whole = Box::Whole({4, 6});
  Checkpoint ck = Lay(rng, {Tensor(DType::kF32, {4, 6}, {Slice{whole, FlatRange{0, 10}},
                                                         Slice{whole, FlatRange{10, 24}}})},
                      1, 0);
  const LoadPlan plan = PlanOk(ck, {Want{0, Box2(1, 3, 2, 5)}});
  EXPECT_EQ(plan.bytes_needed, 6u * 4);
}

TEST(LoadPlannerTest, BoxToBoxMergesFullTrailingDims) {
  Rng rng(2);
  Checkpoint ck = Lay(rng, {Tensor(DType::kBF16, {8, 16}, {Box2(0, 4, 0, 16), Box2(4, 8, 0, 16)})},
                      1, 0);
  LoadPlanOptions exact;
  exact.join_gap_bytes = 0;
  const LoadPlan plan = PlanOk(ck, {Want{0, Box2(1, 3, 0, 16)}}, exact);
  ASSERT_EQ(plan.groups.size(), 1u);
  ASSERT_EQ(plan.groups[0].reads.size(), 1u);
  EXPECT_EQ(plan.groups[0].reads[0].segments.size(), 1u);
  EXPECT_EQ(plan.groups[0].reads[0].length, 2u * 16 * 2);
  EXPECT_TRUE(plan.groups[0].whole_chunks.empty());
  // By default the unread first and last rows are read too: the chunk is
  // whole, so its checksum can be verified.
  const LoadPlan whole = PlanOk(ck, {Want{0, Box2(1, 3, 0, 16)}});
  ASSERT_EQ(whole.groups.size(), 1u);
  ASSERT_EQ(whole.groups[0].reads.size(), 1u);
  EXPECT_EQ(whole.groups[0].reads[0].length, 4u * 16 * 2);
  EXPECT_EQ(whole.groups[0].reads[0].segments[0].src_byte, 16u * 2);
  EXPECT_EQ(whole.groups[0].whole_chunks.size(), 1u);
}

TEST(LoadPlannerTest, ColumnShardOfRowShardsReadsOnlyItsColumnsWithinBudget) {
  Rng rng(3);
  Checkpoint ck = Lay(rng, {Tensor(DType::kF32, {64, 64}, {Box2(0, 32, 0, 64), Box2(32, 64, 0, 64)})},
                      2, 0);
  LoadPlanOptions options;
  options.join_gap_bytes = 0;
  const LoadPlan plan = PlanOk(ck, {Want{0, Box2(0, 64, 0, 16)}}, options);
  EXPECT_EQ(plan.bytes_needed, 64u * 16 * 4);
  EXPECT_EQ(plan.bytes_read, plan.bytes_needed + 192);  // the 5% budget pays for one 192-byte gap
}

// Narrow gaps cost less than the requests they save: a column slice of
// row-major chunks is one read per chunk, not one per row.
TEST(LoadPlannerTest, ColumnShardReadsThroughNarrowGaps) {
  Rng rng(3);
  Checkpoint ck = Lay(rng, {Tensor(DType::kF32, {64, 64}, {Box2(0, 32, 0, 64), Box2(32, 64, 0, 64)})},
                      2, 0);
  const LoadPlan plan = PlanOk(ck, {Want{0, Box2(0, 64, 16, 48)}});
  auto count = [](const LoadPlan& p, size_t* reads, size_t* segments, size_t* rows) {
    *reads = *segments = *rows = 0;
    for (const ReadGroup& g : p.groups) {
      for (const ReadOp& r : g.reads) {
        ++*reads;
        *segments += r.segments.size();
        for (const Segment& seg : r.segments) *rows += seg.rows;
      }
    }
  };
  size_t reads, segments, rows;
  count(plan, &reads, &segments, &rows);
  EXPECT_LE(reads, 2u);  // one per chunk, or one for both where they are neighbours in a file
  EXPECT_EQ(rows, 64u);
  EXPECT_EQ(segments, 2u);  // a chunk's 32 rows of 16 columns are one strided segment
  EXPECT_EQ(plan.bytes_read, 64u * 256);  // whole chunks, edges included: both verified
  size_t whole = 0;
  for (const ReadGroup& g : plan.groups) whole += g.whole_chunks.size();
  EXPECT_EQ(whole, 2u);
  LoadPlanOptions narrow;
  narrow.join_gap_bytes = 127;  // the gaps are 128 bytes: each row its own read
  narrow.max_overread_fraction = 0;
  count(PlanOk(ck, {Want{0, Box2(0, 64, 16, 48)}}, narrow), &reads, &segments, &rows);
  EXPECT_EQ(reads, 64u);
  EXPECT_EQ(segments, 64u);  // rows farther apart than join_gap_bytes stay apart
}

TEST(LoadPlannerTest, SmallGapsMergeWithinBudget) {
  Rng rng(4);
  // Columns 0..62 of 64: one-column gaps, 1/63 overread.
  Checkpoint ck = Lay(rng, {Tensor(DType::kU8, {32, 64}, {Box2(0, 32, 0, 64)})}, 1, 0);
  const LoadPlan plan = PlanOk(ck, {Want{0, Box2(0, 32, 0, 63)}}, {64 << 20, 0.05, 0});
  ASSERT_EQ(plan.groups.size(), 1u);
  EXPECT_EQ(plan.groups[0].reads.size(), 1u);
  EXPECT_EQ(plan.bytes_read, 32u * 64 - 1);
  EXPECT_EQ(plan.groups[0].whole_chunks.size(), 0u);  // the last byte is not read
  const LoadPlan strict = PlanOk(ck, {Want{0, Box2(0, 32, 0, 63)}}, {64 << 20, 0.0, 0});
  EXPECT_EQ(strict.bytes_read, 32u * 63);
}

TEST(LoadPlannerTest, SmallAdjacentChunksShareOneRead) {
  std::vector<SavedTensor> tensors;
  std::vector<Want> wants;
  for (uint32_t t = 0; t < 10; ++t) {
    tensors.push_back(Tensor(DType::kF32, {16}, {Slice{Box::Whole({16}), {}}}));
    wants.push_back(Want{t, Slice{Box::Whole({16}), {}}});
  }
  Rng rng(5);
  Checkpoint ck = Lay(rng, tensors, 1, 0);
  const LoadPlan plan = PlanOk(ck, wants);
  ASSERT_EQ(plan.groups.size(), 1u);
  EXPECT_EQ(plan.groups[0].reads.size(), 1u);
  EXPECT_EQ(plan.groups[0].reads[0].segments.size(), 10u);
  EXPECT_EQ(plan.groups[0].whole_chunks.size(), 10u);
}

TEST(LoadPlannerTest, LargeChunkSplitsIntoReadsOfOneGroup) {
  Rng rng(6);
  Checkpoint ck = Lay(rng, {Tensor(DType::kF32, {100, 10}, {Box2(0, 100, 0, 10)})}, 1, 0);
  // Two wants side by side: not one destination, so reads are capped.
  const LoadPlanOptions options{1000, 0.05};
  const LoadPlan plan = PlanOk(ck, {Want{0, Box2(0, 50, 0, 10)}, Want{0, Box2(50, 100, 0, 10)}},
                               options);
  ASSERT_EQ(plan.groups.size(), 1u);
  EXPECT_EQ(plan.groups[0].reads.size(), 4u);
  for (const ReadOp& r : plan.groups[0].reads) EXPECT_LE(r.length, 1000u);
  EXPECT_EQ(plan.groups[0].whole_chunks.size(), 1u);
}

TEST(LoadPlannerTest, StraightReadIsNotSplit) {
  Rng rng(7);
  Checkpoint ck = Lay(rng, {Tensor(DType::kF32, {100, 10}, {Box2(0, 100, 0, 10)})}, 1, 0);
  const LoadPlan plan = PlanOk(ck, {Want{0, Box2(0, 100, 0, 10)}}, {1000, 0.05});
  ASSERT_EQ(plan.groups.size(), 1u);
  ASSERT_EQ(plan.groups[0].reads.size(), 1u);
  EXPECT_EQ(plan.groups[0].reads[0].length, 4000u);
}

TEST(LoadPlannerTest, ZeroDimTensorAndZeroSizeDimension) {
  Rng rng(8);
  Checkpoint ck = Lay(rng, {Tensor(DType::kF64, {}, {Slice{Box{}, {}}}),
                            Tensor(DType::kF32, {0, 4}, {}),
                            Tensor(DType::kF32, {3, 0}, {Slice{Box::Whole({3, 0}), {}}})},
                      1, 0);
  const LoadPlan plan = PlanOk(ck, {Want{0, Slice{Box{}, {}}}, Want{1, Slice{Box::Whole({0, 4}), {}}},
                                    Want{2, Box2(1, 2, 0, 0)}});
  EXPECT_EQ(plan.bytes_needed, 8u);
  ASSERT_EQ(plan.groups.size(), 1u);
}

TEST(LoadPlannerTest, SubByteDtypesCutOnBytes) {
  Rng rng(9);
  Checkpoint ck = Lay(rng, {Tensor(DType::kF4, {4, 8}, {Box2(0, 4, 0, 4), Box2(0, 4, 4, 8)}),
                            Tensor(DType::kF6E3M2, {2, 8},
                                   {Slice{Box::Whole({2, 8}), FlatRange{0, 12}},
                                    Slice{Box::Whole({2, 8}), FlatRange{12, 16}}})},
                      1, 0);
  PlanOk(ck, {Want{0, Box2(1, 3, 2, 6)}, Want{1, Box2(0, 2, 4, 8)}});
}

TEST(LoadPlannerTest, SubByteRunOffByteBoundaryIsInvalidArgument) {
  Rng rng(10);
  // [3, 5] F4 saved whole; row 1 starts at element 5, half-way into a byte.
  Checkpoint ck = Lay(rng, {Tensor(DType::kF4, {3, 5}, {Slice{Box::Whole({3, 5}), {}}})}, 1, 0);
  auto plan = PlanLoad(ck.tensors, std::vector<Want>{Want{0, Box2(1, 2, 0, 4)}}, {});
  EXPECT_EQ(plan.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(plan.status().message(), HasSubstr("byte boundary"));
  plan = PlanLoad(ck.tensors, std::vector<Want>{Want{0, Box2(0, 3, 1, 3)}}, {});
  EXPECT_EQ(plan.status().code(), StatusCode::kInvalidArgument);  // ValidateSlice
}

TEST(LoadPlannerTest, UncoveredWantIsDataLoss) {
  Rng rng(11);
  Checkpoint ck = Lay(rng, {Tensor(DType::kF32, {4, 4}, {Box2(0, 2, 0, 4)})}, 1, 0);
  auto plan = PlanLoad(ck.tensors, std::vector<Want>{Want{0, Box2(1, 3, 0, 4)}}, {});
  EXPECT_EQ(plan.status().code(), StatusCode::kDataLoss);
  EXPECT_THAT(plan.status().message(), HasSubstr("cover 4 of 8 elements"));
}

TEST(LoadPlannerTest, BadWantIsInvalidArgument) {
  Rng rng(12);
  Checkpoint ck = Lay(rng, {Tensor(DType::kF32, {4, 4}, {Box2(0, 4, 0, 4)})}, 1, 0);
  EXPECT_EQ(PlanLoad(ck.tensors, std::vector<Want>{Want{1, Box2(0, 1, 0, 1)}}, {}).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(PlanLoad(ck.tensors, std::vector<Want>{Want{0, Box2(0, 5, 0, 1)}}, {}).status().code(),
            StatusCode::kInvalidArgument);
}

TEST(LoadPlannerTest, OverlappingWantsEachGetTheirElements) {
  Rng rng(13);
  Checkpoint ck = Lay(rng, {Tensor(DType::kI16, {6, 6}, {Box2(0, 3, 0, 6), Box2(3, 6, 0, 6)})}, 1, 0);
  PlanOk(ck, {Want{0, Box2(0, 6, 0, 6)}, Want{0, Box2(2, 4, 1, 5)}, Want{0, Box2(0, 6, 0, 6)}});
}

// Random tensors saved in one random layout, loaded in another, executed
// against simulated files and compared element by element.
TEST(LoadPlannerTest, RandomLayoutsMatchOracle) {
  Rng rng(20240601);
  static constexpr uint64_t kMaxRead[] = {1, 3, 8, 24, 100, 64 << 20};
  static constexpr double kOverread[] = {0.0, 0.05, 0.3};
  uint64_t total_segments = 0;
  for (int iter = 0; iter < 6000; ++iter) {
    std::vector<SavedTensor> tensors;
    std::vector<Want> wants;
    const uint32_t num_tensors = static_cast<uint32_t>(Uniform(rng, 1, 4));
    for (uint32_t t = 0; t < num_tensors; ++t) {
      const DType dtype = testing::RandomDType(rng);
      const Shape shape = testing::RandomShape(rng, dtype);
      tensors.push_back(Tensor(dtype, shape, testing::RandomTiling(rng, shape, dtype)));
      const uint64_t mode = Uniform(rng, 0, 3);
      if (mode == 0) wants.push_back(Want{t, Slice{Box::Whole(shape), {}}});
      if (mode == 1) {
        for (const Slice& s : testing::RandomTiling(rng, shape, dtype, 0.5)) wants.push_back(Want{t, s});
      }
      for (uint64_t k = 0; mode >= 2 && k < mode; ++k) {
        wants.push_back(Want{t, testing::RandomSlice(rng, shape, dtype)});
      }
    }
    std::shuffle(wants.begin(), wants.end(), rng);
    const Checkpoint ck = Lay(rng, tensors, static_cast<uint32_t>(Uniform(rng, 1, 3)), 0.2);
    static constexpr uint64_t kJoinGap[] = {0, 8, 128 << 10};
    const LoadPlanOptions options{kMaxRead[Uniform(rng, 0, 5)], kOverread[Uniform(rng, 0, 2)],
                                  kJoinGap[Uniform(rng, 0, 2)]};
    const LoadPlan plan = PlanOk(ck, wants, options);
    for (const ReadGroup& g : plan.groups) {
      for (const ReadOp& r : g.reads) total_segments += r.segments.size();
    }
    if (::testing::Test::HasFatalFailure() || ::testing::Test::HasFailure()) {
      FAIL() << "iteration " << iter;
    }
  }
  EXPECT_GT(total_segments, 10000u);
}

}  // namespace
}  // namespace shardsafe
