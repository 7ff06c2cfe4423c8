// shardsafe import SRC DST: copy every tensor of SRC (a .safetensors file, a
// Hugging Face model directory, a shardsafe checkpoint or root) into a new
// one-rank shardsafe checkpoint at DST. A one-rank checkpoint's data file is
// an ordinary safetensors file, so this also converts the other way round
// in effect: DST/data-00000-000.safetensors is loadable by any reader.
//
// A directory the engine cannot open (NotFound: no checkpoint, model or
// safetensors file it knows) is handed to the Python package's importer,
// which reads other tools' checkpoints (torch DCP, Megatron torch_dist,
// DeepSpeed, nanotron: their pickles, which the engine never reads; an
// s3:// SRC is staged on a local disk first) with a bounded memory and a
// progress bar: this process becomes `python3 -c BOOT
// ENGINE_ERROR import SRC DST ...` running shardsafe.__main__ (the python3
// next to this program when there is one, as in a virtual environment; else
// the PATH's). Nothing claims the path: the engine's message, extended.
//
// Everything is read into memory first (Save needs every buffer at once),
// with checksums verified for native sources. Saved JSON values, metadata
// and global blobs of a native source are carried over; per-rank blobs
// belong to the ranks of the saving job and are not (they are counted). A
// Hugging Face directory's other files (config.json, generation and
// tokenizer files, ...: all but the weights) come along as saved files
// (`file/NAME`, docs/format.md §6), which `export-hf` writes back.
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "cli/output.h"
#include "shardsafe/filesystem.h"
#include "shardsafe/hf.h"
#include "shardsafe/source.h"

