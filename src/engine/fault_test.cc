// Crash and fault tests of the save/commit protocol (commit.h) and of loading
// damaged checkpoints.
//
// The save tests count the file system operations of a clean save of step 2
// over a root holding a committed step 1, then re-run that save once per
// operation with that operation failed: as a crash (FailAfter: it and every
// later operation fail) and as a lone transient fault (FailNth, per kind).
// After each run a clean file system must see step 1 bit-exact, step 2 only
// if its rename happened (and then bit-exact), `latest` naming one of them,
// and the next save must clean every leftover.
#include <gtest/gtest.h>
#include <gmock/gmock.h>

#include <array>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <optional>
#include <cstdio>
#include <cstdlib>
#include <sstream>

#include <nlohmann/json.hpp>

#include "testing/fault_injection.h"
#include "testing/test_util.h"

namespace shardsafe {
namespace {

using ::testing::HasSubstr;

using Json = nlohmann::json;

namespace fs = std::filesystem;

constexpr int kRanks = 3;
constexpr uint64_t kMaxFileBytes = 200;  // several data files per rank

const Shape kW{12, 10};  // F32, tensor-parallel: rank r holds rows [4r, 4r+4)
const Shape kB{30};      // BF16, replicated on every rank
const Shape kM{9, 7};    // F64, ZeRO flat ranges
const uint64_t kMCuts[kRanks + 1] = {0, 20, 41, 63};

std::string Tag(int64_t step) { return *CheckpointManager("", {}).TagOf(step); }

// The oracle key of `key` at `step`: every step has its own bytes, so a mix
// of two steps shows.
std::string StepKey(const std::string& key, int64_t step) {
  return key + "@" + std::to_string(step);
}

std::string RngBlob(int64_t step, int rank) {
  std::string s;
  for (int i = 0; s.size() < 90 + 7 * static_cast<size_t>(rank); ++i) {
    s += "rng/" + std::to_string(step) + "/" + std::to_string(rank) + "/" + std::to_string(i) + ";";
  }
  return s;
}
std::string SamplerBlob(int64_t step) { return "sampler position " + std::to_string(step * 1000); }

// One rank's part of the state saved at `step`; owns every byte it points to.
struct RankState {
  std::vector<OwnedShard> shards;
  std::string rng, sampler;
  SaveState state;
};

OwnedShard StepShard(const std::string& key, DType dtype, const Shape& shape, const Slice& slice,
                     int64_t step) {
  return {key, dtype, shape, slice, OracleShard(StepKey(key, step), dtype, shape, slice)};
}

std::unique_ptr<RankState> MakeRankState(int64_t step, int rank) {
  auto rs = std::make_unique<RankState>();
  const uint64_t r = static_cast<uint64_t>(rank);
  rs->shards.push_back(
      StepShard("w", DType::kF32, kW, {Box{{4 * r, 0}, {4, 10}}, std::nullopt}, step));
  rs->shards.push_back(StepShard("b", DType::kBF16, kB, {Box::Whole(kB), std::nullopt}, step));
  rs->shards.push_back(StepShard("m", DType::kF64, kM,
                                 {Box::Whole(kM), FlatRange{kMCuts[r], kMCuts[r + 1]}}, step));
  rs->rng = RngBlob(step, rank);
  rs->sampler = SamplerBlob(step);
  for (const auto& s : rs->shards) rs->state.tensors.push_back(s.View());
  rs->state.blobs.push_back({"rng", rs->rng.data(), rs->rng.size(), /*per_rank=*/true});
  rs->state.blobs.push_back({"sampler", rs->sampler.data(), rs->sampler.size(), false});
  rs->state.values = Json{{"step", step}, {"config", {{"lr", 0.0003}, {"name", "fault"}}}}.dump();
  rs->state.layout = Json{{"tp", kRanks}}.dump();
  return rs;
}

// Saves `step` with a manager over `root` from kRanks thread ranks; returns
// each rank's status, and (when asked) each rank's post-commit warnings.
std::vector<Status> SaveStep(const std::string& root, int64_t step, FileSystem* fsys,
                             int keep_last = 0,
                             std::vector<std::vector<std::string>>* warnings = nullptr) {
  std::vector<Status> out(kRanks);
  if (warnings) warnings->assign(kRanks, {});
  RunRanks(kRanks, [&](int r, Comm& comm) {
    auto rs = MakeRankState(step, r);
    CheckpointManager m(root, {.keep_last = keep_last, .fs = fsys});
    SaveOptions opts;
    opts.max_file_bytes = kMaxFileBytes;
    opts.io_threads = 2;
    auto saved = m.Save(step, rs->state, comm, opts);
    out[r] = saved.status();
    if (saved.ok() && warnings) (*warnings)[r] = saved->warnings;
  });
  return out;
}

// Post-commit warnings: present, the same on every rank, naming the fault.
::testing::AssertionResult WarnedAlike(const std::vector<std::vector<std::string>>& w,
                                       const std::string& mentions) {
  for (size_t r = 1; r < w.size(); ++r) {
    if (w[r] != w[0]) {
      return ::testing::AssertionFailure() << "rank " << r << " has other warnings than rank 0: "
                                           << ::testing::PrintToString(w[r]) << " vs "
                                           << ::testing::PrintToString(w[0]);
    }
  }
  if (w.empty() || w[0].empty()) return ::testing::AssertionFailure() << "no warning";
  for (const std::string& line : w[0]) {
    if (line.find(mentions) != std::string::npos) return ::testing::AssertionSuccess();
  }
  return ::testing::AssertionFailure() << "no warning mentions \"" << mentions
                                       << "\": " << ::testing::PrintToString(w[0]);
}

// Loads `path` (a checkpoint or a root) on kRanks ranks in a layout other
// than the saved one and checks every byte, value and blob against `step`.
// Uses the clean file system.
::testing::AssertionResult LoadsBitExact(const std::string& path, int64_t step,
                                         LoadOptions options = {}, std::string tag = "") {
  if (tag.empty()) tag = Tag(step);
  const uint64_t wcuts[] = {0, 3, 7, 10}, mrows[] = {0, 2, 5, 9};
  std::vector<std::string> errors(kRanks);
  std::vector<uint64_t> verified(kRanks);
  RunRanks(kRanks, [&](int r, Comm& comm) {
    struct Want {
      std::string key;
      DType dtype;
      Shape shape;
      Slice slice;
      std::vector<std::byte> buf;
    };
    const uint64_t u = static_cast<uint64_t>(r);
    std::vector<Want> wants;
    wants.push_back({"w", DType::kF32, kW, {Box{{0, wcuts[u]}, {12, wcuts[u + 1] - wcuts[u]}}, std::nullopt}, {}});
    wants.push_back({"b", DType::kBF16, kB, {Box::Whole(kB), FlatRange{10 * u, 10 * u + 10}}, {}});
    wants.push_back({"m", DType::kF64, kM, {Box{{mrows[u], 0}, {mrows[u + 1] - mrows[u], 7}}, std::nullopt}, {}});
    LoadRequest req;
    for (auto& w : wants) {
      w.buf.assign(*NumBytes(w.dtype, w.slice.NumElements()) + 1, std::byte{0xEE});
      req.tensors.push_back({w.key, w.dtype, w.shape, w.slice, w.buf.data()});
    }
    auto res = Load(req, path, comm, options);
    std::string& err = errors[r];
    if (!res.ok()) {
      err = res.status().ToString();
      return;
    }
    for (const auto& w : wants) {
      auto want = OracleShard(StepKey(w.key, step), w.dtype, w.shape, w.slice);
      if (!std::equal(want.begin(), want.end(), w.buf.begin()) || w.buf.back() != std::byte{0xEE}) {
        err += "tensor " + w.key + " differs from step " + std::to_string(step) + "; ";
      }
    }
    if (res->tag != tag) err += "loaded tag " + res->tag + "; ";
    if (Json::parse(res->values).value("step", int64_t{-1}) != step) {
      err += "values " + res->values + "; ";
    }
    if (res->blobs["rng"] != RngBlob(step, r)) err += "per-rank blob rng differs; ";
    if (res->blobs["sampler"] != SamplerBlob(step)) err += "global blob sampler differs; ";
    verified[r] = res->chunks_verified;
  });
  // Only chunks read whole are verified; some rank reads each chunk whole.
  uint64_t total_verified = 0;
  for (uint64_t v : verified) total_verified += v;
  if (options.verify_checksums && total_verified == 0) errors[0] += "no chunk verified; ";
  std::string all;
  for (int r = 0; r < kRanks; ++r) {
    if (!errors[r].empty()) all += "rank " + std::to_string(r) + ": " + errors[r] + "\n";
  }
  if (all.empty()) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "loading " << path << " as step " << step << ":\n" << all;
}

std::vector<std::string> DirNames(const std::string& dir) {
  std::vector<std::string> out;
  for (auto& e : fs::directory_iterator(dir)) out.push_back(e.path().filename());
  std::sort(out.begin(), out.end());
  return out;
}

std::string Joined(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : " ") + x;
  return s;
}

std::optional<std::string> ReadLatest(const std::string& root) {
  std::ifstream in(root + "/latest", std::ios::binary);
  if (!in) return std::nullopt;
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// -------------------------------------------------------------------------
// A FileSystem that logs every operation FaultInjectingFileSystem counts, in
// the same kinds, so a failure index can be named ("rename .tmp-... ->
// step-00000002"). Used for the dry run only.

class RecordingFileSystem final : public FileSystem {
 public:
  struct Op {
    OpKind kind;
    std::string what;
  };

  explicit RecordingFileSystem(FileSystem* base) : base_(base) {}

  std::vector<Op> ops() const {
    std::lock_guard<std::mutex> lock(mu_);
    return ops_;
  }
  void Record(OpKind kind, std::string what) {
    std::lock_guard<std::mutex> lock(mu_);
    ops_.push_back({kind, std::move(what)});
  }

  Result<std::unique_ptr<WritableFile>> NewWritableFile(const std::string& path,
                                                        const WriteOptions& options) override {
    Record(OpKind::kCreate, path);
    SS_ASSIGN_OR_RETURN(auto file, base_->NewWritableFile(path, options));
    return std::unique_ptr<WritableFile>(new File(this, path, std::move(file)));
  }
  Result<std::unique_ptr<RandomAccessFile>> NewRandomAccessFile(
      const std::string& path, const ReadOptions& options) override {
    return base_->NewRandomAccessFile(path, options);
  }
  Result<FileInfo> Stat(const std::string& path) override { return base_->Stat(path); }
  Result<std::vector<DirEntry>> ListDir(const std::string& path) override {
    return base_->ListDir(path);
  }
  Status CreateDir(const std::string& path) override {
    Record(OpKind::kCreateDir, path);
    return base_->CreateDir(path);
  }
  Status RemoveFile(const std::string& path) override {
    Record(OpKind::kRemove, path);
    return base_->RemoveFile(path);
  }
  Status RemoveAll(const std::string& path) override {
    Record(OpKind::kRemove, path);
    return base_->RemoveAll(path);
  }
  Status Rename(const std::string& from, const std::string& to) override {
    Record(OpKind::kRename, from + " -> " + to);
    return base_->Rename(from, to);
  }
  Status RenameExchange(const std::string& a, const std::string& b) override {
    Record(OpKind::kRename, a + " <-> " + b);
    return base_->RenameExchange(a, b);
  }
  Status SyncDir(const std::string& path) override {
    Record(OpKind::kSyncDir, path);
    return base_->SyncDir(path);
  }

 private:
  class File final : public WritableFile {
   public:
    File(RecordingFileSystem* fs, std::string path, std::unique_ptr<WritableFile> base)
        : fs_(fs), path_(std::move(path)), base_(std::move(base)) {}
    Status Append(const void* data, size_t n) override {
      fs_->Record(OpKind::kAppend, path_ + " +" + std::to_string(n));
      return base_->Append(data, n);
    }
    Status Sync() override {
      fs_->Record(OpKind::kSync, path_);
      return base_->Sync();
    }
    Status Close() override {
      fs_->Record(OpKind::kClose, path_);
      return base_->Close();
    }
    uint64_t size() const override { return base_->size(); }

   private:
    RecordingFileSystem* const fs_;
    const std::string path_;
    std::unique_ptr<WritableFile> base_;
  };

  FileSystem* const base_;
  mutable std::mutex mu_;
  std::vector<Op> ops_;
};

// -------------------------------------------------------------------------

class FaultTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::MakeTempDir("fault");
    golden_ = dir_ + "/golden";
    // The state every run starts from: step 1 committed and `latest`, plus
    // leftovers of an earlier killed save (so cleanup is among the counted
    // operations, and its faults are exercised too).
    for (const Status& s : SaveStep(golden_, 1, nullptr)) ASSERT_TRUE(s.ok()) << s.ToString();
    fs::create_directory(golden_ + "/.tmp-step-00000009.0123456789abcdef");
    std::ofstream(golden_ + "/.tmp-step-00000009.0123456789abcdef/data-00000-000.safetensors")
        << "partial";
    std::ofstream(golden_ + "/.latest.tmp.fedcba9876543210") << "step-0000";
    ASSERT_TRUE(LoadsBitExact(golden_ + "/" + Tag(1), 1));
  }
  void TearDown() override { fs::remove_all(dir_); }

