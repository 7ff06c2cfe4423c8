// The Python package's records in a checkpoint (docs/format.md §6), checked
// as its loader reads them, so that `verify` finds what a load would refuse:
//
// - a per-rank value, blob `rank/KEY` of each saving rank: a safetensors
//   file whose `__metadata__` has one entry, `value`, the value as JSON text
//   with each tensor replaced by {"__shardsafe_tensor__": "tN"} (a tensor
//   of that file) and each non-finite float by {"__shardsafe_float__": F};
// - the global values (the index's `values`), with non-finite floats
//   written the same way.
//
// F is one of "nan", "inf", "-inf". Nesting is bounded as in the index
// (kMaxPackageJsonNesting arrays and objects).
#pragma once

#include <cstdint>
#include <string_view>

#include "shardsafe/status.h"

namespace shardsafe {

inline constexpr std::string_view kPerRankValuePrefix = "rank/";
inline constexpr size_t kMaxPackageJsonNesting = 256;

// True for the name of a per-rank value's blob.
bool IsPerRankValueBlob(std::string_view blob_name);

// Checks a per-rank value blob of `blob_bytes` bytes whose safetensors
// header (the N bytes after its 8-byte length) is `header_json`. DataLoss
// saying what is wrong (no context: the caller names file, blob and rank).
Status CheckPerRankValue(std::string_view header_json, uint64_t blob_bytes);

// Checks the values' JSON text (an object) for tags the loader refuses.
Status CheckValuesJson(std::string_view values_json);

}  // namespace shardsafe
