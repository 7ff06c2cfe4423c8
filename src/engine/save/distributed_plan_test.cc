// The distributed plan against PlanSave: every rank's part must be the one
// PartOfPlan cuts from the whole plan, byte for byte as rank 0 would send
// it (EncodePlanMessage), on random layouts (replicas, pieces, flat ranges,
// empty tensors, blobs, small file caps), on TP x PP x DP, FSDP and MoE
// meshes, over simulated ranks in one process and over thread ranks; a
// layout PlanSave refuses fails on every rank with one error.
#include "engine/plan/distributed_plan.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <numeric>
#include <thread>

#include "engine/plan/plan_home.h"
#include "engine/save/plan_wire.h"
#include "engine/testing/plan_simulation.h"
#include "engine/testing/plan_testing.h"
#include "layout/plan_part.h"
#include "testing/layout/layout_testing.h"
#include "testing/layout/simulated_layouts.h"

namespace shardsafe {
namespace {

using ::testing::HasSubstr;
using testing::RandomHoldings;
using testing::Rng;
using testing::Shard;
using testing::Uniform;

// Every rank's part, planned by simulated ranks in one process.
std::vector<Result<SavePlan>> PlanInProcess(const std::vector<RankHoldings>& holdings,
                                            const SavePlanOptions& options,
                                            PlanSimulation* sim = nullptr) {
  std::vector<Result<SavePlan>> parts;
  PlanSimulation done = SimulatePlan(
      static_cast<int>(holdings.size()), [&](int r) { return holdings[r]; }, options,
      [&](int, Result<SavePlan> part) { parts.push_back(std::move(part)); });
  if (sim) *sim = std::move(done);
  return parts;
}

// Every rank's part equals the one cut from PlanSave's whole plan.
void ExpectSameParts(const std::vector<RankHoldings>& holdings, const SavePlanOptions& options,
                     const std::vector<Result<SavePlan>>& parts) {
  const Result<SavePlan> whole = PlanSave(holdings, options);
  ASSERT_TRUE(whole.ok()) << whole.status().ToString();
  const PlanPartInfo totals = PlanTotals(*whole);
  ASSERT_EQ(parts.size(), holdings.size());
  for (int r = 0; r < static_cast<int>(holdings.size()); ++r) {
    ASSERT_TRUE(parts[r].ok()) << "rank " << r << ": " << parts[r].status().ToString();
    const std::string expected = EncodePlanMessage(PartOfPlan(*whole, r, totals), Digest{});
    ASSERT_EQ(EncodePlanMessage(*parts[r], Digest{}), expected) << "rank " << r;
  }
}

TEST(DistributedPlanTest, RandomLayoutsGiveEveryRankThePartPlanSaveGives) {
  Rng rng(2026);
  for (int iter = 0; iter < 1000; ++iter) {
    const std::vector<RankHoldings> holdings = RandomHoldings(rng);
    SavePlanOptions options{Uniform(rng, 1, 300)};
    if (iter % 2) options.min_split_bytes = 1;  // cut every replica that can be cut
    ExpectSameParts(holdings, options, PlanInProcess(holdings, options));
    if (HasFailure()) FAIL() << "iteration " << iter;
  }
}

// Holder lists longer than the coordinator scans (it keeps a heap of them),
// overlapping, over ranks whose own loads differ.
TEST(DistributedPlanTest, ReplicasOfHundredsOfHoldersGetTheWritersPlanSaveGives) {
  Rng rng(11);
  for (int iter = 0; iter < 6; ++iter) {
    const int world = static_cast<int>(Uniform(rng, 130, 300));
    std::vector<RankHoldings> h(world);
    for (int t = 0; t < 12; ++t) {
      const Shape shape{Uniform(rng, 1, 40), 64};
      for (const Slice& s : testing::RandomTiling(rng, shape, DType::kF32)) {
        std::vector<int> ranks(world);
        std::iota(ranks.begin(), ranks.end(), 0);
        std::shuffle(ranks.begin(), ranks.end(), rng);
        ranks.resize(Uniform(rng, 0, 3) == 0 ? 1 : Uniform(rng, 65, world));
        for (int r : ranks) h[r].shards.push_back(Shard("t" + std::to_string(t), shape, s));
      }
    }
    SavePlanOptions options;
    if (iter % 2) options.min_split_bytes = 1;
    ExpectSameParts(h, options, PlanInProcess(h, options));
    if (HasFailure()) FAIL() << "iteration " << iter;
  }
}

TEST(DistributedPlanTest, MeshLayoutsGiveEveryRankThePartPlanSaveGives) {
  simulated::TransformerLayout dense;  // TP 8 x PP 4 x DP 4, ZeRO-1
  dense.dp = 4;
  dense.layers = 8;
  simulated::TransformerLayout fsdp = dense;
  fsdp.fsdp = true;
  fsdp.pp = 1;
  simulated::MoeLayout moe;
  moe.ep = 2;
  moe.dp = 2;
  moe.layers = 4;
  std::vector<RankHoldings> moe_holdings;
  for (int r = 0; r < moe.world(); ++r) moe_holdings.push_back(simulated::RankShards(moe, r));
  for (const auto& holdings :
       {simulated::MakeHoldings(dense), simulated::MakeHoldings(fsdp), moe_holdings}) {
    SavePlanOptions options;
    options.max_file_bytes = uint64_t{1} << 30;
    ExpectSameParts(holdings, options, PlanInProcess(holdings, options));
  }
}

// The lean simulation the planner benchmark runs (SimulateSave) gives what
// the full one gives, on random layouts, mesh layouts and a refused one.
TEST(DistributedPlanTest, SimulateSaveGivesWhatSimulatePlanAndSimulateIndexGive) {
  const auto check = [](const std::vector<RankHoldings>& holdings, const SavePlanOptions& options) {
    return CheckSimulateSave(
        static_cast<int>(holdings.size()), [&](int r) { return holdings[r]; }, options);
  };
  Rng rng(52);
  for (int iter = 0; iter < 200; ++iter) {
    const std::vector<RankHoldings> holdings = RandomHoldings(rng);
    SavePlanOptions options{Uniform(rng, 1, 300)};
    if (iter % 2) options.min_split_bytes = 1;
    const Status s = check(holdings, options);
    ASSERT_TRUE(s.ok()) << "iteration " << iter << ": " << s.ToString();
  }
  simulated::TransformerLayout fsdp;  // TP 8 x DP 4, FSDP
  fsdp.dp = 4;
  fsdp.pp = 1;
  fsdp.layers = 4;
  fsdp.fsdp = true;
  const Status s = check(simulated::MakeHoldings(fsdp), SavePlanOptions{});
  EXPECT_TRUE(s.ok()) << s.ToString();
  std::vector<RankHoldings> gap(3);
  gap[1].shards = {Shard("w", {4, 2}, Slice{Box{{0, 0}, {2, 2}}, {}})};
  gap[2].shards = {Shard("w", {4, 2}, Slice{Box{{3, 0}, {1, 2}}, {}})};
  const Status refused = check(gap, SavePlanOptions{});
  EXPECT_TRUE(refused.ok()) << refused.ToString();
}

TEST(DistributedPlanTest, ThreadRanksPlanOverTheirCommAsTheSimulatedRanksDo) {
  Rng rng(7);
  for (int iter = 0; iter < 20; ++iter) {
    std::vector<RankHoldings> holdings = RandomHoldings(rng);
    const SavePlanOptions options{Uniform(rng, 1, 300), 1};
    const int n = static_cast<int>(holdings.size());
    auto comms = MakeThreadComms(n);
    std::vector<Result<SavePlan>> parts(n, Result<SavePlan>(InternalError("not run")));
    std::vector<PlanTraffic> traffic(n);
    std::vector<std::thread> threads;
    for (int r = 0; r < n; ++r) {
      threads.emplace_back([&, r] {
        parts[r] = PlanOverComm(*comms[r], holdings[r], options, &traffic[r]);
      });
    }
    for (std::thread& t : threads) t.join();
    ExpectSameParts(holdings, options, parts);
    PlanSimulation sim;
    PlanInProcess(holdings, options, &sim);
    for (int r = 0; r < n; ++r) {
      EXPECT_EQ(traffic[r].sent, sim.ranks[r].sent) << "rank " << r;
      EXPECT_EQ(traffic[r].received, sim.ranks[r].received) << "rank " << r;
    }
    if (HasFailure()) FAIL() << "iteration " << iter;
  }
}

// Every rank returns the same error, the one naming the key.
void ExpectErrorEverywhere(const std::vector<RankHoldings>& holdings, const std::string& what) {
  const Result<SavePlan> whole = PlanSave(holdings, {});
  ASSERT_FALSE(whole.ok());
  EXPECT_EQ(whole.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(whole.status().message(), HasSubstr(what));
  const std::vector<Result<SavePlan>> parts = PlanInProcess(holdings, {});
  ASSERT_FALSE(parts[0].ok());
  EXPECT_EQ(parts[0].status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(parts[0].status().message(), HasSubstr(what));
  for (const Result<SavePlan>& p : parts) {
    ASSERT_FALSE(p.ok());
    EXPECT_EQ(p.status().ToString(), parts[0].status().ToString());
  }
}

TEST(DistributedPlanTest, ALayoutPlanSaveRefusesFailsOnEveryRank) {
  const Shape shape{4, 2};
  const auto rows = [](uint64_t a, uint64_t b) { return Slice{Box{{a, 0}, {b - a, 2}}, {}}; };
  std::vector<RankHoldings> gap(3);
  gap[1].shards = {Shard("w", shape, rows(0, 2))};
  gap[2].shards = {Shard("w", shape, rows(3, 4))};
  ExpectErrorEverywhere(gap, "\"w\"");

  std::vector<RankHoldings> dtype(3);
  dtype[0].shards = {Shard("w", shape, rows(0, 2))};
  dtype[2].shards = {Shard("w", shape, rows(2, 4), DType::kBF16)};
  ExpectErrorEverywhere(dtype, "rank 2 has BF16 [4, 2] but rank 0 has F32 [4, 2]");

  std::vector<RankHoldings> twice(2);
  twice[1].shards = {Shard("w", shape, rows(0, 4)), Shard("w", shape, rows(0, 4))};
  ExpectErrorEverywhere(twice, "rank 1 holds slice");

  std::vector<RankHoldings> mixed(2);
  mixed[1].shards = {Shard("w", shape, rows(0, 2)), Shard("w", {4, 3}, rows(2, 4))};
  ExpectErrorEverywhere(mixed, "\"w\"");

  std::vector<RankHoldings> blob(3);
  blob[0].blobs = {{"config", 3, false}};
  blob[2].blobs = {{"config", 4, false}};
  ExpectErrorEverywhere(blob, "blob \"config\"");
}

// The rounds of `holdings` with the messages of round `cut_round` (1-6)
// that rank `from` sends cut to `keep` bytes each (a truncated or damaged
// peer): every rank's result.
std::vector<Result<SavePlan>> PlanWithCut(const std::vector<RankHoldings>& holdings,
                                          int cut_round, int from, size_t keep) {
  const int n = static_cast<int>(holdings.size());
  const auto cut = [&](int round, int rank, std::vector<std::string> msgs) {
    if (round == cut_round && rank == from) {
      for (std::string& m : msgs) m.resize(std::min(m.size(), keep));
    }
    return msgs;
  };
  const auto transpose = [n](const std::vector<std::vector<std::string>>& sent) {
    std::vector<std::vector<std::string>> got(n, std::vector<std::string>(n));
    for (int a = 0; a < n; ++a) {
      for (int b = 0; b < n; ++b) got[b][a] = sent[a][b];
    }
    return got;
  };
  std::vector<std::unique_ptr<RankPlanner>> p;
  for (int r = 0; r < n; ++r) p.push_back(std::make_unique<RankPlanner>(r, n, holdings[r], SavePlanOptions{}));
  std::vector<std::vector<std::string>> sent(n);
  for (int r = 0; r < n; ++r) sent[r] = cut(1, r, p[r]->ToHomes());
  auto got = transpose(sent);
  for (int r = 0; r < n; ++r) sent[r] = cut(2, r, p[r]->PlanHome(got[r]));
  got = transpose(sent);
  std::vector<std::string> summaries;
  for (int r = 0; r < n; ++r) summaries.push_back(cut(3, r, {p[r]->Summary(got[r])})[0]);
  const std::vector<std::string> decisions = cut(4, 0, RankPlanner::Coordinate(summaries, {}));
  for (int r = 0; r < n; ++r) sent[r] = cut(5, r, p[r]->Assign(decisions[r]));
  got = transpose(sent);
  std::vector<std::string> packed;
  for (int r = 0; r < n; ++r) packed.push_back(cut(6, r, {p[r]->PackPart(got[r])})[0]);
  std::vector<Result<SavePlan>> out;
  for (int r = 0; r < n; ++r) out.push_back(p[r]->Finish(packed));
  return out;
}

TEST(DistributedPlanTest, ACutMessageFailsEveryRankWithOneError) {
  simulated::TransformerLayout m;  // TP 2 x DP 2: replicas, pieces, blobs
  m.tp = 2;
  m.pp = 1;
  m.dp = 2;
  m.layers = 1;
  const std::vector<RankHoldings> holdings = simulated::MakeHoldings(m);
  for (int round = 1; round <= 6; ++round) {
    for (int from : {0, 3}) {
      for (size_t keep : {0, 1, 5, 40}) {
        const std::vector<Result<SavePlan>> parts = PlanWithCut(holdings, round, from, keep);
        if (parts[0].ok()) {  // nothing was cut (no message, or a shorter one)
          for (const auto& p : parts) ASSERT_TRUE(p.ok()) << round << " " << from << " " << keep;
          continue;
        }
        for (const auto& p : parts) {
          ASSERT_FALSE(p.ok()) << "round " << round << " from " << from << " keep " << keep;
          EXPECT_EQ(p.status().ToString(), parts[0].status().ToString());
          // Round 1 cut to nothing: the rank holds nothing, and leaves gaps.
          const StatusCode want = round == 1 && keep == 0 ? StatusCode::kInvalidArgument
                                                          : StatusCode::kInternal;
          EXPECT_EQ(p.status().code(), want) << p.status().ToString();
        }
      }
    }
  }
}

TEST(DistributedPlanTest, HomesSpreadKeysAndHolderListsTakeAFewBytes) {
  std::vector<int> keys_at(64, 0);
  for (int k = 0; k < 64 * 8; ++k) ++keys_at[HomeOf("layers." + std::to_string(k) + ".w", 64)];
  EXPECT_LE(*std::max_element(keys_at.begin(), keys_at.end()), 24);
  EXPECT_EQ(HomeOf("any", 1), 0);

  std::vector<int> dp_group;  // one TP x PP position's DP replicas at 65,536 ranks
  for (int dp = 0; dp < 2048; ++dp) dp_group.push_back(5 + 32 * dp);
  wire::Writer w;
  PutRanks(w, dp_group);
  const std::string bytes = w.Take();
  EXPECT_EQ(bytes.size(), 5u) << "one run: count, first, stride, 2,048";
  wire::Reader r(bytes);
  const Result<std::vector<RankRun>> back = GetRankRuns(r, 65536);
  ASSERT_TRUE(back.ok());
  std::vector<int> ranks;
  for (const RankRun& run : *back) {
    for (uint32_t k = 0; k < run.count; ++k) ranks.push_back(static_cast<int>(run.first + k * run.stride));
  }
  EXPECT_EQ(ranks, dp_group);
  wire::Reader outside(bytes);
  const Result<std::vector<RankRun>> past = GetRankRuns(outside, 32 * 2047);
  ASSERT_FALSE(past.ok()) << "a rank past the world";
  EXPECT_EQ(past.status().code(), StatusCode::kInternal);
  EXPECT_THAT(past.status().message(), HasSubstr("a holder list out of range or order"));
}

}  // namespace
}  // namespace shardsafe