  // A fresh copy of the golden root.
  std::string FreshRoot() {
    const std::string root = dir_ + "/run-" + std::to_string(runs_++);
    fs::copy(golden_, root, fs::copy_options::recursive);
    return root;
  }

  // The dry run: every counted operation of a clean save of step 2, in order.
  void DryRun() {
    const std::string root = FreshRoot();
    RecordingFileSystem rec(DefaultFileSystem());
    FaultInjectingFileSystem counting(&rec);
    for (const Status& s : SaveStep(root, 2, &counting)) ASSERT_TRUE(s.ok()) << s.ToString();
    ops_ = rec.ops();
    dry_root_ = root;
    ASSERT_EQ(static_cast<int64_t>(ops_.size()), counting.total_count());
    for (int k = 0; k < kNumOpKinds; ++k) per_kind_[k] = counting.count(static_cast<OpKind>(k));
    rename_index_ = -1;
    for (size_t i = 0; i < ops_.size(); ++i) {
      if (ops_[i].kind == OpKind::kRename &&
          ops_[i].what.ends_with(" -> " + root + "/" + Tag(2))) {
        rename_index_ = static_cast<int64_t>(i);
      }
    }
    ASSERT_GE(rename_index_, 0) << "no commit rename in the dry run";
    if (std::getenv("SHARDSAFE_FAULT_TEST_VERBOSE")) {
      for (size_t i = 0; i < ops_.size(); ++i) std::printf("op %zu: %s\n", i, Describe(i).c_str());
    }
    // The same save again counts the same operations.
    const std::string again = FreshRoot();
    FaultInjectingFileSystem recount(DefaultFileSystem());
    for (const Status& s : SaveStep(again, 2, &recount)) ASSERT_TRUE(s.ok()) << s.ToString();
    ASSERT_EQ(recount.total_count(), counting.total_count());
    ASSERT_TRUE(LoadsBitExact(root, 2));
    fs::remove_all(root);
    fs::remove_all(again);
  }

