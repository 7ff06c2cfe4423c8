#include "engine/tier/memory_tier.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "engine/tier/persister.h"
#include "shardsafe/async_save.h"
#include "testing/fault_injection.h"
#include "testing/test_util.h"

namespace shardsafe {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
namespace fs = std::filesystem;

class MemoryTierTest : public ::testing::Test {
 protected:
  void SetUp() override {
    base_ = testing::MakeTempDir("tier");
    root_ = base_ + "/root";
    memory_ = base_ + "/memory";
  }
  void TearDown() override { fs::remove_all(base_); }

  CheckpointManager::Options Tiered(int persist_every, int keep_last = 2) {
    CheckpointManager::Options o;
    o.memory = MemoryTierOptions{memory_, 0, keep_last};
    o.persist_every = persist_every;
    return o;
  }

  // The step a load of the manager's `step` (nullopt: latest) gave, as the
  // saved values say; -1 on failure (the status in *failure).
  int64_t LoadedStep(CheckpointManager& m, std::optional<int64_t> step, LoadResult* out = nullptr,
                     Status* failure = nullptr) {
    auto comm = MakeSingleProcessComm();
    float w[4] = {};
    LoadRequest request;
    request.tensors.push_back({"w", DType::kF32, {4}, {Box::Whole({4}), std::nullopt}, w});
    auto r = m.Load(request, step, *comm, {});
    if (!r.ok()) {
      if (failure) *failure = r.status();
      return -1;
    }
    EXPECT_EQ(w[3], static_cast<float>(nlohmann::json::parse(r->values)["step"].get<int64_t>()));
    if (out) *out = *r;
    return nlohmann::json::parse(r->values)["step"].get<int64_t>();
  }

  // Flips one byte in the middle of the first data file of `dir`.
  static void Corrupt(const std::string& dir) {
    const std::string file = dir + "/data-00000-000.safetensors";
    ASSERT_TRUE(fs::exists(file)) << file;
    std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(-3, std::ios::end);
    char c = 0;
    f.read(&c, 1);
    c = static_cast<char>(c ^ 0x5a);
    f.seekp(-3, std::ios::end);
    f.write(&c, 1);
  }

