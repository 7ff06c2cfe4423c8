// A real crash: a child process saves checkpoints into a root in a loop and
// is killed with SIGKILL at a random moment; the parent then checks that
// every committed checkpoint loads bit-exact, `latest` names a committed
// checkpoint, and the next save succeeds and leaves no leftover.
#include <gtest/gtest.h>
#include <gmock/gmock.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "testing/test_util.h"

namespace shardsafe {
namespace {

using Json = nlohmann::json;

namespace fs = std::filesystem;

struct TensorSpec {
  const char* key;
  DType dtype;
  Shape shape;
};

// ~24 MiB per checkpoint, one file per tensor (written in parallel).
const TensorSpec kTensors[] = {
    {"embed", DType::kF32, {2048, 1024}},
    {"layers.0.w", DType::kBF16, {4096, 1024}},
    {"layers.0.m", DType::kF32, {1024, 2048}},
};
constexpr uint64_t kMaxFileBytes = 9 << 20;

uint64_t SplitMix(uint64_t& x) {
  uint64_t z = (x += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// The bytes of tensor `key` at `step`: cheap to make, different per step.
std::vector<std::byte> StepBytes(const TensorSpec& t, int64_t step) {
  uint64_t n = 1;
  for (uint64_t d : t.shape) n *= d;
  std::vector<std::byte> out(*NumBytes(t.dtype, n));
  uint64_t x = std::hash<std::string>{}(t.key) ^ (static_cast<uint64_t>(step) * 0xD1B54A32D192ED03ull);
  for (size_t i = 0; i < out.size(); i += 8) {
    const uint64_t v = SplitMix(x);
    std::memcpy(out.data() + i, &v, std::min<size_t>(8, out.size() - i));
  }
  return out;
}

std::string RngBlob(int64_t step) { return "rng state at step " + std::to_string(step); }

Status SaveStep(const std::string& root, int64_t step) {
  std::vector<std::vector<std::byte>> data;
  data.reserve(std::size(kTensors));  // the state points into them
  SaveState state;
  for (const auto& t : kTensors) {
    data.push_back(StepBytes(t, step));
    state.tensors.push_back({t.key, t.dtype, t.shape, {Box::Whole(t.shape), std::nullopt},
                             data.back().data()});
  }
  const std::string rng = RngBlob(step);
  state.blobs.push_back({"rng", rng.data(), rng.size(), /*per_rank=*/true});
  state.values = Json{{"step", step}}.dump();
  auto comm = MakeSingleProcessComm();
  CheckpointManager m(root, {.keep_last = 2});
  SaveOptions opts;
  opts.max_file_bytes = kMaxFileBytes;
  return m.Save(step, state, *comm, opts).status();
}

// Loads `path` whole and compares with `step`'s bytes; checksums verified.
::testing::AssertionResult LoadsBitExact(const std::string& path, int64_t step) {
  std::vector<std::vector<std::byte>> bufs;
  bufs.reserve(std::size(kTensors));  // the request points into them
  LoadRequest req;
  for (const auto& t : kTensors) {
    bufs.emplace_back(StepBytes(t, step).size(), std::byte{0xEE});
    req.tensors.push_back({t.key, t.dtype, t.shape, {Box::Whole(t.shape), std::nullopt},
                           bufs.back().data()});
  }
  auto comm = MakeSingleProcessComm();
  LoadOptions opts;
  opts.verify_checksums = true;
  auto res = Load(req, path, *comm, opts);
  if (!res.ok()) return ::testing::AssertionFailure() << path << ": " << res.status().ToString();
  for (size_t i = 0; i < std::size(kTensors); ++i) {
    if (bufs[i] != StepBytes(kTensors[i], step)) {
      return ::testing::AssertionFailure() << path << ": tensor " << kTensors[i].key
                                           << " is not step " << step << "'s";
    }
  }
  if (Json::parse(res->values).value("step", int64_t{-1}) != step) {
    return ::testing::AssertionFailure() << path << ": values " << res->values;
  }
  if (res->blobs["rng"] != RngBlob(step)) {
    return ::testing::AssertionFailure() << path << ": blob rng differs";
  }
  if (res->chunks_verified != std::size(kTensors)) {  // blobs are checked apart
    return ::testing::AssertionFailure() << path << ": " << res->chunks_verified
                                         << " chunks verified";
  }
  return ::testing::AssertionSuccess();
}

int64_t MaxStep(const std::string& root) {
  auto list = ListCheckpoints(root);
  int64_t max = 0;
  if (list.ok()) {
    for (const auto& c : *list) max = std::max(max, c.step.value_or(0));
  }
  return max;
}

std::vector<std::string> DirNames(const std::string& dir) {
  std::vector<std::string> out;
  for (auto& e : fs::directory_iterator(dir)) out.push_back(e.path().filename());
  std::sort(out.begin(), out.end());
  return out;
}

// The child: save step after step until killed. Tells the parent through
// `ready` when the first save starts.
[[noreturn]] void SaveForever(const std::string& root, int ready) {
  int64_t step = MaxStep(root) + 1;
  const char go = 'g';
  if (write(ready, &go, 1) != 1) _exit(3);
  close(ready);
  for (int i = 0; i < 1000; ++i, ++step) {
    Status s = SaveStep(root, step);
    if (!s.ok()) {
      fprintf(stderr, "child: save of step %lld failed: %s\n", static_cast<long long>(step),
              s.ToString().c_str());
      _exit(2);
    }
  }
  _exit(0);
}

class CrashTest : public ::testing::Test {
 protected:
  void SetUp() override { root_ = testing::MakeTempDir("crash"); }
  void TearDown() override { fs::remove_all(root_); }
  std::string root_;
};

TEST_F(CrashTest, KilledSaveLeavesOnlyCompleteCheckpoints) {
  // A first checkpoint, and how long one save takes here.
  auto t0 = std::chrono::steady_clock::now();
  ASSERT_TRUE(SaveStep(root_, 1).ok());
  const double save_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  RecordProperty("save_ms", static_cast<int>(save_ms));

  const unsigned seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed) + ", one save takes " +
               std::to_string(static_cast<int>(save_ms)) + " ms");
  std::mt19937 rng(seed);
  // A fixed number of kills, however slow the machine: the test counts
  // outcomes, never what happens within a time.
  constexpr int kIterations = 8;
  constexpr int kMaxDelayUs = 300'000;
  int kills = 0, mid_save = 0;
  for (int it = 0; it < kIterations; ++it) {
    // Stratified: iteration i kills within its own slice of 0-300 ms.
    std::uniform_int_distribution<int> pick(it * kMaxDelayUs / kIterations,
                                            (it + 1) * kMaxDelayUs / kIterations);
    const int delay_us = pick(rng);
    SCOPED_TRACE("iteration " + std::to_string(it) + ", kill after " +
                 std::to_string(delay_us / 1000) + " ms");
    const int64_t before = MaxStep(root_);

    int pipefd[2];
    ASSERT_EQ(pipe(pipefd), 0);
    fflush(nullptr);
    const pid_t pid = fork();
    ASSERT_GE(pid, 0) << strerror(errno);
    if (pid == 0) {
      close(pipefd[0]);
      SaveForever(root_, pipefd[1]);
    }
    close(pipefd[1]);
    char go = 0;
    const ssize_t got = read(pipefd[0], &go, 1);
    close(pipefd[0]);
    if (got == 1) std::this_thread::sleep_for(std::chrono::microseconds(delay_us));
    kill(pid, SIGKILL);
    int wstatus = 0;
    ASSERT_EQ(waitpid(pid, &wstatus, 0), pid);
    ASSERT_EQ(got, 1) << "child died before saving";
    if (WIFEXITED(wstatus)) {
      FAIL() << "child exited by itself with status " << WEXITSTATUS(wstatus);
    }
    ASSERT_TRUE(WIFSIGNALED(wstatus) && WTERMSIG(wstatus) == SIGKILL);
    ++kills;

    // Every listed checkpoint is complete and is the step its name says.
    auto list = ListCheckpoints(root_);
    ASSERT_TRUE(list.ok()) << list.status().ToString();
    ASSERT_FALSE(list->empty()) << "no committed checkpoint left";
    for (const std::string& name : DirNames(root_)) mid_save += name.starts_with(".tmp-");
    std::string listed;
    for (const auto& c : *list) listed += c.tag + " ";
    SCOPED_TRACE("listed: " + listed + "| in root: " + ::testing::PrintToString(DirNames(root_)));
    EXPECT_GE(list->back().step.value_or(0), before) << "a committed checkpoint disappeared";
    for (const auto& c : *list) {
      ASSERT_TRUE(c.step.has_value()) << c.tag;
      EXPECT_TRUE(LoadsBitExact(c.path, *c.step));
    }
    // `latest`, if there, names a committed checkpoint (it may lag behind
    // the newest one when the kill fell between the rename and its update).
    std::ifstream in(root_ + "/latest");
    if (in) {
      std::stringstream ss;
      ss << in.rdbuf();
      std::string text = ss.str();
      ASSERT_TRUE(text.ends_with("\n")) << "latest: \"" << text << "\"";
      text.pop_back();
      bool found = false;
      for (const auto& c : *list) found |= c.tag == text;
      EXPECT_TRUE(found) << "latest names \"" << text << "\", which is not committed";
      auto comm = MakeSingleProcessComm();
      auto res = Load({}, root_, *comm, {});
      ASSERT_TRUE(res.ok()) << res.status().ToString();
      // ... and the root resolves to the newest committed checkpoint, which
      // overrules a `latest` left behind by a kill after the commit.
      EXPECT_EQ(res->tag, list->back().tag) << "loading the root (latest: " << text << ")";
    }

    // The next save in the same root succeeds and removes every leftover.
    const int64_t next = list->back().step.value_or(0) + 1;
    Status s = SaveStep(root_, next);
    ASSERT_TRUE(s.ok()) << "save of step " << next << " after the kill: " << s.ToString();
    for (const std::string& name : DirNames(root_)) {
      EXPECT_FALSE(name.starts_with(".")) << "leftover after the next save: " << name;
    }
    EXPECT_TRUE(LoadsBitExact(root_, next));
    auto after = ListCheckpoints(root_);
    ASSERT_TRUE(after.ok());
    EXPECT_LE(after->size(), 2u) << "keep_last=2";
    if (HasFatalFailure()) return;
  }
  RecordProperty("kills", kills);
  RecordProperty("kills_leaving_a_partial_save", mid_save);
  EXPECT_EQ(kills, kIterations);
}

}  // namespace
}  // namespace shardsafe