  // Global index (in ops_) of the n-th operation of `kind`.
  int64_t GlobalIndex(OpKind kind, int64_t n) const {
    for (size_t i = 0; i < ops_.size(); ++i) {
      if (ops_[i].kind == kind && n-- == 0) return static_cast<int64_t>(i);
    }
    return -1;
  }
  // "rename ROOT/.tmp-step-00000002.NONCE -> ROOT/step-00000002", from the
  // dry run (ROOT is each run's own root).
  std::string Describe(int64_t i) const {
    std::string what = ops_[i].what;
    for (size_t at; (at = what.find(dry_root_)) != std::string::npos;) {
      what.replace(at, dry_root_.size(), "ROOT");
    }
    return std::string(OpKindName(ops_[i].kind)) + " " + what;
  }
  // Cleanup of leftovers at the start of the save: its failure is harmless.
  bool IsLeftoverCleanup(int64_t i) const {
    return ops_[i].kind == OpKind::kRemove && i < rename_index_ &&
           (ops_[i].what.find("/.tmp-step-00000009.") != std::string::npos ||
            ops_[i].what.find("/.latest.tmp.fedcba") != std::string::npos);
  }

  // What a clean file system must see after any failed or crashed save of
  // step 2; `step2` says whether its commit rename happened. Then a clean
  // save of step 3 must succeed and leave no leftover.
  void CheckRoot(const std::string& root, bool step2, const std::string& what) {
    SCOPED_TRACE(what);
    auto list = ListCheckpoints(root);
    ASSERT_TRUE(list.ok()) << list.status().ToString();
    std::vector<std::string> tags;
    for (const auto& c : *list) tags.push_back(c.tag);
    if (step2) {
      EXPECT_THAT(tags, ::testing::ElementsAre(Tag(1), Tag(2))) << "listed: " << Joined(tags);
    } else {
      EXPECT_THAT(tags, ::testing::ElementsAre(Tag(1))) << "listed: " << Joined(tags);
    }
    EXPECT_TRUE(LoadsBitExact(root + "/" + Tag(1), 1));
    if (step2) {
      EXPECT_TRUE(LoadsBitExact(root + "/" + Tag(2), 2));
    }
    // `latest` is replaced atomically: always there, naming a committed step.
    auto latest = ReadLatest(root);
    ASSERT_TRUE(latest.has_value()) << "latest is missing";
    if (step2) {
      EXPECT_THAT(*latest, ::testing::AnyOf(Tag(1) + "\n", Tag(2) + "\n"));
    } else {
      EXPECT_EQ(*latest, Tag(1) + "\n");
    }
    // The root resolves to `latest`, unless a newer checkpoint was committed
    // after it was written (its update failed or was cut short): the newest.
    const int64_t resolved = step2 ? 2 : 1;
    EXPECT_TRUE(LoadsBitExact(root, resolved)) << "loading the root (latest: " << *latest << ")";
    EXPECT_TRUE(list->back().is_latest) << "ListCheckpoints marks another as latest";
    // The next clean save removes every leftover.
    for (const Status& s : SaveStep(root, 3, nullptr)) {
      ASSERT_TRUE(s.ok()) << "next save: " << s.ToString();
    }
    for (const std::string& name : DirNames(root)) {
      EXPECT_FALSE(name.starts_with(".")) << "leftover after the next save: " << name;
    }
    EXPECT_EQ(ReadLatest(root).value_or("?"), Tag(3) + "\n");
    EXPECT_TRUE(LoadsBitExact(root, 3));
  }

