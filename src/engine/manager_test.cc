#include <gtest/gtest.h>
#include <gmock/gmock.h>

#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "testing/test_util.h"

namespace shardsafe {
namespace {

using Json = nlohmann::json;

class ManagerTest : public ::testing::Test {
 protected:
  void SetUp() override { root_ = testing::MakeTempDir("manager"); }
  void TearDown() override { std::filesystem::remove_all(root_); }

  Status SaveStep(CheckpointManager& m, int64_t step, SaveOptions options = {}) {
    return testing::SaveManagerStep(m, step, options);
  }

  std::vector<std::string> Tags() { return testing::ListedTags(root_); }

  int64_t LoadedStep(CheckpointManager& m, std::optional<int64_t> step) {
    auto comm = MakeSingleProcessComm();
    auto res = m.Load({}, step, *comm, {});
    EXPECT_TRUE(res.ok()) << res.status().ToString();
    return res.ok() ? Json::parse(res->values)["step"].get<int64_t>() : -1;
  }

  std::string root_;
};

TEST_F(ManagerTest, EmptyRootHasNoLatest) {
  CheckpointManager m(root_ + "/none", {});
  auto latest = m.LatestStep();
  ASSERT_TRUE(latest.ok());
  EXPECT_FALSE(latest->has_value());
}

TEST_F(ManagerTest, LatestFollowsSavesAndRetentionKeepsNewest) {
  CheckpointManager m(root_, {.keep_last = 2});
  for (int64_t step : {10, 20, 30, 40}) ASSERT_TRUE(SaveStep(m, step).ok());
  EXPECT_EQ(**m.LatestStep(), 40);
  auto list = m.List();
  ASSERT_TRUE(list.ok());
  ASSERT_EQ(list->size(), 2u);
  EXPECT_EQ((*list)[0].tag, "step-00000030");
  EXPECT_TRUE((*list)[1].is_latest);
  EXPECT_EQ(LoadedStep(m, std::nullopt), 40);
  EXPECT_EQ(LoadedStep(m, 30), 30);
}

// A checkpoint a load holds stays beside the newest keep_last, never in
// place of one of them.
TEST_F(ManagerTest, RetentionKeepsTheNewestWhenAnOlderOneIsInUse) {
  CheckpointManager m(root_, {.keep_last = 2});
  for (int64_t step : {1, 2}) ASSERT_TRUE(SaveStep(m, step).ok());
  auto pin = DefaultFileSystem()->TryLock(root_ + "/step-00000001/shardsafe.json",
                                          LockMode::kShared);  // as a load holds it
  ASSERT_TRUE(pin.ok()) << pin.status().ToString();
  ASSERT_TRUE(SaveStep(m, 3).ok());
  EXPECT_THAT(Tags(), ::testing::ElementsAre("step-00000001", "step-00000002", "step-00000003"));
  pin->reset();
  ASSERT_TRUE(SaveStep(m, 4).ok());  // the next retention removes what is no longer held
  EXPECT_THAT(Tags(), ::testing::ElementsAre("step-00000003", "step-00000004"));
}

TEST_F(ManagerTest, LeftoversAreIgnoredAndCleanedAtNextSave) {
  CheckpointManager m(root_, {});
  ASSERT_TRUE(SaveStep(m, 1).ok());
  // A killed save: a temporary directory with a partial data file, and a
  // half-written latest replacement.
  std::filesystem::create_directory(root_ + "/.tmp-step-00000002.deadbeef");
  std::ofstream(root_ + "/.tmp-step-00000002.deadbeef/data-00000-000.safetensors") << "partial";
  std::ofstream(root_ + "/.latest.tmp.1234") << "step-000";
  EXPECT_EQ(m.List()->size(), 1u);
  EXPECT_EQ(**m.LatestStep(), 1);
  ASSERT_TRUE(SaveStep(m, 2).ok());
  EXPECT_FALSE(std::filesystem::exists(root_ + "/.tmp-step-00000002.deadbeef"));
  EXPECT_FALSE(std::filesystem::exists(root_ + "/.latest.tmp.1234"));
}

TEST_F(ManagerTest, CleanupLeavesLockedSavesInProgressAlone) {
  CheckpointManager m(root_, {});
  const std::string live = root_ + "/.tmp-step-00000009.live", dead = root_ + "/.tmp-x.dead";
  std::filesystem::create_directories(live);
  std::filesystem::create_directories(dead);
  {
    // As the save writing there holds it.
    auto lock = DefaultFileSystem()->TryLock(live, LockMode::kExclusive);
    ASSERT_TRUE(lock.ok()) << lock.status().ToString();
    EXPECT_EQ(DefaultFileSystem()->TryLock(live, LockMode::kExclusive).status().code(),
              StatusCode::kFailedPrecondition);
    ASSERT_TRUE(SaveStep(m, 1).ok());
    EXPECT_TRUE(std::filesystem::exists(live));
    EXPECT_FALSE(std::filesystem::exists(dead));
  }
  ASSERT_TRUE(SaveStep(m, 2).ok());  // its process died: now a leftover
  EXPECT_FALSE(std::filesystem::exists(live));
}

TEST_F(ManagerTest, DanglingLatestFallsBackToNewestCommitted) {
  CheckpointManager m(root_, {});
  ASSERT_TRUE(SaveStep(m, 5).ok());
  ASSERT_TRUE(SaveStep(m, 6).ok());
  std::ofstream(root_ + "/latest") << "step-00000099\n";
  EXPECT_EQ(**m.LatestStep(), 6);
  EXPECT_EQ(LoadedStep(m, std::nullopt), 6);
}

TEST_F(ManagerTest, StaleLatestDoesNotHideANewerCommit) {
  CheckpointManager m(root_, {});
  ASSERT_TRUE(SaveStep(m, 1).ok());
  ASSERT_TRUE(SaveStep(m, 2).ok());
  // As if the save of step 2 had failed to replace `latest` after its commit.
  std::ofstream(root_ + "/latest") << "step-00000001\n";
  std::filesystem::last_write_time(root_ + "/latest", std::filesystem::file_time_type::clock::now() -
                                                         std::chrono::seconds(5));
  EXPECT_EQ(**m.LatestStep(), 2);
}

TEST_F(ManagerTest, CommitOrderNotNamesOrTimesDecidesTheNewest) {
  CheckpointManager m(root_, {.tag_format = "global_step{step}"});
  for (int64_t step : {98, 99, 100}) ASSERT_TRUE(SaveStep(m, step).ok());
  // All in one second, and "global_step100" sorts before "global_step99".
  const auto later = std::filesystem::file_time_type::clock::now() + std::chrono::hours(1);
  std::filesystem::last_write_time(root_ + "/global_step98/shardsafe.json", later);
  EXPECT_THAT(Tags(), ::testing::ElementsAre("global_step98", "global_step99", "global_step100"));
  EXPECT_EQ(**m.LatestStep(), 100);
  EXPECT_EQ(LoadedStep(m, std::nullopt), 100);
  EXPECT_EQ(LoadedStep(m, 99), 99);
  auto removed = m.Prune(1);
  ASSERT_TRUE(removed.ok());
  EXPECT_THAT(*removed, ::testing::ElementsAre("global_step98", "global_step99"));
}

TEST_F(ManagerTest, ASaveThatDoesNotMoveLatestIsNeverTakenAsTheLatest) {
  CheckpointManager m(root_, {.keep_last = 1});
  ASSERT_TRUE(SaveStep(m, 1).ok());
  SaveOptions keep_latest;
  keep_latest.update_latest = false;
  ASSERT_TRUE(SaveStep(m, 2, keep_latest).ok());
  EXPECT_EQ(**m.LatestStep(), 1);
  EXPECT_EQ(LoadedStep(m, std::nullopt), 1);
  // Retention keeps the newest commit and the one `latest` names.
  EXPECT_THAT(Tags(), ::testing::ElementsAre("step-00000001", "step-00000002"));
  // Even when its index is newer than `latest` on disk.
  const auto later = std::filesystem::file_time_type::clock::now() + std::chrono::hours(1);
  std::filesystem::last_write_time(root_ + "/step-00000002/shardsafe.json", later);
  EXPECT_EQ(**m.LatestStep(), 1);
}

TEST_F(ManagerTest, BadTagFormatsAreRefused) {
  for (const char* format : {"step", "a{step}{step}", "{step:8d}", "x/{step}", ".{step}"}) {
    CheckpointManager m(root_, {.tag_format = format});
    EXPECT_EQ(SaveStep(m, 1).code(), StatusCode::kInvalidArgument) << format;
  }
  CheckpointManager m(root_, {.tag_format = "epoch=0-step={step:05d}.ckpt"});
  EXPECT_EQ(*m.TagOf(42), "epoch=0-step=00042.ckpt");
}

TEST_F(ManagerTest, PruneNeverRemovesTheLatest) {
  CheckpointManager m(root_, {});
  for (int64_t step : {1, 2, 3}) ASSERT_TRUE(SaveStep(m, step).ok());
  // A rollback: `latest` rewritten by hand, after every commit, to the oldest.
  std::ofstream(root_ + "/latest") << "step-00000001\n";
  std::filesystem::last_write_time(root_ + "/latest", std::filesystem::file_time_type::clock::now() +
                                                         std::chrono::seconds(5));
  auto removed = m.Prune(1);
  ASSERT_TRUE(removed.ok());
  // Neither the one `latest` names nor the newest committed one goes.
  EXPECT_THAT(*removed, ::testing::ElementsAre("step-00000002"));
  EXPECT_EQ(LoadedStep(m, std::nullopt), 1);
  EXPECT_EQ(m.Prune(0).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace shardsafe
