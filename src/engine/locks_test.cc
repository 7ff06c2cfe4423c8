// Processes sharing one root: names under the root are created and removed
// with the root locked, concurrent saves all commit with distinct commit
// sequences, and retention never removes a checkpoint a load holds.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <filesystem>
#include <set>
#include <thread>

#include <nlohmann/json.hpp>

#include "engine/catalog/checkpoint_dir.h"
#include "shardsafe/source.h"
#include "testing/test_util.h"

namespace shardsafe {
namespace {

using Json = nlohmann::json;

// Records, at every name created or renamed directly under the root,
// whether the root was locked then (a TryLock of it from here fails).
class RootLockProbe : public testing::ForwardingFileSystem {
 public:
  explicit RootLockProbe(std::string root)
      : ForwardingFileSystem(DefaultFileSystem()), root_(std::move(root)) {}

  Status CreateDir(const std::string& p) override {
    Probe(p);
    return base_->CreateDir(p);
  }
  Result<std::unique_ptr<WritableFile>> NewWritableFile(const std::string& p,
                                                        const WriteOptions& o) override {
    Probe(p);
    return base_->NewWritableFile(p, o);
  }
  Status Rename(const std::string& a, const std::string& b) override {
    Probe(b);
    return base_->Rename(a, b);
  }

  std::vector<std::string> unlocked;  // names made while the root was not locked
  int probed = 0;

 private:
  void Probe(const std::string& path) {
    if (ParentDir(path) != root_) return;
    ++probed;
    auto lock = base_->TryLock(root_, LockMode::kExclusive);
    if (lock.status().code() != StatusCode::kFailedPrecondition) unlocked.push_back(BaseName(path));
  }
  const std::string root_;
};

class LocksTest : public ::testing::Test {
 protected:
  void SetUp() override { root_ = testing::MakeTempDir("locks"); }
  void TearDown() override { std::filesystem::remove_all(root_); }
  std::string root_;
};

TEST_F(LocksTest, NamesUnderTheRootAreMadeWithTheRootLocked) {
  RootLockProbe fs(root_);
  CheckpointManager m(root_, {.keep_last = 1, .fs = &fs});
  for (int64_t step : {1, 2, 3}) ASSERT_TRUE(SaveManagerStep(m, step).ok());
  ASSERT_TRUE(m.Prune(1).ok());
  // Per save: the temporary directory, its rename, latest's temporary file
  // and rename, and retention's hiding rename.
  EXPECT_GE(fs.probed, 3 * 4);
  EXPECT_TRUE(fs.unlocked.empty()) << ::testing::PrintToString(fs.unlocked);
  EXPECT_EQ(ListCheckpoints(root_)->size(), 1u);
}

TEST_F(LocksTest, ConcurrentSavesIntoOneRootAllCommitWithDistinctSequences) {
  constexpr int kSavesPerWriter = 25;
  std::atomic<int> failed{0};
  std::vector<std::string> errors(2);
  auto writer = [&](int w) {
    CheckpointManager m(root_, {});
    for (int i = 0; i < kSavesPerWriter; ++i) {
      Status s = SaveManagerStep(m, 2 * i + w);
      if (!s.ok()) {
        ++failed;
        errors[w] = s.ToString();
      }
    }
  };
  std::thread a(writer, 0), b(writer, 1);
  a.join();
  b.join();
  EXPECT_EQ(failed.load(), 0) << errors[0] << " / " << errors[1];
  auto list = ListCheckpoints(root_);
  ASSERT_TRUE(list.ok());
  EXPECT_EQ(list->size(), 2u * kSavesPerWriter);
  std::set<uint64_t> sequences;
  for (const CheckpointInfo& c : *list) sequences.insert(c.sequence);
  EXPECT_EQ(sequences.size(), list->size()) << "two commits got one sequence";
  for (const auto& e : std::filesystem::directory_iterator(root_)) {
    EXPECT_NE(e.path().filename().string()[0], '.') << "leftover " << e.path();
  }
}

TEST_F(LocksTest, RetentionLeavesACheckpointALoadHoldsUntilItIsReleased) {
  CheckpointManager m(root_, {});
  ASSERT_TRUE(SaveManagerStep(m, 1).ok());
  ASSERT_TRUE(SaveManagerStep(m, 2).ok());
  auto src = OpenSource(*DefaultFileSystem(), root_ + "/step-00000001");
  ASSERT_TRUE(src.ok()) << src.status().ToString();
  ASSERT_NE(src->pin, nullptr);
  auto removed = m.Prune(1);
  ASSERT_TRUE(removed.ok()) << removed.status().ToString();
  EXPECT_TRUE(removed->empty());
  // The held checkpoint still loads in full.
  float out[4] = {};
  LoadRequest request;
  request.tensors.push_back({"w", DType::kF32, {4}, {Box::Whole({4}), std::nullopt}, out});
  auto comm = MakeSingleProcessComm();
  auto loaded = LoadOpenedSource(request, *src, *comm, {});
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  EXPECT_EQ(out[3], 1.0f);
  src = Result<CheckpointSource>(NotFoundError("released"));
  removed = m.Prune(1);
  ASSERT_TRUE(removed.ok());
  EXPECT_EQ(*removed, std::vector<std::string>{"step-00000001"});
}

TEST_F(LocksTest, OpeningACheckpointAPruneIsRemovingSaysItWasRemoved) {
  CheckpointManager m(root_, {});
  ASSERT_TRUE(SaveManagerStep(m, 1).ok());
  const std::string dir = root_ + "/step-00000001";
  // As a prune holds it between claiming and deleting it.
  auto held = DefaultFileSystem()->TryLock(dir + "/shardsafe.json", LockMode::kExclusive);
  ASSERT_TRUE(held.ok());
  auto src = OpenSource(*DefaultFileSystem(), dir);
  EXPECT_EQ(src.status().code(), StatusCode::kNotFound);
  EXPECT_THAT(src.status().message(), ::testing::HasSubstr("was removed (by retention or prune) "
                                                          "while it was being opened"));
}

TEST_F(LocksTest, LoadsOfLatestRacingRetentionAllSucceed) {
  constexpr int kSaves = 40;
  CheckpointManager writer(root_, {.keep_last = 1});
  ASSERT_TRUE(SaveManagerStep(writer, 0).ok());
  std::atomic<bool> done{false};
  int loads = 0, failures = 0;
  std::string error;
  std::thread reader([&] {
    CheckpointManager m(root_, {});
    while (!done.load() || loads == 0) {
      float out[4] = {};
      LoadRequest request;
      request.tensors.push_back({"w", DType::kF32, {4}, {Box::Whole({4}), std::nullopt}, out});
      auto comm = MakeSingleProcessComm();
      auto res = m.Load(request, std::nullopt, *comm, {});
      ++loads;
      if (!res.ok()) {
        ++failures;
        error = res.status().ToString();
      } else if (Json::parse(res->values)["step"].get<float>() != out[3]) {
        ++failures;
        error = "values of one step, tensor of another";
      }
    }
  });
  for (int64_t step = 1; step <= kSaves; ++step) EXPECT_TRUE(SaveManagerStep(writer, step).ok());
  done = true;
  reader.join();
  EXPECT_EQ(failures, 0) << "of " << loads << " loads; last error: " << error;
  EXPECT_GE(loads, 1);
  // What retention skipped while a load held it goes at the next prune.
  ASSERT_TRUE(writer.Prune(1).ok());
  EXPECT_EQ(ListCheckpoints(root_)->size(), 1u);
}

}  // namespace
}  // namespace shardsafe
