// Reading follows the reference reader step by step (formats.md §1.5); the
// step numbers in comments are that list's. Steps 1-3 need only the 8-byte
// prefix and the file size, so callers can bound their read of the header
// before allocating for it.
//
// One deliberate difference: the reference computes `end + 8 + N` for the
// final coverage check (step 7) with wrapping arithmetic in release builds,
// so a header whose entries sum to nearly 2^64 bytes could wrap around to the
// file size and pass. Here the check cannot wrap; such files are rejected.
//
// Writing reproduces the reference writer (formats.md §1.4) byte for byte:
// sort by dtype descending (the enum is in safetensors order), then name;
// offsets assigned contiguously; compact JSON with serde_json's escaping;
// space padding to a multiple of 8 (or further, to a given alignment).
#include "format/safetensors.h"

#include <algorithm>
#include <string_view>
#include <tuple>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "format/json_text.h"
#include "format/safetensors_sax.h"

namespace shardsafe {
namespace {

using internal::RawHeader;
using internal::RawTensorInfo;

constexpr uint64_t kPrefixBytes = 8;

Status JsonError(std::string detail) {
  return DataLossError("invalid JSON in header: " + detail);
}

std::string Quoted(std::string_view name) { return "`" + std::string(name) + "`"; }

// Step 5. nlohmann quirks handled before its parser sees the text: it skips
// a leading UTF-8 BOM and takes a NUL byte for the end of input, while serde
// rejects both (no raw NUL is valid anywhere in JSON).
Result<RawHeader> DecodeJson(std::string_view text) {
  const size_t nul = text.find('\0');
  if (nul != std::string_view::npos) {
    return JsonError("NUL byte at index " + std::to_string(nul));
  }
  if (text.starts_with("\xEF\xBB\xBF")) return JsonError("expected value (byte order mark)");
  internal::HeaderSaxHandler handler;
  const bool ok = nlohmann::json::sax_parse(text.data(), text.data() + text.size(), &handler,
                                            nlohmann::json::input_format_t::json,
                                            /*strict=*/true, /*ignore_comments=*/false);
  if (!ok) return JsonError(handler.error());
  return std::move(handler.header());
}

// Applies the reference's map semantics: a repeated tensor name replaces
// the earlier entry. Returns the surviving entries and the repeated names.
std::vector<SafetensorsEntry> LastWins(std::vector<RawTensorInfo>& raw,
                                       std::vector<std::string>& duplicates) {
  std::vector<SafetensorsEntry> entries;
  std::unordered_map<std::string, size_t> index;  // name -> position in entries
  for (RawTensorInfo& t : raw) {
    auto [it, inserted] = index.try_emplace(t.name, entries.size());
    if (!inserted && std::find(duplicates.begin(), duplicates.end(), t.name) == duplicates.end()) {
      duplicates.push_back(t.name);
    }
    SafetensorsEntry e{std::move(t.name), t.dtype, std::move(t.shape), t.begin, t.end};
    if (inserted) {
      entries.push_back(std::move(e));
    } else {
      entries[it->second] = std::move(e);
    }
  }
  return entries;
}

// Step 6 b-e for one entry whose offsets already passed step 6 a.
Status ValidateSize(const SafetensorsEntry& e) {
  static const std::string kOverflow =
      "overflow computing buffer size from shape and/or element type";
  uint64_t n = 1;
  for (uint64_t d : e.shape) {  // left to right, like Rust's try_fold
    if (__builtin_mul_overflow(n, d, &n)) {
      return DataLossError(kOverflow + " (tensor " + Quoted(e.name) + ")");
    }
  }
  uint64_t bits;
  if (__builtin_mul_overflow(n, static_cast<uint64_t>(DTypeBits(e.dtype)), &bits)) {
    return DataLossError(kOverflow + " (tensor " + Quoted(e.name) + ")");
  }
  if (bits % 8 != 0) {
    return DataLossError("misaligned slice for tensor " + Quoted(e.name) +
                         ": The slice is slicing for subbytes dtypes, and the slice does not "
                         "end up at a byte boundary, this is invalid.");
  }
  if (e.end - e.begin != bits / 8) {
    return DataLossError("invalid shape, data type, or offset for tensor " + Quoted(e.name));
  }
  return Status();
}

// Step 6: entries sorted by (begin, end) must tile [0, end of last).
// Returns where the last entry ends.
Result<uint64_t> ValidateEntries(const std::vector<SafetensorsEntry>& entries) {
  uint64_t expected = 0;
  for (const SafetensorsEntry& e : entries) {
    if (e.begin != expected || e.end < e.begin) {
      return DataLossError("invalid offset for tensor " + Quoted(e.name));
    }
    SS_RETURN_IF_ERROR(ValidateSize(e));
    expected = e.end;
  }
  return expected;
}

}  // namespace

Result<uint64_t> ParseSafetensorsHeaderLength(std::span<const std::byte> prefix,
                                              uint64_t file_size) {
  // 1. Room for the length prefix.
  if (file_size < kPrefixBytes || prefix.size() < kPrefixBytes) {
    return DataLossError("header too small");
  }
  // 2. N, little-endian, bounded.
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | std::to_integer<uint64_t>(prefix[i]);
  if (n > kMaxSafetensorsHeaderBytes) return DataLossError("header too large");
  // 3. The header fits in the file (no overflow: N <= 1e8).
  if (kPrefixBytes + n > file_size) return DataLossError("invalid header length");
  return n;
}

Result<SafetensorsHeader> ParseSafetensorsHeader(std::string_view header_json,
                                                 uint64_t file_size) {
  // Steps 2-3 again, for callers that did not go through the prefix.
  const uint64_t n = header_json.size();
  if (n > kMaxSafetensorsHeaderBytes) return DataLossError("header too large");
  if (file_size < kPrefixBytes || n > file_size - kPrefixBytes) {
    return DataLossError("invalid header length");
  }
  // 4. UTF-8.
  if (auto bad = internal::CheckUtf8(header_json)) {
    return DataLossError("invalid UTF-8 in header: " + *bad);
  }
  // 5. JSON into the reference's schema.
  SS_ASSIGN_OR_RETURN(RawHeader raw, DecodeJson(header_json));
  SafetensorsHeader header;
  header.header_bytes = n;
  header.metadata = std::move(raw.metadata);
  header.entries = LastWins(raw.tensors, header.duplicate_names);
  // 6. Sort by (begin, end) (name breaks ties: the reference's order there
  // comes from a hash map and is arbitrary), then tile from 0.
  std::sort(header.entries.begin(), header.entries.end(),
            [](const SafetensorsEntry& a, const SafetensorsEntry& b) {
              return std::tie(a.begin, a.end, a.name) < std::tie(b.begin, b.end, b.name);
            });
  SS_ASSIGN_OR_RETURN(uint64_t data_bytes, ValidateEntries(header.entries));
  // 7. The data buffer ends exactly at the end of the file.
  if (data_bytes != file_size - kPrefixBytes - n) {
    return DataLossError("incomplete metadata, file not fully covered (entries end at byte " +
                         std::to_string(data_bytes) + " of the data buffer, which holds " +
                         std::to_string(file_size - kPrefixBytes - n) + ")");
  }
  return header;
}

}  // namespace shardsafe
