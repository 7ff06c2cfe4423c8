// PartOfPlan: every rank's part of a whole plan holds exactly its files,
// the chunks of those files, their tensors and the whole plan's numbers of
// each, and its held copies with the whole plan's numbers and their pieces'
// sizes, on DP x TP x PP with ZeRO-1 and with replicas cut into pieces.
#include "layout/plan_part.h"

#include <gtest/gtest.h>

#include <algorithm>

#include "testing/layout/simulated_layouts.h"

namespace shardsafe {
namespace {

// Same content, whatever the numbering of tensors.
void ExpectSameChunk(const SavePlan& whole, uint32_t w, const SavePlan& part, uint32_t p) {
  const PlannedChunk& a = whole.chunks[w];
  const PlannedChunk& b = part.chunks[p];
  EXPECT_EQ(whole.tensors[a.tensor].key, part.tensors[b.tensor].key);
  EXPECT_EQ(whole.tensors[a.tensor].shape, part.tensors[b.tensor].shape);
  EXPECT_EQ(a.slice, b.slice);
  EXPECT_EQ(a.bytes, b.bytes);
  EXPECT_EQ(a.writer, b.writer);
  EXPECT_EQ(a.writer_shard, b.writer_shard);
  EXPECT_EQ(a.shard_offset, b.shard_offset);
  EXPECT_EQ(a.holders, b.holders);
}

void CheckParts(const SavePlan& whole) {
  const int ranks = static_cast<int>(whole.bytes_per_rank.size());
  size_t files = 0, copies = 0;
  uint64_t held = 0;
  for (const PlannedChunk& c : whole.chunks) held += c.bytes * c.holders;
  for (int r = 0; r < ranks; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    const SavePlan part = PartOfPlan(whole, r, PlanTotals(whole));
    ASSERT_TRUE(part.part.has_value());
    EXPECT_EQ(part.part->whole_files, whole.files.size());
    EXPECT_EQ(part.part->held_bytes, held);
    EXPECT_TRUE(part.bytes_per_rank.empty()) << "a part does not grow with the job";
    EXPECT_EQ(RankBytes(part, r), whole.bytes_per_rank[r]);
    EXPECT_EQ(MaxRankBytes(part), MaxRankBytes(whole));
    EXPECT_EQ(MaxRankBytes(whole),
              *std::max_element(whole.bytes_per_rank.begin(), whole.bytes_per_rank.end()));
    ASSERT_EQ(part.part->files.size(), part.files.size());
    ASSERT_EQ(part.part->chunks.size(), part.chunks.size());
    for (size_t t = 1; t < part.tensors.size(); ++t) {
      EXPECT_LT(part.tensors[t - 1].key, part.tensors[t].key);
    }
    uint64_t written = 0;
    for (size_t f = 0; f < part.files.size(); ++f) {
      const PlannedFile& mine = part.files[f];
      const PlannedFile& theirs = whole.files[WholeFileNumber(part, static_cast<uint32_t>(f))];
      EXPECT_EQ(mine.rank, r);
      EXPECT_EQ(theirs.rank, r);
      EXPECT_EQ(mine.number, theirs.number);
      EXPECT_EQ(mine.payload_bytes, theirs.payload_bytes);
      ASSERT_EQ(mine.chunks.size(), theirs.chunks.size());
      for (size_t i = 0; i < mine.chunks.size(); ++i) {
        EXPECT_EQ(WholeChunkNumber(part, mine.chunks[i]), theirs.chunks[i]);
        ExpectSameChunk(whole, theirs.chunks[i], part, mine.chunks[i]);
        written += part.chunks[mine.chunks[i]].bytes;
      }
      ASSERT_EQ(mine.blobs.size(), theirs.blobs.size());
      for (size_t i = 0; i < mine.blobs.size(); ++i) {
        EXPECT_EQ(part.blobs[mine.blobs[i]].name, whole.blobs[theirs.blobs[i]].name);
        written += part.blobs[mine.blobs[i]].bytes;
      }
    }
    EXPECT_EQ(written, whole.bytes_per_rank[r]);
    files += part.files.size();
    // The rank's copies, in order, their pieces those of the whole plan.
    std::vector<size_t> expected;
    for (size_t i = 0; i < whole.copies.size(); ++i) {
      if (whole.copies[i].rank == r) expected.push_back(i);
    }
    ASSERT_EQ(part.copies.size(), expected.size());
    ASSERT_EQ(part.part->copy_shapes.size(), expected.size());
    for (size_t i = 0; i < expected.size(); ++i) {
      const HeldCopy& theirs = whole.copies[expected[i]];
      EXPECT_EQ(part.copies[i].shard, theirs.shard);
      EXPECT_EQ(part.copies[i].chunk, theirs.chunk);
      ASSERT_EQ(part.copies[i].chunks, theirs.chunks);
      const std::vector<CopyPiece> mine = PiecesOf(part, i), all = PiecesOf(whole, expected[i]);
      ASSERT_EQ(mine.size(), theirs.chunks);
      for (uint32_t k = 0; k < theirs.chunks; ++k) {
        EXPECT_EQ(mine[k].chunk, theirs.chunk + k);
        EXPECT_EQ(all[k].chunk, theirs.chunk + k);
        EXPECT_EQ(mine[k].bytes, whole.chunks[theirs.chunk + k].bytes);
        EXPECT_EQ(all[k].bytes, whole.chunks[theirs.chunk + k].bytes);
      }
    }
    copies += expected.size();
  }
  EXPECT_EQ(files, whole.files.size());
  EXPECT_EQ(copies, whole.copies.size());
}

TEST(PlanPartTest, EveryRankGetsItsFilesAndCopiesOnZero) {
  simulated::TransformerLayout m{.tp = 2, .pp = 2, .dp = 3, .layers = 4, .hidden = 64,
                                 .ffn = 96, .vocab = 100, .zero = true};
  auto plan = PlanSave(simulated::MakeHoldings(m), SavePlanOptions{.max_file_bytes = 1 << 16});
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  ASSERT_FALSE(plan->copies.empty());
  CheckParts(*plan);
}

TEST(PlanPartTest, EveryRankGetsItsPiecesAndTheWholeCopyOfACutReplica) {
  simulated::TransformerLayout m{.tp = 1, .pp = 1, .dp = 4, .layers = 2, .hidden = 64,
                                 .ffn = 96, .vocab = 100, .zero = false};
  auto plan = PlanSave(simulated::MakeHoldings(m),
                       SavePlanOptions{.max_file_bytes = 1 << 20, .min_split_bytes = 1});
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  bool cut = false;
  for (const HeldCopy& h : plan->copies) cut |= h.chunks > 1;
  ASSERT_TRUE(cut) << "a replica is cut into pieces";
  CheckParts(*plan);
}

TEST(PlanPartTest, AWholePlanNumbersAsItself) {
  SavePlan whole;
  EXPECT_EQ(WholeFileNumber(whole, 7), 7u);
  EXPECT_EQ(WholeChunkNumber(whole, 9), 9u);
}

}  // namespace
}  // namespace shardsafe
