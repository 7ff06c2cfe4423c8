// Memory of opening a checkpoint with a large index (docs/format.md §3):
// ParseIndex, `shardsafe inspect`, `shardsafe verify` and a one-rank Load
// must each raise a process's peak resident memory by at most 3x the size
// of shardsafe.json (ParseIndex by at most 2x: the tools also hold the
// text they read).
//
// The checkpoint, written once by a child process so that this one stays
// small: 640 BF16 tensors of 1,024 flat chunks each (what a ZeRO save of a
// large job gives: many small chunks), round robin over 64 data files with
// real headers and checksums. Its index is ~69 MB at ~105 bytes a chunk;
// the 4,096-rank plan of bench/planner_benchmark writes 126 (shorter
// numbers make this the harder case: the parsed index's size is per chunk).
//
// Each measurement runs in a process of its own that starts small. The
// library calls run in a forked child: Linux starts a child's high-water
// mark (VmHWM) at its resident size at the fork, so VmHWM at the end less
// VmRSS at the start is what the call added. The tool runs as its own
// program: its ru_maxrss less that of the same command over a one-tensor
// checkpoint (the program's own footprint; the size this process had when
// it forked counts in both, and is checked to be below the smaller).
//
// Registered only in builds without sanitizers (tests/CMakeLists.txt),
// whose allocators pad every block and keep freed memory.
#include <fcntl.h>
#include <malloc.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "base/crc32c.h"
#include "format/index.h"
#include "format/safetensors.h"
#include "shardsafe/checkpoint.h"
#include "shardsafe/comm.h"
#include "shardsafe/filesystem.h"
#include "shardsafe/tools.h"

namespace shardsafe {
namespace {

constexpr uint64_t kRow = 8;  // BF16 elements a chunk

struct Layout {
  int tensors;
  int chunks;  // a tensor's
  int files;
};
constexpr Layout kLarge = {640, 1024, 64};
constexpr Layout kTiny = {1, 4, 1};

std::string Key(int t) {
  char key[64];  // sorted as made: the index lists them in this order
  std::snprintf(key, sizeof key, "model.layers.%03d.mlp.experts.%d.w%d", t / 24, t / 3 % 8, t % 3);
  return key;
}

Shape TensorShape(const Layout& l) { return {static_cast<uint64_t>(l.chunks), kRow}; }

// Chunk c of tensor t: a flat range of the whole box, in file (t*chunks+c)
// % files, its bytes a pattern of its number.
void WriteCheckpoint(const std::string& dir, const Layout& l) {
  CheckpointIndex index;
  index.world_size = l.files;
  std::vector<std::vector<EntrySpec>> entries(l.files);
  for (int t = 0; t < l.tensors; ++t) {
    IndexTensor& tensor = index.tensors[Key(t)];
    tensor.dtype = DType::kBF16;
    tensor.shape = TensorShape(l);
    for (uint64_t c = 0; c < static_cast<uint64_t>(l.chunks); ++c) {
      const uint32_t f = (t * l.chunks + c) % l.files;
      const Slice slice{Box::Whole(tensor.shape), FlatRange{c * kRow, (c + 1) * kRow}};
      entries[f].push_back({ChunkEntryName(Key(t), slice, tensor.shape), DType::kBF16, {kRow},
                            kRow * 2});
      tensor.chunks.push_back({slice, f, 0, kRow * 2, 0});
    }
  }
  std::vector<SafetensorsLayout> layouts;
  std::vector<std::string> data(l.files);
  for (int f = 0; f < l.files; ++f) {
    auto layout = BuildSafetensorsHeader(entries[f], std::nullopt, kDataFileAlignment);
    ASSERT_TRUE(layout.ok()) << layout.status().ToString();
    data[f] = layout->header;
    data[f].resize(layout->file_size);
    index.files.push_back({"data-" + std::to_string(f) + ".safetensors", layout->file_size, f});
    layouts.push_back(std::move(*layout));
  }
  std::vector<size_t> next(l.files);  // each file's entries, in the order made
  uint64_t n = 0;
  for (auto& [key, tensor] : index.tensors) {
    for (IndexChunk& c : tensor.chunks) {
      c.at = layouts[c.file].offsets[next[c.file]++];
      for (uint64_t b = 0; b < c.bytes; ++b) data[c.file][c.at + b] = static_cast<char>(n * 31 + b);
      c.crc32c = Crc32c(data[c.file].data() + c.at, c.bytes);
      ++n;
    }
  }
  for (int f = 0; f < l.files; ++f) {
    std::ofstream(dir + "/" + index.files[f].name, std::ios::binary) << data[f];
  }
  std::ofstream(dir + "/" + std::string(kIndexFileName), std::ios::binary)
      << SerializeIndex(index);
}

// A size from /proc/self/status ("VmRSS:", "VmHWM:"), in bytes.
uint64_t StatusBytes(const std::string& field) {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind(field, 0) == 0) return std::stoull(line.substr(field.size())) << 10;
  }
  return 0;
}

