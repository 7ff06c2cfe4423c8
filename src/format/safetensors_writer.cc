// BuildSafetensorsHeader: the reference writer's canonical form
// (formats.md §1.4), byte for byte.
//
//   1. order: dtype descending in the safetensors enum (DType has that
//      order), ties by name compared byte-wise; offsets contiguous from 0 in
//      that order, so every entry starts aligned to its element size;
//   2. JSON: compact, `__metadata__` first when given (std::map iterates
//      keys sorted, which makes multi-key metadata deterministic where the
//      reference's hash map is not), fields dtype, shape, data_offsets;
//      strings escaped like serde_json;
//   3. spaces appended until the data buffer starts at a multiple of the
//      alignment (8 in the reference, whose prefix is 8 bytes: the JSON
//      length becomes a multiple of 8); N counts them.
#include <algorithm>
#include <numeric>
#include <set>
#include <string_view>

#include "format/json_text.h"
#include "format/safetensors.h"

namespace shardsafe {
namespace {

using internal::JsonQuote;

Status CheckEntry(const EntrySpec& e) {
  const std::string where = "safetensors entry \"" + e.name + "\": ";
  if (e.name == "__metadata__") {
    return InvalidArgumentError(where + "the name is reserved for the metadata");
  }
  Result<uint64_t> n = NumElements(e.shape);
  if (!n.ok()) return n.status().WithContext(where);
  Result<uint64_t> bytes = NumBytes(e.dtype, *n);
  if (!bytes.ok()) return bytes.status().WithContext(where);
  if (*bytes != e.bytes) {
    return InvalidArgumentError(where + std::to_string(e.bytes) + " bytes given, but " +
                                std::string(DTypeName(e.dtype)) + " " + ShapeToString(e.shape) +
                                " takes " + std::to_string(*bytes));
  }
  return Status();
}

Status CheckEntries(std::span<const EntrySpec> entries) {
  std::set<std::string_view> names;
  for (const EntrySpec& e : entries) {
    SS_RETURN_IF_ERROR(CheckEntry(e));
    if (!names.insert(e.name).second) {
      return InvalidArgumentError("safetensors entry \"" + e.name + "\" given twice");
    }
  }
  return Status();
}

std::vector<uint32_t> CanonicalOrder(std::span<const EntrySpec> entries) {
  std::vector<uint32_t> order(entries.size());
  std::iota(order.begin(), order.end(), 0u);
  std::sort(order.begin(), order.end(), [&](uint32_t a, uint32_t b) {
    if (entries[a].dtype != entries[b].dtype) return entries[a].dtype > entries[b].dtype;
    return entries[a].name < entries[b].name;  // std::string compares bytes as unsigned
  });
  return order;
}

std::string MetadataJson(const std::map<std::string, std::string>& metadata) {
  std::string s = "\"__metadata__\":{";
  for (const auto& [key, value] : metadata) {
    if (s.back() != '{') s += ',';
    s += JsonQuote(key) + ":" + JsonQuote(value);
  }
  return s + "}";
}

std::string EntryJson(const EntrySpec& e, uint64_t begin) {
  std::string s = JsonQuote(e.name) + ":{\"dtype\":\"" + std::string(DTypeName(e.dtype)) +
                  "\",\"shape\":[";
  for (size_t i = 0; i < e.shape.size(); ++i) {
    if (i) s += ',';
    s += std::to_string(e.shape[i]);
  }
  return s + "],\"data_offsets\":[" + std::to_string(begin) + "," +
         std::to_string(begin + e.bytes) + "]}";
}

std::string LengthPrefix(uint64_t n) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[i] = static_cast<char>((n >> (8 * i)) & 0xFF);
  return s;
}

}  // namespace

Result<SafetensorsLayout> BuildSafetensorsHeader(
    std::span<const EntrySpec> entries,
    const std::optional<std::map<std::string, std::string>>& metadata,
    uint64_t data_alignment) {
  if (data_alignment < 8 || (data_alignment & (data_alignment - 1)) != 0) {
    return InvalidArgumentError("safetensors data alignment " + std::to_string(data_alignment) +
                                " is not a power of two >= 8");
  }
  SS_RETURN_IF_ERROR(CheckEntries(entries));
  SafetensorsLayout layout;
  layout.order = CanonicalOrder(entries);
  // 1-2. JSON text, with data offsets relative to the data buffer.
  std::string json = "{";
  if (metadata) json += MetadataJson(*metadata);
  std::vector<uint64_t> begin(entries.size());
  uint64_t data_bytes = 0;
  for (uint32_t i : layout.order) {
    begin[i] = data_bytes;
    if (__builtin_add_overflow(data_bytes, entries[i].bytes, &data_bytes)) {
      return InvalidArgumentError("safetensors entries add up to more than 2^64 bytes");
    }
    if (json.size() > 1) json += ',';
    json += EntryJson(entries[i], begin[i]);
  }
  json += '}';
  // 3. Pad so that the data buffer starts aligned.
  json.append((data_alignment - (8 + json.size()) % data_alignment) % data_alignment, ' ');
  if (json.size() > kMaxSafetensorsHeaderBytes) {
    return InvalidArgumentError("header too large: " + std::to_string(json.size()) +
                                " bytes, the limit is " +
                                std::to_string(kMaxSafetensorsHeaderBytes));
  }
  const uint64_t data_start = 8 + json.size();
  if (__builtin_add_overflow(data_start, data_bytes, &layout.file_size)) {
    return InvalidArgumentError("safetensors file size overflows 64 bits");
  }
  layout.offsets.resize(entries.size());
  for (size_t i = 0; i < entries.size(); ++i) layout.offsets[i] = data_start + begin[i];
  layout.header = LengthPrefix(json.size()) + json;
  return layout;
}

}  // namespace shardsafe
