// Fuzzes the checks of the Python package's records (format/package_records.h,
// docs/format.md §6) that `verify` runs: the input is both a per-rank value's
// blob (a safetensors file: its 8-byte length, the header, which
// CheckPerRankValue decodes, and the tensors' bytes) and, as text, the
// values' JSON (CheckValuesJson). Each fails fast on the other's inputs (a
// blob is no JSON text; JSON text has no plausible length prefix), so one
// input format serves both. The whole-checkpoint fuzzer reaches
// CheckPerRankValue only through a blob whose checksum matches; here every
// mutation of the value's JSON and its tensor tags gets through.
//
// Seeds: checkpoint_dir_seeds writes them (its second directory).
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

#include "format/package_records.h"
#include "format/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace shardsafe;
  const std::string_view in(reinterpret_cast<const char*>(data), size);
  const auto prefix = std::as_bytes(std::span(data, std::min<size_t>(size, 8)));
  if (auto length = ParseSafetensorsHeaderLength(prefix, size); length.ok()) {
    CheckPerRankValue(in.substr(8, *length), size).IgnoreError();
  }
  CheckValuesJson(in).IgnoreError();
  return 0;
}
