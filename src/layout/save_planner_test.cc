#include "layout/save_planner.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <set>

#include "layout/box_math.h"
#include "layout/tiling.h"
#include "testing/layout/layout_testing.h"
#include "testing/layout/simulated_layouts.h"

namespace shardsafe {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using testing::Rng;
using testing::Uniform;

Slice Rows(uint64_t r0, uint64_t r1, uint64_t cols) {
  return Slice{Box{{r0, 0}, {r1 - r0, cols}}, {}};
}

ShardInfo Shard(std::string key, Shape shape, Slice slice, DType dtype = DType::kF32) {
  return ShardInfo{std::move(key), dtype, std::move(shape), std::move(slice)};
}

// Checks the invariants of save_planner.h that hold for every plan.
void CheckInvariants(std::span<const RankHoldings> holdings, const SavePlan& plan,
                     const SavePlanOptions& options) {
  // Each chunk is written by a holder of exactly that slice.
  std::vector<uint64_t> per_rank(holdings.size(), 0);
  uint64_t unique = 0;
  for (const PlannedChunk& c : plan.chunks) {
    const PlannedTensor& t = plan.tensors[c.tensor];
    const ShardInfo& s = holdings[c.writer].shards[c.writer_shard];
    ASSERT_EQ(s.key, t.key);
    if (s.slice != c.slice) {  // a piece of a replicated chunk: a flat range of the shard's
      ASSERT_GT(c.holders, 1u);
      ASSERT_EQ(s.slice.box, c.slice.box);
      ASSERT_TRUE(c.slice.flat.has_value());
      const uint64_t begin = s.slice.flat ? s.slice.flat->begin : 0;
      ASSERT_EQ(c.shard_offset, *NumBytes(t.dtype, c.slice.flat->begin - begin));
    } else {
      ASSERT_EQ(c.shard_offset, 0u);
    }
    ASSERT_EQ(c.bytes, *NumBytes(t.dtype, c.slice.NumElements()));
    per_rank[c.writer] += c.bytes;
    unique += c.bytes;
  }
  for (const PlannedBlob& b : plan.blobs) {
    ASSERT_EQ(holdings[b.rank].blobs[b.writer_blob].name, b.name);
    per_rank[b.rank] += b.bytes;
    unique += b.bytes;
  }
  EXPECT_EQ(per_rank, plan.bytes_per_rank);
  EXPECT_EQ(unique, plan.unique_bytes);
  // Tensors by key, chunks row-major, blobs by (name, rank).
  for (size_t t = 1; t < plan.tensors.size(); ++t) {
    ASSERT_LT(plan.tensors[t - 1].key, plan.tensors[t].key);
  }
  for (const PlannedTensor& t : plan.tensors) {
    for (size_t i = 1; i < t.chunks.size(); ++i) {
      ASSERT_TRUE(SliceLess(plan.chunks[t.chunks[i - 1]].slice, plan.chunks[t.chunks[i]].slice));
    }
  }
  for (size_t b = 1; b < plan.blobs.size(); ++b) {
    ASSERT_LT(std::tie(plan.blobs[b - 1].name, plan.blobs[b - 1].rank),
              std::tie(plan.blobs[b].name, plan.blobs[b].rank));
  }
  // Files: sorted, numbered from 0 per rank, each item in exactly one file
  // of its writer, the cap respected unless a file holds one oversized item.
  std::vector<int> chunk_seen(plan.chunks.size(), 0), blob_seen(plan.blobs.size(), 0);
  for (size_t f = 0; f < plan.files.size(); ++f) {
    const PlannedFile& file = plan.files[f];
    const bool first_of_rank = f == 0 || plan.files[f - 1].rank != file.rank;
    ASSERT_EQ(file.number, first_of_rank ? 0u : plan.files[f - 1].number + 1);
    if (!first_of_rank) {
      ASSERT_EQ(plan.files[f - 1].rank, file.rank);
    }
    if (f > 0) {
      ASSERT_LE(plan.files[f - 1].rank, file.rank);
    }
    uint64_t payload = 0;
    for (uint32_t c : file.chunks) {
      ASSERT_EQ(plan.chunks[c].writer, file.rank);
      payload += plan.chunks[c].bytes;
      chunk_seen[c]++;
    }
    for (uint32_t b : file.blobs) {
      ASSERT_EQ(plan.blobs[b].rank, file.rank);
      payload += plan.blobs[b].bytes;
      blob_seen[b]++;
    }
    ASSERT_EQ(payload, file.payload_bytes);
    if (file.chunks.size() + file.blobs.size() > 1) {
      ASSERT_LE(payload, options.max_file_bytes);
    }
  }
  for (int n : chunk_seen) ASSERT_EQ(n, 1);
  for (int n : blob_seen) ASSERT_EQ(n, 1);
}

SavePlan PlanOk(std::span<const RankHoldings> holdings, const SavePlanOptions& options = {}) {
  auto plan = PlanSave(holdings, options);
  EXPECT_TRUE(plan.ok()) << plan.status().ToString();
  if (!plan.ok()) return {};
  CheckInvariants(holdings, *plan, options);
  return *plan;
}

Status PlanError(std::span<const RankHoldings> holdings) {
  return PlanSave(holdings, {}).status();
}

TEST(SavePlannerTest, ReplicasAreWrittenOnceAndSpreadOverHolders) {
  // Two TP halves of one tensor, each replicated over 4 DP ranks; 8 tensors.
  std::vector<RankHoldings> h(8);
  for (int r = 0; r < 8; ++r) {
    for (int t = 0; t < 8; ++t) {
      const uint64_t half = r % 2;
      h[r].shards.push_back(
          Shard("t" + std::to_string(t), {8, 16}, Rows(half * 4, half * 4 + 4, 16)));
    }
  }
  const SavePlan plan = PlanOk(h);
  ASSERT_EQ(plan.tensors.size(), 8u);
  ASSERT_EQ(plan.chunks.size(), 16u);
  for (const PlannedChunk& c : plan.chunks) EXPECT_EQ(c.holders, 4u);
  for (uint64_t b : plan.bytes_per_rank) EXPECT_EQ(b, 2u * 256);  // 16 chunks of 256 B over 8
}

TEST(SavePlannerTest, LargeReplicasAreCutIntoPiecesWrittenByDifferentHolders) {
  // One [64, 64] F32 tensor (16 KiB) on all 4 ranks: an ideal share is
  // 4 KiB, the split size 512 B, so it is cut into one piece per holder.
  std::vector<RankHoldings> h(4);
  for (auto& r : h) r.shards.push_back(Shard("w", {64, 64}, Slice{Box::Whole({64, 64}), {}}));
  SavePlanOptions options;
  options.min_split_bytes = 1;
  const SavePlan plan = PlanOk(h, options);
  ASSERT_EQ(plan.chunks.size(), 4u);
  std::set<int> writers;
  for (uint32_t i = 0; i < 4; ++i) {
    const PlannedChunk& c = plan.chunks[plan.tensors[0].chunks[i]];
    EXPECT_EQ(c.slice, (Slice{Box::Whole({64, 64}), FlatRange{i * 1024, (i + 1) * 1024}}));
    EXPECT_EQ(c.shard_offset, i * 4096u);
    writers.insert(c.writer);
  }
  EXPECT_EQ(writers.size(), 4u);
  for (uint64_t b : plan.bytes_per_rank) EXPECT_EQ(b, 4096u);
  // Every holder checks its whole copy against the four pieces, once.
  ASSERT_EQ(plan.copies.size(), 4u);
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(plan.copies[r].rank, r);
    EXPECT_EQ(plan.copies[r].chunk, plan.tensors[0].chunks[0]);
    EXPECT_EQ(plan.copies[r].chunks, 4u);
  }
  // Held by 2 of 4 ranks, with single-holder tensors beside: cut into at
  // most one piece per holder; a flat shard's pieces keep its flat offset.
  std::vector<RankHoldings> g(4);
  for (int r = 0; r < 2; ++r) {
    g[r].shards.push_back(Shard("f", {100, 64}, Slice{Box::Whole({100, 64}), FlatRange{400, 6400}}));
  }
  g[2].shards.push_back(Shard("f", {100, 64}, Slice{Box::Whole({100, 64}), FlatRange{0, 400}}));
  for (int r = 0; r < 4; ++r) {
    g[r].shards.push_back(Shard("z", {4, 64}, Rows(r, r + 1, 64)));
  }
  const SavePlan cut = PlanOk(g, options);
  const PlannedTensor& f = cut.tensors[0];
  ASSERT_EQ(f.key, "f");
  ASSERT_EQ(f.chunks.size(), 3u);
  EXPECT_EQ(cut.chunks[f.chunks[1]].slice.flat->begin, 400u);
  EXPECT_EQ(cut.chunks[f.chunks[2]].slice.flat->end, 6400u);
  EXPECT_NE(cut.chunks[f.chunks[1]].writer, cut.chunks[f.chunks[2]].writer);
  // Small replicas (below min_split_bytes) stay whole.
  EXPECT_EQ(PlanOk(h).chunks.size(), 1u);
}

