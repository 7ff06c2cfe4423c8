// Writes checkpoint_dir_fuzzer's seed corpus: small checkpoint roots saved
// by the engine, framed as the fuzzer reads them (checkpoint_dir_framing.h),
// and, when given a second directory, package_records_fuzzer's: the
// per-rank value blobs and values those roots hold.
//
//   build-fuzz/checkpoint_dir_seeds fuzz/corpus/checkpoint_dir [fuzz/corpus/package_records]
//
// Checkpoint seeds, each checkpoint saved as ROOT/step-00000001 by Save
// unless said otherwise: one rank with tensors of several dtypes, a 0-d
// tensor, global and per-rank blobs, values, metadata and layout (as
// saved, each data header padded to 4 KiB, and compacted); two ranks with a
// row-sharded, a replicated and a ZeRO flat-sharded tensor; one rank split
// over two data files (with sub-byte F4 and an F8); a foreign
// model.safetensors alone and with a Hugging Face index. Then roots saved
// by a CheckpointManager (commit records with a step, `latest`): one
// checkpoint holding the Python package's per-rank values (blobs
// `rank/KEY`, docs/format.md §6) and values with non-finite floats; two
// checkpoints, `latest` naming the second; two whose second did not move
// `latest`; and the per-rank one with its commit.json a directory, a link
// out of the root, and its `latest` a FIFO. "Compacted" strips a data
// file's header padding and shifts the index's offsets to match, so that
// the fuzzer mutates bytes that matter rather than 4 KiB of spaces (and
// reads unaligned data).
//
// Deterministic but for the index's created_unix and commit.json's time:
// scripts/fuzz.sh writes them to a scratch directory and copies those the
// corpus lacks, so that committed seeds do not change at every run.
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
#include "format/safetensors.h"
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

// Every file of `root`'s two checkpoints and its `latest`, by path
// relative to the root (the framing's names).
Files ReadRoot(const std::string& root) {
  Files files;
  for (std::string_view tag : {fuzz::kFirst, fuzz::kSecond}) {
    const std::string dir = JoinPath(root, std::string(tag));
    if (!DefaultFileSystem()->Stat(dir).ok()) continue;
    auto entries = DefaultFileSystem()->ListDir(dir);
    Check(entries.status(), "list");
    for (const DirEntry& e : *entries) {
      files[std::string(tag) + "/" + e.name] = ReadAll(JoinPath(dir, e.name));
    }
  }
  const std::string latest = JoinPath(root, "latest");
  if (DefaultFileSystem()->Stat(latest).ok()) files["latest"] = ReadAll(latest);
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

// Compacts every data file of checkpoint `tag` and rewrites its index's
// offsets and sizes.
Files CompactOne(Files files, std::string_view tag) {
  const std::string prefix = std::string(tag) + "/";
  const std::string index_path = prefix + "shardsafe.json";
  if (!files.count(index_path)) return files;
  auto index = ParseIndex(files.at(index_path), "seed");
  Check(index.status(), "parse index");
  for (uint32_t f = 0; f < index->files.size(); ++f) {
    IndexFile& info = index->files[f];
    const uint64_t delta = CompactHeader(&files.at(prefix + info.name));
    info.bytes -= delta;
    for (auto& [key, t] : index->tensors) {
      for (IndexChunk& c : t.chunks) c.at -= c.file == f ? delta : 0;
    }
    for (auto& [name, b] : index->blobs) {
      for (IndexBlobChunk& c : b.chunks) c.at -= c.file == f ? delta : 0;
    }
  }
  files[index_path] = SerializeIndex(*index);
  return files;
}

// Both checkpoints' data files compacted.
Files Compact(Files files) {
  return CompactOne(CompactOne(std::move(files), fuzz::kFirst), fuzz::kSecond);
}

// `files` framed, then `extra` (sections of links, directories, FIFOs).
void WriteSeed(const std::string& out_dir, const std::string& name, const Files& files,
               const std::string& extra = "") {
  for (const auto& [file, bytes] : files) {
    bool known = file == fuzz::kIndexPath;
    for (const auto& [id, framed_name] : fuzz::FramedFiles()) known |= file == framed_name;
    if (!known) {
      std::fprintf(stderr, "%s: the framing has no id for %s\n", name.c_str(), file.c_str());
      std::exit(1);
    }
  }
  const std::string framed = fuzz::Frame(files) + extra;
  std::ofstream(JoinPath(out_dir, name), std::ios::binary) << framed;
  std::printf("%s: %zu bytes, %zu files\n", name.c_str(), framed.size(), files.size());
}

// A per-rank value's blob as the Python package writes it (docs/format.md
// §6): a safetensors file of `tensors` (named t0, t1, ...) whose metadata's
// one entry, "value", is `value_json`.
std::string PerRankValueBlob(const std::string& value_json,
                             const std::vector<std::pair<EntrySpec, std::vector<char>>>& tensors) {
  std::vector<EntrySpec> specs;
  for (const auto& [spec, bytes] : tensors) specs.push_back(spec);
  const std::map<std::string, std::string> metadata{{"value", value_json}};
  auto layout = BuildSafetensorsHeader(specs, metadata);
  Check(layout.status(), "per-rank value header");
  std::string blob = layout->header;
  blob.resize(layout->file_size);
  for (size_t i = 0; i < tensors.size(); ++i) {
    const std::vector<char>& bytes = tensors[i].second;
    std::memcpy(blob.data() + layout->offsets[i], bytes.data(), bytes.size());
  }
  return blob;
}

// The path a seed's checkpoint is saved at: `root`'s first checkpoint.
std::string First(const std::string& root) { return JoinPath(root, std::string(fuzz::kFirst)); }

Files OneRank(const std::string& root) {
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
  Check(Save(state, First(root), *comm, {}).status(), "save one_rank");
  return ReadRoot(root);
}

// Rank r of two: rows of "w", a replicated "bias", half of "opt" (flat).
Files TwoRanks(const std::string& root) {
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
      status[r] = Save(state, First(root), *comms[r], {}).status();
    });
  }
  for (auto& t : threads) t.join();
  Check(status[0], "save two_ranks");
  return ReadRoot(root);
}

