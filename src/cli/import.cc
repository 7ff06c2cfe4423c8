// shardsafe import SRC DST: copy every tensor of SRC (a .safetensors file, a
// Hugging Face model directory, a shardsafe checkpoint or root) into a new
// one-rank shardsafe checkpoint at DST. A one-rank checkpoint's data file is
// an ordinary safetensors file, so this also converts the other way round
// in effect: DST/data-00000-000.safetensors is loadable by any reader.
//
// A torch DCP checkpoint (SRC/.metadata: a pickle, which the engine never
// reads) is handed to the Python package's importer: this process becomes
// `python3 -m shardsafe import SRC DST` (the python3 next to this program
// when there is one, as in a virtual environment; else the PATH's).
//
// Everything is read into memory first (Save needs every buffer at once),
// with checksums verified for native sources. Saved JSON values, metadata
// and global blobs of a native source are carried over; per-rank blobs
// belong to the ranks of the saving job and are not (they are counted).
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "cli/output.h"
#include "shardsafe/source.h"

namespace shardsafe::cli {
namespace {

struct ImportSummary {
  std::string source;
  bool native = false;
  size_t tensors = 0;
  size_t blobs = 0;
  size_t skipped_per_rank_blobs = 0;
  uint64_t bytes = 0;
  SaveStats stats;
};

Result<ImportSummary> Import(const std::string& src_path, const std::string& dst,
                             ProgressLine* progress) {
  SS_ASSIGN_OR_RETURN(CheckpointSource src, OpenSource(*DefaultFileSystem(), src_path));
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
  SS_ASSIGN_OR_RETURN(LoadResult loaded, Load(request, src.path, *comm, load_options));
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

  SaveOptions save_options;
  if (progress) save_options.progress = progress->Callback();
  SS_ASSIGN_OR_RETURN(summary.stats, Save(state, dst, *comm, save_options));
  if (progress) progress->Finish();
  return summary;
}

bool IsTorchDcp(const std::string& path) {
  std::error_code ec;
  return std::filesystem::is_regular_file(JoinPath(path, ".metadata"), ec) &&
         !std::filesystem::exists(JoinPath(path, kIndexFileName), ec);
}

// Runs the Python importer in place of this process; returns only on failure.
Status ExecPythonImport(const std::string& src, const std::string& dst) {
  std::error_code ec;
  const auto self = std::filesystem::read_symlink("/proc/self/exe", ec);
  const auto sibling = self.parent_path() / "python3";
  const std::string python =
      !ec && std::filesystem::exists(sibling, ec) ? sibling.string() : std::string("python3");
  std::vector<std::string> args = {python, "-m", "shardsafe", "import", src, dst};
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::cout.flush();
  execvp(argv[0], argv.data());
  return UnavailableError(src + " is a torch DCP checkpoint, which the Python package imports: "
                          "running " + python + " -m shardsafe import failed: " +
                          std::strerror(errno));
}

}  // namespace

void AddImport(CLI::App& app, int* exit_code) {
  auto* cmd = app.add_subcommand(
      "import", "Copy every tensor of SRC (safetensors file, Hugging Face dir, checkpoint) "
                "into a new one-rank checkpoint DST");
  auto src = std::make_shared<std::string>();
  auto dst = std::make_shared<std::string>();
  auto json = std::make_shared<bool>(false);
  cmd->add_option("SRC", *src, "checkpoint dir, root, Hugging Face dir or .safetensors file")
      ->required();
  cmd->add_option("DST", *dst, "checkpoint directory to create (its name is the tag)")
      ->required();
  cmd->add_flag("--json", *json, "machine-readable output");
  cmd->callback([=] {
    if (IsTorchDcp(*src)) {  // text output only
      *exit_code = Fail(ExecPythonImport(*src, *dst));
      return;
    }
    ProgressLine progress(!*json);
    auto summary = Import(*src, *dst, &progress);
    progress.Finish();
    if (!summary.ok()) {
      *exit_code = Fail(summary.status());
      return;
    }
    *exit_code = kExitOk;
    const ImportSummary& s = *summary;
    if (*json) {
      PrintJson({{"source", s.source}, {"native", s.native}, {"path", *dst},
                 {"tensors", s.tensors}, {"blobs", s.blobs},
                 {"skipped_per_rank_blobs", s.skipped_per_rank_blobs}, {"bytes", s.bytes},
                 {"files", s.stats.files}, {"seconds", s.stats.seconds}});
      return;
    }
    std::cout << "imported " << s.tensors << " tensors (" << FormatBytes(s.bytes) << ") from "
              << s.source << " into " << *dst << ": " << s.stats.files << " data file(s)";
    if (s.blobs) std::cout << ", " << s.blobs << " blob(s)";
    std::cout << "\n";
    if (s.skipped_per_rank_blobs) {
      std::cout << "note: " << s.skipped_per_rank_blobs
                << " per-rank blob(s) not copied (they belong to the ranks of the saving job)\n";
    }
  });
}

}  // namespace shardsafe::cli
