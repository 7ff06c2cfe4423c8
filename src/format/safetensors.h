// The safetensors byte format: parse and validate a header, and build one.
//
// Layout (shared/reference/formats.md §1): u64 little-endian header length
// N, N bytes of UTF-8 JSON, then the data buffer; each entry addresses
// [begin, end) relative to the data buffer; entries tile the buffer without
// gap, and the file ends exactly at the end of the last entry.
//
// The parser accepts and rejects exactly what the reference Rust reader
// (safetensors 0.8) does, in the same check order, and names the rule in its
// error. Deliberate extra strictness: one, on the final coverage check (step
// 7), which the reference computes with wrapping u64 arithmetic in release
// builds; here it cannot wrap. Entries with equal (begin, end) are ordered
// by name (the reference's order there is arbitrary, from a hash map), which
// can change which name an "invalid offset" error reports. Duplicate tensor
// names follow the reference (last one
// wins) and are reported in SafetensorsHeader::duplicate_names so `verify`
// can warn. Parsing is bounded: the header is at most 100,000,000 bytes and
// no allocation is sized by a number from the file before it is validated.
//
// No I/O here: the caller reads the 8-byte prefix and the header bytes.
// Thread-safe (pure functions).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "shardsafe/status.h"
#include "shardsafe/types.h"

namespace shardsafe {

inline constexpr uint64_t kMaxSafetensorsHeaderBytes = 100'000'000;

struct SafetensorsEntry {
  std::string name;
  DType dtype = DType::kF32;
  Shape shape;
  uint64_t begin = 0;  // relative to the data buffer
  uint64_t end = 0;
};

struct SafetensorsHeader {
  uint64_t header_bytes = 0;  // N
  std::vector<SafetensorsEntry> entries;  // sorted by (begin, end)
  std::optional<std::map<std::string, std::string>> metadata;
  std::vector<std::string> duplicate_names;  // names that appeared twice

  uint64_t data_start() const { return 8 + header_bytes; }
};

// Step 1-3 of the reference reader: decodes N from the first 8 bytes of a
// file of `file_size` bytes. DataLoss "header too small" (file < 8 bytes),
// "header too large" (N > 100,000,000), "invalid header length" (8 + N >
// file size).
Result<uint64_t> ParseSafetensorsHeaderLength(std::span<const std::byte> prefix,
                                              uint64_t file_size);

// Steps 4-7: parses the N header bytes of a file of `file_size` bytes.
// DataLoss naming the rule: "invalid UTF-8 in header", "invalid JSON in
// header: ...", "invalid offset for tensor `x`", "overflow computing buffer
// size ...", "misaligned slice ...", "invalid shape, data type, or offset for
// tensor `x`", "incomplete metadata, file not fully covered".
Result<SafetensorsHeader> ParseSafetensorsHeader(std::string_view header_json,
                                                 uint64_t file_size);

// ParseSafetensorsHeader's checks and errors without keeping the entries:
// of each, only its byte range and a hash of its name (32 bytes, the text
// aside; names are read again where hashes or ranges tie). Then `each`
// gets every entry the reference keeps (the last of a repeated name), in
// the text's order, and `duplicates` the repeated names, as
// SafetensorsHeader::duplicate_names. For a reader of a header of many
// entries that needs each once (`verify`).
Status ScanSafetensorsHeader(std::string_view header_json, uint64_t file_size,
                             const std::function<void(const SafetensorsEntry&)>& each,
                             std::vector<std::string>* duplicates);

// One entry to write: its bytes follow in the data buffer.
struct EntrySpec {
  std::string name;
  DType dtype = DType::kF32;
  Shape shape;
  uint64_t bytes = 0;  // must equal NumBytes(dtype, elements of shape)
};

struct SafetensorsLayout {
  std::string header;  // the 8-byte length prefix and the padded JSON
  // For each input entry (input order): absolute byte offset in the file.
  std::vector<uint64_t> offsets;
  // Input indices in the order their bytes appear in the file.
  std::vector<uint32_t> order;
  uint64_t file_size = 0;
};

// Where a checkpoint's data files start their data buffer (export-hf keeps
// the reference's 8). 4 KiB: a tensor whose offset in the buffer is a
// multiple of 64 then lies at the same address modulo 64 in the page cache
// as in a 64-aligned allocation (PyTorch's), which keeps the kernel's copy
// of a hot load on its fast path (docs/format.md §2); and the first entry
// starts on a page, for mmap and O_DIRECT.
inline constexpr uint64_t kDataFileAlignment = 4096;

// Builds the header of a file holding `entries`, in the reference writer's
// canonical form (formats.md §1.4): entries sorted by dtype descending then
// name, compact JSON, `__metadata__` first when given, padded with spaces
// until the data buffer starts at a multiple of `data_alignment` (a power of
// two >= 8; with 8 the header is byte for byte the reference writer's).
// InvalidArgument for duplicate names, the name "__metadata__", a
// bytes/shape mismatch, a bad alignment, or a header over the size limit.
Result<SafetensorsLayout> BuildSafetensorsHeader(
    std::span<const EntrySpec> entries,
    const std::optional<std::map<std::string, std::string>>& metadata,
    uint64_t data_alignment = 8);

// An entry as the builder below reads it: views, no copy of its name or
// shape.
struct EntryRef {
  std::string_view name;
  DType dtype = DType::kF32;
  std::span<const uint64_t> shape;
  uint64_t bytes = 0;
};
// BuildSafetensorsHeader of `count` entries, entry i as `entry(i)` returns
// it (its views valid until the next call), for a caller that holds many
// entries in another form. Memory beyond the header: 20 bytes an entry.
Result<SafetensorsLayout> BuildSafetensorsHeader(
    size_t count, const std::function<EntryRef(size_t)>& entry,
    const std::optional<std::map<std::string, std::string>>& metadata,
    uint64_t data_alignment = 8);

}  // namespace shardsafe
