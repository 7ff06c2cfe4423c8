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
#include <string_view>

#include "format/json_text.h"
#include "format/safetensors.h"

namespace shardsafe {
namespace {

using internal::JsonQuote;

using Entries = std::function<EntryRef(size_t)>;

Status CheckEntry(const EntryRef& e) {
  const std::string where = "safetensors entry \"" + std::string(e.name) + "\": ";
  if (e.name == "__metadata__") {
    return InvalidArgumentError(where + "the name is reserved for the metadata");
  }
  const Shape shape(e.shape.begin(), e.shape.end());
  Result<uint64_t> n = NumElements(shape);
  if (!n.ok()) return n.status().WithContext(where);
  Result<uint64_t> bytes = NumBytes(e.dtype, *n);
  if (!bytes.ok()) return bytes.status().WithContext(where);
  if (*bytes != e.bytes) {
    return InvalidArgumentError(where + std::to_string(e.bytes) + " bytes given, but " +
                                std::string(DTypeName(e.dtype)) + " " + ShapeToString(shape) +
                                " takes " + std::to_string(*bytes));
  }
  return Status();
}

// Each entry's checks in input order, a name given twice failing at its
// second entry (the first such in input order). The repeats are found by
// sorting the entries' numbers by name: 4 bytes an entry, no copy of a
// name.
Status CheckEntries(size_t count, const Entries& entry) {
  std::vector<uint32_t> by_name(count);
  std::iota(by_name.begin(), by_name.end(), 0u);
  std::stable_sort(by_name.begin(), by_name.end(),
                   [&](uint32_t a, uint32_t b) { return entry(a).name < entry(b).name; });
  size_t repeat = count;  // the first entry, in input order, whose name came before
  for (size_t i = 1; i < count; ++i) {
    if (entry(by_name[i]).name == entry(by_name[i - 1]).name) {
      repeat = std::min<size_t>(repeat, by_name[i]);
    }
  }
  for (size_t i = 0; i < count; ++i) {
    const EntryRef e = entry(i);
    SS_RETURN_IF_ERROR(CheckEntry(e));
    if (i == repeat) {
      return InvalidArgumentError("safetensors entry \"" + std::string(e.name) + "\" given twice");
    }
  }
  return Status();
}

std::vector<uint32_t> CanonicalOrder(size_t count, const Entries& entry) {
  std::vector<uint32_t> order(count);
  std::iota(order.begin(), order.end(), 0u);
  std::sort(order.begin(), order.end(), [&](uint32_t a, uint32_t b) {
    const EntryRef x = entry(a), y = entry(b);
    if (x.dtype != y.dtype) return x.dtype > y.dtype;
    return x.name < y.name;  // std::string_view compares bytes as unsigned
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

// Appends entry `e`'s JSON, its bytes at `begin` of the data buffer.
void AppendEntryJson(const EntryRef& e, uint64_t begin, std::string* out) {
  *out += JsonQuote(e.name);
  *out += ":{\"dtype\":\"";
  *out += DTypeName(e.dtype);
  *out += "\",\"shape\":[";
  for (size_t i = 0; i < e.shape.size(); ++i) {
    if (i) *out += ',';
    *out += std::to_string(e.shape[i]);
  }
  *out += "],\"data_offsets\":[" + std::to_string(begin) + "," + std::to_string(begin + e.bytes) +
          "]}";
}

void SetLengthPrefix(uint64_t n, std::string* header) {
  for (int i = 0; i < 8; ++i) (*header)[i] = static_cast<char>((n >> (8 * i)) & 0xFF);
}

}  // namespace

Result<SafetensorsLayout> BuildSafetensorsHeader(
    std::span<const EntrySpec> entries,
    const std::optional<std::map<std::string, std::string>>& metadata,
    uint64_t data_alignment) {
  return BuildSafetensorsHeader(
      entries.size(),
      [&](size_t i) {
        const EntrySpec& e = entries[i];
        return EntryRef{e.name, e.dtype, e.shape, e.bytes};
      },
      metadata, data_alignment);
}

Result<SafetensorsLayout> BuildSafetensorsHeader(
    size_t count, const std::function<EntryRef(size_t)>& entry,
    const std::optional<std::map<std::string, std::string>>& metadata,
    uint64_t data_alignment) {
  if (data_alignment < 8 || (data_alignment & (data_alignment - 1)) != 0) {
    return InvalidArgumentError("safetensors data alignment " + std::to_string(data_alignment) +
                                " is not a power of two >= 8");
  }
  SS_RETURN_IF_ERROR(CheckEntries(count, entry));
  SafetensorsLayout layout;
  layout.order = CanonicalOrder(count, entry);
  // 1-2. Data offsets relative to the data buffer, then the JSON text,
  // written once at its size (counted first) after the 8-byte prefix.
  std::vector<uint64_t> begin(count);
  uint64_t data_bytes = 0;
  for (uint32_t i : layout.order) {
    begin[i] = data_bytes;
    if (__builtin_add_overflow(data_bytes, entry(i).bytes, &data_bytes)) {
      return InvalidArgumentError("safetensors entries add up to more than 2^64 bytes");
    }
  }
  const std::string head = "{" + (metadata ? MetadataJson(*metadata) : std::string());
  uint64_t json_size = head.size();  // so far, without the closing '}'
  std::string piece;
  for (uint32_t i : layout.order) {
    piece.clear();
    AppendEntryJson(entry(i), begin[i], &piece);
    json_size += piece.size() + (json_size > 1 ? 1 : 0);  // a ',' after anything but '{'
  }
  json_size += 1;
  // 3. Pad so that the data buffer starts aligned.
  const uint64_t pad = (data_alignment - (8 + json_size) % data_alignment) % data_alignment;
  json_size += pad;
  if (json_size > kMaxSafetensorsHeaderBytes) {
    return InvalidArgumentError("header too large: " + std::to_string(json_size) +
                                " bytes, the limit is " +
                                std::to_string(kMaxSafetensorsHeaderBytes));
  }
  std::string& header = layout.header;
  header.reserve(8 + json_size);
  header.assign(8, '\0');
  header += head;
  for (uint32_t i : layout.order) {
    if (header.size() > 8 + 1) header += ',';
    AppendEntryJson(entry(i), begin[i], &header);
  }
  header += '}';
  header.append(pad, ' ');
  SetLengthPrefix(json_size, &header);
  const uint64_t data_start = 8 + json_size;
  if (__builtin_add_overflow(data_start, data_bytes, &layout.file_size)) {
    return InvalidArgumentError("safetensors file size overflows 64 bits");
  }
  layout.offsets.resize(count);
  for (size_t i = 0; i < count; ++i) layout.offsets[i] = data_start + begin[i];
  return layout;
}

}  // namespace shardsafe
