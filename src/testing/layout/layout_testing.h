// Test helpers for the layout module (header-only, used by *_test.cc only):
// random dtypes, shapes and tilings, and a brute-force element enumerator
// that the planners are checked against.
#pragma once

#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

#include "layout/box_math.h"
#include "shardsafe/types.h"

namespace shardsafe::testing {

using Rng = std::mt19937_64;

inline uint64_t Uniform(Rng& rng, uint64_t lo, uint64_t hi) {  // [lo, hi]
  return std::uniform_int_distribution<uint64_t>(lo, hi)(rng);
}

inline bool Chance(Rng& rng, double p) { return std::bernoulli_distribution(p)(rng); }

// Elements between legal cuts of a sub-byte dtype (1 for the others).
inline uint64_t Quantum(DType dtype) {
  const int bits = DTypeBits(dtype);
  return bits == 4 ? 2 : bits == 6 ? 4 : 1;
}

inline DType RandomDType(Rng& rng) {
  static constexpr DType kTypes[] = {DType::kBool, DType::kF4,  DType::kF6E2M3, DType::kU8,
                                     DType::kBF16, DType::kF32, DType::kF64,    DType::kI16};
  return kTypes[Uniform(rng, 0, std::size(kTypes) - 1)];
}

// Rank 0..4, sizes 0..7 (zero rarely). Sub-byte dtypes get rank >= 1 and a
// last dimension that is a multiple of the cut quantum.
inline Shape RandomShape(Rng& rng, DType dtype) {
  const uint64_t q = Quantum(dtype);
  const size_t rank = Uniform(rng, q > 1 ? 1 : 0, 4);
  Shape shape(rank);
  for (size_t d = 0; d < rank; ++d) {
    shape[d] = Chance(rng, 0.05) ? 0 : Uniform(rng, 1, rank > 2 ? 5 : 9);
  }
  if (q > 1) shape.back() = shape.back() / q * q;
  return shape;
}

// A cut point in (0, size) of dimension d, aligned for the dtype; 0 if none.
inline uint64_t RandomCut(Rng& rng, uint64_t size, uint64_t align) {
  if (size < 2 * align) return 0;
  return Uniform(rng, 1, size / align - 1) * align;
}

// Splits `box` into flat ranges at random aligned cut points (uneven).
inline void SplitFlat(Rng& rng, const Box& box, uint64_t q, std::vector<Slice>* out) {
  const uint64_t volume = Volume(box);
  std::vector<uint64_t> cuts = {0, volume};
  const uint64_t pieces = Uniform(rng, 1, 4);
  for (uint64_t i = 0; i < pieces && volume >= 2 * q; ++i) {
    cuts.push_back(RandomCut(rng, volume, q));
  }
  std::sort(cuts.begin(), cuts.end());
  cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
  for (size_t i = 0; i + 1 < cuts.size(); ++i) {
    out->push_back(Slice{box, FlatRange{cuts[i], cuts[i + 1]}});
  }
}

// A random exact tiling of `shape`: boxes split along random dimensions at
// uneven points, some boxes further split into flat ranges.
inline std::vector<Slice> RandomTiling(Rng& rng, const Shape& shape, DType dtype,
                                       double flat_chance = 0.3) {
  const uint64_t q = Quantum(dtype);
  std::vector<Box> boxes = {Box::Whole(shape)};
  const uint64_t splits = shape.empty() ? 0 : Uniform(rng, 0, 6);
  for (uint64_t s = 0; s < splits; ++s) {
    Box& box = boxes[Uniform(rng, 0, boxes.size() - 1)];
    const size_t d = Uniform(rng, 0, shape.size() - 1);
    const uint64_t cut = RandomCut(rng, box.size[d], d + 1 == shape.size() ? q : 1);
    if (cut == 0) continue;
    Box rest = box;
    box.size[d] = cut;
    rest.offset[d] += cut;
    rest.size[d] -= cut;
    boxes.push_back(rest);
  }
  std::vector<Slice> out;
  for (const Box& box : boxes) {
    if (Chance(rng, flat_chance)) SplitFlat(rng, box, q, &out);
    else out.push_back(Slice{box, {}});
  }
  return out;
}

// A random sub-range [lo, hi) of [0, units): rarely empty, usually covering
// the middle, so that two random ranges mostly overlap.
inline std::pair<uint64_t, uint64_t> RandomRange(Rng& rng, uint64_t units) {
  if (units == 0 || Chance(rng, 0.03)) {
    const uint64_t at = Uniform(rng, 0, units);
    return {at, at};
  }
  const uint64_t lo = Uniform(rng, 0, (units - 1) / 2);
  return {lo, Uniform(rng, std::max(lo + 1, units / 2 + 1), units)};
}

// A random box of `shape`, aligned for the dtype, with a random flat range
// of it half the time.
inline Slice RandomSlice(Rng& rng, const Shape& shape, DType dtype) {
  const uint64_t q = Quantum(dtype);
  Slice s{Box::Whole(shape), {}};
  for (size_t d = 0; d < shape.size(); ++d) {
    const uint64_t a = d + 1 == shape.size() ? q : 1;
    const auto [lo, hi] = RandomRange(rng, shape[d] / a);
    s.box.offset[d] = lo * a;
    s.box.size[d] = (hi - lo) * a;
  }
  if (Chance(rng, 0.5)) {
    const auto [lo, hi] = RandomRange(rng, Volume(s.box) / q);
    s.flat = FlatRange{lo * q, hi * q};
  }
  return s;
}

// Global row-major element indices of the elements of `slice`, in order.
inline std::vector<uint64_t> GlobalIndices(const Slice& slice, const Shape& shape) {
  const Box& box = slice.box;
  const uint64_t volume = Volume(box);
  const FlatRange f = slice.flat ? *slice.flat : FlatRange{0, volume};
  std::vector<uint64_t> out;
  for (uint64_t e = f.begin; e < f.end; ++e) {
    uint64_t rest = e, global = 0, stride = 1;
    for (size_t d = box.rank(); d-- > 0;) {
      global += (box.offset[d] + rest % box.size[d]) * stride;
      rest /= box.size[d];
      stride *= shape[d];
    }
    out.push_back(global);
  }
  return out;
}

// A value for element `index` of tensor `tensor`, `bits` wide.
inline uint64_t ElementValue(uint64_t tensor, uint64_t index, int bits) {
  uint64_t h = (tensor + 1) * 0x9e3779b97f4a7c15ULL ^ (index + 7) * 0xc2b2ae3d27d4eb4fULL;
  h ^= h >> 29;
  h *= 0xbf58476d1ce4e5b9ULL;
  h ^= h >> 32;
  return bits == 64 ? h : h & ((uint64_t{1} << bits) - 1);
}

// Elements packed as the format stores them: little-endian bit stream,
// element k in bits [k*bits, (k+1)*bits).
inline std::vector<uint8_t> PackElements(const std::vector<uint64_t>& values, int bits) {
  std::vector<uint8_t> out((values.size() * bits + 7) / 8, 0);
  for (size_t k = 0; k < values.size(); ++k) {
    for (int b = 0; b < bits; ++b) {
      const uint64_t bit = k * bits + b;
      if ((values[k] >> b) & 1) out[bit / 8] |= static_cast<uint8_t>(1u << (bit % 8));
    }
  }
  return out;
}

// The bytes of `slice` of tensor number `tensor`.
inline std::vector<uint8_t> SliceBytes(uint64_t tensor, const Slice& slice, const Shape& shape,
                                       DType dtype) {
  std::vector<uint64_t> values = GlobalIndices(slice, shape);
  for (uint64_t& v : values) v = ElementValue(tensor, v, DTypeBits(dtype));
  return PackElements(values, DTypeBits(dtype));
}

}  // namespace shardsafe::testing
