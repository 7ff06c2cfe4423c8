// Conversion goes element by element through an exact intermediate: a
// double for float sources (F16/BF16/F32/F64 are all exact in double) or a
// 128-bit integer for integer and BOOL sources. The encoder then rounds once
// to the destination. Where the destination is narrower than the
// intermediate path allows in one hardware step (int -> BF16, double ->
// BF16), the value is first rounded to odd at a precision of at least
// destination + 2 bits, which makes the final round-to-nearest-even exact.
#include "engine/load/convert.h"

#include <cmath>
#include <cstring>

namespace shardsafe {
namespace {

using i128 = __int128;

enum class Kind { kBool, kSigned, kUnsigned, kFloat, kOther };

Kind KindOf(DType d) {
  switch (d) {
    case DType::kBool: return Kind::kBool;
    case DType::kI8: case DType::kI16: case DType::kI32: case DType::kI64: return Kind::kSigned;
    case DType::kU8: case DType::kU16: case DType::kU32: case DType::kU64: return Kind::kUnsigned;
    case DType::kF16: case DType::kBF16: case DType::kF32: case DType::kF64: return Kind::kFloat;
    default: return Kind::kOther;
  }
}

template <typename T>
T Load(const char* p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

template <typename T>
void Store(char* p, T v) {
  std::memcpy(p, &v, sizeof v);
}

double Bf16ToDouble(uint16_t bits) {
  uint32_t f = uint32_t{bits} << 16;
  float x;
  std::memcpy(&x, &f, 4);
  return x;
}

// Round-to-odd: truncate toward zero, then set the last mantissa bit if the
// result is inexact.
float RoundToOddFloat(double d) {
  float f = static_cast<float>(d);
  if (std::isnan(d) || std::isinf(f) || static_cast<double>(f) == d) return f;
  if (std::fabs(static_cast<double>(f)) > std::fabs(d)) f = std::nextafter(f, 0.0f);
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  bits |= 1;
  std::memcpy(&f, &bits, 4);
  return f;
}

double RoundToOddDouble(i128 x) {
  double d = static_cast<double>(x);
  if (static_cast<i128>(d) == x) return d;
  const bool too_far = x >= 0 ? static_cast<i128>(d) > x : static_cast<i128>(d) < x;
  if (too_far) d = std::nextafter(d, 0.0);
  uint64_t bits;
  std::memcpy(&bits, &d, 8);
  bits |= 1;
  std::memcpy(&d, &bits, 8);
  return d;
}

uint16_t FloatToBf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  if (std::isnan(f)) return static_cast<uint16_t>((bits >> 16) | 0x40);  // keep it a NaN
  bits += 0x7FFF + ((bits >> 16) & 1);
  return static_cast<uint16_t>(bits >> 16);
}

double DecodeFloat(const char* p, DType d) {
  switch (d) {
    case DType::kF16: return static_cast<double>(Load<_Float16>(p));
    case DType::kBF16: return Bf16ToDouble(Load<uint16_t>(p));
    case DType::kF32: return Load<float>(p);
    default: return Load<double>(p);
  }
}

i128 DecodeInt(const char* p, DType d) {
  switch (d) {
    case DType::kBool: return Load<uint8_t>(p) != 0;
    case DType::kI8: return Load<int8_t>(p);
    case DType::kI16: return Load<int16_t>(p);
    case DType::kI32: return Load<int32_t>(p);
    case DType::kI64: return Load<int64_t>(p);
    case DType::kU8: return Load<uint8_t>(p);
    case DType::kU16: return Load<uint16_t>(p);
    case DType::kU32: return Load<uint32_t>(p);
    default: return Load<uint64_t>(p);
  }
}

// Range of an integer dtype as 128-bit bounds.
void IntRange(DType d, i128* lo, i128* hi) {
  const int bits = DTypeBits(d);
  if (KindOf(d) == Kind::kUnsigned) {
    *lo = 0;
    *hi = (i128{1} << bits) - 1;
  } else {
    *lo = -(i128{1} << (bits - 1));
    *hi = (i128{1} << (bits - 1)) - 1;
  }
}

void StoreInt(char* p, DType d, i128 v) {
  switch (DTypeBits(d)) {
    case 8: Store<uint8_t>(p, static_cast<uint8_t>(v)); break;
    case 16: Store<uint16_t>(p, static_cast<uint16_t>(v)); break;
    case 32: Store<uint32_t>(p, static_cast<uint32_t>(v)); break;
    default: Store<uint64_t>(p, static_cast<uint64_t>(v)); break;
  }
}

void EncodeFromInt(char* p, DType d, i128 v) {
  if (d == DType::kBool) return Store<uint8_t>(p, v != 0);
  if (KindOf(d) != Kind::kFloat) {
    i128 lo, hi;
    IntRange(d, &lo, &hi);
    return StoreInt(p, d, v < lo ? lo : (v > hi ? hi : v));
  }
  if (d == DType::kF64) return Store<double>(p, static_cast<double>(v));  // one RNE step
  const double odd = RoundToOddDouble(v);
  if (d == DType::kF32) return Store<float>(p, static_cast<float>(odd));
  if (d == DType::kF16) return Store<_Float16>(p, static_cast<_Float16>(odd));
  Store<uint16_t>(p, FloatToBf16(RoundToOddFloat(odd)));
}

i128 SaturatingTrunc(double x, DType d) {
  if (std::isnan(x)) return 0;
  i128 lo, hi;
  IntRange(d, &lo, &hi);
  const double t = std::trunc(x);
  if (t <= static_cast<double>(lo)) return lo;
  if (t >= static_cast<double>(hi)) return hi;  // hi+1 is a power of two: exact compare
  return static_cast<i128>(t);
}

void EncodeFromFloat(char* p, DType d, double x) {
  switch (d) {
    case DType::kBool: return Store<uint8_t>(p, x != 0);
    case DType::kF64: return Store<double>(p, x);
    case DType::kF32: return Store<float>(p, static_cast<float>(x));
    case DType::kF16: return Store<_Float16>(p, static_cast<_Float16>(x));
    case DType::kBF16: return Store<uint16_t>(p, FloatToBf16(RoundToOddFloat(x)));
    default: return StoreInt(p, d, SaturatingTrunc(x, d));
  }
}

}  // namespace

bool CanConvert(DType from, DType to) {
  return from == to || (KindOf(from) != Kind::kOther && KindOf(to) != Kind::kOther);
}

void ConvertElements(const void* src, DType from, void* dst, DType to, uint64_t n) {
  if (from == to) {
    std::memcpy(dst, src, *NumBytes(from, n));
    return;
  }
  const size_t in = DTypeBits(from) / 8, out = DTypeBits(to) / 8;
  const char* s = static_cast<const char*>(src);
  char* t = static_cast<char*>(dst);
  const bool float_src = KindOf(from) == Kind::kFloat;
  for (uint64_t i = 0; i < n; ++i, s += in, t += out) {
    if (float_src) {
      EncodeFromFloat(t, to, DecodeFloat(s, from));
    } else {
      EncodeFromInt(t, to, DecodeInt(s, from));
    }
  }
}

}  // namespace shardsafe
