// Hugging Face export: a checkpoint (or any source Load accepts) written as
// a standard Hugging Face weights directory (docs/format.md §7).
//
//   shardsafe::ExportHfOptions opts;
//   opts.prefix = "model.";                       // the model part of a training state
//   opts.dtype = shardsafe::DType::kBF16;
//   opts.experts = shardsafe::Qwen2MoeExperts();  // grouped experts -> per-expert keys
//   auto stats = shardsafe::ExportHf("/ckpt/run1", "/models/run1-hf", opts);
//
// The export streams: it reads the source in bounded batches straight into
// the output files, so its memory is bounded by the options below whatever
// the model size, and output files are written in parallel. One process
// runs ExportHf; ExportHfStaging and ExportHfPart (below) split the same
// export over the processes of a group.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "shardsafe/checkpoint.h"

namespace re2 {
class RE2;
}

namespace shardsafe {

// One rename rule: every match of `pattern` in a name is replaced by
// `replacement`, as Python's re.sub does.
//
// The one regex dialect of shardsafe's name rules (export and load renames,
// export include / exclude) is RE2's: Python re syntax without
// backreferences or lookaround in patterns (https://github.com/google/re2/wiki/Syntax);
// a replacement names groups as \0 .. \9 (not \g<name>).
struct RenameRule {
  std::string pattern;
  std::string replacement;
};

// Ordered rename rules, compiled once; each rule applies to the result of
// the previous one. Thread-compatible: Apply may be called concurrently.
class RenameRules {
 public:
  // InvalidArgument naming the pattern (bad syntax) or the rule (a
  // replacement naming a group the pattern lacks).
  static Result<RenameRules> Create(const std::vector<RenameRule>& rules);
  RenameRules(RenameRules&&) noexcept;
  RenameRules& operator=(RenameRules&&) noexcept;
  ~RenameRules();

  std::string Apply(const std::string& name) const;
  const std::vector<RenameRule>& rules() const { return rules_; }

 private:
  RenameRules() = default;
  std::vector<RenameRule> rules_;
  std::vector<std::unique_ptr<re2::RE2>> compiled_;  // compiled_[i]: rules_[i].pattern
};

// Grouped expert tensors <-> per-expert tensors, as transformers 5's
// conversion_mapping (and shardsafe.hf.ExpertGroup in Python). `sources`
// hold one `*` each (the expert number); with several sources the grouped
// tensor's dimension `dim` is their concatenation, in order.
struct ExpertRule {
  std::vector<std::string> sources;  // e.g. "mlp.experts.*.gate_proj.weight"
  std::string target;                // e.g. "mlp.experts.gate_up_proj"
  int dim = 1;                       // in the grouped tensor; negative counts from the end
};

// transformers' "qwen2_moe" mapping (also qwen3_moe, deepseek_v2/v3, olmoe,
// glm4_moe, ...) and "mixtral" (whose .block_sparse_moe. <-> .mlp. rename is
// a RenameRule of its own).
std::vector<ExpertRule> Qwen2MoeExperts();
std::vector<ExpertRule> MixtralExperts();

struct ExportHfOptions {
  // Shard size cap in bytes of tensor data (transformers 5's default, 50 GB).
  uint64_t max_shard_bytes = 50'000'000'000;
  // Cast F16/BF16/F32/F64 tensors to this float dtype; others stay as saved.
  std::optional<DType> dtype;
  // Only keys starting with `prefix` are exported, without it.
  std::string prefix;
  // RE2 patterns on the key (after `prefix` is stripped): with `include`
  // non-empty a key must match one; a key matching an `exclude` is skipped.
  std::vector<std::string> include;
  std::vector<std::string> exclude;
  std::vector<ExpertRule> experts;  // split grouped tensors, before renaming
  std::vector<RenameRule> rename;   // applied in order to every output name
  // Instead of `rename` when set (a Python callable, from the Python
  // package): the output name of a name. An error aborts the export.
  std::function<Result<std::string>(const std::string&)> rename_fn;
  // File names: NAME.safetensors or NAME-0000i-of-0000N.safetensors and
  // NAME.safetensors.index.json. "adapter_model" for PEFT adapters.
  std::string weights_name = "model";
  bool overwrite = false;         // replace an existing OUT
  bool verify_checksums = true;   // every source chunk used, before OUT appears
  bool direct_io = true;          // O_DIRECT output (buffered fallback on tmpfs)
  int io_threads = 4;             // output files written at once
  // Memory per output file in flight: two windows of batch_bytes (one read
  // while the other is written in place with O_DIRECT) and one write buffer
  // of io_buffer_bytes for the file's unaligned tail. Writes go out in
  // requests of io_buffer_bytes, io_depth at a time.
  // At the defaults, 40 MiB per file: 160 MiB for 4 files, which the
  // process-wide buffer cache keeps pre-faulted from one export to the next.
  uint64_t batch_bytes = uint64_t{16} << 20;
  size_t io_buffer_bytes = 8 << 20;
  int io_depth = 2;
  FileSystem* fs = nullptr;  // default: DefaultFileSystem()
  ProgressFn progress;       // phases "plan", "write", "verify"; calling thread
};

struct ExportHfStats {
  std::string source;             // what the source path resolved to
  std::vector<std::string> files; // weight files written, in order
  std::vector<std::string> copied;  // other files written (config.json, ...)
  uint64_t tensors = 0;
  uint64_t bytes = 0;             // tensor bytes written
  uint64_t total_parameters = 0;  // elements written
  uint64_t bytes_read = 0;        // source bytes read (verification included)
  uint64_t chunks_verified = 0;
  double seconds = 0;
  std::vector<std::string> warnings;  // e.g. a saved file that was not copied
};

// Writes the Hugging Face directory `out` from `source`. Errors: NotFound
// (no source), AlreadyExists (`out` exists, without overwrite),
// InvalidArgument (a bad pattern or rule, two tensors under one name, a
// rule that does not fit a tensor's shape, nothing to export), DataLoss
// (corrupt source, naming file, tensor and chunk), ResourceExhausted (disk
// full). On error `out` is as it was and no temporary is left behind.
Result<ExportHfStats> ExportHf(const std::string& source, const std::string& out,
                               const ExportHfOptions& options);

// Collective export: the weight files of one export written by several
// processes at once (shardsafe.hf.export(..., process_group=...) in the
// Python package; docs/format.md §7). The plan is a pure function of the
// source's index and the options, so every process computes the same one;
// process p of n writes weight files p, p + n, ... into one temporary
// directory, which one process publishes:
//
//   // one process (the publisher):
//   auto staging = shardsafe::ExportHfStaging::Create(source, out, opts);
//   // ... sends (*staging)->source() and ->dir() to the others; then every
//   // process p of n, the publisher too, with the same options:
//   auto part = shardsafe::ExportHfPart(staged_source, staged_dir, opts, p, n);
//   // ... the publisher, once every process reported success:
//   auto stats = (*staging)->Finish();
//   // or, if any process failed: staging->reset() removes the temporary.
//
// The processes must share the file system holding `out`'s parent.
class ExportHfStaging {
 public:
  // The checks ExportHf makes before writing, in its order: NotFound (no
  // source), InvalidArgument (a bad option or rule, nothing to export),
  // AlreadyExists (`out` exists, without overwrite). Then creates
  // PARENT/.tmp-export-BASE.NONCE, locked while this object lives. Keeps the
  // source open (a native checkpoint stays pinned against retention), the
  // plan and the saved files to copy; `options.fs` must outlive it.
  static Result<std::unique_ptr<ExportHfStaging>> Create(const std::string& source,
                                                         const std::string& out,
                                                         const ExportHfOptions& options);
  ~ExportHfStaging();  // removes the temporary directory unless published

