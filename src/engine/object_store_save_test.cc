// The commit protocol on an object store (save/object_store_commit.h),
// against moto behind the fault proxy (testing/s3_test_util.h): a save of step
// 2 over a root holding step 1 is cut short at every one of its storage
// operations in turn (FaultInjectingFileSystem::FailAfter: the process
// "dies" there), after which step 1 must load bit-exact, step 2 must be
// listed only if its index exists (and then load bit-exact), a save that
// reported success must be committed, and the next save must leave no
// object that is not part of a committed checkpoint or `latest`.
#include <gtest/gtest.h>

#include <cstdlib>
#include <set>

#include "s3/s3_file_system.h"
#include "shardsafe/source.h"
#include "testing/fault_injection.h"
#include "testing/s3_test_util.h"
#include "testing/test_util.h"

namespace shardsafe {
namespace {

constexpr int kSavers = 2;
constexpr int kLoaders = 3;
const Shape kW{6, 10};  // F32: saver r holds rows [3r, 3r + 3)
const Shape kB{8};      // BF16, replicated

std::string StepKey(const std::string& key, int64_t step) {
  return key + "@" + std::to_string(step);
}

bool AllOk(const std::vector<Status>& statuses) {
  for (const Status& s : statuses) {
    if (!s.ok()) return false;
  }
  return true;
}

class ObjectStoreSaveTest : public testing::S3ServerTest {
 protected:
  void SetUp() override {
    S3ServerTest::SetUp();
    // Every leftover is old enough to clean: the next save must leave none.
    setenv("SHARDSAFE_S3_LEFTOVER_AGE", "0", 1);
    auto client = S3Client::Create(config_);
    S3_ASSERT_OK(client);
    store_ = std::make_unique<S3FileSystem>(std::move(*client), S3FileOptions{});
  }
  void TearDown() override {
    unsetenv("SHARDSAFE_S3_LEFTOVER_AGE");
    unsetenv("SHARDSAFE_CHUNK_TABLE_MIN_CHUNKS");
  }

  std::string Root(const std::string& name) const {
    return "s3://" + std::string(kBucket) + "/" + name;
  }

  // Saves `step` through a manager over `root`; each saver's status.
  std::vector<Status> SaveStep(const std::string& root, int64_t step, FileSystem* fs) {
    std::vector<Status> out(kSavers);
    RunRanks(kSavers, [&](int r, Comm& comm) {
      const uint64_t u = static_cast<uint64_t>(r);
      std::vector<OwnedShard> shards = {
          MakeShard(StepKey("w", step), DType::kF32, kW, {Box{{3 * u, 0}, {3, 10}}, std::nullopt}),
          MakeShard(StepKey("b", step), DType::kBF16, kB, {Box::Whole(kB), std::nullopt})};
      shards[0].key = "w";
      shards[1].key = "b";
      SaveState state;
      for (const OwnedShard& s : shards) state.tensors.push_back(s.View());
      state.values = "{\"step\":" + std::to_string(step) + "}";
      CheckpointManager manager(root, {.fs = fs});
      out[r] = manager.Save(step, state, comm, {}).status();
    });
    return out;
  }

  // Loads `path` on kLoaders ranks by columns and compares with `step`.
  ::testing::AssertionResult LoadsStep(const std::string& path, int64_t step) {
    std::vector<std::string> errors(kLoaders);
    RunRanks(kLoaders, [&](int r, Comm& comm) {
      const uint64_t cuts[] = {0, 3, 7, 10}, u = static_cast<uint64_t>(r);
      std::vector<OwnedTarget> targets = {
          MakeTarget(StepKey("w", step), DType::kF32, kW,
                     {Box{{0, cuts[u]}, {6, cuts[u + 1] - cuts[u]}}, std::nullopt}),
          MakeTarget(StepKey("b", step), DType::kBF16, kB, {Box::Whole(kB), std::nullopt})};
      LoadRequest request;
      for (OwnedTarget& t : targets) {
        t.target.data = t.buffer.data();  // the buffer moved into the vector
        TensorTarget renamed = t.target;
        renamed.key = t.target.key.substr(0, 1);
        request.tensors.push_back(renamed);
      }
      LoadOptions options;
      options.fs = store_.get();
      auto loaded = Load(request, path, comm, options);
      if (!loaded.ok()) {
        errors[r] = loaded.status().ToString();
        return;
      }
      for (const OwnedTarget& t : targets) {
        if (!testing::MatchesOracle(t)) errors[r] += t.target.key + " differs; ";
      }
    });
    std::string all;
    for (int r = 0; r < kLoaders; ++r) {
      if (!errors[r].empty()) all += "rank " + std::to_string(r) + ": " + errors[r] + "\n";
    }
    if (all.empty()) return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure() << path << " as step " << step << ": " << all;
  }

