// Writes checkpoint_dir_fuzzer's seed corpus: small checkpoints saved by the
// engine, framed as the fuzzer reads them (checkpoint_dir_framing.h).
//
//   build-fuzz/checkpoint_dir_seeds fuzz/corpus/checkpoint_dir
//
// Seeds: one rank with tensors of several dtypes, a 0-d tensor, global and
// per-rank blobs, values, metadata and layout (as saved, each data header
// padded to 4 KiB, and compacted); two ranks with a row-sharded, a
// replicated and a ZeRO flat-sharded tensor; one rank split over two data
// files (with sub-byte F4 and an F8); a foreign model.safetensors alone and
// with a Hugging Face index. "Compacted" strips a data file's header padding
// and shifts the index's offsets to match, so that the fuzzer mutates bytes
// that matter rather than 4 KiB of spaces (and reads unaligned data).
// Deterministic but for the index's created_unix and commit.json's time.
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "checkpoint_dir_framing.h"
#include "format/index.h"
#include "shardsafe/checkpoint.h"
#include "shardsafe/comm.h"
#include "shardsafe/filesystem.h"

namespace {

using namespace shardsafe;
using Files = std::map<std::string, std::string>;

void Check(const Status& s, const char* what) {
  if (!s.ok()) {
    std::fprintf(stderr, "%s: %s\n", what, s.ToString().c_str());
    std::exit(1);
  }
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Every file of checkpoint directory `dir`, by name.
Files ReadDir(const std::string& dir) {
  auto entries = DefaultFileSystem()->ListDir(dir);
  Check(entries.status(), "list");
  Files files;
  for (const DirEntry& e : *entries) files[e.name] = ReadAll(JoinPath(dir, e.name));
  return files;
}

Slice Whole(const Shape& shape) { return Slice{Box::Whole(shape), std::nullopt}; }

// Bytes 0..255 repeating, so every dtype sees varied values.
std::vector<char> Bytes(size_t n, int salt) {
  std::vector<char> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<char>(i * 37 + salt);
  return v;
}

// The data file's header without its padding (rounded up to 8 bytes, as
// the reference writer pads); returns how many bytes it shrank by.
uint64_t CompactHeader(std::string* file) {
  uint64_t n = 0;
  std::memcpy(&n, file->data(), 8);
  uint64_t keep = n;
  while (keep > 0 && (*file)[8 + keep - 1] == ' ') --keep;
  keep = (keep + 7) / 8 * 8;
  const uint64_t delta = n - keep;
  file->erase(8 + keep, delta);
  std::memcpy(file->data(), &keep, 8);
  return delta;
}

// Compacts every data file and rewrites the index's offsets and sizes.
Files Compact(Files files) {
  auto index = ParseIndex(files.at("shardsafe.json"), "seed");
  Check(index.status(), "parse index");
  for (uint32_t f = 0; f < index->files.size(); ++f) {
    IndexFile& info = index->files[f];
    const uint64_t delta = CompactHeader(&files.at(info.name));
    info.bytes -= delta;
    for (auto& [key, t] : index->tensors) {
      for (IndexChunk& c : t.chunks) c.at -= c.file == f ? delta : 0;
    }
    for (auto& [name, b] : index->blobs) {
      for (IndexBlobChunk& c : b.chunks) c.at -= c.file == f ? delta : 0;
    }
  }
  files["shardsafe.json"] = SerializeIndex(*index);
  return files;
}

void WriteSeed(const std::string& out_dir, const std::string& name, const Files& files) {
  for (const auto& [file, bytes] : files) {
    bool known = file == "shardsafe.json";
    for (const auto& [id, framed_name] : fuzz::FramedFiles()) known |= file == framed_name;
    if (!known) {
      std::fprintf(stderr, "%s: the framing has no id for %s\n", name.c_str(), file.c_str());
      std::exit(1);
    }
  }
  const std::string framed = fuzz::Frame(files);
  std::ofstream(JoinPath(out_dir, name), std::ios::binary) << framed;
  std::printf("%s: %zu bytes, %zu files\n", name.c_str(), framed.size(), files.size());
}

Files OneRank(const std::string& dir) {
  auto comm = MakeSingleProcessComm();
  const auto w = Bytes(4 * 8 * 4, 1), e = Bytes(16 * 2, 2), step = Bytes(8, 3), mask = Bytes(5, 4);
  const auto ids = Bytes(3 * 5, 5), rng = Bytes(24, 6), sampler = Bytes(10, 7);
  SaveState state;
  state.tensors.push_back({"layers.0.w", DType::kF32, {4, 8}, Whole({4, 8}), w.data()});
  state.tensors.push_back({"embed", DType::kBF16, {16}, Whole({16}), e.data()});
  state.tensors.push_back({"step", DType::kI64, {}, Whole({}), step.data()});
  state.tensors.push_back({"mask", DType::kBool, {5}, Whole({5}), mask.data()});
  state.tensors.push_back({"ids", DType::kU8, {3, 5}, Whole({3, 5}), ids.data()});
  state.blobs.push_back({"rng", rng.data(), rng.size(), /*per_rank=*/true});
  state.blobs.push_back({"sampler", sampler.data(), sampler.size(), /*per_rank=*/false});
  state.values = R"({"step": 7, "config": {"lr": 0.0003, "name": "fuzz"}})";
  state.metadata = R"({"run": "seed"})";
  state.layout = R"({"tp": 1, "dp": 1})";
  Check(Save(state, dir, *comm, {}).status(), "save one_rank");
  return ReadDir(dir);
}

// Rank r of two: rows of "w", a replicated "bias", half of "opt" (flat).
Files TwoRanks(const std::string& dir) {
  auto comms = MakeThreadComms(2);
  std::vector<std::thread> threads;
  Status status[2];
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      const auto w = Bytes(3 * 4 * 2, 10 + r), bias = Bytes(4 * 2, 20), opt = Bytes(5 * 4, 30 + r);
      const auto rng = Bytes(8, 40 + r);
      SaveState state;
      state.tensors.push_back({"w", DType::kF16, {6, 4},
                               {Box{{uint64_t(3 * r), 0}, {3, 4}}, std::nullopt}, w.data()});
      state.tensors.push_back({"bias", DType::kBF16, {4}, Whole({4}), bias.data()});
      const FlatRange half{uint64_t(5 * r), uint64_t(5 * r + 5)};
      state.tensors.push_back({"opt.w.exp_avg", DType::kF32, {2, 5}, {Box::Whole({2, 5}), half},
                               opt.data()});
      state.blobs.push_back({"rng", rng.data(), rng.size(), /*per_rank=*/true});
      state.values = R"({"step": 2})";
      status[r] = Save(state, dir, *comms[r], {}).status();
    });
  }
  for (auto& t : threads) t.join();
  Check(status[0], "save two_ranks");
  return ReadDir(dir);
}