// A file cap of 16 bytes splits the chunks over two files.
Files TwoFiles(const std::string& root) {
  auto comm = MakeSingleProcessComm();
  const auto f4 = Bytes(4 * 4 / 2, 50), f8 = Bytes(6, 51), i32 = Bytes(3 * 4, 52);
  SaveState state;
  state.tensors.push_back({"q", DType::kF4, {4, 4}, Whole({4, 4}), f4.data()});
  state.tensors.push_back({"scale", DType::kF8E4M3, {2, 3}, Whole({2, 3}), f8.data()});
  state.tensors.push_back({"pos", DType::kI32, {3}, Whole({3}), i32.data()});
  SaveOptions options;
  options.max_file_bytes = 16;
  Check(Save(state, First(root), *comm, options).status(), "save two_files");
  return ReadRoot(root);
}

// What the Python package saves besides tensors: per-rank values (one with
// tensors and non-finite floats, one without tensors) and values with a
// non-finite float and the package's own record.
struct PackageRecords {
  std::vector<std::pair<std::string, std::string>> per_rank;  // blob name, bytes
  std::string values;
};

PackageRecords PythonRecords(int salt) {
  const auto t0 = Bytes(2 * 2 * 4, 60 + salt), t1 = Bytes(3 * 8, 61 + salt);
  PackageRecords r;
  r.per_rank.emplace_back(
      "rank/sampler",
      PerRankValueBlob(R"({"epoch": )" + std::to_string(3 + salt) +
                           R"(, "weights": {"__shardsafe_tensor__": "t0"}, "history": )"
                           R"([{"__shardsafe_tensor__": "t1"}, {"__shardsafe_float__": "nan"}], )"
                           R"("best": {"__shardsafe_float__": "-inf"}, "name": "rank0"})",
                       {{EntrySpec{"t0", DType::kF32, {2, 2}, t0.size()}, t0},
                        {EntrySpec{"t1", DType::kI64, {3}, t1.size()}, t1}}));
  r.per_rank.emplace_back("rank/scaler",
                          PerRankValueBlob(R"({"scale": 65536.0, "growth": [2, 0.5, null]})", {}));
  r.values = R"({"step": )" + std::to_string(salt + 1) +
             R"(, "loss": {"__shardsafe_float__": "inf"}, )"
             R"("__shardsafe__": {"excluded_frozen": ["frozen.w"]}})";
  return r;
}

// Saves step `step` through `manager`: a tensor, the Python records, and a
// per-rank and a global plain blob.
void SaveStep(CheckpointManager& manager, int64_t step, bool update_latest) {
  auto comm = MakeSingleProcessComm();
  const int salt = static_cast<int>(step);
  const auto w = Bytes(2 * 3 * 4, 70 + salt), config = Bytes(12, 71 + salt);
  const PackageRecords records = PythonRecords(salt);
  SaveState state;
  state.tensors.push_back({"model.w", DType::kF32, {2, 3}, Whole({2, 3}), w.data()});
  for (const auto& [name, bytes] : records.per_rank) {
    state.blobs.push_back({name, bytes.data(), bytes.size(), /*per_rank=*/true});
  }
  state.blobs.push_back({"file/config.json", config.data(), config.size(), /*per_rank=*/false});
  state.values = records.values;
  SaveOptions options;
  options.update_latest = update_latest;
  Check(manager.Save(step, state, *comm, options).status(), "save with a manager");
}

