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
#include <deque>
#include <functional>
#include <map>
#include <string_view>
#include <tuple>
#include <unordered_map>
#include <unordered_set>

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

// Step 5 for a reader that keeps no entry: each TensorInfo, with its
// number in the text, to `sink`.
Status ParseEach(std::string_view text,
                 const std::function<void(size_t, RawTensorInfo&&)>& sink) {
  const size_t nul = text.find('\0');
  if (nul != std::string_view::npos) {
    return JsonError("NUL byte at index " + std::to_string(nul));
  }
  if (text.starts_with("\xEF\xBB\xBF")) return JsonError("expected value (byte order mark)");
  internal::HeaderSaxHandler handler;
  size_t n = 0;
  handler.set_sink([&](RawTensorInfo&& t) { sink(n++, std::move(t)); });
  const bool ok = nlohmann::json::sax_parse(text.data(), text.data() + text.size(), &handler,
                                            nlohmann::json::input_format_t::json,
                                            /*strict=*/true, /*ignore_comments=*/false);
  if (!ok) return JsonError(handler.error());
  return Status();
}

// The names of entries `wanted` (numbers in `text`, which parsed once).
std::unordered_map<size_t, std::string> NamesOf(std::string_view text,
                                                const std::vector<size_t>& wanted) {
  std::unordered_map<size_t, std::string> names;
  if (wanted.empty()) return names;
  for (size_t i : wanted) names.emplace(i, std::string());
  ParseEach(text, [&](size_t i, RawTensorInfo&& t) {
    auto it = names.find(i);
    if (it != names.end()) it->second = std::move(t.name);
  }).IgnoreError();
  return names;
}

// What the scan keeps of an entry: 32 bytes.
struct Scanned {
  uint64_t begin;
  uint64_t end;
  uint64_t hash;   // of its name
  uint64_t index;  // its number in the text
};

// LastWins on scanned entries: drops all but the last of each repeated
// name (found by hash, then by name), and lists the repeated names in the
// order LastWins would.
void DropRepeats(std::string_view text, std::deque<Scanned>& scanned,
                 std::vector<std::string>* duplicates) {
  std::sort(scanned.begin(), scanned.end(), [](const Scanned& a, const Scanned& b) {
    return std::tie(a.hash, a.index) < std::tie(b.hash, b.index);
  });
  std::vector<size_t> candidates;  // entries whose name's hash another has
  for (size_t i = 0; i < scanned.size(); ++i) {
    const bool same_prev = i > 0 && scanned[i - 1].hash == scanned[i].hash;
    const bool same_next = i + 1 < scanned.size() && scanned[i + 1].hash == scanned[i].hash;
    if (same_prev || same_next) candidates.push_back(scanned[i].index);
  }
  if (candidates.empty()) return;
  const std::unordered_map<size_t, std::string> names = NamesOf(text, candidates);
  std::map<std::string_view, std::vector<size_t>> by_name;  // of the candidates, in text order
  for (size_t i : candidates) by_name[names.at(i)].push_back(i);
  std::vector<std::pair<size_t, std::string_view>> repeated;  // (second entry, name)
  std::unordered_set<size_t> dropped;
  for (auto& [name, entries] : by_name) {
    if (entries.size() < 2) continue;
    std::sort(entries.begin(), entries.end());
    repeated.emplace_back(entries[1], name);
    dropped.insert(entries.begin(), entries.end() - 1);
  }
  std::sort(repeated.begin(), repeated.end());
  for (const auto& [second, name] : repeated) duplicates->emplace_back(name);
  std::erase_if(scanned, [&](const Scanned& s) { return dropped.count(s.index) > 0; });
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

Status ScanSafetensorsHeader(std::string_view header_json, uint64_t file_size,
                             const std::function<void(const SafetensorsEntry&)>& each,
                             std::vector<std::string>* duplicates) {
  // Steps 2-4 as ParseSafetensorsHeader.
  const uint64_t n = header_json.size();
  if (n > kMaxSafetensorsHeaderBytes) return DataLossError("header too large");
  if (file_size < kPrefixBytes || n > file_size - kPrefixBytes) {
    return DataLossError("invalid header length");
  }
  if (auto bad = internal::CheckUtf8(header_json)) {
    return DataLossError("invalid UTF-8 in header: " + *bad);
  }
  // 5. Each entry's range and name's hash, and where its size is wrong the
  // error (reported if step 6 reaches it).
  std::deque<Scanned> scanned;
  std::map<uint64_t, Status> size_errors;
  SS_RETURN_IF_ERROR(ParseEach(header_json, [&](size_t i, RawTensorInfo&& t) {
    scanned.push_back({t.begin, t.end, std::hash<std::string_view>()(t.name), i});
    if (t.end < t.begin) return;  // an offset error, found first
    Status size = ValidateSize({std::move(t.name), t.dtype, std::move(t.shape), t.begin, t.end});
    if (!size.ok()) size_errors.emplace(i, std::move(size));
  }));
  DropRepeats(header_json, scanned, duplicates);
  // 6. Sorted by (begin, end, name) (names read again for ties only), then
  // tiling from 0.
  std::sort(scanned.begin(), scanned.end(), [](const Scanned& a, const Scanned& b) {
    return std::tie(a.begin, a.end, a.index) < std::tie(b.begin, b.end, b.index);
  });
  std::vector<size_t> tied;
  for (size_t i = 1; i < scanned.size(); ++i) {
    if (scanned[i].begin == scanned[i - 1].begin && scanned[i].end == scanned[i - 1].end) {
      if (tied.empty() || tied.back() != scanned[i - 1].index) tied.push_back(scanned[i - 1].index);
      tied.push_back(scanned[i].index);
    }
  }
  if (!tied.empty()) {
    const std::unordered_map<size_t, std::string> names = NamesOf(header_json, tied);
    std::stable_sort(scanned.begin(), scanned.end(), [&](const Scanned& a, const Scanned& b) {
      if (std::tie(a.begin, a.end) != std::tie(b.begin, b.end)) {
        return std::tie(a.begin, a.end) < std::tie(b.begin, b.end);
      }
      return names.at(a.index) < names.at(b.index);
    });
  }
  uint64_t data_bytes = 0;
  for (const Scanned& e : scanned) {
    if (e.begin != data_bytes || e.end < e.begin) {
      return DataLossError("invalid offset for tensor " +
                           Quoted(NamesOf(header_json, {e.index}).at(e.index)));
    }
    if (auto it = size_errors.find(e.index); it != size_errors.end()) return it->second;
    data_bytes = e.end;
  }
  // 7. The data buffer ends exactly at the end of the file.
  if (data_bytes != file_size - kPrefixBytes - n) {
    return DataLossError("incomplete metadata, file not fully covered (entries end at byte " +
                         std::to_string(data_bytes) + " of the data buffer, which holds " +
                         std::to_string(file_size - kPrefixBytes - n) + ")");
  }
  // The entries the reference keeps, in the text's order.
  std::vector<bool> kept;
  for (const Scanned& e : scanned) {
    if (e.index >= kept.size()) kept.resize(e.index + 1, false);
    kept[e.index] = true;
  }
  return ParseEach(header_json, [&](size_t i, RawTensorInfo&& t) {
    if (i < kept.size() && kept[i]) {
      each(SafetensorsEntry{std::move(t.name), t.dtype, std::move(t.shape), t.begin, t.end});
    }
  });
}

}  // namespace shardsafe
