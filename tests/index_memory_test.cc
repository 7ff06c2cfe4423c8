// Memory of opening a checkpoint with a large index (docs/format.md §3,
// §3c): `shardsafe inspect` (and `--json`), `shardsafe verify`, `shardsafe
// export-hf` and Load (of one tensor, or of every tensor) must each raise a
// process's peak resident memory by at most 3x the size of the index; the
// read paths' parse (into PackedTensors) by at most 1.5x, ParseIndex into
// IndexTensors by at most 2x on "large" (it takes ~3x on "many": no read
// path holds that form).
//
// Four checkpoints, each written once by a child process so that this one
// stays small, with real headers and checksums:
//  - "large": 640 BF16 tensors of 1,024 flat chunks each (what a ZeRO save
//    of a large job gives: many small chunks), round robin over 64 data
//    files. Its JSON index is ~69 MB at ~105 bytes a chunk; the 4,096-rank
//    plan of planner_benchmark writes 126 (shorter numbers make this
//    the harder case: the parsed index's size is per chunk).
//  - "many": 500,000 BF16 tensors [8] of one whole chunk each (the tensors
//    of a large mixture of experts) in one data file, as one rank saves
//    them: a ~71 MB JSON index at ~142 bytes a tensor (keys of 19 bytes),
//    where the parsed index's size is per tensor (its key, shape, chunk
//    list), and a data file header of ~40 MB that `verify` checks.
//  - "table" and "many-table": the chunks of "large" and of "many" in a
//    version-4 chunk table, in one part per writing rank, with their
//    checksums in checksum files (what a save writes from 65,536 chunks
//    on). Their "index" is what a reader of every chunk must read to know
//    them: the JSON index, the table's parts and the checksum files (the
//    column of checksums the JSON index holds in version 1), ~65 MB at
//    ~102 bytes a chunk, ~98 MB at ~197 bytes a tensor. A load of one
//    tensor reads only the blocks of the table it needs, and is measured
//    against the same total.
// The loads check every byte they read.
//
// Each measurement runs in a process of its own that starts small. The
// library calls run in a forked child: Linux starts a child's high-water
// mark (VmHWM) at its resident size at the fork, so VmHWM at the end less
// VmRSS at the start is what the call added. The tool runs as its own
// program: its ru_maxrss less that of the same command over a one-tensor
// checkpoint (the program's own footprint). A forked child's ru_maxrss
// counts the size of what it was forked from, so the tool is started by a
// fresh process of this program that does nothing else (kSpawner).
//
// Registered only in builds without sanitizers (tests/CMakeLists.txt),
// whose allocators pad every block and keep freed memory.
#include <fcntl.h>
#include <malloc.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "base/crc32c.h"
#include "format/checksum_file.h"
#include "format/chunk_table.h"
#include "format/index.h"
#include "format/index_packed.h"
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
  int chunks;  // a tensor's; one is a whole-box chunk, more are flat ranges
  int files;   // data files, one per writing rank
  bool table = false;  // version 4: a chunk table in parts, checksum files
};
constexpr Layout kLarge = {640, 1024, 64};
constexpr Layout kMany = {500000, 1, 1};
constexpr Layout kTable = {640, 1024, 64, true};
constexpr Layout kManyTable = {500000, 1, 1, true};
constexpr Layout kTiny = {1, 4, 1};

std::string Key(const Layout& l, int t) {
  char key[64];
  if (l.tensors > 24000) {
    std::snprintf(key, sizeof key, "layers.%04d.e%03d.w%d", t / 384, t / 3 % 128, t % 3);
  } else {
    std::snprintf(key, sizeof key, "model.layers.%03d.mlp.experts.%d.w%d", t / 24, t / 3 % 8,
                  t % 3);
  }
  return key;
}

// [chunks, 8]; [8] for a tensor of one chunk.
Shape TensorShape(const Layout& l) {
  if (l.chunks == 1) return {kRow};
  return {static_cast<uint64_t>(l.chunks), kRow};
}

Slice ChunkSlice(const Layout& l, const Shape& shape, uint64_t c) {
  if (l.chunks == 1) return Slice{Box::Whole(shape), std::nullopt};
  return Slice{Box::Whole(shape), FlatRange{c * kRow, (c + 1) * kRow}};
}

