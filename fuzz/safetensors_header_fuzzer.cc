// Fuzzes the safetensors header reader, and checks the writer against it.
//
// The input is header JSON (what follows the 8-byte length). Requiring the
// fuzzer to also guess a matching length prefix and data size would waste
// almost every mutation on steps 3 and 7, so the file size is derived:
//   1. parse with no data buffer;
//   2. if only the final coverage check failed, its message says where the
//      entries end; parse again with exactly that much data, which must then
//      succeed (steps 1-6 do not depend on the file size);
//   3. for an accepted header, write the same entries and metadata with
//      BuildSafetensorsHeader and parse that: it must be accepted and hold
//      the same entries.
// The first 8 bytes also go through ParseSafetensorsHeaderLength.
// Any violated property aborts, which libFuzzer reports as a crash.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <tuple>

#include "format/safetensors.h"

namespace {

using namespace shardsafe;

[[noreturn]] void Fail(const char* what, const Status& status = Status()) {
  std::fprintf(stderr, "property violated: %s %s\n", what, status.ToString().c_str());
  std::abort();
}

// Where the entries end, from "... (entries end at byte X of the data ...".
bool DataBytesFromError(const Status& status, uint64_t& bytes) {
  const std::string& m = status.message();
  if (m.rfind("incomplete metadata", 0) != 0) return false;
  const size_t at = m.find("end at byte ");
  if (at == std::string::npos) Fail("coverage error without the data size", status);
  bytes = std::strtoull(m.c_str() + at + 12, nullptr, 10);
  return true;
}

using EntryKey = std::tuple<std::string, DType, Shape, uint64_t>;

std::map<std::string, EntryKey> Entries(const SafetensorsHeader& h) {
  std::map<std::string, EntryKey> out;
  for (const SafetensorsEntry& e : h.entries) {
    out[e.name] = {e.name, e.dtype, e.shape, e.end - e.begin};
  }
  return out;
}

void CheckWriterRoundTrip(const SafetensorsHeader& parsed) {
  std::vector<EntrySpec> specs;
  for (const SafetensorsEntry& e : parsed.entries) {
    specs.push_back({e.name, e.dtype, e.shape, e.end - e.begin});
  }
  Result<SafetensorsLayout> built = BuildSafetensorsHeader(specs, parsed.metadata);
  if (!built.ok()) Fail("writer rejected an accepted header", built.status());
  const std::string_view json = std::string_view(built->header).substr(8);
  Result<SafetensorsHeader> again = ParseSafetensorsHeader(json, built->file_size);
  if (!again.ok()) Fail("reader rejected the writer's header", again.status());
  if (again->metadata != parsed.metadata) Fail("metadata changed in the round trip");
  if (Entries(*again) != Entries(parsed)) Fail("entries changed in the round trip");
  if (!again->duplicate_names.empty()) Fail("the writer wrote a name twice");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto prefix = std::as_bytes(std::span(data, size < 8 ? size : 8));
  ParseSafetensorsHeaderLength(prefix, size).status().IgnoreError();

  const std::string_view json(reinterpret_cast<const char*>(data), size);
  Result<SafetensorsHeader> header = ParseSafetensorsHeader(json, 8 + size);
  uint64_t data_bytes = 0;
  if (!header.ok() && DataBytesFromError(header.status(), data_bytes)) {
    if (data_bytes > UINT64_MAX - 8 - size) return 0;  // cannot be a file size
    header = ParseSafetensorsHeader(json, 8 + size + data_bytes);
    if (!header.ok()) Fail("rejected with the data size it asked for", header.status());
  }
  if (header.ok()) CheckWriterRoundTrip(*header);
  return 0;
}
