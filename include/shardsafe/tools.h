// Offline tools over any source Load accepts (the engine behind `shardsafe
// verify` and `shardsafe diff`). Not collective: one process runs them.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "shardsafe/checkpoint.h"

namespace shardsafe {

// ---------------------------------------------------------------- verify --

// Every data file present with its recorded size and a valid safetensors
// header naming each chunk where the index says it is, every chunk's and
// blob's checksum, every tensor fully covered.
struct VerifyReport {
  std::string path;  // what was verified
  bool native = false;
  std::vector<std::string> faults;  // one line each, naming file and tensor
  // Why there was nothing to verify (faults then holds the message):
  // NotFound when nothing exists at `path`, InvalidArgument when it is no
  // valid path; else kOk (what exists but cannot be opened is a fault).
  StatusCode unopened = StatusCode::kOk;
  uint64_t files = 0;  // data files (a version-3 checkpoint's checksum files not counted)
  uint64_t tensors = 0;
  uint64_t chunks_verified = 0;  // checksums computed and matching
  uint64_t bytes_checked = 0;
  bool ok() const { return faults.empty(); }
};

// Checks everything at `path`. A checkpoint that cannot be opened at all
// yields a report with that one fault. Errors only for invalid arguments.
VerifyReport VerifyCheckpoint(const std::string& path, FileSystem* fs = nullptr,
                              int io_threads = 4, const ProgressFn& progress = nullptr);

// ------------------------------------------------------------------ diff --

// Tensor-by-tensor comparison, in whatever layout each side was saved:
// tensors are compared in flat pieces of bounded size, so memory stays small
// whatever the model size.
struct TensorDiff {
  std::string key;
  // "equal", "differs", "only in A", "only in B", "shape differs",
  // "dtype differs".
  std::string status;
  uint64_t elements = 0;
  uint64_t differing_elements = 0;
  std::optional<double> max_abs_diff;  // float dtypes that differ
};

struct DiffReport {
  std::vector<TensorDiff> tensors;  // sorted by key
  bool values_equal = true;         // saved JSON values, equal as JSON
  // Where they differ: a JSON pointer (RFC 6901: "/config/lr") to each value
  // changed, added or removed (inside objects and arrays, the innermost
  // place), sorted; "" when the values as a whole differ in type.
  std::vector<std::string> differing_values;
  bool identical() const;
};

// Compares every tensor of `a` and `b`. Errors: NotFound / DataLoss from
// opening or reading either side (checksums are verified).
Result<DiffReport> DiffCheckpoints(const std::string& a, const std::string& b,
                                   FileSystem* fs = nullptr,
                                   uint64_t piece_bytes = uint64_t{32} << 20);

}  // namespace shardsafe
