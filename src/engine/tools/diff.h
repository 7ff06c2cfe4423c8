// Tensor-by-tensor comparison of two checkpoints (the engine behind
// `shardsafe diff`). Works on any sources Load accepts, in whatever layout
// each was saved: tensors are compared in flat pieces of bounded size, so
// memory stays small whatever the model size.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "shardsafe/checkpoint.h"

namespace shardsafe {

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
  bool values_equal = true;         // saved JSON values
  bool identical() const;
};

// Compares every tensor of `a` and `b`. Errors: NotFound / DataLoss from
// opening or reading either side (checksums are verified).
Result<DiffReport> DiffCheckpoints(const std::string& a, const std::string& b,
                                   FileSystem* fs = nullptr,
                                   uint64_t piece_bytes = uint64_t{32} << 20);

}  // namespace shardsafe
