// Saves planned by all ranks together (engine/save/distributed_save.h),
// over thread ranks: the index and every part of the chunk table equal
// those of the same save planned on rank 0, each home writes its part, a
// repeated save reuses the plan, a changed layout is planned anew, loads
// (resharded) are bit-exact, and replicas that differ, values that differ
// and ranks that disagree on planning together fail every rank with one
// named error and commit nothing; an asynchronous save planned together
// commits what a synchronous one does and fails on a replica that
// differs.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>

#include <nlohmann/json.hpp>

#include "engine/plan/distributed_plan.h"
#include "engine/save/distributed_save.h"
#include "engine/save/plan_cache.h"
#include "shardsafe/async_save.h"
#include "shardsafe/tools.h"
#include "testing/status_matchers.h"
#include "testing/test_util.h"

namespace shardsafe {
namespace {

using ::testing::HasSubstr;

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
  void SetUp() override {
    root_ = testing::MakeTempDir("together");
    ForgetPlans();
  }

  // No plan cached (by an earlier test or save): the next save plans.
  static void ForgetPlans() {
    RunRanks(kRanks, [](int, Comm& comm) { StorePlan(comm, CachedPlan{}); });
  }
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
  // The same through an AsyncSaver per rank, `saves` tags one after the
  // other (each Save waits for the one before); each rank's stats or error
  // of each.
  std::vector<std::vector<Result<SaveStats>>> SaveAllAsync(
      const std::vector<std::string>& tags, const std::vector<std::vector<OwnedShard>>& held) {
    std::vector<std::vector<Result<SaveStats>>> out(
        kRanks, std::vector<Result<SaveStats>>(tags.size(), InternalError("not run")));
    RunRanks(kRanks, [&](int r, Comm& comm) {
      SaveState state;
      for (const OwnedShard& s : held[r]) state.tensors.push_back(s.View());
      state.values = R"({"step": 3})";
      AsyncSaver saver;
      for (size_t i = 0; i < tags.size(); ++i) {
        auto handle = saver.Save(state, root_, tags[i], comm, Together());
        out[r][i] = handle.ok() ? (*handle)->Wait() : Result<SaveStats>(handle.status());
      }
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

  // Index(tag) without what differs between two saves of one state.
  nlohmann::json Unstamped(const std::string& tag) {
    nlohmann::json j = Index(tag);
    j.erase("tag");
    j.erase("created_unix");
    return j;
  }

  // Every part of the chunk table of `tag` equals that of `like`.
  void ExpectSameParts(const std::string& tag, const std::string& like) {
    const nlohmann::json index = Index(like);
    for (size_t file : index["chunk_tables"]) {
      const std::string name = index["files"][file]["name"];
      EXPECT_EQ(Read(tag, name), Read(like, name)) << tag << " " << name;
    }
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
  const nlohmann::json together = Unstamped("together");
  EXPECT_EQ(together["version"], 4);
  // The same index (but its tag and time) and the same parts, byte for
  // byte, each named after the home of its tensors.
  EXPECT_EQ(together, Unstamped("central"));
  ASSERT_FALSE(together["chunk_tables"].empty());
  for (const auto& [key, t] : together["tensors"].items()) {
    const nlohmann::json& part = together["files"][together["chunk_tables"][t["table"][0].get<size_t>()].get<size_t>()];
    EXPECT_EQ(part["rank"], HomeOf(key, kRanks)) << key;
  }
  ExpectSameParts("together", "central");
  for (size_t file : together["chunk_tables"]) {
    const std::string name = together["files"][file]["name"];
    EXPECT_EQ(Read("together", name).size(), together["files"][file]["bytes"].get<size_t>());
  }
  EXPECT_GT(together["tensors"]["large"]["table"][1], 1);  // cut into pieces
  ExpectLoadsBitExact("together");

  // The save that reused the plan wrote the same index and parts.
  EXPECT_EQ(Unstamped("again"), together);
  ExpectSameParts("again", "together");
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

// An asynchronous save planned together: the same index and parts as a
// synchronous one, a second save reusing the plan, loads bit-exact.
TEST_F(DistributedSaveTest, AnAsyncSavePlannedTogetherCommitsWhatASyncOneDoes) {
  std::vector<std::vector<OwnedShard>> held;
  for (int r = 0; r < kRanks; ++r) held.push_back(HeldBy(r));
  const auto async = SaveAllAsync({"async-1", "async-2"}, held);
  for (int r = 0; r < kRanks; ++r) {
    ASSERT_TRUE(async[r][0].ok()) << async[r][0].status().ToString();
    ASSERT_TRUE(async[r][1].ok()) << async[r][1].status().ToString();
    EXPECT_FALSE(async[r][0]->plan_reused);
    EXPECT_TRUE(async[r][1]->plan_reused);
  }
  ForgetPlans();  // planned anew: two plannings give one index
  for (const auto& s : SaveAll("sync", false, Together())) {
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    EXPECT_FALSE(s->plan_reused);
  }
  const nlohmann::json sync = Unstamped("sync");
  EXPECT_EQ(sync["version"], 4);
  for (const std::string tag : {"async-1", "async-2"}) {
    EXPECT_EQ(Unstamped(tag), sync) << tag;
    ExpectSameParts(tag, "sync");
    ExpectLoadsBitExact(tag);
    EXPECT_FALSE(std::filesystem::exists(root_ + "/" + tag + "/done-00000")) << tag;
  }
}

// A marker cut short, or with bytes after its end, is an error naming its
// rank.
TEST(TogetherMarkersTest, AMarkerCutShortOrTooLongNamesItsRank) {
  const std::string report = EncodeReport(RankReport{}, {.compact = true, .chunk_checksums = false});
  const std::string marker = EncodeTogetherMarker(report, "");
  auto read = ReadTogetherMarkers({marker, marker});
  ASSERT_TRUE(read.ok()) << read.status().ToString();
  EXPECT_EQ(read->size(), 2u);
  for (const std::string& bad : {marker.substr(0, marker.size() - 1), marker + "x"}) {
    read = ReadTogetherMarkers({marker, bad});
    EXPECT_EQ(read.status().code(), StatusCode::kInternal);
    EXPECT_THAT(read.status().message(), HasSubstr("rank 1's completion marker is cut short"));
  }
  // The replica rounds are read only when the digests do not add up.
  const std::string unreadable_round = EncodeTogetherMarker(report, "\xff");
  EXPECT_TRUE(ReadTogetherMarkers({marker, unreadable_round}).ok());
  RankReport off;
  off.replica_digest = 1;
  const std::string digest_off =
      EncodeTogetherMarker(EncodeReport(off, {.compact = true, .chunk_checksums = false}), "\xff");
  EXPECT_TRUE(IsError(ReadTogetherMarkers({marker, digest_off}), StatusCode::kInternal,
                      "truncated message between ranks"));
}

// Its markers carry each rank's copies: a replica that differs fails every
// rank's save, naming the tensor, and nothing is committed.
TEST_F(DistributedSaveTest, AnAsyncSavePlannedTogetherChecksTheReplicas) {
  std::vector<std::vector<OwnedShard>> held;
  for (int r = 0; r < kRanks; ++r) held.push_back(HeldBy(r));
  held[1][3].bytes[100] ^= std::byte{1};  // a copy of "large", cut into pieces
  const auto async = SaveAllAsync({"large-differs"}, held);
  for (int r = 0; r < kRanks; ++r) {
    const Status s = async[r][0].status();
    EXPECT_FALSE(s.ok()) << "rank " << r;
    // Rank 0 names the tensor; the others learn it from the aborted marker.
    EXPECT_THAT(s.message(), HasSubstr("tensor \"large\": ranks ")) << "rank " << r;
  }
  EXPECT_FALSE(std::filesystem::exists(root_ + "/large-differs"));
}

}  // namespace
}  // namespace shardsafe