TEST(SavePlannerTest, SingleHolderChunksStayWithTheirRank) {
  std::vector<RankHoldings> h(2);
  h[0].shards.push_back(Shard("a", {4, 4}, Rows(0, 2, 4)));
  h[1].shards.push_back(Shard("a", {4, 4}, Rows(2, 4, 4)));
  h[0].shards.push_back(Shard("b", {4}, Slice{Box::Whole({4}), {}}));
  h[1].shards.push_back(Shard("b", {4}, Slice{Box::Whole({4}), {}}));
  const SavePlan plan = PlanOk(h);
  EXPECT_EQ(plan.chunks[plan.tensors[0].chunks[0]].writer, 0);
  EXPECT_EQ(plan.chunks[plan.tensors[0].chunks[1]].writer, 1);
  EXPECT_EQ(plan.bytes_per_rank[0] + plan.bytes_per_rank[1], 64u + 16u);
}

TEST(SavePlannerTest, RejectsGap) {
  std::vector<RankHoldings> h(2);
  h[0].shards.push_back(Shard("w", {4, 4}, Rows(0, 2, 4)));
  h[1].shards.push_back(Shard("w", {4, 4}, Rows(3, 4, 4)));
  Status s = PlanError(h);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), AllOf(HasSubstr("\"w\""), HasSubstr("gap")));
}