  // Keys under `root` that are neither `latest` nor named by a committed
  // checkpoint's index (its data files, index and commit record).
  std::vector<std::string> StrayKeys(const std::string& root) {
    std::set<std::string> expected = {root + "/latest"};
    auto list = ListCheckpoints(root, store_.get());
    EXPECT_TRUE(list.ok()) << list.status().ToString();
    for (const CheckpointInfo& c : list.ok() ? *list : std::vector<CheckpointInfo>()) {
      auto src = OpenSource(*store_, c.path);
      EXPECT_TRUE(src.ok()) << src.status().ToString();
      if (!src.ok()) continue;
      expected.insert(c.path + "/shardsafe.json");
      expected.insert(c.path + "/commit.json");
      for (const IndexFile& f : src->index.files) expected.insert(c.path + "/" + f.name);
    }
    auto keys = client_->List(kBucket, root.substr(std::string("s3://").size() +
                                                   std::string(kBucket).size() + 1) + "/", "");
    EXPECT_TRUE(keys.ok());
    std::vector<std::string> stray;
    for (const ObjectInfo& o : keys.ok() ? keys->objects : std::vector<ObjectInfo>()) {
      const std::string uri = "s3://" + std::string(kBucket) + "/" + o.key;
      if (!expected.count(uri)) stray.push_back(uri);
    }
    auto uploads = client_->ListMultipartUploads(kBucket, "");
    if (uploads.ok()) {
      for (const MultipartUpload& u : *uploads) {
        if (u.key.starts_with(root.substr(std::string("s3://").size() +
                                          std::string(kBucket).size() + 1))) {
          stray.push_back("upload " + u.key);
        }
      }
    }
    return stray;
  }

  // A save of step 2 over a root holding step 1, cut short at each of its
  // storage operations in turn (roots named `name`-N).
  void CutShortAnywhere(const std::string& name);

