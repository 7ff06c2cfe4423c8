// Saves planned by all ranks together (engine/save/distributed_save.h),
// over thread ranks: the index and every part of the chunk table equal
// those of the same save planned on rank 0, each home writes its part, a
// repeated save reuses the plan, a changed layout is planned anew, loads
// (resharded) are bit-exact, and replicas that differ, values that differ
// and ranks that disagree on planning together fail every rank with one
// named error and commit nothing.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>

#include <nlohmann/json.hpp>

#include "engine/save/distributed_plan.h"
#include "engine/test_util.h"
#include "shardsafe/tools.h"

namespace shardsafe {
namespace {

using ::testing::HasSubstr;
using testing::MakeShard;
using testing::MakeTarget;
using testing::MatchesOracle;
using testing::OwnedShard;
using testing::OwnedTarget;
using testing::RunRanks;

constexpr int kRanks = 4;
const Shape kW{64, 48};         // F32: 2 row boxes (TP), each in 2 flat pieces (ZeRO)
const Shape kE{40, 16};         // BF16: 4 column boxes
const Shape kB{7};              // I64: replicated on every rank
const Shape kLarge{1024, 512};  // F32, 2 MiB, replicated: cut into pieces
const Shape kEmpty{0, 3};

Slice Box2(uint64_t r0, uint64_t rows, uint64_t c0, uint64_t cols) {
  return {Box{{r0, c0}, {rows, cols}}, std::nullopt};
}
Slice Whole(const Shape& s) { return {Box::Whole(s), std::nullopt}; }

// Rank r: TP rank r / 2, DP rank r % 2; `swap` swaps w's ZeRO pieces.
std::vector<OwnedShard> HeldBy(int r, bool swap = false) {
  const uint64_t tp = r / 2, dp = (r % 2) ^ (swap ? 1 : 0);
  Slice w = Box2(32 * tp, 32, 0, 48);
  w.flat = FlatRange{dp * 768, dp * 768 + 768};
  return {MakeShard("w", DType::kF32, kW, w),
          MakeShard("e", DType::kBF16, kE, Box2(0, 40, 4 * r, 4)),
          MakeShard("b", DType::kI64, kB, Whole(kB)),
          MakeShard("large", DType::kF32, kLarge, Whole(kLarge)),
          MakeShard("empty", DType::kF32, kEmpty, Whole(kEmpty))};
}

SaveOptions Together() {
  SaveOptions options;
  options.distributed_plan_min_ranks = 1;
  options.chunk_table_min_chunks = uint64_t{1} << 40;  // planned together: a table anyway
  return options;
}

SaveOptions OnRankZero() {
  SaveOptions options;
  options.distributed_plan_min_ranks = uint64_t{1} << 40;
  options.chunk_table_min_chunks = 1;
  return options;
}

class DistributedSaveTest : public ::testing::Test {
 protected:
  void SetUp() override { root_ = testing::MakeTempDir("together"); }
  void TearDown() override { std::filesystem::remove_all(root_); }

  // Saves `held` (by rank) as root_/TAG; each rank's stats or error.
  std::vector<Result<SaveStats>> SaveAll(const std::string& tag,
                                         const std::vector<std::vector<OwnedShard>>& held,
                                         const std::function<SaveOptions(int)>& options) {
    std::vector<Result<SaveStats>> out(kRanks, InternalError("not run"));
    RunRanks(kRanks, [&](int r, Comm& comm) {
      SaveState state;
      for (const OwnedShard& s : held[r]) state.tensors.push_back(s.View());
      state.values = R"({"step": 3})";
      out[r] = Save(state, root_ + "/" + tag, comm, options(r));
    });
    return out;
  }
  std::vector<Result<SaveStats>> SaveAll(const std::string& tag, bool swap,
                                         const SaveOptions& options) {
    std::vector<std::vector<OwnedShard>> held;
    for (int r = 0; r < kRanks; ++r) held.push_back(HeldBy(r, swap));
    return SaveAll(tag, held, [&](int) { return options; });
  }

  nlohmann::json Index(const std::string& tag) {
    std::ifstream in(root_ + "/" + tag + "/shardsafe.json");
    return nlohmann::json::parse(in);
  }