// A file cap of 16 bytes splits the chunks over two files.
Files TwoFiles(const std::string& dir) {
  auto comm = MakeSingleProcessComm();
  const auto f4 = Bytes(4 * 4 / 2, 50), f8 = Bytes(6, 51), i32 = Bytes(3 * 4, 52);
  SaveState state;
  state.tensors.push_back({"q", DType::kF4, {4, 4}, Whole({4, 4}), f4.data()});
  state.tensors.push_back({"scale", DType::kF8E4M3, {2, 3}, Whole({2, 3}), f8.data()});
  state.tensors.push_back({"pos", DType::kI32, {3}, Whole({3}), i32.data()});
  SaveOptions options;
  options.max_file_bytes = 16;
  Check(Save(state, dir, *comm, options).status(), "save two_files");
  return ReadDir(dir);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s OUT_DIR\n", argv[0]);
    return 2;
  }
  const std::string out = argv[1];
  FileSystem& fs = *DefaultFileSystem();
  const std::string tmp = "/tmp/shardsafe-seeds-" + RandomSuffix();
  Check(CreateDirs(fs, out), "create output dir");
  Check(CreateDirs(fs, tmp), "create temporary dir");

  const Files one = OneRank(JoinPath(tmp, "step-00000001"));
  WriteSeed(out, "one_rank", one);
  const Files one_compact = Compact(one);
  WriteSeed(out, "one_rank_compact", one_compact);
  WriteSeed(out, "two_ranks", Compact(TwoRanks(JoinPath(tmp, "step-00000002"))));
  WriteSeed(out, "two_files", Compact(TwoFiles(JoinPath(tmp, "step-00000003"))));

  // The one-rank data file is what safetensors writes: alone it is a
  // foreign model, and with an HF index naming its tensors a model dir.
  const std::string model = one_compact.at("data-00000-000.safetensors");
  WriteSeed(out, "foreign_file", {{"model.safetensors", model}});
  WriteSeed(out, "hf_dir",
            {{"model.safetensors", model},
             {"model.safetensors.index.json",
              R"({"metadata": {"total_size": 256}, "weight_map": {"layers.0.w": )"
              R"("model.safetensors", "embed": "model.safetensors"}})"}});
  return fs.RemoveAll(tmp).ok() ? 0 : 1;
}