  // Every rank must report the same outcome.
  static ::testing::AssertionResult SameOnAllRanks(const std::vector<Status>& st) {
    for (const Status& s : st) {
      if (s.code() != st[0].code()) {
        std::string all;
        for (const Status& x : st) all += "\n  " + x.ToString();
        return ::testing::AssertionFailure() << "ranks disagree:" << all;
      }
    }
    return ::testing::AssertionSuccess();
  }

  std::string dir_, golden_, dry_root_;
  int runs_ = 0;
  std::vector<RecordingFileSystem::Op> ops_;
  std::array<int64_t, kNumOpKinds> per_kind_{};
  int64_t rename_index_ = -1;
};

// A crash before or after every operation of the save: the crash point k
// makes op k and everything after it fail.
TEST_F(FaultTest, CrashAtEveryOperationLeavesOldOrNewCheckpoint) {
  ASSERT_NO_FATAL_FAILURE(DryRun());
  const int64_t total = static_cast<int64_t>(ops_.size());
  ASSERT_GT(total, 20) << "expected several files per rank";
  for (int64_t k = 0; k < total; ++k) {
    const std::string what = "crash at op k=" + std::to_string(k) + " of " +
                             std::to_string(total) + " (" + Describe(k) + ")";
    const std::string root = FreshRoot();
    FaultInjectingFileSystem faulty(DefaultFileSystem());
    faulty.FailAfter(k, UnavailableError("injected crash"));
    auto st = SaveStep(root, 2, &faulty);
    EXPECT_TRUE(SameOnAllRanks(st)) << what;
    // Save succeeds exactly when committed (checkpoint.h): the crash stops
    // the rest, but after the rename the checkpoint is there.
    EXPECT_EQ(st[0].ok(), k > rename_index_) << what << ": " << st[0].ToString();
    EXPECT_GT(faulty.injected_failures(), 0) << what;
    // The commit point is the rename: step 2 exists iff it happened.
    ASSERT_NO_FATAL_FAILURE(CheckRoot(root, /*step2=*/k > rename_index_, what));
    fs::remove_all(root);
    if (HasFatalFailure()) return;
  }
}