  std::string base_, root_, memory_;
};

std::vector<std::string> TiersOf(const std::vector<CheckpointInfo>& list, const std::string& tag) {
  for (const CheckpointInfo& c : list) {
    if (c.tag == tag) return c.tiers;
  }
  return {"not listed"};
}

TEST_F(MemoryTierTest, SavesGoToMemoryAndEveryNthIsPersisted) {
  CheckpointManager m(root_, Tiered(/*persist_every=*/2));
  for (int64_t step : {10, 20, 30, 40}) ASSERT_TRUE(SaveManagerStep(m, step).ok());
  ASSERT_TRUE(m.WaitForAsyncSave().ok());
  // The tier keeps its 2 newest; the root has every second save.
  EXPECT_THAT(testing::ListedTags(memory_), ElementsAre("step-00000030", "step-00000040"));
  EXPECT_THAT(testing::ListedTags(root_), ElementsAre("step-00000020", "step-00000040"));
  auto list = m.List();
  ASSERT_TRUE(list.ok()) << list.status().ToString();
  ASSERT_EQ(list->size(), 3u);
  EXPECT_THAT(TiersOf(*list, "step-00000020"), ElementsAre("root"));
  EXPECT_THAT(TiersOf(*list, "step-00000030"), ElementsAre("memory"));
  EXPECT_THAT(TiersOf(*list, "step-00000040"), ElementsAre("memory", "root"));
  EXPECT_EQ(**m.LatestStep(), 40);
  // The root's copies are its own commits, of the saved steps.
  auto root_list = ListCheckpoints(root_);
  ASSERT_TRUE(root_list.ok());
  EXPECT_EQ((*root_list)[0].sequence, 1u);
  EXPECT_EQ((*root_list)[1].sequence, 2u);
  EXPECT_EQ((*root_list)[1].step, 40);
  EXPECT_TRUE((*root_list)[1].is_latest);

  LoadResult r;
  EXPECT_EQ(LoadedStep(m, std::nullopt, &r), 40);
  EXPECT_EQ(r.step, 40);
  EXPECT_GT(r.bytes_by_tier["memory"], 0u);
  EXPECT_EQ(r.bytes_by_tier.count("root"), 0u);
  EXPECT_TRUE(r.warnings.empty());
  EXPECT_EQ(LoadedStep(m, 20), 20);  // only the root has it
}

TEST_F(MemoryTierTest, ACorruptMemoryCopyIsReplacedByTheRootsCopyOfTheSameStep) {
  CheckpointManager m(root_, Tiered(1));
  ASSERT_TRUE(SaveManagerStep(m, 5).ok());
  ASSERT_TRUE(m.WaitForAsyncSave().ok());
  Corrupt(memory_ + "/step-00000005");
  LoadResult r;
  EXPECT_EQ(LoadedStep(m, std::nullopt, &r), 5);
  EXPECT_GT(r.bytes_by_tier["root"], 0u);
  ASSERT_EQ(r.warnings.size(), 1u);
  EXPECT_THAT(r.warnings[0], HasSubstr("memory copy of step 5"));
  EXPECT_THAT(r.warnings[0], HasSubstr("data-00000-000.safetensors"));
  EXPECT_THAT(r.warnings[0], HasSubstr("checksum"));
}

TEST_F(MemoryTierTest, AMemoryCopyMissingADataFileIsReplacedByTheRootsCopy) {
  CheckpointManager m(root_, Tiered(1));
  ASSERT_TRUE(SaveManagerStep(m, 5).ok());
  ASSERT_TRUE(m.WaitForAsyncSave().ok());
  fs::remove(memory_ + "/step-00000005/data-00000-000.safetensors");
  LoadResult r;
  Status failure;
  EXPECT_EQ(LoadedStep(m, std::nullopt, &r, &failure), 5) << failure.ToString();
  EXPECT_GT(r.bytes_by_tier["root"], 0u);
  ASSERT_EQ(r.warnings.size(), 1u);
  EXPECT_THAT(r.warnings[0], HasSubstr("data-00000-000.safetensors"));
}

TEST_F(MemoryTierTest, WhenNoTierHoldsTheLatestWholeTheNewestOlderStepLoadsAndSaysSo) {
  CheckpointManager m(root_, Tiered(2));
  for (int64_t step : {1, 2, 3}) ASSERT_TRUE(SaveManagerStep(m, step).ok());
  ASSERT_TRUE(m.WaitForAsyncSave().ok());
  Corrupt(memory_ + "/step-00000003");  // step 3 is in memory only
  Corrupt(memory_ + "/step-00000002");  // step 2's memory copy too; the root's is whole
  LoadResult r;
  EXPECT_EQ(LoadedStep(m, std::nullopt, &r), 2);
  EXPECT_EQ(r.step, 2);
  ASSERT_EQ(r.warnings.size(), 3u);
  EXPECT_THAT(r.warnings[0], HasSubstr("memory copy of step 3"));
  EXPECT_THAT(r.warnings[1], HasSubstr("memory copy of step 2"));
  EXPECT_THAT(r.warnings[2], HasSubstr("step 3 could not be loaded from any tier; loaded step 2"));
  // An asked step is never replaced by another.
  Status failure;
  EXPECT_EQ(LoadedStep(m, 3, nullptr, &failure), -1);
  EXPECT_EQ(failure.code(), StatusCode::kDataLoss) << failure.ToString();
}

TEST_F(MemoryTierTest, ACorruptMemoryCopyIsNeverPersisted) {
  CheckpointManager m(root_, Tiered(/*persist_every=*/100));
  ASSERT_TRUE(SaveManagerStep(m, 4).ok());
  Corrupt(memory_ + "/step-00000004");
  std::vector<std::string> warnings;
  Status s = CopyCheckpoint(nullptr, memory_ + "/step-00000004", root_, "step-00000004",
                            CommitOptions{false, true, 4, 0}, &warnings);
  EXPECT_EQ(s.code(), StatusCode::kDataLoss) << s.ToString();
  EXPECT_THAT(s.message(), HasSubstr("data-00000-000.safetensors"));
  EXPECT_THAT(testing::ListedTags(root_), ::testing::IsEmpty());
  for (const auto& e : fs::directory_iterator(root_)) {
    EXPECT_EQ(e.path().filename().string().rfind(".tmp-", 0), std::string::npos) << e.path();
  }
}

TEST_F(MemoryTierTest, APersistThatDoesNotFitFailsBeforeItCopies) {
  CheckpointManager m(root_, Tiered(/*persist_every=*/100));
  ASSERT_TRUE(SaveManagerStep(m, 4).ok());
  FaultInjectingFileSystem faulty(DefaultFileSystem());
  faulty.SetFreeBytes(10);
  Status s = CopyCheckpoint(&faulty, memory_ + "/step-00000004", root_, "step-00000004",
                            CommitOptions{false, true, 4, 0}, nullptr);
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted) << s.ToString();
  EXPECT_THAT(s.message(), HasSubstr("10 bytes free; nothing was written"));
  EXPECT_EQ(faulty.count(OpKind::kCreate), 0);
  EXPECT_FALSE(fs::exists(root_));
}

