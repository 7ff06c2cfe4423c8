// shardsafe export-hf CKPT OUT: a checkpoint (or any loadable source) as a
// standard Hugging Face weights directory (docs/format.md §7).
#include <iostream>

#include "cli/commands.h"
#include "cli/output.h"
#include "shardsafe/hf.h"

namespace shardsafe::cli {
namespace {

Result<DType> ParseExportDType(std::string name) {
  for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  static const std::map<std::string, DType> kNames = {
      {"bf16", DType::kBF16},    {"bfloat16", DType::kBF16}, {"fp16", DType::kF16},
      {"f16", DType::kF16},      {"float16", DType::kF16},   {"half", DType::kF16},
      {"fp32", DType::kF32},     {"f32", DType::kF32},       {"float32", DType::kF32},
      {"float", DType::kF32},    {"fp64", DType::kF64},      {"f64", DType::kF64},
      {"float64", DType::kF64}, {"double", DType::kF64}};
  auto it = kNames.find(name);
  if (it == kNames.end()) {
    return InvalidArgumentError("--dtype " + name + ": use bf16, fp16, fp32 or fp64");
  }
  return it->second;
}

// PATTERN=REPLACEMENT, split at the last '=' (patterns may hold '=').
Result<RenameRule> ParseRename(const std::string& text) {
  const size_t eq = text.rfind('=');
  if (eq == std::string::npos || eq == 0) {
    return InvalidArgumentError("--rename \"" + text + "\": expected PATTERN=REPLACEMENT");
  }
  return RenameRule{text.substr(0, eq), text.substr(eq + 1)};
}

// qwen2_moe | mixtral | SRC[,SRC...]=TARGET[@DIM]
Result<std::vector<ExpertRule>> ParseExperts(const std::string& text) {
  if (text == "qwen2_moe" || text == "qwen3_moe" || text == "deepseek_v3") {
    return Qwen2MoeExperts();
  }
  if (text == "mixtral") return MixtralExperts();
  const size_t eq = text.find('=');
  if (eq == std::string::npos) {
    return InvalidArgumentError("--experts \"" + text +
                                "\": expected qwen2_moe, mixtral or SRC[,SRC]=TARGET[@DIM]");
  }
  ExpertRule rule;
  std::string target = text.substr(eq + 1);
  if (const size_t at = target.rfind('@'); at != std::string::npos) {
    try {
      rule.dim = std::stoi(target.substr(at + 1));
    } catch (...) {
      return InvalidArgumentError("--experts \"" + text + "\": bad dim after '@'");
    }
    target.resize(at);
  }
  rule.target = target;
  std::string sources = text.substr(0, eq);
  for (size_t start = 0;;) {
    const size_t comma = sources.find(',', start);
    rule.sources.push_back(sources.substr(start, comma - start));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return std::vector<ExpertRule>{rule};
}

struct Args {
  std::string src, out, max_shard = "50GB", dtype, prefix, name = "model";
  std::vector<std::string> include, exclude, rename, experts;
  bool overwrite = false, no_verify = false, json = false;
  int threads = 4;
};

Result<ExportHfOptions> OptionsOf(const Args& a) {
  ExportHfOptions o;
  SS_ASSIGN_OR_RETURN(o.max_shard_bytes, ParseByteSize(a.max_shard));
  if (!a.dtype.empty()) {
    SS_ASSIGN_OR_RETURN(o.dtype, ParseExportDType(a.dtype));
  }
  o.prefix = a.prefix;
  o.include = a.include;
  o.exclude = a.exclude;
  for (const std::string& r : a.rename) {
    SS_ASSIGN_OR_RETURN(RenameRule rule, ParseRename(r));
    o.rename.push_back(std::move(rule));
  }
  for (const std::string& e : a.experts) {
    SS_ASSIGN_OR_RETURN(auto rules, ParseExperts(e));
    o.experts.insert(o.experts.end(), rules.begin(), rules.end());
  }
  o.weights_name = a.name;
  o.overwrite = a.overwrite;
  o.verify_checksums = !a.no_verify;
  o.io_threads = a.threads;
  return o;
}

void Report(const Args& a, const ExportHfStats& s) {
  if (a.json) {
    PrintJson({{"source", s.source}, {"path", a.out}, {"files", s.files}, {"copied", s.copied},
               {"tensors", s.tensors}, {"bytes", s.bytes},
               {"total_parameters", s.total_parameters}, {"bytes_read", s.bytes_read},
               {"chunks_verified", s.chunks_verified}, {"seconds", s.seconds},
               {"warnings", s.warnings}});
    return;
  }
  std::cout << "exported " << s.tensors << " tensors (" << FormatBytes(s.bytes) << ", "
            << s.total_parameters << " parameters) from " << s.source << " to " << a.out << " in "
            << s.seconds << " s (" << FormatRate(s.bytes, s.seconds) << ")\n";
  for (const std::string& f : s.files) std::cout << "  " << Printable(f) << "\n";
  for (const std::string& f : s.copied) {
    std::cout << "  " << Printable(f) << " (saved with the checkpoint)\n";
  }
  std::cout << s.chunks_verified << " source checksums verified\n";
  for (const std::string& w : s.warnings) std::cout << "warning: " << Printable(w) << "\n";
}

}  // namespace

void AddExportHf(CLI::App& app, int* exit_code) {
  auto* cmd = app.add_subcommand(
      "export-hf", "Write a checkpoint as a Hugging Face weights directory (model.safetensors "
                   "or shards + index, config files)");
  auto a = std::make_shared<Args>();
  cmd->add_option("CKPT", a->src, "checkpoint dir, root, Hugging Face dir or .safetensors file")
      ->required();
  cmd->add_option("OUT", a->out, "directory to create")->required();
  cmd->add_option("--max-shard-size", a->max_shard,
                  "largest shard in tensor bytes: 5GB, 500MB, 2GiB (default 50GB)");
  cmd->add_option("--dtype", a->dtype, "cast F16/BF16/F32/F64 tensors: bf16, fp16, fp32, fp64");
  cmd->add_option("--prefix", a->prefix,
                  "export only keys starting with this, without it (e.g. model.)");
  // Repeatable options take one value each, so positionals can follow them.
  cmd->add_option("--include", a->include, "export only keys matching one of these regexes (RE2)")
      ->allow_extra_args(false);
  cmd->add_option("--exclude", a->exclude, "skip keys matching any of these regexes")
      ->allow_extra_args(false);
  cmd->add_option("--rename", a->rename,
                  "PATTERN=REPLACEMENT, applied in order to every name (re.sub; \\1 for groups)")
      ->allow_extra_args(false);
  cmd->add_option("--experts", a->experts,
                  "split grouped expert tensors: qwen2_moe, mixtral, or SRC[,SRC]=TARGET[@DIM]")
      ->allow_extra_args(false);
  cmd->add_option("--name", a->name, "weights file name stem (adapter_model for PEFT)");
  cmd->add_flag("--overwrite", a->overwrite, "replace OUT if it exists");
  cmd->add_flag("--no-verify", a->no_verify, "skip checking the source's checksums");
  cmd->add_option("--threads", a->threads, "output files written at once")
      ->check(CLI::Range(1, 256));
  cmd->add_flag("--json", a->json, "machine-readable output");
  cmd->callback([=] {
    auto options = OptionsOf(*a);
    if (!options.ok()) {
      *exit_code = Fail(options.status());
      return;
    }
    ProgressLine progress(!a->json);
    options->progress = progress.Callback();
    auto stats = ExportHf(a->src, a->out, *options);
    progress.Finish();
    if (!stats.ok()) {
      *exit_code = FailOverwritable(stats.status());
      return;
    }
    *exit_code = kExitOk;
    Report(*a, *stats);
  });
}

}  // namespace shardsafe::cli