// A save whose data files do not fit in what the file system has free fails
// on every rank before it creates or writes anything; the root is as it was.
TEST_F(FaultTest, ASaveThatDoesNotFitFailsBeforeItWritesAnything) {
  const std::string root = FreshRoot();
  FaultInjectingFileSystem faulty(DefaultFileSystem());
  faulty.SetFreeBytes(10);
  auto st = SaveStep(root, 2, &faulty);
  EXPECT_TRUE(SameOnAllRanks(st));
  EXPECT_EQ(st[0].code(), StatusCode::kResourceExhausted) << st[0].ToString();
  EXPECT_THAT(st[0].message(), HasSubstr("10 bytes free; nothing was written"));
  EXPECT_THAT(st[0].message(), HasSubstr(root));
  EXPECT_EQ(faulty.count(OpKind::kCreate), 0);
  EXPECT_EQ(faulty.count(OpKind::kCreateDir), 0);
  ASSERT_NO_FATAL_FAILURE(CheckRoot(root, /*step2=*/false, "refused for space"));
  faulty.SetFreeBytes(std::nullopt);  // the space is there again
  for (const Status& s : SaveStep(root, 2, &faulty)) EXPECT_TRUE(s.ok()) << s.ToString();
}

// Each operation failing alone (a transient fault), kind by kind.
TEST_F(FaultTest, EachSingleFailureIsAllOrNothing) {
  ASSERT_NO_FATAL_FAILURE(DryRun());
  int exercised = 0;
  for (int kind = 0; kind < kNumOpKinds; ++kind) {
    const OpKind k = static_cast<OpKind>(kind);
    for (int64_t n = 0; n < per_kind_[kind]; ++n) {
      const int64_t g = GlobalIndex(k, n);
      ASSERT_GE(g, 0);
      const std::string what = "failing " + std::string(OpKindName(k)) + " #" + std::to_string(n) +
                               " (op k=" + std::to_string(g) + ": " + Describe(g) + ")";
      const std::string root = FreshRoot();
      FaultInjectingFileSystem faulty(DefaultFileSystem());
      faulty.FailNth(k, n, UnavailableError("injected fault"));
      std::vector<std::vector<std::string>> warnings;
      auto st = SaveStep(root, 2, &faulty, 0, &warnings);
      ++exercised;
      EXPECT_EQ(faulty.injected_failures(), 1) << what;
      EXPECT_TRUE(SameOnAllRanks(st)) << what;
      bool step2;
      if (g < rename_index_ && IsLeftoverCleanup(g)) {
        // Removing an old leftover is best effort: the save goes on.
        EXPECT_TRUE(st[0].ok()) << what << ": " << st[0].ToString();
        step2 = true;
      } else if (g <= rename_index_) {
        EXPECT_EQ(st[0].code(), StatusCode::kUnavailable) << what << ": " << st[0].ToString();
        EXPECT_THAT(st[0].message(), HasSubstr("injected fault")) << what;
        step2 = false;
      } else {
        // After the commit point: committed, so a success with a warning.
        EXPECT_TRUE(st[0].ok()) << what << ": " << st[0].ToString();
        EXPECT_TRUE(WarnedAlike(warnings, "injected fault")) << what;
        step2 = true;
      }
      ASSERT_NO_FATAL_FAILURE(CheckRoot(root, step2, what));
      fs::remove_all(root);
      if (HasFatalFailure()) return;
    }
  }
  EXPECT_EQ(exercised, static_cast<int>(ops_.size()));
}

