// Planning a 4,096-rank save (TP 8 x PP 4 x DP 128, ZeRO-1, an 80-layer ~1
// TB transformer) by all ranks together (distributed_plan.h), every rank
// simulated (plan_simulation.h): the busiest writer stays within 1.1x its
// ideal share, and what each rank sends and receives follows its own work,
// where PlanSave's would be every rank's layout on rank 0: rank 0 adds a few
// hundred bytes per rank of the job, a home the shards of its keys, any
// other rank its layout and its part. At 1,024 ranks (the smaller size) every part is checked
// against PlanSave's. Counts bytes, never times. Under AddressSanitizer
// (a debug build, ~60x slower: 10 minutes here) the same layouts run at 512
// and 2,048 ranks (a third of the time): what is checked is how traffic
// grows with the job, which holds from 2,048 ranks (below, rank 0's fixed
// share is over 512 bytes a rank) with ranks that are no home (at 256
// ranks every rank is one).
#include <gtest/gtest.h>

#include <algorithm>

#include "engine/save/plan_wire.h"
#include "engine/testing/plan_simulation.h"
#include "layout/plan_part.h"
#include "testing/layout/simulated_layouts.h"

namespace shardsafe {
namespace {

struct Measured {
  uint64_t rank0 = 0;          // bytes sent + received
  uint64_t most_other = 0;     // of any other rank
  uint64_t most_not_home = 0;  // of a rank that is no home of a key
  double balance = 0;
};

Measured Plan(int dp, bool against_plan_save) {
  simulated::TransformerLayout m;  // TP 8, PP 4, ZeRO-1
  m.dp = dp;
  std::optional<SavePlan> whole;
  if (against_plan_save) {
    auto plan = PlanSave(simulated::MakeHoldings(m), SavePlanOptions{});
    EXPECT_TRUE(plan.ok()) << plan.status().ToString();
    if (plan.ok()) whole = std::move(*plan);
  }
  const PlanPartInfo totals = whole ? PlanTotals(*whole) : PlanPartInfo{};
  std::vector<uint64_t> mandatory(m.world(), 0);
  uint64_t most = 0, unique = 0;
  std::vector<bool> home(m.world(), false);
  const PlanSimulation sim = SimulatePlan(
      m.world(),
      [&](int r) {
        RankHoldings h = simulated::RankShards(m, r);
        for (const ShardInfo& s : h.shards) home[HomeOf(s.key, m.world())] = true;
        return h;
      },
      SavePlanOptions{},
      [&](int r, Result<SavePlan> part) {
        ASSERT_TRUE(part.ok()) << part.status().ToString();
        if (whole) {
          ASSERT_EQ(EncodePlanMessage(*part, Digest{}),
                    EncodePlanMessage(PartOfPlan(*whole, r, totals), Digest{}))
              << "rank " << r;
        }
        for (const PlannedChunk& c : part->chunks) mandatory[r] += c.holders == 1 ? c.bytes : 0;
        for (const PlannedBlob& b : part->blobs) mandatory[r] += b.bytes;
        most = part->part->max_rank_bytes;
        unique = part->unique_bytes;
      });
  Measured out;
  uint64_t ideal = (unique + m.world() - 1) / m.world();
  for (uint64_t b : mandatory) ideal = std::max(ideal, b);
  out.balance = static_cast<double>(most) / static_cast<double>(ideal);
  out.rank0 = sim.ranks[0].sent + sim.ranks[0].received;
  for (int r = 1; r < m.world(); ++r) {
    const uint64_t bytes = sim.ranks[r].sent + sim.ranks[r].received;
    out.most_other = std::max(out.most_other, bytes);
    if (!home[r]) out.most_not_home = std::max(out.most_not_home, bytes);
  }
  return out;
}

#if defined(__SANITIZE_ADDRESS__)
constexpr int kSmallDp = 16, kLargeDp = 64;  // 512 and 2,048 ranks
#else
constexpr int kSmallDp = 32, kLargeDp = 128;  // 1,024 and 4,096 ranks
#endif

TEST(DistributedPlanScaleTest, WritersBalanceAndEveryRanksTrafficFollowsItsWork) {
  const Measured small = Plan(kSmallDp, true), large = Plan(kLargeDp, false);
  const uint64_t world = 32u * kLargeDp;
  EXPECT_LE(small.balance, 1.1);
  EXPECT_LE(large.balance, 1.1);
  // Rank 0 (1.4 MB at 4,096 ranks): a summary and a decision per rank, the
  // keys and the replicated chunks; every rank's layout would be 200+ MB.
  EXPECT_GT(large.rank0, 0u);
  EXPECT_LE(large.rank0, world * 512) << "rank 0: at most 512 bytes per rank of the job";
  // A home (0.7 MB at 4,096 ranks): the shards of its keys, one per holder.
  EXPECT_LE(large.most_other, 1u << 20) << "a home receives its keys' shards only";
  // A rank that is no home (80 KB at 4,096 ranks): its layout and part, and
  // a few bytes per rank from the all-gather of file counts.
  EXPECT_LE(large.most_not_home, small.most_not_home * 5 / 4)
      << "a rank's traffic grows with the job, not its own work";
}

}  // namespace
}  // namespace shardsafe