TEST_F(MemoryTierTest, AsyncSavesArePersistedAfterTheirCommit) {
  CheckpointManager m(root_, Tiered(1));
  auto comm = MakeSingleProcessComm();
  const float data[4] = {1, 2, 3, 7};
  SaveState state;
  state.tensors.push_back({"w", DType::kF32, {4}, {Box::Whole({4}), std::nullopt}, data});
  state.values = "{\"step\":7}";
  auto handle = m.AsyncSave(7, state, *comm, {});
  ASSERT_TRUE(handle.ok()) << handle.status().ToString();
  ASSERT_TRUE(m.WaitForAsyncSave().ok());
  EXPECT_THAT(testing::ListedTags(memory_), ElementsAre("step-00000007"));
  EXPECT_THAT(testing::ListedTags(root_), ElementsAre("step-00000007"));
  fs::remove_all(memory_);  // the node restarted: the root's copy loads
  LoadResult r;
  EXPECT_EQ(LoadedStep(m, std::nullopt, &r), 7);
  EXPECT_GT(r.bytes_by_tier["root"], 0u);
}

TEST_F(MemoryTierTest, EveryRankSavesIntoTheSharedFolderAndRankZeroPersists) {
  RunRanks(2, [&](int rank, Comm& comm) {
    CheckpointManager m(root_, Tiered(1));
    const float data[2] = {static_cast<float>(rank), 9};
    SaveState state;
    state.tensors.push_back(
        {"w", DType::kF32, {4}, {Box({static_cast<uint64_t>(rank) * 2}, {2}), std::nullopt}, data});
    ASSERT_TRUE(m.Save(9, state, comm, {}).ok());
    ASSERT_TRUE(m.WaitForAsyncSave().ok());
  });
  EXPECT_THAT(testing::ListedTags(root_), ElementsAre("step-00000009"));
  EXPECT_TRUE(fs::exists(root_ + "/step-00000009/data-00001-000.safetensors"));
}

