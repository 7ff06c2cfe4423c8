// The data model: element types, shapes, and the pieces of a global tensor
// that ranks hold (shards).
//
// A tensor has a key, a dtype and a global shape. A rank holds shards of it.
// A shard is a Box of the global tensor (an offset and a size per dimension),
// optionally narrowed to a contiguous range [begin, end) of the box's
// row-major elements (a FlatRange: the flat shards of ZeRO and FSDP1). The
// bytes of a shard are the selected elements, row-major, densely packed,
// little-endian. A 0-d scalar has an empty offset and size; its box holds one
// element. Zero-size dimensions are allowed and hold no elements.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "shardsafe/status.h"

namespace shardsafe {

// Every element type safetensors can store, in the safetensors enum order
// (which the canonical writer relies on: see docs/format.md).
enum class DType : uint8_t {
  kBool,
  kF4,      // 4-bit float E2M1, two per byte
  kF6E2M3,  // 6-bit floats, bit-packed
  kF6E3M2,
  kU8,
  kI8,
  kF8E5M2,
  kF8E4M3,
  kF8E8M0,
  kF8E4M3FNUZ,
  kF8E5M2FNUZ,
  kI16,
  kU16,
  kF16,
  kBF16,
  kI32,
  kU32,
  kF32,
  kC64,
  kF64,
  kI64,
  kU64,
};
inline constexpr int kNumDTypes = 22;

// "F32", "BF16", ... exactly as safetensors spells them.
std::string_view DTypeName(DType dtype);
// Parses a safetensors dtype name (case-sensitive). InvalidArgument if unknown.
Result<DType> ParseDType(std::string_view name);
// Bits per element: 4 (F4), 6 (F6_*), 8, 16, 32 or 64.
int DTypeBits(DType dtype);
// True for F4 and F6_*: elements are bit-packed and a byte range can only
// start or end where the element index times the bit width is a multiple of 8.
inline bool IsSubByte(DType dtype) { return DTypeBits(dtype) < 8; }

using Shape = std::vector<uint64_t>;

// Product of the sizes; 1 for a 0-d shape. InvalidArgument on overflow.
Result<uint64_t> NumElements(const Shape& shape);
// Bytes of `n` elements of `dtype`. InvalidArgument on overflow or when a
// sub-byte dtype's bit count is not a multiple of 8.
Result<uint64_t> NumBytes(DType dtype, uint64_t n);

// An axis-aligned box of a tensor: offset[d] <= index[d] < offset[d]+size[d].
struct Box {
  Shape offset;
  Shape size;

  size_t rank() const { return size.size(); }
  // The box that covers a whole tensor of this shape.
  static Box Whole(const Shape& shape) { return Box{Shape(shape.size(), 0), shape}; }
  friend bool operator==(const Box&, const Box&) = default;
};

// A half-open range of row-major element indices within a Box.
struct FlatRange {
  uint64_t begin = 0;
  uint64_t end = 0;
  uint64_t size() const { return end - begin; }
  friend bool operator==(const FlatRange&, const FlatRange&) = default;
};

// What part of a global tensor a shard (saved) or request (loaded) covers.
struct Slice {
  Box box;
  std::optional<FlatRange> flat;  // absent: the whole box

  // Number of elements selected (box volume, or the flat range's size).
  uint64_t NumElements() const;
  friend bool operator==(const Slice&, const Slice&) = default;
};

// Checks that `slice` lies inside a tensor of `shape`: same rank, every box
// dimension within bounds (no overflow), flat range within the box volume,
// and for sub-byte dtypes every run of the slice starts and ends on a byte
// boundary. InvalidArgument naming the problem otherwise.
Status ValidateSlice(const Slice& slice, const Shape& shape, DType dtype);

// "[0:512, 0:4096]" or "[0:512, 0:4096].flat[100:200]"; "[]" for a 0-d box.
std::string SliceToString(const Slice& slice);
std::string ShapeToString(const Shape& shape);  // "[512, 4096]"

}  // namespace shardsafe
