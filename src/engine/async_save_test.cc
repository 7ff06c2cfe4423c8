#include <nlohmann/json.hpp>

#include "shardsafe/async_save.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <future>

#include "shardsafe/tools.h"
#include "testing/fault_injection.h"
#include "testing/status_matchers.h"
#include "testing/test_util.h"

namespace shardsafe {
namespace {

using Json = nlohmann::json;

using ::testing::HasSubstr;

constexpr int kRanks = 4;
const Shape kShape{64, 48};

// Rank r holds rows [16r, 16r+16) of "w" and a flat quarter of "m", plus a
// per-rank blob.
struct RankState {
  std::vector<OwnedShard> shards;
  std::string rng;
  SaveState state;
};

std::unique_ptr<RankState> MakeState(int r, int64_t step) {
  auto s = std::make_unique<RankState>();
  const uint64_t n = kShape[0] * kShape[1];
  s->shards.push_back(MakeShard("w", DType::kF32, kShape, {Box{{16u * r, 0}, {16, 48}}, std::nullopt}));
  s->shards.push_back(
      MakeShard("m", DType::kBF16, kShape, {Box::Whole(kShape), FlatRange{n * r / 4, n * (r + 1) / 4}}));
  s->rng = "rng-" + std::to_string(r) + "-" + std::to_string(step);
  for (auto& sh : s->shards) s->state.tensors.push_back(sh.View());
  s->state.blobs.push_back({"rng", s->rng.data(), s->rng.size(), true});
  s->state.values = Json{{"step", step}}.dump();
  return s;
}

class AsyncSaveTest : public ::testing::Test {
 protected:
  void SetUp() override { root_ = testing::MakeTempDir("async"); }
  void TearDown() override { std::filesystem::remove_all(root_); }

  // Every rank loads "w" as column halves and checks it and the step.
  void ExpectLoads(std::optional<int64_t> step, int64_t expect_step) {
    RunRanks(2, [&](int r, Comm& comm) {
      CheckpointManager m(root_, {});
      OwnedTarget t = MakeTarget("w", DType::kF32, kShape, {Box{{0, 24u * r}, {64, 24}}, std::nullopt});
      LoadRequest req;
      req.tensors.push_back(t.target);
      auto res = m.Load(req, step, comm, {});
      ASSERT_TRUE(res.ok()) << res.status().ToString();
      EXPECT_TRUE(MatchesOracle(t));
      EXPECT_EQ(Json::parse(res->values)["step"], expect_step);
      EXPECT_EQ(res->blobs["rng"], "rng-" + std::to_string(r) + "-" + std::to_string(expect_step));
    });
  }