TEST(SavePlannerTest, RejectsOverlap) {
  std::vector<RankHoldings> h(2);
  h[0].shards.push_back(Shard("w", {4, 4}, Rows(0, 3, 4)));
  h[1].shards.push_back(Shard("w", {4, 4}, Rows(2, 4, 4)));
  EXPECT_THAT(PlanError(h).message(), HasSubstr("overlap between [0:3, 0:4] and [2:4, 0:4]"));
}

TEST(SavePlannerTest, RejectsDtypeMismatchNamingRanks) {
  std::vector<RankHoldings> h(3);
  h[0].shards.push_back(Shard("w", {4}, Slice{Box{{0}, {2}}, {}}));
  h[2].shards.push_back(Shard("w", {4}, Slice{Box{{2}, {2}}, {}}, DType::kBF16));
  Status s = PlanError(h);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), AllOf(HasSubstr("\"w\""), HasSubstr("rank 2 has BF16 [4]"),
                                 HasSubstr("rank 0 has F32 [4]")));
}

TEST(SavePlannerTest, RejectsShapeMismatch) {
  std::vector<RankHoldings> h(2);
  h[0].shards.push_back(Shard("w", {4}, Slice{Box{{0}, {2}}, {}}));
  h[1].shards.push_back(Shard("w", {5}, Slice{Box{{2}, {2}}, {}}));
  EXPECT_THAT(PlanError(h).message(), HasSubstr("rank 1 has F32 [5] but rank 0 has F32 [4]"));
}

TEST(SavePlannerTest, RejectsInvalidSliceNamingRank) {
  std::vector<RankHoldings> h(2);
  h[1].shards.push_back(Shard("w", {4}, Slice{Box{{2}, {3}}, {}}));
  Status s = PlanError(h);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), AllOf(HasSubstr("\"w\" on rank 1"), HasSubstr("exceeds")));
}

TEST(SavePlannerTest, RejectsSameSliceTwiceOnOneRank) {
  std::vector<RankHoldings> h(1);
  h[0].shards.push_back(Shard("w", {4}, Slice{Box::Whole({4}), {}}));
  h[0].shards.push_back(Shard("w", {4}, Slice{Box::Whole({4}), {}}));
  EXPECT_THAT(PlanError(h).message(), HasSubstr("rank 0 holds slice [0:4] twice"));
}