  std::unique_ptr<S3FileSystem> store_;
};

TEST_F(ObjectStoreSaveTest, ASaveCutShortAnywhereLosesNothingAndLeavesNothing) {
  CutShortAnywhere("cut");
}

// The same with the index's chunks in a chunk table, its parts written
// before the index under the save's private names.
TEST_F(ObjectStoreSaveTest, ASaveWithAChunkTableCutShortAnywhereLosesNothing) {
  setenv("SHARDSAFE_CHUNK_TABLE_MIN_CHUNKS", "1", 1);
  CutShortAnywhere("table");
  auto src = OpenSource(*store_, Root("table-counted") + "/step-00000002");
  ASSERT_TRUE(src.ok()) << src.status().ToString();
  ASSERT_FALSE(src->index.chunk_tables.empty());
  for (const IndexChunkTable& t : src->index.chunk_tables) {
    ASSERT_TRUE(t.file.has_value());
    EXPECT_EQ(src->index.files[*t.file].name, t.name);
    EXPECT_TRUE(t.name.starts_with("chunks-")) << t.name;
    EXPECT_TRUE(t.name.ends_with(".chunks")) << t.name;
    EXPECT_GT(t.name.size(), std::string("chunks-00000.chunks").size()) << "the save's nonce";
  }
}

void ObjectStoreSaveTest::CutShortAnywhere(const std::string& name) {
  // The operations of a clean save of step 2 over step 1.
  const std::string counted_root = Root(name + "-counted");
  ASSERT_TRUE(AllOk(SaveStep(counted_root, 1, store_.get())));
  FaultInjectingFileSystem counting(store_.get());
  ASSERT_TRUE(AllOk(SaveStep(counted_root, 2, &counting)));
  const int64_t total = counting.total_count();
  ASSERT_GE(total, 10) << "a save issues its data, claim, index and `latest` writes";
  ASSERT_TRUE(LoadsStep(counted_root, 2));

  int committed_runs = 0;
  for (int64_t n = 0; n < total; ++n) {
    SCOPED_TRACE("the save stops at operation " + std::to_string(n) + " of " +
                 std::to_string(total));
    const std::string root = Root(name + "-" + std::to_string(n));
    ASSERT_TRUE(AllOk(SaveStep(root, 1, store_.get())));
    FaultInjectingFileSystem faulty(store_.get());
    faulty.FailAfter(n, UnavailableError("injected: the process died here"));
    const std::vector<Status> saved = SaveStep(root, 2, &faulty);

    auto list = ListCheckpoints(root, store_.get());
    ASSERT_TRUE(list.ok()) << list.status().ToString();
    std::set<int64_t> steps;
    for (const CheckpointInfo& c : *list) steps.insert(c.step.value_or(-1));
    ASSERT_TRUE(steps.count(1)) << "step 1 must stay listed";
    const bool committed = steps.count(2) > 0;
    EXPECT_EQ(steps.size(), committed ? 2u : 1u);
    for (const Status& s : saved) {
      EXPECT_TRUE(!s.ok() || committed) << "a save reported success without committing";
    }
    committed_runs += committed;
    EXPECT_TRUE(LoadsStep(root + "/step-00000001", 1));
    if (committed) {
      EXPECT_TRUE(LoadsStep(root + "/step-00000002", 2));
    }
    // The root loads whichever its latest is, whole.
    auto latest = CheckpointManager(root, {.fs = store_.get()}).LatestStep();
    ASSERT_TRUE(latest.ok() && latest->has_value());
    EXPECT_TRUE(LoadsStep(root, **latest));

    // The next save cleans what the cut-short one left, and nothing of a
    // save that committed and stopped before removing its prefix.
    ASSERT_TRUE(AllOk(SaveStep(root, 3, store_.get())));
    EXPECT_EQ(StrayKeys(root), std::vector<std::string>());
    EXPECT_TRUE(LoadsStep(root, 3));
    if (committed) {
      EXPECT_TRUE(LoadsStep(root + "/step-00000002", 2));
    }
  }
  EXPECT_GT(committed_runs, 0) << "the late cut points (after the index) commit";
  EXPECT_LT(committed_runs, total) << "the early cut points do not";
}

// A job killed inside the save of step 2 restarts and saves step 2 again
// within the leftover age, so the dead save's data objects stay under a
// tag that is committed: the sweep finds them by the dead save's private
// prefix once they age.
TEST_F(ObjectStoreSaveTest, AKilledSavesDataGoesOnceAgedUnderATagCommittedAgain) {
  const std::string counted_root = Root("again-counted");
  ASSERT_TRUE(AllOk(SaveStep(counted_root, 1, store_.get())));
  FaultInjectingFileSystem counting(store_.get());
  ASSERT_TRUE(AllOk(SaveStep(counted_root, 2, &counting)));
  // The last cut point that leaves data objects of step 2 and no claim.
  std::string root;
  bool killed = false;
  for (int64_t n = counting.total_count() - 1; n > 0 && !killed; --n) {
    root = Root("again-" + std::to_string(n));
    ASSERT_TRUE(AllOk(SaveStep(root, 1, store_.get())));
    FaultInjectingFileSystem faulty(store_.get());
    faulty.FailAfter(n, UnavailableError("injected: the process died here"));
    SaveStep(root, 2, &faulty);
    auto keys = client_->List(kBucket, "again-" + std::to_string(n) + "/step-00000002/", "");
    ASSERT_TRUE(keys.ok()) << keys.status().ToString();
    bool data = false, claim = false;
    for (const ObjectInfo& o : keys->objects) {
      data |= o.key.find("/data-") != std::string::npos;
      claim |= o.key.ends_with("/commit.json");
    }
    killed = data && !claim;
  }
  ASSERT_TRUE(killed) << "no cut point leaves data objects without a claim";

  setenv("SHARDSAFE_S3_LEFTOVER_AGE", "3600", 1);  // the restart comes within the hour
  ASSERT_TRUE(AllOk(SaveStep(root, 2, store_.get())));
  ASSERT_NE(StrayKeys(root), std::vector<std::string>()) << "the dead save's data is left";
  EXPECT_TRUE(LoadsStep(root + "/step-00000002", 2));

  setenv("SHARDSAFE_S3_LEFTOVER_AGE", "0", 1);  // an hour later
  ASSERT_TRUE(AllOk(SaveStep(root, 3, store_.get())));
  EXPECT_EQ(StrayKeys(root), std::vector<std::string>());
  EXPECT_TRUE(LoadsStep(root + "/step-00000002", 2));
  EXPECT_TRUE(LoadsStep(root, 3));
}

// A load knows each data object's size from the index: it reads them with
// ranged GETs and asks for no HEAD. Small objects (indexes, commit records)
// are read with one GET each, no HEAD first.
TEST_F(ObjectStoreSaveTest, LoadsAndCommitsSendNoHeadsForWhatTheyRead) {
  const std::string root = Root("heads");
  ASSERT_TRUE(AllOk(SaveStep(root, 1, store_.get())));
  const size_t heads = CountRequests("HEAD", "/data-");
  const size_t gets = CountRequests("GET", "/data-");
  ASSERT_TRUE(LoadsStep(root, 1));
  EXPECT_EQ(CountRequests("HEAD", "/data-"), heads);
  EXPECT_GT(CountRequests("GET", "/data-"), gets);

  const size_t record_heads = CountRequests("HEAD", "commit.json");
  const size_t record_gets = CountRequests("GET", "step-00000001/commit.json");
  ASSERT_TRUE(AllOk(SaveStep(root, 2, store_.get())));  // reads step 1's record
  EXPECT_EQ(CountRequests("HEAD", "commit.json"), record_heads);
  EXPECT_GT(CountRequests("GET", "step-00000001/commit.json"), record_gets);
}

// An object store has no read lease: a load whose checkpoint retention
// removed after it was opened fails saying so, naming the missing object.
TEST_F(ObjectStoreSaveTest, ALoadRacingRetentionSaysTheCheckpointWasRemoved) {
  const std::string root = Root("raced");
  ASSERT_TRUE(AllOk(SaveStep(root, 1, store_.get())));
  auto src = OpenSource(*store_, root + "/step-00000001");
  ASSERT_TRUE(src.ok()) << src.status().ToString();
  ASSERT_TRUE(store_->RemoveAll(src->path).ok());  // retention, after the open
  OwnedTarget t = MakeTarget(StepKey("w", 1), DType::kF32, kW, {Box::Whole(kW), std::nullopt});
  TensorTarget renamed = t.target;
  renamed.key = "w";
  auto comm = MakeSingleProcessComm();
  LoadOptions options;
  options.fs = store_.get();
  auto loaded = LoadOpenedSource(LoadRequest{{renamed}}, *src, *comm, options);
  ASSERT_EQ(loaded.status().code(), StatusCode::kNotFound) << loaded.status().ToString();
  EXPECT_NE(loaded.status().message().find("was removed (by retention or prune) while it was "
                                           "being loaded"),
            std::string::npos)
      << loaded.status().ToString();
  // Either data object (they are read in parallel), by its key.
  EXPECT_NE(loaded.status().message().find(src->path + "/data-0000"), std::string::npos)
      << loaded.status().ToString();
}

}  // namespace
}  // namespace shardsafe