  std::string root_;
};

TEST_F(AsyncSaveTest, CallerMayOverwriteItsStateOnceTheCallReturns) {
  std::vector<std::shared_ptr<AsyncSaveHandle>> handles(kRanks);
  RunRanks(kRanks, [&](int r, Comm& comm) {
    CheckpointManager m(root_, {});
    auto state = MakeState(r, 7);
    auto handle = m.AsyncSave(7, state->state, comm, {});
    ASSERT_TRUE(handle.ok()) << handle.status().ToString();
    // Scribble over the caller's buffers while the save runs.
    for (auto& sh : state->shards) std::fill(sh.bytes.begin(), sh.bytes.end(), std::byte{0x55});
    state->rng.assign(state->rng.size(), 'x');
    auto stats = (*handle)->Wait();
    ASSERT_TRUE(stats.ok()) << stats.status().ToString();
    EXPECT_GT(stats->bytes_written, 0u);
    EXPECT_LE((*handle)->blocked_seconds(), stats->seconds);
    handles[r] = *handle;
  });
  for (auto& h : handles) EXPECT_TRUE(h->Done());
  ExpectLoads(std::nullopt, 7);
  EXPECT_THAT(std::filesystem::exists(root_ + "/step-00000007/done-00000"), false);
}

TEST_F(AsyncSaveTest, BackToBackSavesRunInOrderWithRetentionAndReuseStaging) {
  std::vector<size_t> staging(kRanks), staging_after(kRanks);
  RunRanks(kRanks, [&](int r, Comm& comm) {
    AsyncSaver saver;
    for (int64_t step : {1, 2, 3}) {
      auto state = MakeState(r, step);
      auto h = saver.Save(state->state, root_, *CheckpointManager("", {}).TagOf(step), comm, {},
                          /*update_latest=*/true, /*keep_last=*/2);
      ASSERT_TRUE(h.ok()) << h.status().ToString();
      if (step == 1) staging[r] = saver.staging_bytes();
      // No wait: the next Save waits for this one.
    }
    staging_after[r] = saver.staging_bytes();
    ASSERT_TRUE(saver.WaitForPending().ok());
  });
  auto list = ListCheckpoints(root_);
  ASSERT_TRUE(list.ok());
  ASSERT_EQ(list->size(), 2u);
  EXPECT_EQ((*list)[1].tag, "step-00000003");
  EXPECT_TRUE((*list)[1].is_latest);
  ExpectLoads(std::nullopt, 3);
  ExpectLoads(2, 2);
  for (int r = 0; r < kRanks; ++r) {
    EXPECT_EQ(staging[r], staging_after[r]) << "staging reallocated on rank " << r;
  }
}

// With a chunk table (format version 3) each rank also writes its
// checksum file; rank 0 compares the copies of a replicated tensor against
// the writers' checksums from the markers, and the repeated save writes
// the same table. Both checkpoints verify and load.
TEST_F(AsyncSaveTest, ChunkTableSavesKeepTheChecksumsBesideTheDataAndLoad) {
  RunRanks(kRanks, [&](int r, Comm& comm) {
    AsyncSaver saver;
    for (int64_t step : {1, 2}) {
      auto state = MakeState(r, step);
      state->shards.push_back(
          MakeShard("rep", DType::kF32, {8, 8}, {Box::Whole({8, 8}), std::nullopt}));
      state->state.tensors.clear();
      for (auto& sh : state->shards) state->state.tensors.push_back(sh.View());
      SaveOptions options;
      options.chunk_table_min_chunks = 1;
      auto h = saver.Save(state->state, root_, *CheckpointManager("", {}).TagOf(step), comm,
                          options, /*update_latest=*/true, /*keep_last=*/0);
      ASSERT_TRUE(h.ok()) << h.status().ToString();
      auto stats = (*h)->Wait();
      ASSERT_TRUE(stats.ok()) << stats.status().ToString();
    }
  });
  std::string tables[2];
  for (int64_t step : {1, 2}) {
    const std::string dir = root_ + "/" + *CheckpointManager("", {}).TagOf(step);
    std::ifstream in(dir + "/shardsafe.json");
    const Json index = Json::parse(in);
    EXPECT_EQ(index["version"], 4);
    EXPECT_EQ(index["checksum_files"].size(), size_t{kRanks});
    ASSERT_FALSE(index["chunk_tables"].empty());
    for (size_t file : index["chunk_tables"]) {  // the parts, in order
      std::ifstream part(dir + "/" + index["files"][file]["name"].get<std::string>(),
                         std::ios::binary);
      tables[step - 1].append(std::istreambuf_iterator<char>(part), {});
    }
    const VerifyReport report = VerifyCheckpoint(dir);
    EXPECT_TRUE(report.faults.empty()) << report.faults.front();
    EXPECT_GT(report.chunks_verified, 0u);
    ExpectLoads(step, step);
  }
  EXPECT_EQ(tables[0], tables[1]);
}

TEST_F(AsyncSaveTest, StagingHoldsOneCopyOfWhatTheRankWrites) {
  RunRanks(kRanks, [&](int r, Comm& comm) {
    AsyncSaver saver;
    auto state = MakeState(r, 1);
    auto h = saver.Save(state->state, root_, "one", comm, {});
    ASSERT_TRUE(h.ok());
    auto stats = (*h)->Wait();
    ASSERT_TRUE(stats.ok()) << stats.status().ToString();
    // Headers and 4 KiB alignment of each file image are the only extra.
    EXPECT_LE(saver.staging_bytes(), stats->bytes_written * 11 / 10 + 2 * 4096) << r;
  });
}

TEST_F(AsyncSaveTest, BackgroundWriteFailureCommitsNothingAndIsReportedOnceByItsHandle) {
  FaultInjectingFileSystem faulty(DefaultFileSystem());
  faulty.FailNth(OpKind::kAppend, 2, ResourceExhaustedError("no space left on device (injected)"));
  std::vector<Status> waited(kRanks), next(kRanks), sync(kRanks);
  std::vector<std::unique_ptr<CheckpointManager>> managers(kRanks);
  RunRanks(kRanks, [&](int r, Comm& comm) {
    managers[r] = std::make_unique<CheckpointManager>(
        root_, CheckpointManager::Options{.keep_last = 0, .fs = &faulty});
    CheckpointManager& m = *managers[r];
    auto state = MakeState(r, 1);
    auto h = m.AsyncSave(1, state->state, comm, {});
    ASSERT_TRUE(h.ok()) << h.status().ToString();
    waited[r] = (*h)->Wait().status();
    // The next save is attempted as usual.
    auto state2 = MakeState(r, 2);
    auto h2 = m.AsyncSave(2, state2->state, comm, {});
    next[r] = h2.ok() ? (*h2)->Wait().status() : h2.status();
  });
  faulty.FailNth(OpKind::kAppend, 1, ResourceExhaustedError("no space left on device (injected)"));
  RunRanks(kRanks, [&](int r, Comm& comm) {
    CheckpointManager& m = *managers[r];
    auto state3 = MakeState(r, 3);
    ASSERT_TRUE(m.AsyncSave(3, state3->state, comm, {}).ok());  // fails; nobody waits
    auto state4 = MakeState(r, 4);
    sync[r] = m.Save(4, state4->state, comm, {}).status();  // waits for it, then saves
  });
  for (int r = 0; r < kRanks; ++r) {
    // The rank whose write failed (whichever appended first) reports its
    // own error; the others learn it from that rank's marker or rank 0's.
    EXPECT_TRUE(IsError(waited[r], StatusCode::kResourceExhausted,
                        "no space left on device (injected)") ||
                IsError(waited[r], StatusCode::kUnavailable, "no space left on device (injected)"))
        << r << ": " << waited[r].ToString();
    EXPECT_TRUE(next[r].ok()) << r << ": " << next[r].ToString();
    EXPECT_TRUE(sync[r].ok()) << r << ": " << sync[r].ToString();
  }
  auto list = ListCheckpoints(root_);
  ASSERT_TRUE(list.ok());
  std::vector<std::string> tags;
  for (const auto& c : *list) tags.push_back(c.tag);
  // Step 1 never committed; nor did step 3 (the second injected failure).
  EXPECT_THAT(tags, ::testing::ElementsAre("step-00000002", "step-00000004"));
  for (const auto& e : std::filesystem::directory_iterator(root_)) {
    EXPECT_NE(e.path().filename().string().rfind(".tmp-", 0), 0u) << "leftover " << e.path();
  }
}

// A rank whose process "dies" once its state is staged (every file
// operation of its own fails, so it cannot even leave a marker): the others
// wait SaveOptions::peer_timeout for it, then fail, naming what they waited
// for. Nothing is committed.
TEST_F(AsyncSaveTest, ASilentPeerFailsTheSaveAfterThePeerTimeout) {
  FaultInjectingFileSystem dead(DefaultFileSystem());
  dead.FailAfter(0, UnavailableError("process died (injected)"));
  std::vector<Status> waited(kRanks);
  RunRanks(kRanks, [&](int r, Comm& comm) {
    auto state = MakeState(r, 1);
    SaveOptions options;
    options.peer_timeout = std::chrono::seconds(1);
    if (r == 3) options.fs = &dead;
    AsyncSaver saver;
    auto h = saver.Save(state->state, root_, "step-1", comm, options);
    ASSERT_TRUE(h.ok()) << h.status().ToString();
    waited[r] = (*h)->Wait().status();
  });
  EXPECT_TRUE(IsError(waited[0], StatusCode::kUnavailable,
                      "timed out waiting for the other ranks' completion markers"));
  // Ranks 1 and 2 time out waiting for rank 0's commit, or hear of rank 0's
  // time-out first.
  for (int r = 1; r < 3; ++r) {
    EXPECT_TRUE(IsError(waited[r], StatusCode::kUnavailable, "timed out waiting")) << r;
  }
  EXPECT_TRUE(IsError(waited[3], StatusCode::kUnavailable, "process died (injected)"));
  auto list = ListCheckpoints(root_);
  ASSERT_TRUE(list.ok());
  EXPECT_TRUE(list->empty());
}

using WholeTensors = std::vector<std::pair<std::string, Shape>>;  // F32, saved whole

// Async-saves `tensors` (oracle bytes) as root/tag through `fs`, scribbles
// over the caller's copies once the call returns, and waits.
Status AsyncSaveWhole(const WholeTensors& tensors, Comm& comm, const std::string& root,
                      const std::string& tag, FileSystem* fs = nullptr) {
  std::vector<OwnedShard> shards;
  SaveState state;
  for (const auto& [key, shape] : tensors) {
    shards.push_back(MakeShard(key, DType::kF32, shape, {Box::Whole(shape), std::nullopt}));
    state.tensors.push_back(shards.back().View());
  }
  AsyncSaver saver;
  SaveOptions opts;
  opts.fs = fs;
  auto h = saver.Save(state, root, tag, comm, opts);
  if (!h.ok()) return h.status();
  for (auto& sh : shards) std::fill(sh.bytes.begin(), sh.bytes.end(), std::byte{0x55});
  return (*h)->Wait().status();
}

// Loads every one of `tensors` whole from `path` (checking each chunk's
// checksum) and expects the oracle bytes.
void ExpectLoadsWhole(const WholeTensors& tensors, Comm& comm, const std::string& path) {
  LoadRequest req;
  std::vector<OwnedTarget> targets;
  for (const auto& [key, shape] : tensors) {
    targets.push_back(MakeTarget(key, DType::kF32, shape, {Box::Whole(shape), std::nullopt}));
  }
  for (auto& t : targets) req.tensors.push_back(t.target);
  auto res = Load(req, path, comm, {});
  ASSERT_TRUE(res.ok()) << res.status().ToString();
  for (const auto& t : targets) EXPECT_TRUE(MatchesOracle(t)) << t.target.key;
}

// Tensors of several write steps and copy pieces in one file: the writer
// follows the staging copy through the file (pieces finish out of order)
// and the checkpoint still loads bit-exact after the caller scribbled over
// its state.
TEST_F(AsyncSaveTest, LargeFileIsWrittenAsTheCopyStagesIt) {
  const WholeTensors tensors = {
      {"a", {9000, 2048}}, {"b", {3, 5}}, {"c", {4100, 2048}}};  // F32: 70 MiB, 60 B, 32 MiB
  RunRanks(1, [&](int, Comm& comm) {
    ASSERT_TRUE(AsyncSaveWhole(tensors, comm, root_, "ok").ok());
    ExpectLoadsWhole(tensors, comm, root_ + "/ok");
    // The first write fails while most of the copy is still to come: the
    // handle reports it, nothing is committed, and the copy finishes safely.
    FaultInjectingFileSystem faulty(DefaultFileSystem());
    faulty.FailNth(OpKind::kAppend, 0, ResourceExhaustedError("no space left (injected)"));
    Status failed = AsyncSaveWhole(tensors, comm, root_, "full", &faulty);
    EXPECT_THAT(failed.message(), HasSubstr("no space left (injected)"));
    EXPECT_FALSE(std::filesystem::exists(root_ + "/full"));
  });
}

TEST_F(AsyncSaveTest, ManySmallTensorsShareCopyTasksAndAllArriveIntact) {
  // 600 tensors of ~65 KiB (39 MiB, more than one write step) then one of
  // 20 MiB: the small ones are copied several to a task, the large one in
  // pieces; every chunk's checksum and bytes must come out right.
  WholeTensors tensors;
  for (int i = 0; i < 600; ++i) tensors.push_back({"s" + std::to_string(i), {128, 130}});
  tensors.push_back({"big", {2560, 2048}});
  RunRanks(1, [&](int, Comm& comm) {
    Status saved = AsyncSaveWhole(tensors, comm, root_, "many");
    ASSERT_TRUE(saved.ok()) << saved.ToString();
    ExpectLoadsWhole(tensors, comm, root_ + "/many");
  });
}

// A rank's failure reaches every handle with its code (and detail): rank 0
// reads it from the rank's `failed-` marker, the others from `aborted`.
TEST_F(AsyncSaveTest, ARanksFailureReachesEveryHandleWithItsCode) {
  FaultInjectingFileSystem full(DefaultFileSystem());
  full.FailNth(OpKind::kAppend, 0, ResourceExhaustedError("disk full (injected)"));
  std::vector<Status> waited(kRanks);
  RunRanks(kRanks, [&](int r, Comm& comm) {
    AsyncSaver saver;
    auto state = MakeState(r, 1);
    SaveOptions opts;
    if (r == 2) opts.fs = &full;
    auto h = saver.Save(state->state, root_, "ck", comm, opts);
    ASSERT_TRUE(h.ok());
    waited[r] = (*h)->Wait().status();
  });
  EXPECT_EQ(full.injected_failures(), 1);
  for (int r = 0; r < kRanks; ++r) {
    EXPECT_EQ(waited[r].code(), StatusCode::kResourceExhausted) << r << ": " << waited[r].ToString();
    if (r != 2) EXPECT_THAT(waited[r].message(), HasSubstr("rank 2")) << r;
    EXPECT_THAT(waited[r].message(), HasSubstr("disk full (injected)")) << r;
  }
  EXPECT_FALSE(std::filesystem::exists(root_ + "/ck"));
}

TEST_F(AsyncSaveTest, CommitFailureOnRankZeroFailsEveryHandle) {
  FaultInjectingFileSystem faulty(DefaultFileSystem());
  // Renames 0-3 publish the ranks' completion markers; #4 is the commit.
  faulty.FailNth(OpKind::kRename, kRanks, UnavailableError("injected rename failure"));
  std::vector<Status> waited(kRanks);
  RunRanks(kRanks, [&](int r, Comm& comm) {
    AsyncSaver saver;
    auto state = MakeState(r, 1);
    SaveOptions opts;
    opts.fs = &faulty;
    auto h = saver.Save(state->state, root_, "ck", comm, opts);
    ASSERT_TRUE(h.ok());
    waited[r] = (*h)->Wait().status();
  });
  EXPECT_EQ(faulty.injected_failures(), 1);
  EXPECT_THAT(waited[0].message(), HasSubstr("injected rename failure"));
  for (int r = 1; r < kRanks; ++r) {  // they learn why from the `aborted` marker
    EXPECT_THAT(waited[r].message(), HasSubstr("aborted by rank 0: injected rename failure")) << r;
    EXPECT_EQ(waited[r].code(), StatusCode::kUnavailable) << r;
  }
  EXPECT_FALSE(std::filesystem::exists(root_ + "/ck"));
}

// Holds every Sync of the files it creates until Release(): an async save
// stays in flight, its temporary directory in place, for as long as a test
// needs.
class GatedFileSystem final : public testing::ForwardingFileSystem {
 public:
  explicit GatedFileSystem(FileSystem* base)
      : ForwardingFileSystem(base), gate_(open_.get_future().share()) {}
  void Release() { open_.set_value(); }