// Version 4: the chunks' checksums move to a checksum file per writing
// rank (the rank of the chunk's data file), their records to a part of
// the chunk table per rank (tensor i in part i % files).
void MoveToTable(CheckpointIndex* index, std::map<std::string, std::string>* out) {
  std::vector<std::vector<ChunkChecksum>> sums(index->files.size());
  for (auto& [key, tensor] : index->tensors) {
    for (IndexChunk& c : tensor.chunks) {
      sums[c.file].push_back({c.file, c.at, *c.crc32c});
      c.crc32c.reset();
    }
  }
  for (size_t rank = 0; rank < sums.size(); ++rank) {
    char name[64];
    std::snprintf(name, sizeof name, "checksums-%05zu.crc32c", rank);
    (*out)[name] = EncodeChecksumFile(std::move(sums[rank]));
    index->checksum_files.push_back(static_cast<uint32_t>(index->files.size()));
    index->files.push_back({name, (*out)[name].size(), static_cast<int>(rank)});
  }
  std::vector<int> homes;
  for (size_t i = 0; i < index->tensors.size(); ++i) homes.push_back(i % sums.size());
  const EncodedChunkTable table = EncodeChunkTable(*index, homes, [](int rank) {
    char name[64];
    std::snprintf(name, sizeof name, "chunks-%05d.chunks", rank);
    return std::string(name);
  });
  for (size_t p = 0; p < table.parts.size(); ++p) (*out)[table.parts[p].name] = table.bytes[p];
  ASSERT_TRUE(SetChunkTable(table, index).ok());
}