  std::string Read(const std::string& tag, const std::string& name) {
    std::ifstream in(root_ + "/" + tag + "/" + name, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }

  // Three ranks load rows of w, columns of e, b, large and empty whole,
  // checked against the oracle.
  void ExpectLoadsBitExact(const std::string& tag) {
    RunRanks(3, [&](int r, Comm& comm) {
      std::vector<OwnedTarget> targets = {
          MakeTarget("w", DType::kF32, kW, Box2(20 * r, 24, 0, 48)),
          MakeTarget("e", DType::kBF16, kE, Box2(0, 40, 5 * r, 6)),
          MakeTarget("b", DType::kI64, kB, Whole(kB)),
          MakeTarget("large", DType::kF32, kLarge, Box2(300 * r, 100, 0, 512)),
          MakeTarget("empty", DType::kF32, kEmpty, Whole(kEmpty))};
      LoadRequest request;
      for (OwnedTarget& t : targets) {
        t.target.data = t.buffer.data();  // the buffer was copied into the vector
        request.tensors.push_back(t.target);
      }
      auto loaded = Load(request, root_ + "/" + tag, comm, {});
      ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
      for (const OwnedTarget& t : targets) EXPECT_TRUE(MatchesOracle(t)) << tag << " " << t.target.key;
    });
    const VerifyReport report = VerifyCheckpoint(root_ + "/" + tag);
    EXPECT_TRUE(report.faults.empty()) << report.faults.front();
  }

  std::string root_;
};

TEST_F(DistributedSaveTest, ASavePlannedTogetherWritesWhatRankZeroWouldAndEachHomeItsPart) {
  for (const auto& s : SaveAll("together", false, Together())) {
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    EXPECT_FALSE(s->plan_reused);
  }
  // The same layout again: the plan is reused.
  for (const auto& s : SaveAll("again", false, Together())) {
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    EXPECT_TRUE(s->plan_reused);
  }
  for (const auto& s : SaveAll("central", false, OnRankZero())) ASSERT_TRUE(s.ok());
  nlohmann::json together = Index("together"), central = Index("central");
  EXPECT_EQ(together["version"], 4);
  // The same index (but its tag and time) and the same parts, byte for
  // byte, each named after the home of its tensors.
  for (nlohmann::json* j : {&together, &central}) {
    j->erase("tag");
    j->erase("created_unix");
  }
  EXPECT_EQ(together, central);
  ASSERT_FALSE(together["chunk_tables"].empty());
  for (const auto& [key, t] : together["tensors"].items()) {
    const nlohmann::json& part = together["files"][together["chunk_tables"][t["table"][0].get<size_t>()].get<size_t>()];
    EXPECT_EQ(part["rank"], HomeOf(key, kRanks)) << key;
  }
  for (size_t file : together["chunk_tables"]) {
    const std::string name = together["files"][file]["name"];
    EXPECT_EQ(Read("together", name), Read("central", name)) << name;
    EXPECT_EQ(Read("together", name).size(), together["files"][file]["bytes"].get<size_t>());
  }
  EXPECT_GT(together["tensors"]["large"]["table"][1], 1);  // cut into pieces
  ExpectLoadsBitExact("together");

  // The save that reused the plan wrote the same index and parts.
  nlohmann::json again = Index("again");
  again.erase("tag");
  again.erase("created_unix");
  EXPECT_EQ(again, together);
  for (size_t file : together["chunk_tables"]) {
    const std::string name = together["files"][file]["name"];
    EXPECT_EQ(Read("again", name), Read("together", name)) << name;
  }
  ExpectLoadsBitExact("again");

  // Another layout between two saves: planned anew, loaded bit-exact.
  for (const auto& s : SaveAll("swapped", true, Together())) {
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    EXPECT_FALSE(s->plan_reused);
  }
  ExpectLoadsBitExact("swapped");
}

TEST_F(DistributedSaveTest, ReplicasThatDifferFailEveryRankNamingTheTensorAndCommitNothing) {
  std::vector<std::vector<OwnedShard>> held;
  for (int r = 0; r < kRanks; ++r) held.push_back(HeldBy(r));
  ASSERT_EQ(held[3][2].key, "b");
  held[3][2].bytes[5] ^= std::byte{1};
  for (const auto& s : SaveAll("b-differs", held, [](int) { return Together(); })) {
    EXPECT_EQ(s.status().code(), StatusCode::kInvalidArgument) << s.status().ToString();
    EXPECT_THAT(s.status().message(), HasSubstr("tensor \"b\": ranks"));
    EXPECT_THAT(s.status().message(), HasSubstr("and 3 hold different bytes for the same slice"));
  }
  EXPECT_FALSE(std::filesystem::exists(root_ + "/b-differs"));
  held[3][2].bytes[5] ^= std::byte{1};
  held[1][3].bytes[100] ^= std::byte{1};  // a copy of "large", which is cut into pieces
  for (const auto& s : SaveAll("large-differs", held, [](int) { return Together(); })) {
    EXPECT_EQ(s.status().code(), StatusCode::kInvalidArgument) << s.status().ToString();
    EXPECT_THAT(s.status().message(), HasSubstr("tensor \"large\": ranks "));
    EXPECT_THAT(s.status().message(),
                HasSubstr("hold different bytes for the same slice [0:1024, 0:512]"));
  }
  EXPECT_FALSE(std::filesystem::exists(root_ + "/large-differs"));
}

TEST_F(DistributedSaveTest, RanksThatDisagreeOnPlanningTogetherOrOnAValueFailEveryRank) {
  std::vector<std::vector<OwnedShard>> held;
  for (int r = 0; r < kRanks; ++r) held.push_back(HeldBy(r));
  const auto statuses = SaveAll("split", held, [](int r) {
    return r == 2 ? OnRankZero() : Together();
  });
  for (const auto& s : statuses) {
    EXPECT_EQ(s.status().code(), StatusCode::kInvalidArgument) << s.status().ToString();
    EXPECT_THAT(s.status().message(), HasSubstr("ranks disagree on whether the save is planned"));
  }
  std::vector<Result<SaveStats>> out(kRanks, InternalError("not run"));
  RunRanks(kRanks, [&](int r, Comm& comm) {
    SaveState state;
    for (const OwnedShard& s : held[r]) state.tensors.push_back(s.View());
    state.values = r == 1 ? R"({"step": 4})" : R"({"step": 3})";
    out[r] = Save(state, root_ + "/values", comm, Together());
  });
  for (const auto& s : out) {
    EXPECT_EQ(s.status().code(), StatusCode::kInvalidArgument) << s.status().ToString();
    EXPECT_THAT(s.status().message(), HasSubstr("value \"step\" differs between ranks 0 and 1"));
  }
  EXPECT_FALSE(std::filesystem::exists(root_ + "/split"));
  EXPECT_FALSE(std::filesystem::exists(root_ + "/values"));
}

}  // namespace
}  // namespace shardsafe