// checkpoint.h: "if any rank fails ..., every rank returns an error and
// nothing is committed". A lone fault after the commit rename (the fsync of
// ROOT, or any step of replacing `latest`) must therefore either be reported
// as success (the checkpoint is committed) or undo the commit; an error with
// the checkpoint left committed tells the caller the save failed while the
// checkpoint is there (a retry then fails with AlreadyExists).
TEST_F(FaultTest, FailureAfterCommitPointIsReportedConsistently) {
  ASSERT_NO_FATAL_FAILURE(DryRun());
  const int64_t total = static_cast<int64_t>(ops_.size());
  ASSERT_GT(total, rename_index_ + 1) << "expected operations after the commit rename";
  for (int64_t g = rename_index_ + 1; g < total; ++g) {
    const OpKind k = ops_[g].kind;
    int64_t n = 0;
    for (int64_t i = 0; i < g; ++i) n += ops_[i].kind == k;
    const std::string what = "failing " + std::string(OpKindName(k)) + " #" + std::to_string(n) +
                             " (op k=" + std::to_string(g) + ": " + Describe(g) + ")";
    const std::string root = FreshRoot();
    FaultInjectingFileSystem faulty(DefaultFileSystem());
    faulty.FailNth(k, n, UnavailableError("injected fault"));
    std::vector<std::vector<std::string>> warnings;
    auto st = SaveStep(root, 2, &faulty, 0, &warnings);
    EXPECT_TRUE(SameOnAllRanks(st)) << what;
    if (st[0].ok()) {
      EXPECT_TRUE(WarnedAlike(warnings, "injected fault")) << what;
    }
    auto list = ListCheckpoints(root);
    ASSERT_TRUE(list.ok());
    bool committed = false;
    for (const auto& c : *list) committed |= c.tag == Tag(2);
    EXPECT_EQ(st[0].ok(), committed)
        << what << ": save returned " << st[0].ToString() << " but step 2 is "
        << (committed ? "committed" : "not committed");
    fs::remove_all(root);
  }
}

// The same for retention: CheckpointManager::Save prunes after the commit,
// so a failure there must not turn a committed save into an error either.
TEST_F(FaultTest, RetentionFailureAfterCommitIsReportedConsistently) {
  // In a keep_last=1 save of step 2, rename #0 commits step 2, #1 replaces
  // `latest`, #2 hides step 1; removes #0-1 are the old leftovers, #2
  // deletes the hidden step 1.
  for (OpKind kind : {OpKind::kRename, OpKind::kRemove}) {
    const int64_t n = 2;
    const std::string what = "failing retention " + std::string(OpKindName(kind)) + " #" +
                             std::to_string(n);
    const std::string root = FreshRoot();
    FaultInjectingFileSystem faulty(DefaultFileSystem());
    faulty.FailNth(kind, n, UnavailableError("injected fault"));
    std::vector<std::vector<std::string>> warnings;
    auto st = SaveStep(root, 2, &faulty, /*keep_last=*/1, &warnings);
    EXPECT_EQ(faulty.injected_failures(), 1) << what;
    EXPECT_TRUE(SameOnAllRanks(st)) << what;
    EXPECT_EQ(ReadLatest(root).value_or("?"), Tag(2) + "\n") << what;
    EXPECT_TRUE(LoadsBitExact(root, 2)) << what;
    EXPECT_TRUE(st[0].ok()) << what << ": save returned " << st[0].ToString()
                            << " but step 2 is committed and latest";
    if (st[0].ok()) {
      EXPECT_TRUE(WarnedAlike(warnings, "retention")) << what;
    }
    fs::remove_all(root);
  }
}