// Chunk c of the tensor in place t of the index (key order) is chunk
// number n = t * chunks + c: in file n % files, its bytes a pattern of n.
void WriteCheckpoint(const std::string& dir, const Layout& l) {
  CheckpointIndex index;
  index.world_size = l.files;
  for (int t = 0; t < l.tensors; ++t) {
    index.tensors[Key(l, t)] = IndexTensor{DType::kBF16, TensorShape(l), {}};
  }
  std::vector<std::vector<EntrySpec>> entries(l.files);
  uint64_t n = 0;
  for (auto& [key, tensor] : index.tensors) {
    for (uint64_t c = 0; c < static_cast<uint64_t>(l.chunks); ++c, ++n) {
      const uint32_t f = n % l.files;
      const Slice slice = ChunkSlice(l, tensor.shape, c);
      entries[f].push_back({ChunkEntryName(key, slice, tensor.shape), DType::kBF16, {kRow},
                            kRow * 2});
      tensor.chunks.push_back({slice, f, 0, kRow * 2, 0});
    }
  }
  std::vector<SafetensorsLayout> layouts;
  std::map<std::string, std::string> files;  // name -> bytes
  std::vector<std::string*> data;
  for (int f = 0; f < l.files; ++f) {
    auto layout = BuildSafetensorsHeader(entries[f], std::nullopt, kDataFileAlignment);
    ASSERT_TRUE(layout.ok()) << layout.status().ToString();
    std::vector<EntrySpec>().swap(entries[f]);
    const std::string name = "data-" + std::to_string(f) + ".safetensors";
    data.push_back(&files[name]);
    *data.back() = layout->header;
    data.back()->resize(layout->file_size);
    index.files.push_back({name, layout->file_size, f});
    layouts.push_back(std::move(*layout));
  }
  std::vector<size_t> next(l.files);  // each file's entries, in the order made
  n = 0;
  for (auto& [key, tensor] : index.tensors) {
    for (IndexChunk& c : tensor.chunks) {
      std::string& bytes = *data[c.file];
      c.at = layouts[c.file].offsets[next[c.file]++];
      for (uint64_t b = 0; b < c.bytes; ++b) bytes[c.at + b] = static_cast<char>(n * 31 + b);
      c.crc32c = Crc32c(bytes.data() + c.at, c.bytes);
      ++n;
    }
  }
  if (l.table) MoveToTable(&index, &files);
  for (const auto& [name, bytes] : files) {
    std::ofstream(dir + "/" + name, std::ios::binary) << bytes;
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

// `args` as a child process, its output discarded.
ToolRun Spawn(std::vector<std::string> args) {
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

// A child's ru_maxrss counts the resident size of the process it was
// forked from (its copy of it, until exec). So the tool is started by a
// fresh, small process of this program instead, which runs only this
// (before main: SHARDSAFE_INDEX_MEMORY_SPAWN set), forks the tool, and
// writes "PEAK EXIT" to stdout.
const bool kSpawner = [] {
  if (std::getenv("SHARDSAFE_INDEX_MEMORY_SPAWN") == nullptr) return false;
  std::ifstream cmdline("/proc/self/cmdline", std::ios::binary);
  std::vector<std::string> args;
  for (std::string arg; std::getline(cmdline, arg, '\0');) args.push_back(arg);
  args.erase(args.begin());  // this program
  const ToolRun run = Spawn(args);
  std::printf("%llu %d\n", static_cast<unsigned long long>(run.peak), run.exit_code);
  std::fflush(stdout);
  _exit(0);
}();

// `shardsafe ARGS...`, started by a spawner (above).
ToolRun RunTool(std::vector<std::string> args) {
  args.insert(args.begin(), SHARDSAFE_CLI);
  int fds[2];
  if (pipe(fds) != 0) return {};
  std::vector<char*> argv = {const_cast<char*>("/proc/self/exe")};
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  const pid_t pid = fork();
  if (pid == 0) {
    close(fds[0]);
    dup2(fds[1], 1);
    setenv("SHARDSAFE_INDEX_MEMORY_SPAWN", "1", 1);
    execv("/proc/self/exe", argv.data());
    _exit(127);
  }
  close(fds[1]);
  std::string out;
  char buf[64];
  for (ssize_t n; (n = read(fds[0], buf, sizeof buf)) > 0;) out.append(buf, n);
  close(fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  ToolRun run;
  unsigned long long peak = 0;
  if (std::sscanf(out.c_str(), "%llu %d", &peak, &run.exit_code) != 2) return {};
  run.peak = peak;
  return run;
}

// What the measures divide by: the bytes a reader of every chunk reads
// to know them (the JSON index, and the parts of a chunk table and the
// checksum files where there are).
uint64_t IndexBytes(const std::string& dir) {
  uint64_t bytes = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    if (name == kIndexFileName || name.ends_with(".chunks") || name.ends_with(".crc32c")) {
      bytes += e.file_size();
    }
  }
  return bytes;
}

class IndexMemoryTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    root_ = new std::string(testing::TempDir() + "/index_memory_" + std::to_string(getpid()));
    for (const auto& [name, layout] :
         {std::pair{"large", kLarge}, std::pair{"many", kMany}, std::pair{"table", kTable},
          std::pair{"many-table", kManyTable}, std::pair{"tiny", kTiny}}) {
      std::filesystem::create_directories(Dir(name));
      const pid_t pid = fork();  // the writer's memory stays out of this process
      if (pid == 0) {
        WriteCheckpoint(Dir(name), layout);
        _exit(::testing::Test::HasFailure() ? 1 : 0);
      }
      int status = 0;
      waitpid(pid, &status, 0);
      ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "writing " << name;
    }
  }
  static void TearDownTestSuite() {
    std::filesystem::remove_all(*root_);
    delete root_;
  }

  static std::string Dir(const std::string& name) { return *root_ + "/" + name; }

  // How far `shardsafe ARGS...` over checkpoint `name` rises above its own
  // footprint (the same command over the tiny checkpoint), checking that
  // both succeed. `args` makes the arguments from a checkpoint's directory.
  static uint64_t ToolGrowth(const std::string& name,
                             const std::function<std::vector<std::string>(const std::string&)>&
                                 args) {
    const std::vector<std::string> tiny = args(Dir("tiny")), large = args(Dir(name));
    const ToolRun base = RunTool(tiny);
    const ToolRun run = RunTool(large);
    EXPECT_EQ(base.exit_code, 0);
    EXPECT_EQ(run.exit_code, 0);
    std::printf("shardsafe %s over %s: peak %.1f MB, own footprint %.1f MB\n", large[0].c_str(),
                name.c_str(), run.peak / 1e6, base.peak / 1e6);
    return run.peak - base.peak;
  }
  // `shardsafe ARGS... DIR`.
  static uint64_t ToolGrowth(const std::string& name, const std::vector<std::string>& args) {
    return ToolGrowth(name, [&](const std::string& dir) {
      std::vector<std::string> all = args;
      all.push_back(dir);
      return all;
    });
  }
  // `shardsafe export-hf DIR DIR-hf`, the output removed afterwards.
  static uint64_t ExportGrowth(const std::string& name) {
    const uint64_t growth = ToolGrowth(name, [&](const std::string& dir) {
      return std::vector<std::string>{"export-hf", dir, dir + "-hf"};
    });
    std::filesystem::remove_all(Dir("tiny") + "-hf");
    std::filesystem::remove_all(Dir(name) + "-hf");
    return growth;
  }

  static void ExpectAtMost(const std::string& name, double times, uint64_t growth) {
    const uint64_t index = IndexBytes(Dir(name));
    std::printf("%s: index %.1f MB, peak growth %.1f MB = %.2f x\n", name.c_str(), index / 1e6,
                growth / 1e6, static_cast<double>(growth) / index);
    EXPECT_LE(growth, times * index);
  }

  static inline std::string* root_ = nullptr;
};

TEST_F(IndexMemoryTest, TheIndexesAreLarge) {
  EXPECT_GE(IndexBytes(Dir("large")), uint64_t{64} << 20);
  EXPECT_GE(IndexBytes(Dir("many")), uint64_t{60} << 20);
  EXPECT_GE(IndexBytes(Dir("table")), uint64_t{60} << 20);
  EXPECT_GE(IndexBytes(Dir("many-table")), uint64_t{60} << 20);
  // The table's index is in its parts and checksum files, not in the JSON.
  EXPECT_LE(std::filesystem::file_size(Dir("table") + "/" + std::string(kIndexFileName)),
            IndexBytes(Dir("table")) / 100);
}

// What the read paths hold of an index: its tensors packed
// (format/index_packed.h), the text read a piece at a time.
TEST_F(IndexMemoryTest, PackedParseTakesAtMostOneAndAHalfTimesTheIndex) {
  for (const auto& [name, layout] : {std::pair{"large", kLarge}, std::pair{"many", kMany}}) {
    const std::string path = Dir(name) + "/" + std::string(kIndexFileName);
    std::unique_ptr<RandomAccessFile> file;
    std::string piece;
    uint64_t offset = 0;
    PackedTensors tensors;
    const auto growth = ChildPeakGrowth(
        [&] { file = DefaultFileSystem()->NewRandomAccessFile(path, {}).value(); },
        [&] {
          const IndexTextReader next = [&]() -> Result<std::string_view> {
            piece.resize(std::min<uint64_t>(uint64_t{4} << 20, file->size() - offset));
            SS_RETURN_IF_ERROR(file->ReadAt(offset, piece.data(), piece.size()));
            offset += piece.size();
            return std::string_view(piece);
          };
          Result<CheckpointIndex> index = ParseIndex(next, path, &tensors);
          return index.ok() && tensors.size() == static_cast<size_t>(layout.tensors);
        });
    ASSERT_TRUE(growth.has_value()) << "ParseIndex failed";
    ExpectAtMost(name, 1.5, *growth);
  }
}

// The index as IndexTensors (what OpenSource returns): ~170 bytes a chunk
// of "large", ~430 a tensor of "many" (3x its ~140 bytes of JSON: a map
// node, a key, a shape and a chunk's box, each allocated apart), which is
// why no read path holds it.
TEST_F(IndexMemoryTest, ParseIndexTakesAtMostTwiceTheIndex) {
  std::string text;
  const std::string path = Dir("large") + "/" + std::string(kIndexFileName);
  const auto growth = ChildPeakGrowth(
      [&] { text = ReadFileToString(*DefaultFileSystem(), path, kMaxIndexBytes).value(); },
      [&] {
        Result<CheckpointIndex> index = ParseIndex(text, path);
        return index.ok() && index->tensors.size() == static_cast<size_t>(kLarge.tensors);
      });
  ASSERT_TRUE(growth.has_value()) << "ParseIndex failed";
  ExpectAtMost("large", 2, *growth);
}

class ToolMemoryTest : public IndexMemoryTest,
                       public ::testing::WithParamInterface<const char*> {};

TEST_P(ToolMemoryTest, InspectTakesAtMostThreeTimesTheIndex) {
  ExpectAtMost(GetParam(), 3, ToolGrowth(GetParam(), std::vector<std::string>{"inspect"}));
}

TEST_P(ToolMemoryTest, InspectJsonTakesAtMostThreeTimesTheIndex) {
  ExpectAtMost(GetParam(), 3,
               ToolGrowth(GetParam(), std::vector<std::string>{"inspect", "--json"}));
}

TEST_P(ToolMemoryTest, VerifyTakesAtMostThreeTimesTheIndex) {
  ExpectAtMost(GetParam(), 3, ToolGrowth(GetParam(), std::vector<std::string>{"verify"}));
}

TEST_P(ToolMemoryTest, ExportHfTakesAtMostThreeTimesTheIndex) {
  ExpectAtMost(GetParam(), 3, ExportGrowth(GetParam()));
}

INSTANTIATE_TEST_SUITE_P(Checkpoints, ToolMemoryTest,
                         ::testing::Values("large", "many", "table", "many-table"),
                         [](const auto& info) {
                           std::string name = info.param;
                           std::replace(name.begin(), name.end(), '-', '_');
                           return name;
                         });

// Whether `out` holds what WriteCheckpoint wrote of `tensors` (in key
// order) of layout `l`: chunk c of the tensor in place t is chunk number
// n = t * chunks + c, its byte b is n * 31 + b.
bool HoldsWhatWasWritten(const std::vector<uint16_t>& out, const Layout& l,
                         const std::vector<int>& tensors) {
  const auto* bytes = reinterpret_cast<const unsigned char*>(out.data());
  const uint64_t chunk_bytes = kRow * 2;
  for (size_t i = 0; i < tensors.size(); ++i) {
    for (uint64_t c = 0; c < static_cast<uint64_t>(l.chunks); ++c) {
      const uint64_t n = static_cast<uint64_t>(tensors[i]) * l.chunks + c;
      const unsigned char* chunk = bytes + (i * l.chunks + c) * chunk_bytes;
      for (uint64_t b = 0; b < chunk_bytes; ++b) {
        if (chunk[b] != static_cast<unsigned char>(n * 31 + b)) return false;
      }
    }
  }
  return true;
}

// Load of `tensors` (in key order) of checkpoint `name` of layout `l` on
// one rank, into buffers made before the measurement, checked to hold what
// was written.
std::optional<uint64_t> LoadGrowth(const std::string& dir, const Layout& l,
                                   const std::vector<int>& tensors) {
  std::vector<uint16_t> out;
  LoadRequest request;
  return ChildPeakGrowth(
      [&] {
        const Shape shape = TensorShape(l);
        out.resize(tensors.size() * l.chunks * kRow);
        for (size_t i = 0; i < tensors.size(); ++i) {
          request.tensors.push_back({Key(l, tensors[i]), DType::kBF16, shape,
                                     Slice{Box::Whole(shape), {}},
                                     out.data() + i * l.chunks * kRow});
        }
      },
      [&] {
        auto comm = MakeSingleProcessComm();
        Result<LoadResult> r = Load(request, dir, *comm, LoadOptions());
        if (!r.ok()) std::fprintf(stderr, "%s\n", r.status().ToString().c_str());
        return r.ok() && HoldsWhatWasWritten(out, l, tensors);
      });
}

TEST_F(IndexMemoryTest, LoadOfOneTensorTakesAtMostThreeTimesTheIndex) {
  for (const auto& [name, layout] : {std::pair{"large", kLarge}, std::pair{"table", kTable}}) {
    const auto growth = LoadGrowth(Dir(name), layout, {7});
    ASSERT_TRUE(growth.has_value()) << "Load failed or loaded other bytes";
    ExpectAtMost(name, 3, *growth);
  }
}

TEST_F(IndexMemoryTest, LoadOfEveryTensorTakesAtMostThreeTimesTheIndex) {
  for (const auto& [name, layout] :
       {std::pair{"many", kMany}, std::pair{"many-table", kManyTable}}) {
    std::vector<int> all(layout.tensors);
    for (int t = 0; t < layout.tensors; ++t) all[t] = t;
    const auto growth = LoadGrowth(Dir(name), layout, all);
    ASSERT_TRUE(growth.has_value()) << "Load failed or loaded other bytes";
    ExpectAtMost(name, 3, *growth);
  }
}

}  // namespace
}  // namespace shardsafe