  Result<std::unique_ptr<WritableFile>> NewWritableFile(const std::string& path,
                                                        const WriteOptions& options) override {
    SS_ASSIGN_OR_RETURN(auto file, base_->NewWritableFile(path, options));
    return std::unique_ptr<WritableFile>(new File(std::move(file), gate_));
  }

 private:
  class File final : public WritableFile {
   public:
    File(std::unique_ptr<WritableFile> f, std::shared_future<void> gate)
        : f_(std::move(f)), gate_(std::move(gate)) {}
    Status Append(const void* d, size_t n) override { return f_->Append(d, n); }
    Status Sync() override {
      gate_.wait();
      return f_->Sync();
    }
    Status Close() override { return f_->Close(); }
    uint64_t size() const override { return f_->size(); }

   private:
    std::unique_ptr<WritableFile> f_;
    std::shared_future<void> gate_;
  };
  std::promise<void> open_;
  std::shared_future<void> gate_;
};

// A one-rank state: all of "w", and the step.
struct WholeState {
  OwnedShard w = MakeShard("w", DType::kF32, kShape, {Box::Whole(kShape), std::nullopt});
  SaveState state;
  explicit WholeState(int64_t step) {
    state.tensors.push_back(w.View());
    state.values = Json{{"step", step}}.dump();
  }
};

std::string TmpDirIn(const std::string& root) {
  for (const auto& e : std::filesystem::directory_iterator(root)) {
    if (e.path().filename().string().rfind(".tmp-", 0) == 0) return e.path().string();
  }
  return "";
}

TEST_F(AsyncSaveTest, AnotherSaveIntoTheRootLeavesTheSaveInFlightAlone) {
  // A synchronous save cleans leftovers of killed saves from the root; the
  // async save still writing there must not be taken for one.
  GatedFileSystem gated(DefaultFileSystem());
  auto comm = MakeSingleProcessComm();
  WholeState one(1), two(2);
  SaveOptions slow;
  slow.fs = &gated;
  AsyncSaver saver;
  auto h = saver.Save(one.state, root_, "step-1", *comm, slow);
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  const std::string tmp = TmpDirIn(root_);
  ASSERT_FALSE(tmp.empty());
  ASSERT_TRUE(Save(two.state, root_ + "/step-2", *comm, {}).ok());
  EXPECT_TRUE(std::filesystem::exists(tmp)) << "the save in flight was removed";
  gated.Release();
  auto done = (*h)->Wait();
  ASSERT_TRUE(done.ok()) << done.status().ToString();
  for (int64_t step : {1, 2}) {
    OwnedTarget t = MakeTarget("w", DType::kF32, kShape, {Box::Whole(kShape), std::nullopt});
    LoadRequest req;
    req.tensors.push_back(t.target);
    auto res = Load(req, root_ + "/step-" + std::to_string(step), *comm, {});
    ASSERT_TRUE(res.ok()) << res.status().ToString();
    EXPECT_TRUE(MatchesOracle(t));
    EXPECT_EQ(Json::parse(res->values)["step"], step);
  }
}

TEST_F(AsyncSaveTest, RankZeroWhoseDirectoryVanishedFailsAtOnce) {
  GatedFileSystem gated(DefaultFileSystem());
  auto comm = MakeSingleProcessComm();
  WholeState one(1);
  SaveOptions slow;
  slow.fs = &gated;
  AsyncSaver saver;  // waiting for the peer timeout (10 minutes) would hang the test
  auto h = saver.Save(one.state, root_, "step-1", *comm, slow);
  ASSERT_TRUE(h.ok());
  // The background writer may be creating its file while the directory
  // goes: retry until it is gone (a throw here would leave the gate shut
  // and the saver's destructor waiting on it).
  const std::string tmp = TmpDirIn(root_);
  std::error_code ec;
  for (int i = 0; i < 1000 && std::filesystem::exists(tmp); ++i) {
    std::filesystem::remove_all(tmp, ec);
  }
  gated.Release();
  ASSERT_FALSE(std::filesystem::exists(tmp)) << ec.message();
  EXPECT_TRUE(IsError((*h)->Wait().status(), StatusCode::kNotFound));
  EXPECT_FALSE(std::filesystem::exists(root_ + "/step-1"));
}

TEST_F(AsyncSaveTest, LayoutErrorsAreReportedByTheCall) {
  std::vector<Status> st(2);
  RunRanks(2, [&](int r, Comm& comm) {
    AsyncSaver saver;
    OwnedShard sh = MakeShard("w", DType::kF32, {8, 4}, {Box{{r * 3u, 0}, {5, 4}}, std::nullopt});
    SaveState state;
    state.tensors.push_back(sh.View());
    st[r] = saver.Save(state, root_, "bad", comm, {}).status();
  });
  for (const Status& s : st) EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
  SaveOptions over;
  over.overwrite = true;
  auto comm = MakeSingleProcessComm();
  AsyncSaver saver;
  EXPECT_EQ(saver.Save({}, root_, "x", *comm, over).status().code(), StatusCode::kInvalidArgument);
}

TEST_F(AsyncSaveTest, ReserveAllocatesTheStagingThatTheFirstSaveUses) {
  std::vector<size_t> reserved(kRanks), by_manager(kRanks), used(kRanks);
  std::vector<uint64_t> written(kRanks);
  RunRanks(kRanks, [&](int r, Comm& comm) {
    CheckpointManager m(root_, {});
    auto state = MakeState(r, 5);
    EXPECT_EQ(m.async_staging_bytes(), 0u);
    ASSERT_TRUE(m.ReserveAsyncSave(state->state, comm).ok());
    by_manager[r] = m.async_staging_bytes();
    AsyncSaver saver;
    ASSERT_TRUE(saver.Reserve(state->state, comm).ok());
    reserved[r] = saver.staging_bytes();
    if (r == 0) {
      EXPECT_TRUE(std::filesystem::is_empty(root_)) << "Reserve touched the root";
    }
    auto h = saver.Save(state->state, root_, "five", comm, {});
    ASSERT_TRUE(h.ok()) << h.status().ToString();
    auto stats = (*h)->Wait();
    ASSERT_TRUE(stats.ok()) << stats.status().ToString();
    used[r] = saver.staging_bytes();
    written[r] = stats->bytes_written;
  });
  for (int r = 0; r < kRanks; ++r) {
    EXPECT_GE(reserved[r], written[r]) << r;
    EXPECT_LE(reserved[r], written[r] * 11 / 10 + 2 * 4096) << r;
    EXPECT_EQ(reserved[r], used[r]) << "the first save grew the staging on rank " << r;
    EXPECT_EQ(by_manager[r], reserved[r]) << r;
  }
}

TEST_F(AsyncSaveTest, ReserveWaitsForAFailedSaveAndFailsAMismatchedCall) {
  FaultInjectingFileSystem faulty(DefaultFileSystem());
  faulty.FailNth(OpKind::kAppend, 1, UnavailableError("I/O error (injected)"));
  std::vector<Status> failed(kRanks), reserve(kRanks), mixed(kRanks), after(kRanks);
  RunRanks(kRanks, [&](int r, Comm& comm) {
    AsyncSaver saver;
    auto state = MakeState(r, 1);
    SaveOptions faulty_fs;
    faulty_fs.fs = &faulty;
    auto h = saver.Save(state->state, root_, "one", comm, faulty_fs);
    ASSERT_TRUE(h.ok()) << h.status().ToString();
    reserve[r] = saver.Reserve(state->state, comm);
    failed[r] = (*h)->Wait().status();  // the failure is the handle's to report
    // Rank 0 reserves while the others save: every rank fails, none hangs.
    mixed[r] = r == 0 ? saver.Reserve(state->state, comm)
                      : saver.Save(state->state, root_, "two", comm, {}).status();
    auto h3 = saver.Save(state->state, root_, "three", comm, {});
    after[r] = h3.ok() ? (*h3)->Wait().status() : h3.status();
  });
  for (int r = 0; r < kRanks; ++r) {
    EXPECT_TRUE(reserve[r].ok()) << r << ": " << reserve[r].ToString();
    EXPECT_THAT(failed[r].message(), HasSubstr("I/O error (injected)")) << r;
    EXPECT_THAT(mixed[r].message(), HasSubstr("ranks disagree")) << r;
    EXPECT_TRUE(after[r].ok()) << r << ": " << after[r].ToString();
  }
  EXPECT_FALSE(std::filesystem::exists(root_ + "/one"));
  EXPECT_FALSE(std::filesystem::exists(root_ + "/two"));
}

}  // namespace
}  // namespace shardsafe