// Runs `work` in a forked child; returns how far the child's peak resident
// size rose above its size when `work` began, or nullopt if `work` failed.
// `prepare` runs first, outside the measurement.
std::optional<uint64_t> ChildPeakGrowth(const std::function<void()>& prepare,
                                        const std::function<bool()>& work) {
  int fds[2];
  if (pipe(fds) != 0) return std::nullopt;
  const pid_t pid = fork();
  if (pid == 0) {
    close(fds[0]);
    prepare();
    malloc_trim(0);  // freed heap reused by `work` counts as growth
    const uint64_t before = StatusBytes("VmRSS:");
    uint64_t growth = UINT64_MAX;
    if (work()) growth = StatusBytes("VmHWM:") - before;
    const bool sent = write(fds[1], &growth, sizeof growth) == sizeof growth;
    _exit(sent ? 0 : 1);
  }
  close(fds[1]);
  uint64_t growth = UINT64_MAX;
  const bool got = read(fds[0], &growth, sizeof growth) == sizeof growth;
  close(fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  if (!got || growth == UINT64_MAX || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    return std::nullopt;
  }
  return growth;
}

struct ToolRun {
  uint64_t peak = 0;  // ru_maxrss, in bytes
  int exit_code = -1;
};

// `shardsafe ARGS...` as a child process, its output discarded.
ToolRun RunTool(std::vector<std::string> args) {
  args.insert(args.begin(), SHARDSAFE_CLI);
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  const pid_t pid = fork();
  if (pid == 0) {
    const int null = open("/dev/null", O_WRONLY);
    dup2(null, 1);
    dup2(null, 2);
    execv(argv[0], argv.data());
    _exit(127);
  }
  int status = 0;
  rusage usage{};
  wait4(pid, &status, 0, &usage);
  return {static_cast<uint64_t>(usage.ru_maxrss) << 10, WIFEXITED(status) ? WEXITSTATUS(status) : -1};
}

class IndexMemoryTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    root_ = new std::string(testing::TempDir() + "/index_memory_" + std::to_string(getpid()));
    for (const auto& [name, layout] : {std::pair{"large", kLarge}, std::pair{"tiny", kTiny}}) {
      std::filesystem::create_directories(*root_ + "/" + name);
      const pid_t pid = fork();  // the writer's memory stays out of this process
      if (pid == 0) {
        WriteCheckpoint(*root_ + "/" + name, layout);
        _exit(::testing::Test::HasFailure() ? 1 : 0);
      }
      int status = 0;
      waitpid(pid, &status, 0);
      ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "writing " << name;
    }
    index_bytes_ = std::filesystem::file_size(Large() + "/" + std::string(kIndexFileName));
  }
  static void TearDownTestSuite() {
    std::filesystem::remove_all(*root_);
    delete root_;
  }

  static std::string Large() { return *root_ + "/large"; }
  static std::string Tiny() { return *root_ + "/tiny"; }

  // How far `shardsafe ARGS... DIR` rises above its own footprint (the
  // same command over the tiny checkpoint), checking that both succeed.
  static uint64_t ToolGrowth(const std::vector<std::string>& args) {
    std::vector<std::string> tiny = args, large = args;
    tiny.push_back(Tiny());
    large.push_back(Large());
    const uint64_t here = StatusBytes("VmRSS:");  // counted in both runs' ru_maxrss
    const ToolRun base = RunTool(tiny);
    const ToolRun run = RunTool(large);
    EXPECT_EQ(base.exit_code, 0);
    EXPECT_EQ(run.exit_code, 0);
    EXPECT_LT(here, base.peak) << "this process is too large for the tiny run to measure the "
                                  "tool's own footprint";
    std::printf("shardsafe %s: peak %.1f MB, own footprint %.1f MB\n", args[0].c_str(),
                run.peak / 1e6, base.peak / 1e6);
    return run.peak - base.peak;
  }

  static void ExpectAtMost(double times, uint64_t growth) {
    std::printf("index %.1f MB: peak growth %.1f MB = %.2f x\n", index_bytes_ / 1e6,
                growth / 1e6, static_cast<double>(growth) / index_bytes_);
    EXPECT_LE(growth, times * index_bytes_);
  }

  static inline std::string* root_ = nullptr;
  static inline uint64_t index_bytes_ = 0;
};

TEST_F(IndexMemoryTest, TheIndexIsLarge) {
  EXPECT_GE(index_bytes_, uint64_t{64} << 20);
}

TEST_F(IndexMemoryTest, ParseIndexTakesAtMostTwiceTheIndex) {
  std::string text;
  const std::string path = Large() + "/" + std::string(kIndexFileName);
  const auto growth = ChildPeakGrowth(
      [&] { text = ReadFileToString(*DefaultFileSystem(), path, kMaxIndexBytes).value(); },
      [&] {
        Result<CheckpointIndex> index = ParseIndex(text, path);
        return index.ok() && index->tensors.size() == static_cast<size_t>(kLarge.tensors);
      });
  ASSERT_TRUE(growth.has_value()) << "ParseIndex failed";
  ExpectAtMost(2, *growth);
}

TEST_F(IndexMemoryTest, InspectTakesAtMostThreeTimesTheIndex) {
  ExpectAtMost(3, ToolGrowth({"inspect"}));
}

TEST_F(IndexMemoryTest, InspectJsonTakesAtMostThreeTimesTheIndex) {
  ExpectAtMost(3, ToolGrowth({"inspect", "--json"}));
}

TEST_F(IndexMemoryTest, VerifyTakesAtMostThreeTimesTheIndex) {
  ExpectAtMost(3, ToolGrowth({"verify"}));
}

TEST_F(IndexMemoryTest, LoadTakesAtMostThreeTimesTheIndex) {
  std::vector<uint16_t> out(kLarge.chunks * kRow);
  const auto growth = ChildPeakGrowth([] {}, [&] {
    const Shape shape = TensorShape(kLarge);
    LoadRequest request;
    request.tensors.push_back({Key(7), DType::kBF16, shape, Slice{Box::Whole(shape), {}},
                               out.data()});
    auto comm = MakeSingleProcessComm();
    Result<LoadResult> r = Load(request, Large(), *comm, LoadOptions());
    if (!r.ok()) std::fprintf(stderr, "%s\n", r.status().ToString().c_str());
    return r.ok();
  });
  ASSERT_TRUE(growth.has_value()) << "Load failed";
  ExpectAtMost(3, *growth);
}

}  // namespace
}  // namespace shardsafe
