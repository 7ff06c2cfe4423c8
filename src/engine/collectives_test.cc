// How many collectives a save and a load make (each is a job-wide wait, so
// one that another already covers is a cost), and how a rank's failure
// before the call reaches every rank through the first of them.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <filesystem>

#include "engine/test_util.h"
#include "shardsafe/checkpoint.h"

namespace shardsafe {
namespace {

using ::testing::HasSubstr;
using testing::MakeShard;
using testing::MakeTarget;
using testing::OwnedShard;
using testing::OwnedTarget;

// Counts the collectives that pass through it.
class CountingComm : public Comm {
 public:
  explicit CountingComm(Comm& inner) : inner_(inner) {}
  int rank() const override { return inner_.rank(); }
  int size() const override { return inner_.size(); }
  Result<std::vector<std::string>> AllGather(std::string_view mine) override {
    ++count;
    return inner_.AllGather(mine);
  }
  Result<std::string> Broadcast(std::string_view data, int root) override {
    ++count;
    return inner_.Broadcast(data, root);
  }
  Status Barrier() override {
    ++count;
    return inner_.Barrier();
  }
  int count = 0;

 private:
  Comm& inner_;
};

class CollectivesTest : public ::testing::Test {
 protected:
  static constexpr int kRanks = 2;
  void SetUp() override { root_ = testing::MakeTempDir("collectives"); }
  void TearDown() override { std::filesystem::remove_all(root_); }

  // Runs `call` on every rank; returns each rank's collective count.
  std::vector<int> Count(const std::function<Status(int, Comm&)>& call) {
    std::vector<int> counts(kRanks);
    testing::RunRanks(kRanks, [&](int r, Comm& comm) {
      CountingComm counting(comm);
      Status s = call(r, counting);
      EXPECT_TRUE(s.ok()) << s.ToString();
      counts[r] = counting.count;
    });
    return counts;
  }

  // Rank r's half of the rows of an 8 x 4 tensor.
  static OwnedShard Half(int r, const std::string& key = "w") {
    return MakeShard(key, DType::kF32, kShape, {Box{{4ull * r, 0}, {4, 4}}, std::nullopt});
  }

  // A state of one shard.
  static SaveState StateOf(const OwnedShard& shard) {
    SaveState state;
    state.tensors.push_back(shard.View());
    return state;
  }

  static inline const Shape kShape = {8, 4};
  std::string root_;
};

// Save: the gather that checks whether the layout is unchanged
// (engine/save/plan_cache.h), the gather that plans (not when it is), the
// broadcast of rank 0's temporary directory (created only once every rank
// agreed), the gather of what each rank wrote, the broadcast of the
// outcome. The key is this test's own, so the first save plans.
TEST_F(CollectivesTest, SaveMakesFiveThenFourWithAnUnchangedLayout) {
  for (int expected : {5, 4, 4}) {
    auto counts = Count([&](int r, Comm& comm) {
      OwnedShard shard = Half(r, "save-makes-five");
      return Save(StateOf(shard), root_ + "/a" + std::to_string(expected), comm, {.overwrite = true})
          .status();
    });
    EXPECT_THAT(counts, ::testing::Each(expected));
  }
}

// A manager's save prunes on rank 0 inside the commit: still five, then
// four.
TEST_F(CollectivesTest, ManagerSaveWithRetentionMakesFiveThenFour) {
  for (int64_t step : {1, 2, 3}) {
    auto counts = Count([&](int r, Comm& comm) {
      OwnedShard shard = Half(r, "manager-makes-five");
      CheckpointManager manager(root_ + "/m", {.keep_last = 1});
      return manager.Save(step, StateOf(shard), comm, {}).status();
    });
    EXPECT_THAT(counts, ::testing::Each(step == 1 ? 5 : 4)) << "step " << step;
  }
  CheckpointManager manager(root_ + "/m", {});
  auto list = manager.List();
  ASSERT_TRUE(list.ok());
  ASSERT_EQ(list->size(), 1u);
  EXPECT_EQ((*list)[0].step, 3);
}

// Load: the broadcast of the index rank 0 read and the agreement on the
// outcome; shared reads add the gather of what each rank reads.
TEST_F(CollectivesTest, LoadMakesTwoOrThreeWithSharedReads) {
  Count([&](int r, Comm& comm) {
    OwnedShard shard = Half(r);
    return Save(StateOf(shard), root_ + "/l", comm, {}).status();
  });
  for (bool share : {false, true}) {
    auto counts = Count([&](int r, Comm& comm) {
      // Each rank loads the other's rows: nothing for the other to share.
      OwnedTarget t = MakeTarget("w", DType::kF32, kShape,
                                 {Box{{4ull * (1 - r), 0}, {4, 4}}, std::nullopt});
      LoadOptions options;
      options.share_reads = share;
      return Load(LoadRequest{{t.target}}, root_ + "/l", comm, options).status();
    });
    EXPECT_THAT(counts, ::testing::Each(share ? 3 : 2)) << "share_reads " << share;
  }
}

// A rank that failed before the call (SaveOptions::local_failure) fails it
// on every rank, named, and nothing is left behind.
TEST_F(CollectivesTest, LocalFailureReachesEveryRankThroughTheFirstCollective) {
  std::vector<Status> out(3);
  testing::RunRanks(3, [&](int r, Comm& comm) {
    CountingComm counting(comm);
    OwnedShard shard = MakeShard("w", DType::kF32, {3}, {Box{{1ull * r}, {1}}, std::nullopt});
    SaveOptions options;
    if (r == 1) options.local_failure = InvalidArgumentError("state walk: bad value 'x'");
    out[r] = Save(StateOf(shard), root_ + "/f", counting, options).status();
    EXPECT_EQ(counting.count, 1) << "rank " << r;
  });
  for (const Status& s : out) {
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
    EXPECT_THAT(s.message(), HasSubstr("rank 1: state walk: bad value 'x'"));
  }
  EXPECT_TRUE(std::filesystem::is_empty(root_));
}

}  // namespace
}  // namespace shardsafe