TEST(SavePlannerTest, BlobsPerRankAndGlobal) {
  std::vector<RankHoldings> h(3);
  for (int r = 0; r < 3; ++r) h[r].blobs.push_back(BlobInfo{"rng", 100u + r, true});
  for (int r = 1; r < 3; ++r) h[r].blobs.push_back(BlobInfo{"sampler", 7, false});
  const SavePlan plan = PlanOk(h);
  ASSERT_EQ(plan.blobs.size(), 4u);
  EXPECT_EQ(plan.blobs[3].name, "sampler");
  EXPECT_EQ(plan.blobs[3].rank, 1);  // the lowest supplier writes it
  EXPECT_EQ(plan.bytes_per_rank, (std::vector<uint64_t>{100, 108, 102}));
}

TEST(SavePlannerTest, RejectsBlobErrors) {
  std::vector<RankHoldings> h(2);
  h[0].blobs.push_back(BlobInfo{"x", 4, true});
  h[1].blobs.push_back(BlobInfo{"x", 4, false});
  EXPECT_THAT(PlanError(h).message(), HasSubstr("per-rank on rank 0 but global on rank 1"));
  h[1].blobs[0] = BlobInfo{"y", 5, false};
  h[0].blobs[0] = BlobInfo{"y", 4, false};
  EXPECT_THAT(PlanError(h).message(), HasSubstr("5 bytes on rank 1 but 4 on rank 0"));
  h[0].blobs = {BlobInfo{"z", 1, true}};
  h[1].blobs = {BlobInfo{"z", 1, true}, BlobInfo{"z", 1, true}};
  EXPECT_THAT(PlanError(h).message(), HasSubstr("supplied twice by rank 1"));
}

TEST(SavePlannerTest, FileCapRespectedAndOversizedChunkGetsOwnFile) {
  std::vector<RankHoldings> h(1);
  for (int t = 0; t < 20; ++t) {
    const Shape shape = {uint64_t(10 + t)};
    h[0].shards.push_back(Shard("t" + std::to_string(t), shape, Slice{Box::Whole(shape), {}}));
  }
  h[0].shards.push_back(Shard("big", {1000}, Slice{Box::Whole({1000}), {}}));
  h[0].blobs.push_back(BlobInfo{"b", 50, true});
  const SavePlanOptions options{300};
  const SavePlan plan = PlanOk(h, options);
  // 20 small tensors: 4 * (10 + ... + 29) = 1560 B + 50 B blob: >= 6 files.
  int oversized = 0;
  for (const PlannedFile& f : plan.files) oversized += f.payload_bytes > 300;
  EXPECT_EQ(oversized, 1);
  EXPECT_GE(plan.files.size(), 7u);
  EXPECT_LE(plan.files.size(), 8u);
}

TEST(SavePlannerTest, EmptyTensorKeepsAChunkAndEmptyFlatShardsAreDropped) {
  std::vector<RankHoldings> h(2);
  h[0].shards.push_back(Shard("e", {0, 3}, Slice{Box::Whole({0, 3}), {}}));
  h[1].shards.push_back(Shard("e", {0, 3}, Slice{Box::Whole({0, 3}), {}}));
  h[0].shards.push_back(Shard("f", {3}, Slice{Box::Whole({3}), FlatRange{0, 3}}));
  h[1].shards.push_back(Shard("f", {3}, Slice{Box::Whole({3}), FlatRange{3, 3}}));
  h[0].shards.push_back(Shard("s", {}, Slice{Box{}, {}}, DType::kF64));
  const SavePlan plan = PlanOk(h);
  ASSERT_EQ(plan.tensors.size(), 3u);
  EXPECT_EQ(plan.tensors[0].chunks.size(), 1u);  // e
  EXPECT_EQ(plan.tensors[1].chunks.size(), 1u);  // f: the empty flat shard is gone
  EXPECT_EQ(plan.chunks[plan.tensors[2].chunks[0]].bytes, 8u);
}