// A root a manager saved `steps` in (the last one not moving `latest`
// unless `last_moves_latest`).
Files ManagedRoot(const std::string& root, int steps, bool last_moves_latest) {
  CheckpointManager manager(root, {});
  for (int step = 1; step <= steps; ++step) {
    SaveStep(manager, step, step < steps || last_moves_latest);
  }
  return ReadRoot(root);
}

// The id FramedFiles gives `path`.
char IdOf(std::string_view path) {
  for (const auto& [id, name] : fuzz::FramedFiles()) {
    if (name == path) return id;
  }
  std::fprintf(stderr, "the framing has no id for %s\n", std::string(path).c_str());
  std::exit(1);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2 && argc != 3) {
    std::fprintf(stderr, "usage: %s OUT_DIR [PACKAGE_RECORDS_OUT_DIR]\n", argv[0]);
    return 2;
  }
  const std::string out = argv[1];
  FileSystem& fs = *DefaultFileSystem();
  const std::string tmp = "/tmp/shardsafe-seeds-" + RandomSuffix();
  Check(CreateDirs(fs, out), "create output dir");
  Check(CreateDirs(fs, tmp), "create temporary dir");

  const Files one = OneRank(JoinPath(tmp, "one_rank"));
  WriteSeed(out, "one_rank", one);
  const Files one_compact = Compact(one);
  WriteSeed(out, "one_rank_compact", one_compact);
  WriteSeed(out, "two_ranks", Compact(TwoRanks(JoinPath(tmp, "two_ranks"))));
  WriteSeed(out, "two_files", Compact(TwoFiles(JoinPath(tmp, "two_files"))));

  // The one-rank data file is what safetensors writes: alone it is a
  // foreign model, and with an HF index naming its tensors a model dir.
  const std::string first = std::string(fuzz::kFirst) + "/";
  const std::string model = one_compact.at(first + "data-00000-000.safetensors");
  WriteSeed(out, "foreign_file", {{first + "model.safetensors", model}});
  WriteSeed(out, "hf_dir",
            {{first + "model.safetensors", model},
             {first + "model.safetensors.index.json",
              R"({"metadata": {"total_size": 256}, "weight_map": {"layers.0.w": )"
              R"("model.safetensors", "embed": "model.safetensors"}})"}});

  // Roots a manager saved: commit records, `latest`, the Python records.
  const Files per_rank = Compact(ManagedRoot(JoinPath(tmp, "per_rank_values"), 1, true));
  WriteSeed(out, "per_rank_values", per_rank);
  WriteSeed(out, "root_two_steps", Compact(ManagedRoot(JoinPath(tmp, "root_two_steps"), 2, true)));
  WriteSeed(out, "root_latest_behind",
            Compact(ManagedRoot(JoinPath(tmp, "root_latest_behind"), 2, false)));

  // What a damaged or hostile root holds where a reader expects a file
  // ("../../outside": the fuzzer's decoy beside its scratch root).
  using Kind = fuzz::FramedEntry::Kind;
  Files no_record = per_rank;
  no_record.erase(first + "commit.json");
  const char commit = IdOf(first + "commit.json");
  WriteSeed(out, "commit_dir", no_record, fuzz::Section(commit, {Kind::kDir, ""}));
  WriteSeed(out, "commit_link_out", no_record,
            fuzz::Section(commit, {Kind::kLink, "../../outside"}));
  Files no_latest = per_rank;
  no_latest.erase("latest");
  WriteSeed(out, "latest_fifo", no_latest, fuzz::Section(IdOf("latest"), {Kind::kFifo, ""}));

  if (argc == 3) {
    // package_records_fuzzer's: the blobs as they are, the values as text.
    const std::string records_out = argv[2];
    Check(CreateDirs(fs, records_out), "create package records output dir");
    const PackageRecords records = PythonRecords(0);
    for (const auto& [name, bytes] : records.per_rank) {
      const std::string file = "per_rank_" + name.substr(name.find('/') + 1);
      std::ofstream(JoinPath(records_out, file), std::ios::binary) << bytes;
      std::printf("%s: %zu bytes\n", file.c_str(), bytes.size());
    }
    std::ofstream(JoinPath(records_out, "values"), std::ios::binary) << records.values;
    std::printf("values: %zu bytes\n", records.values.size());
  }
  return fs.RemoveAll(tmp).ok() ? 0 : 1;
}