// Save with overwrite swaps the new checkpoint in (RENAME_EXCHANGE), fsyncs
// ROOT, then deletes the old one. If that fsync fails, the save must not
// report an error after the old checkpoint has been replaced and deleted.
TEST_F(FaultTest, OverwriteFailingAfterTheExchangeKeepsOldOrReportsSuccess) {
  const std::string root = FreshRoot();
  const std::string path = root + "/" + Tag(1);  // holds step 1's data
  // Syncdir #0 is the temporary directory (step 4), #1 ROOT after the swap.
  FaultInjectingFileSystem faulty(DefaultFileSystem());
  faulty.FailNth(OpKind::kSyncDir, 1, UnavailableError("injected fault"));
  std::vector<Status> st(kRanks);
  std::vector<std::vector<std::string>> warnings(kRanks);
  RunRanks(kRanks, [&](int r, Comm& comm) {
    auto rs = MakeRankState(2, r);
    SaveOptions opts;
    opts.max_file_bytes = kMaxFileBytes;
    opts.overwrite = true;
    opts.fs = &faulty;
    auto saved = Save(rs->state, path, comm, opts);
    st[r] = saved.status();
    if (saved.ok()) warnings[r] = saved->warnings;
  });
  ASSERT_EQ(faulty.injected_failures(), 1);
  ASSERT_GE(faulty.count(OpKind::kRename), 1) << "the exchange did not run";
  EXPECT_TRUE(SameOnAllRanks(st));
  if (st[0].ok()) {
    EXPECT_TRUE(LoadsBitExact(path, 2, {}, Tag(1)));
    EXPECT_TRUE(WarnedAlike(warnings, "injected fault"));
    EXPECT_THAT(DirNames(root), ::testing::Not(::testing::Contains(::testing::StartsWith(".tmp-"))))
        << "the old checkpoint was not removed after the swap";
  } else {
    EXPECT_TRUE(LoadsBitExact(path, 1, {}, Tag(1)))
        << "the save returned " << st[0].ToString()
        << ", but the old checkpoint is no longer there";
  }
  fs::remove_all(root);
}

TEST_F(FaultTest, DiskFullIsResourceExhaustedOnEveryRankAndNothingIsCommitted) {
  ASSERT_NO_FATAL_FAILURE(DryRun());
  const int64_t appends = per_kind_[static_cast<int>(OpKind::kAppend)];
  // Appends before the commit point: data files, then the index. (A full
  // disk while replacing `latest`, after the commit point, is in
  // FailureAfterCommitPointIsReportedConsistently.)
  int64_t last = -1;
  for (int64_t n = 0; n < appends; ++n) {
    if (GlobalIndex(OpKind::kAppend, n) < rename_index_) last = n;
  }
  ASSERT_GT(last, 2);
  for (int64_t n : {int64_t{0}, last / 2, last - 1, last}) {
    const std::string what = "disk full at append #" + std::to_string(n) + " (op k=" +
                             std::to_string(GlobalIndex(OpKind::kAppend, n)) + ": " +
                             Describe(GlobalIndex(OpKind::kAppend, n)) + ")";
    const std::string root = FreshRoot();
    FaultInjectingFileSystem faulty(DefaultFileSystem());
    faulty.FailNth(OpKind::kAppend, n, ResourceExhaustedError("no space left on device (injected)"));
    auto st = SaveStep(root, 2, &faulty);
    for (int r = 0; r < kRanks; ++r) {
      EXPECT_EQ(st[r].code(), StatusCode::kResourceExhausted) << what << " rank " << r << ": "
                                                              << st[r].ToString();
      EXPECT_THAT(st[r].message(), HasSubstr("no space left")) << what;
    }
    // Nothing committed, and the failed save removed its own temporary
    // directory (the old leftovers were removed before it started).
    EXPECT_THAT(DirNames(root), ::testing::ElementsAre("latest", Tag(1))) << what;
    EXPECT_EQ(ReadLatest(root).value_or("?"), Tag(1) + "\n") << what;
    ASSERT_NO_FATAL_FAILURE(CheckRoot(root, false, what));
    fs::remove_all(root);
  }
}

// ----------------------------------------------------------- load side --

class FaultLoadTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::MakeTempDir("faultload");
    for (const Status& s : SaveStep(dir_, 1, nullptr)) ASSERT_TRUE(s.ok()) << s.ToString();
    ckpt_ = dir_ + "/" + Tag(1);
    ASSERT_TRUE(LoadsBitExact(ckpt_, 1));
    files_.clear();
    for (const auto& name : DirNames(ckpt_)) {
      if (name.starts_with("data-")) files_.push_back(name);
    }
    ASSERT_GE(files_.size(), 4u);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // Loads everything on every rank; all ranks must fail alike.
  Status LoadAllFails(StatusCode code, const std::string& mentions) {
    std::vector<Status> st(kRanks);
    RunRanks(kRanks, [&](int r, Comm& comm) {
      std::vector<std::vector<std::byte>> bufs;
      bufs.reserve(3);  // the request points into them
      LoadRequest req;
      for (auto [key, dtype, shape] : {std::tuple{"w", DType::kF32, kW},
                                       std::tuple{"b", DType::kBF16, kB},
                                       std::tuple{"m", DType::kF64, kM}}) {
        bufs.emplace_back(*NumBytes(dtype, ShapeElements(shape)));
        req.tensors.push_back({key, dtype, shape, {Box::Whole(shape), std::nullopt},
                               bufs.back().data()});
      }
      st[r] = Load(req, ckpt_, comm, {}).status();
    });
    for (int r = 0; r < kRanks; ++r) {
      EXPECT_EQ(st[r].code(), code) << "rank " << r << ": " << st[r].ToString();
      EXPECT_THAT(st[r].message(), HasSubstr(mentions)) << "rank " << r;
    }
    return st[0];
  }

  static uint64_t ShapeElements(const Shape& s) {
    uint64_t n = 1;
    for (uint64_t d : s) n *= d;
    return n;
  }

  Json ReadIndex() {
    std::ifstream in(ckpt_ + "/shardsafe.json");
    return Json::parse(in);
  }
  void WriteIndex(const std::string& text) {
    std::ofstream(ckpt_ + "/shardsafe.json", std::ios::binary | std::ios::trunc) << text;
  }

  std::string dir_, ckpt_;
  std::vector<std::string> files_;
};

TEST_F(FaultLoadTest, TruncatedDataFileIsDataLossNamingTheFile) {
  for (const std::string& name : {files_.front(), files_.back()}) {
    SCOPED_TRACE(name);
    const std::string path = ckpt_ + "/" + name;
    const auto size = fs::file_size(path);
    const std::string keep = dir_ + "/keep";
    fs::copy_file(path, keep, fs::copy_options::overwrite_existing);
    fs::resize_file(path, size - 1);
    LoadAllFails(StatusCode::kDataLoss, name).IgnoreError();
    fs::resize_file(path, size / 2);
    LoadAllFails(StatusCode::kDataLoss, name).IgnoreError();
    fs::copy_file(keep, path, fs::copy_options::overwrite_existing);
  }
  EXPECT_TRUE(LoadsBitExact(ckpt_, 1));
}

TEST_F(FaultLoadTest, DeletedDataFileIsDataLossNamingTheFile) {
  const std::string name = files_[files_.size() / 2];
  fs::remove(ckpt_ + "/" + name);
  LoadAllFails(StatusCode::kDataLoss, name).IgnoreError();
}

TEST_F(FaultLoadTest, FlippedPayloadByteIsChecksumMismatchNamingTheFile) {
  const std::string name = files_.front();
  const std::string path = ckpt_ + "/" + name;
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(-1, std::ios::end);
  char c;
  f.get(c);
  f.seekp(-1, std::ios::end);
  f.put(static_cast<char>(c ^ 0x01));
  f.close();
  Status st = LoadAllFails(StatusCode::kDataLoss, name);
  EXPECT_THAT(st.message(), HasSubstr("checksum"));
}

TEST_F(FaultLoadTest, GarbageIndexIsDataLossNamingTheIndex) {
  for (std::string text : {"{\"format\": \"shardsafe\", \"version\": 1, ", "not json at all", "",
                           "[]"}) {
    SCOPED_TRACE(text);
    WriteIndex(text);
    LoadAllFails(StatusCode::kDataLoss, "shardsafe.json").IgnoreError();
  }
}

TEST_F(FaultLoadTest, ChunkPastTheEndOfItsFileIsDataLossNamingTheIndex) {
  Json index = ReadIndex();
  Json& chunk = index["tensors"]["w"]["chunks"][0];
  const uint64_t file_bytes = index["files"][chunk["file"].get<size_t>()]["bytes"].get<uint64_t>();
  chunk["at"] = file_bytes - chunk["bytes"].get<uint64_t>() + 1;  // one byte past the end
  WriteIndex(index.dump());
  Status st = LoadAllFails(StatusCode::kDataLoss, "shardsafe.json");
  EXPECT_THAT(st.message(), HasSubstr("at"));
}

TEST_F(FaultLoadTest, IndexClaimingALargerFileIsDataLossNamingTheFile) {
  // The index is self-consistent but the data file on disk is shorter than
  // it says (e.g. a copy that was cut short).
  Json index = ReadIndex();
  const size_t f = index["tensors"]["m"]["chunks"][0]["file"].get<size_t>();
  const std::string name = index["files"][f]["name"];
  const std::string path = ckpt_ + "/" + name;
  fs::resize_file(path, fs::file_size(path) - 3);
  LoadAllFails(StatusCode::kDataLoss, name).IgnoreError();
}

}  // namespace
}  // namespace shardsafe