  const std::string& source() const;  // resolved: a root's latest checkpoint
  const std::string& dir() const;     // the temporary directory
  size_t num_files() const;           // weight files in the plan

  // Checks that dir() holds every weight file of the plan with its planned
  // size and safetensors header (FailedPrecondition naming the first file
  // missing or different: a process that did not write its share, or that
  // planned with other options), writes the index and the saved files, and
  // publishes dir() as `out` (swapped with an existing one under
  // overwrite). On error `out` is as it was. Once only.
  Result<ExportHfStats> Finish();

 private:
  struct State;
  explicit ExportHfStaging(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
  friend Result<ExportHfStats> ExportHf(const std::string&, const std::string&,
                                        const ExportHfOptions&);
};

// Writes the weight files i (0-based, in plan order) with i % count == index
// of the export of `source` under `options` into `dir` (an
// ExportHfStaging's temporary directory), each fdatasync'ed, and verifies
// every source chunk they use. No index, saved files or rename. Stats: the
// files written (none when index is past the plan's files), their tensors,
// bytes and parameters, and the bytes read and chunks verified.
// FailedPrecondition when `dir` is not a directory here (a file system the
// processes do not share); other errors as ExportHf. A file left half
// written on error is removed with the directory by its ExportHfStaging.
Result<ExportHfStats> ExportHfPart(const std::string& source, const std::string& dir,
                                   const ExportHfOptions& options, int index, int count);

// "5GB" -> 5e9, "500MB", "1.5GB", "2GiB" -> 2^31, "4096" bytes; KB/MB/GB/TB
// are decimal as in huggingface_hub. InvalidArgument otherwise.
Result<uint64_t> ParseByteSize(std::string_view text);

// The blob name under which a file saved with a checkpoint is stored
// ("file/" + name; docs/format.md §6), and the check of such a name.
inline constexpr std::string_view kSavedFilePrefix = "file/";
Status ValidateSavedFileName(std::string_view name);

}  // namespace shardsafe