TEST_F(MemoryTierTest, RanksWithDifferentFoldersAreRefusedOnEveryRank) {
  RunRanks(2, [&](int rank, Comm& comm) {
    CheckpointManager::Options o = Tiered(1);
    o.memory->dir = memory_ + std::to_string(rank);  // two simulated nodes
    CheckpointManager m(root_, o);
    const float data[4] = {1, 2, 3, 4};
    SaveState state;
    state.tensors.push_back({"w", DType::kF32, {4}, {Box::Whole({4}), std::nullopt}, data});
    auto s = m.Save(1, state, comm, {});
    EXPECT_EQ(s.status().code(), StatusCode::kFailedPrecondition);
    EXPECT_THAT(s.status().message(), HasSubstr("ranks use different folders"));
  });
  EXPECT_FALSE(fs::exists(root_));
}

TEST_F(MemoryTierTest, BadOptionsAreRefused) {
  CheckpointManager::Options o = Tiered(0);
  EXPECT_EQ(CheckpointManager::CheckOptions(root_, o).code(), StatusCode::kInvalidArgument);
  o = Tiered(1, /*keep_last=*/0);
  EXPECT_EQ(CheckpointManager::CheckOptions(root_, o).code(), StatusCode::kInvalidArgument);
  o = Tiered(1);
  EXPECT_THAT(CheckpointManager::CheckOptions("s3://bucket/ckpt", o).message(),
              HasSubstr("object store root"));
  EXPECT_TRUE(CheckpointManager::CheckOptions(root_, o).ok());
  CheckpointManager m(root_, Tiered(0));
  EXPECT_EQ(SaveManagerStep(m, 1).code(), StatusCode::kInvalidArgument);
}

TEST(MemoryTierOrder, CopiesAreNewestStepFirstAndFastestTierFirst) {
  auto info = [](int64_t step, const std::string& where) {
    CheckpointInfo c;
    c.step = step;
    c.tag = "s" + std::to_string(step);
    c.path = where + "/" + c.tag;
    return c;
  };
  std::vector<TierListing> tiers = {
      {kMemoryTier, {info(3, "m"), info(4, "m")}, 4},
      {kRootTier, {info(2, "r"), info(4, "r"), info(5, "r")}, 4}};  // 5: latest not moved
  auto copies = OrderCopies(tiers, std::nullopt);
  ASSERT_TRUE(copies.ok());
  std::vector<std::string> paths;
  for (const TierCopy& c : *copies) paths.push_back(c.path);
  EXPECT_THAT(paths, ElementsAre("m/s4", "r/s4", "m/s3", "r/s2"));
  auto decoded = DecodeCopies(EncodeCopies(*copies));
  ASSERT_TRUE(decoded.ok());
  EXPECT_EQ((*decoded)[1].tier, "root");
  EXPECT_EQ((*decoded)[1].step, 4);
  auto two = OrderCopies(tiers, 2);
  ASSERT_TRUE(two.ok());
  ASSERT_EQ(two->size(), 1u);
  EXPECT_EQ((*two)[0].path, "r/s2");
  EXPECT_EQ(OrderCopies(tiers, 7).status().code(), StatusCode::kNotFound);
  auto merged = MergeListings(tiers);
  ASSERT_EQ(merged.size(), 4u);
  EXPECT_EQ(merged[2].tag, "s4");
  EXPECT_THAT(merged[2].tiers, ElementsAre("memory", "root"));
  EXPECT_EQ(merged[2].path, "m/s4");
}

TEST(MemoryTierDir, TheDefaultFolderIsNamedForTheRoot) {
  EXPECT_EQ(DefaultMemoryDir("/ckpt/a"), DefaultMemoryDir("/ckpt/a"));
  EXPECT_NE(DefaultMemoryDir("/ckpt/a"), DefaultMemoryDir("/ckpt/b"));
  EXPECT_THAT(DefaultMemoryDir("/ckpt/a"), ::testing::StartsWith("/dev/shm/shardsafe-"));
  EXPECT_EQ(DefaultMemoryDir("/ckpt/a").size(), std::string("/dev/shm/shardsafe-").size() + 16);
}

}  // namespace
}  // namespace shardsafe