TEST(SavePlannerTest, DeterministicAcrossRuns) {
  simulated::TransformerLayout m{2, 2, 4, 6, 64, 160, 500, true};
  const auto h = simulated::MakeHoldings(m);
  const SavePlan a = PlanOk(h, {1 << 16});
  const SavePlan b = PlanOk(h, {1 << 16});
  ASSERT_EQ(a.chunks.size(), b.chunks.size());
  for (size_t i = 0; i < a.chunks.size(); ++i) {
    EXPECT_EQ(a.chunks[i].slice, b.chunks[i].slice);
    EXPECT_EQ(a.chunks[i].writer, b.chunks[i].writer);
    EXPECT_EQ(a.chunks[i].writer_shard, b.chunks[i].writer_shard);
  }
  ASSERT_EQ(a.files.size(), b.files.size());
  for (size_t i = 0; i < a.files.size(); ++i) EXPECT_EQ(a.files[i].chunks, b.files[i].chunks);
  EXPECT_EQ(a.bytes_per_rank, b.bytes_per_rank);
}

double BalanceRatio(const SavePlan& plan) {
  uint64_t max = 0;
  for (uint64_t b : plan.bytes_per_rank) max = std::max(max, b);
  return static_cast<double>(max) / static_cast<double>(simulated::IdealMaxRankBytes(plan));
}

// The lower bound ignores that a replicated chunk lands whole on one rank,
// so the embedding is kept in proportion to the layers as in real models
// (a Llama-70B-like stage has ~19B parameters against a 0.26B embedding).
TEST(SavePlannerTest, BalancedOnDpTpPp) {
  simulated::TransformerLayout m{4, 2, 8, 16, 512, 1376, 512, false};
  const SavePlan plan = PlanOk(simulated::MakeHoldings(m));
  EXPECT_LE(BalanceRatio(plan), 1.1);
}

TEST(SavePlannerTest, BalancedOnZero) {
  simulated::TransformerLayout m{2, 4, 16, 48, 256, 688, 256, true};
  const SavePlan plan = PlanOk(simulated::MakeHoldings(m));
  EXPECT_LE(BalanceRatio(plan), 1.1);
}

// Random tensors tiled at random, each chunk held by 1..4 random ranks.
TEST(SavePlannerTest, RandomLayoutsKeepInvariants) {
  Rng rng(99);
  for (int iter = 0; iter < 300; ++iter) {
    const int world = static_cast<int>(Uniform(rng, 1, 6));
    std::vector<RankHoldings> h(world);
    std::multiset<std::string> expected_chunks;
    const int tensors = static_cast<int>(Uniform(rng, 1, 6));
    for (int t = 0; t < tensors; ++t) {
      const DType dtype = testing::RandomDType(rng);
      const Shape shape = testing::RandomShape(rng, dtype);
      const bool empty = *NumElements(shape) == 0;
      for (const Slice& s : testing::RandomTiling(rng, shape, dtype)) {
        std::vector<int> ranks(world);
        std::iota(ranks.begin(), ranks.end(), 0);
        std::shuffle(ranks.begin(), ranks.end(), rng);
        ranks.resize(Uniform(rng, 1, world));
        for (int r : ranks) h[r].shards.push_back(Shard("k" + std::to_string(t), shape, s, dtype));
        if (s.NumElements() > 0 || empty) {
          expected_chunks.insert("k" + std::to_string(t) + SliceToString(s));
        }
      }
    }
    SavePlanOptions options{Uniform(rng, 1, 200)};
    const bool cut = iter % 2 == 1;  // cut every replica that can be cut
    if (cut) options.min_split_bytes = 1;
    const SavePlan plan = PlanOk(h, options);
    std::multiset<std::string> chunks;
    for (const PlannedChunk& c : plan.chunks) {
      const Slice whole = cut ? Slice{c.slice.box, std::nullopt} : c.slice;
      chunks.insert(plan.tensors[c.tensor].key + SliceToString(whole));
    }
    if (!cut) {
      ASSERT_EQ(chunks, expected_chunks);
    }
    // Cut or not, each tensor's chunks still tile it.
    for (const PlannedTensor& t : plan.tensors) {
      std::vector<Slice> slices;
      for (uint32_t c : t.chunks) slices.push_back(plan.chunks[c].slice);
      if (*NumElements(t.shape) > 0) {
        ASSERT_TRUE(CheckTiling(t.key, t.shape, slices).ok()) << t.key;
      }
    }
    if (HasFailure()) FAIL() << "iteration " << iter;
  }
}

}  // namespace
}  // namespace shardsafe