namespace shardsafe::cli {
namespace {

struct ImportSummary {
  std::string source;
  bool native = false;
  size_t tensors = 0;
  size_t blobs = 0;
  size_t skipped_per_rank_blobs = 0;
  std::vector<std::string> files;    // a Hugging Face directory's side files, carried over
  std::vector<std::string> skipped;  // side files left out, each with why
  uint64_t bytes = 0;
  SaveStats stats;
};

// The largest side file carried over (a tokenizer.json is tens of MB).
constexpr uint64_t kMaxSideFileBytes = uint64_t{256} << 20;

// Weights and their index: what the tensors already are.
bool IsWeightsFile(std::string_view name) {
  for (std::string_view ext : {".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".h5",
                               ".msgpack", ".gguf", ".onnx", ".index.json"}) {
    if (name.ends_with(ext)) return true;
  }
  return false;
}

// The side files of the Hugging Face directory `src` (read through the
// checked open, inside it), into `contents` (name, bytes).
Status ReadSideFiles(FileSystem& fs, const CheckpointSource& src,
                     std::vector<std::pair<std::string, std::string>>* contents,
                     ImportSummary* summary) {
  SS_ASSIGN_OR_RETURN(std::vector<DirEntry> entries, fs.ListDir(src.data_dir));
  for (const DirEntry& e : entries) {
    if (e.is_dir || e.name.starts_with(".") || IsWeightsFile(e.name)) continue;
    if (!ValidateSavedFileName(e.name).ok()) {
      summary->skipped.push_back(e.name + " (not a name a checkpoint keeps)");
      continue;
    }
    auto bytes = ReadFileToString(fs, JoinPath(src.data_dir, e.name), kMaxSideFileBytes,
                                  ReadOptions{.within = src.data_dir});
    if (!bytes.ok()) {
      summary->skipped.push_back(e.name + " (" + bytes.status().message() + ")");
      continue;
    }
    contents->emplace_back(e.name, std::move(*bytes));
    summary->files.push_back(e.name);
  }
  return Status();
}

Result<ImportSummary> Import(FileSystem& fs, const CheckpointSource& src, const std::string& dst,
                             bool overwrite, ProgressLine* progress) {
  ImportSummary summary;
  summary.source = src.path;
  summary.native = src.native;

  // One buffer per tensor, the whole tensor each. Never hand out a null
  // pointer: zero-size tensors get one spare byte.
  std::vector<std::vector<char>> buffers;
  buffers.reserve(src.index.tensors.size());
  LoadRequest request;
  SaveState state;
  for (const auto& [key, t] : src.index.tensors) {
    SS_ASSIGN_OR_RETURN(uint64_t n, NumElements(t.shape));
    SS_ASSIGN_OR_RETURN(uint64_t bytes, NumBytes(t.dtype, n));
    buffers.emplace_back(bytes == 0 ? 1 : bytes);
    const Slice whole{Box::Whole(t.shape), std::nullopt};
    request.tensors.push_back({key, t.dtype, t.shape, whole, buffers.back().data()});
    state.tensors.push_back({key, t.dtype, t.shape, whole, buffers.back().data()});
    summary.bytes += bytes;
  }
  summary.tensors = state.tensors.size();

  auto comm = MakeSingleProcessComm();
  LoadOptions load_options;
  load_options.verify_checksums = true;
  if (progress) load_options.progress = progress->Callback();
  load_options.fs = &fs;
  // The source opened once: its index is not read again.
  SS_ASSIGN_OR_RETURN(LoadResult loaded, LoadOpenedSource(request, src, *comm, load_options));
  if (progress) progress->Finish();

  if (src.native) {
    state.values = loaded.values;
    state.metadata = loaded.metadata;
    for (const auto& [name, blob] : src.index.blobs) {
      if (blob.per_rank) {
        ++summary.skipped_per_rank_blobs;
        continue;
      }
      auto it = loaded.blobs.find(name);
      if (it == loaded.blobs.end()) continue;
      state.blobs.push_back({name, it->second.data(), it->second.size(), false});
      ++summary.blobs;
    }
  }
  std::vector<std::pair<std::string, std::string>> side_files;  // (blob name, bytes)
  if (!src.native && src.path == src.data_dir) {  // a directory, not one file
    SS_RETURN_IF_ERROR(ReadSideFiles(fs, src, &side_files, &summary));
    for (auto& [name, bytes] : side_files) {
      name = std::string(kSavedFilePrefix) + name;
      state.blobs.push_back({name, bytes.data(), bytes.size(), false});
    }
  }

  SaveOptions save_options;
  save_options.overwrite = overwrite;
  if (progress) save_options.progress = progress->Callback();
  SS_ASSIGN_OR_RETURN(summary.stats, Save(state, dst, *comm, save_options));
  if (progress) progress->Finish();
  return summary;
}

// Runs shardsafe.__main__ in place of this process; returns only on failure.
// Its bootstrap reports a missing Python package with the engine's message.
constexpr const char* kPythonBoot =
    "import sys\n"
    "try:\n"
    "    from shardsafe.__main__ import main\n"
    "except ImportError as e:\n"
    "    print(f'shardsafe: error: {sys.argv[1]} (other tools\\' checkpoints are read by the "
    "shardsafe Python package, which is not importable: {e})', file=sys.stderr)\n"
    "    sys.exit(2)\n"
    "sys.exit(main(sys.argv[2:] + ['--engine-error', sys.argv[1]]))\n";

Status ExecPythonImport(const std::string& src, const std::string& dst,
                        const std::string& engine_error, const std::vector<std::string>& flags) {
  std::error_code ec;
  const auto self = std::filesystem::read_symlink("/proc/self/exe", ec);
  const auto sibling = self.parent_path() / "python3";
  const std::string python =
      !ec && std::filesystem::exists(sibling, ec) ? sibling.string() : std::string("python3");
  std::vector<std::string> args = {python, "-c", kPythonBoot, engine_error, "import", src, dst};
  args.insert(args.end(), flags.begin(), flags.end());
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::cout.flush();
  execvp(argv[0], argv.data());
  return NotFoundError(engine_error + " (other tools' checkpoints are read by the Python "
                       "package: running " + python + " failed: " + std::strerror(errno) + ")");
}

// A directory, or a prefix of an object store: where another tool's
// checkpoint may be (the Python package stages a prefix's objects on a local
// disk to read them).
bool MaybeForeign(const std::string& src) {
  std::error_code ec;
  if (std::filesystem::is_directory(src, ec)) return true;
  Result<FileSystem*> fs = FileSystemFor(src);
  return fs.ok() && (*fs)->IsObjectStore();
}

}  // namespace

void AddImport(CLI::App& app, int* exit_code) {
  auto* cmd = app.add_subcommand(
      "import", "Copy every tensor of SRC (safetensors file, Hugging Face dir, checkpoint; "
                "torch DCP, Megatron torch_dist, DeepSpeed or nanotron checkpoint through the "
                "Python package) into a new one-rank checkpoint DST");
  auto src = std::make_shared<std::string>();
  auto dst = std::make_shared<std::string>();
  auto json = std::make_shared<bool>(false);
  cmd->add_option("SRC", *src, "checkpoint dir, root, Hugging Face dir or .safetensors file")
      ->required();
  cmd->add_option("DST", *dst, "checkpoint directory to create (its name is the tag)")
      ->required();
  auto overwrite = std::make_shared<bool>(false);
  auto unsafe_pickle = std::make_shared<bool>(false);
  cmd->add_flag("--json", *json, "machine-readable output");
  cmd->add_flag("--overwrite", *overwrite, "replace DST if it exists");
  cmd->add_flag("--unsafe-pickle", *unsafe_pickle,
                "other tools' checkpoints: unpickle saved values of any type (only for "
                "checkpoints you trust)");
  cmd->callback([=] {
    Result<FileSystem*> fs = FileSystemFor(*src);
    if (!fs.ok()) {
      *exit_code = Fail(fs.status());
      return;
    }
    auto source = OpenSource(**fs, *src);
    if (!source.ok() && source.status().code() == StatusCode::kNotFound && MaybeForeign(*src)) {
      std::vector<std::string> flags = {*json ? "--json" : "--progress"};
      if (*overwrite) flags.push_back("--overwrite");
      if (*unsafe_pickle) flags.push_back("--unsafe-pickle");
      *exit_code = Fail(ExecPythonImport(*src, *dst, source.status().message(), flags));
      return;
    }
    if (!source.ok()) {
      *exit_code = Fail(source.status());
      return;
    }
    ProgressLine progress(!*json);
    auto summary = Import(**fs, *source, *dst, *overwrite, &progress);
    progress.Finish();
    if (!summary.ok()) {
      *exit_code = FailOverwritable(summary.status());
      return;
    }
    *exit_code = kExitOk;
    const ImportSummary& s = *summary;
    if (*json) {
      PrintJson({{"source", s.source}, {"native", s.native}, {"path", *dst},
                 {"tensors", s.tensors}, {"blobs", s.blobs},
                 {"skipped_per_rank_blobs", s.skipped_per_rank_blobs},
                 {"side_files", s.files}, {"side_files_skipped", s.skipped}, {"bytes", s.bytes},
                 {"files", s.stats.files}, {"seconds", s.stats.seconds}});
      return;
    }
    std::cout << "imported " << s.tensors << " tensors (" << FormatBytes(s.bytes) << ") from "
              << s.source << " into " << *dst << ": " << s.stats.files << " data file(s)";
    if (s.blobs) std::cout << ", " << s.blobs << " blob(s)";
    if (!s.files.empty()) std::cout << ", " << s.files.size() << " file(s) beside the weights";
    std::cout << "\n";
    for (const std::string& f : s.skipped) std::cout << "note: not copied: " << Printable(f) << "\n";
    if (s.skipped_per_rank_blobs) {
      std::cout << "note: " << s.skipped_per_rank_blobs
                << " per-rank blob(s) not copied (they belong to the ranks of the saving job)\n";
    }
  });
}

}  // namespace shardsafe::cli
