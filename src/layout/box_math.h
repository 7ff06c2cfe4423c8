// Box arithmetic shared by the tiling check and the planners.
//
// A Box is a set of global indices (offset[d] <= i[d] < offset[d]+size[d]).
// Its elements are numbered row-major from 0 to Volume(box). A Slice narrows
// a box to the flat index range [begin, end) of that numbering.
//
// CommonRuns answers the core question of loading: which elements do a saved
// slice S and a requested slice R have in common, and where are they in each?
// Let I = box(S) ∩ box(R). Trailing dimensions that I spans fully in both
// boxes are contiguous in both numberings, so they fold into the run: with
// r the last dimension that is not full in both, one run is I restricted to
// one index of each dimension before r (prod(I.size[r:]) elements), and
// there are prod(I.size[:r]) runs. Run j starts at src_j in S's numbering and
// dst_j in R's; both grow with j, so the runs that can meet the flat
// ranges form one interval of j, found by binary search: a tiny flat range
// of a huge box costs O(rank · log runs), not one step per row. Each run is
// then clipped to both flat ranges (a contiguous index interval clipped to
// an interval stays one interval). Only the first two and the last two
// runs can be clipped (a run is no longer than the strides between runs);
// the runs between lie inside both ranges, and those along the last walked
// dimension come out as one strided ElementRun.
// Pure; thread-safe.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "shardsafe/types.h"

namespace shardsafe {

// Number of elements of `box` (1 for 0-d). The box must be valid (no overflow).
uint64_t Volume(const Box& box);

// The box of indices in both `a` and `b` (same rank), or nullopt if they
// share no element (including when either has a zero-size dimension).
std::optional<Box> Intersect(const Box& a, const Box& b);

// True if `a` and `b` share at least one element.
bool Overlaps(const Box& a, const Box& b);

// The order in which the index lists a tensor's chunks: row-major order of
// box offsets, then sizes, then flat begin (a whole box sorts before flat
// ranges of it), then flat end.
bool SliceLess(const Slice& a, const Slice& b);

// `rows` runs of `count` consecutive elements each: run i starts at flat
// index src + i * src_stride of the source slice and dst + i * dst_stride of
// the destination slice (strides are 0 when rows == 1). Indices are
// relative to the slice's first element (its flat begin, or 0 for a whole
// box). A column slice of a row-major box is one ElementRun of many rows.
struct ElementRun {
  uint64_t src = 0;
  uint64_t dst = 0;
  uint64_t count = 0;
  uint64_t rows = 1;
  uint64_t src_stride = 0;
  uint64_t dst_stride = 0;
  friend bool operator==(const ElementRun&, const ElementRun&) = default;
};

// The elements common to `src` and `dst` (same tensor, both valid), in
// increasing order of src (and of dst). Each run is maximal (no two runs,
// nor two rows, are contiguous in both); equal runs at constant strides
// along one dimension of the intersection form one ElementRun, so a column
// slice costs O(rank) here, not one step per row. Appends to `out`.
void CommonRuns(const Slice& src, const Slice& dst, std::vector<ElementRun>* out);

}  // namespace shardsafe
