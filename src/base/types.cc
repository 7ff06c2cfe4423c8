#include "shardsafe/types.h"

#include <algorithm>
#include <array>

namespace shardsafe {
namespace {

struct DTypeInfo {
  std::string_view name;
  int bits;
};

// Indexed by DType; the safetensors enum order.
constexpr std::array<DTypeInfo, kNumDTypes> kDTypes = {{
    {"BOOL", 8},  {"F4", 4},           {"F6_E2M3", 6},      {"F6_E3M2", 6}, {"U8", 8},
    {"I8", 8},    {"F8_E5M2", 8},      {"F8_E4M3", 8},      {"F8_E8M0", 8}, {"F8_E4M3FNUZ", 8},
    {"F8_E5M2FNUZ", 8}, {"I16", 16},   {"U16", 16},         {"F16", 16},    {"BF16", 16},
    {"I32", 32},  {"U32", 32},         {"F32", 32},         {"C64", 64},    {"F64", 64},
    {"I64", 64},  {"U64", 64},
}};

// Elements per byte-aligned group: a sub-byte slice may only be cut at
// multiples of this (F4: 2 elements = 1 byte; F6: 4 elements = 3 bytes).
uint64_t CutQuantum(DType dtype) {
  switch (DTypeBits(dtype)) {
    case 4: return 2;
    case 6: return 4;
    default: return 1;
  }
}

bool MulOverflows(uint64_t a, uint64_t b, uint64_t* out) {
  return __builtin_mul_overflow(a, b, out);
}

}  // namespace

std::string_view DTypeName(DType dtype) { return kDTypes[static_cast<int>(dtype)].name; }

int DTypeBits(DType dtype) { return kDTypes[static_cast<int>(dtype)].bits; }

Result<DType> ParseDType(std::string_view name) {
  for (int i = 0; i < kNumDTypes; ++i) {
    if (kDTypes[i].name == name) return static_cast<DType>(i);
  }
  return InvalidArgumentError("unknown dtype \"" + std::string(name) + "\"");
}

Result<uint64_t> NumElements(const Shape& shape) {
  uint64_t n = 1;
  for (uint64_t d : shape) {
    if (MulOverflows(n, d, &n)) {
      return InvalidArgumentError("element count of shape " + ShapeToString(shape) +
                                  " overflows 64 bits");
    }
  }
  return n;
}

Result<uint64_t> NumBytes(DType dtype, uint64_t n) {
  uint64_t bits;
  if (MulOverflows(n, DTypeBits(dtype), &bits)) {
    return InvalidArgumentError("byte size of " + std::to_string(n) + " " +
                                std::string(DTypeName(dtype)) + " elements overflows");
  }
  if (bits % 8 != 0) {
    return InvalidArgumentError(std::to_string(n) + " elements of " +
                                std::string(DTypeName(dtype)) + " do not fill whole bytes");
  }
  return bits / 8;
}

uint64_t Slice::NumElements() const {
  if (flat) return flat->size();
  uint64_t n = 1;
  for (uint64_t d : box.size) n *= d;  // validated slices do not overflow
  return n;
}

Status ValidateSlice(const Slice& slice, const Shape& shape, DType dtype) {
  const Box& box = slice.box;
  if (box.offset.size() != shape.size() || box.size.size() != shape.size()) {
    return InvalidArgumentError("slice " + SliceToString(slice) + " has rank " +
                                std::to_string(box.size.size()) + " but the tensor " +
                                ShapeToString(shape) + " has rank " + std::to_string(shape.size()));
  }
  uint64_t volume = 1;
  for (size_t d = 0; d < shape.size(); ++d) {
    uint64_t end;
    if (__builtin_add_overflow(box.offset[d], box.size[d], &end) || end > shape[d]) {
      return InvalidArgumentError("slice " + SliceToString(slice) + " exceeds shape " +
                                  ShapeToString(shape) + " in dimension " + std::to_string(d));
    }
    if (MulOverflows(volume, box.size[d], &volume)) {
      return InvalidArgumentError("slice " + SliceToString(slice) + " volume overflows");
    }
  }
  if (slice.flat && (slice.flat->begin > slice.flat->end || slice.flat->end > volume)) {
    return InvalidArgumentError("flat range of slice " + SliceToString(slice) +
                                " is inverted or exceeds the box's " + std::to_string(volume) +
                                " elements");
  }
  const uint64_t q = CutQuantum(dtype);
  if (q > 1 && !(box == Box::Whole(shape) && !slice.flat)) {
    const bool last_ok = shape.empty() ||
                         (box.offset.back() % q == 0 && box.size.back() % q == 0);
    const bool flat_ok = !slice.flat || (slice.flat->begin % q == 0 && slice.flat->end % q == 0);
    if (!last_ok || !flat_ok) {
      return InvalidArgumentError("slice " + SliceToString(slice) + " cuts " +
                                  std::string(DTypeName(dtype)) +
                                  " elements off a byte boundary (cut at multiples of " +
                                  std::to_string(q) + " elements)");
    }
  }
  return Status();
}

std::string ShapeToString(const Shape& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

std::string SliceToString(const Slice& slice) {
  // Tolerates malformed boxes (offset and size of different ranks): this is
  // used to describe invalid input in error messages.
  std::string s = "[";
  const size_t n = std::max(slice.box.offset.size(), slice.box.size.size());
  for (size_t i = 0; i < n; ++i) {
    if (i) s += ", ";
    const bool has_off = i < slice.box.offset.size(), has_size = i < slice.box.size.size();
    const uint64_t off = has_off ? slice.box.offset[i] : 0;
    s += (has_off ? std::to_string(off) : "?") + ":" +
         (has_size && has_off ? std::to_string(off + slice.box.size[i]) : "?");
  }
  s += "]";
  if (slice.flat) {
    s += ".flat[" + std::to_string(slice.flat->begin) + ":" + std::to_string(slice.flat->end) + "]";
  }
  return s;
}

}  // namespace shardsafe
