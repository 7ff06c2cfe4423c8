// Tiling checks: do a tensor's unique shards cover it exactly once?
//
// Shards are Slices (a box, optionally narrowed to a flat range of the box's
// row-major elements). The unique shards of a tensor tile it when every
// element of the global shape lies in exactly one of them.
//
// Algorithm: group the slices by box. Within a group, either one slice covers
// the whole box, or the flat ranges, sorted by begin, must tile
// [0, volume(box)) without gap or overlap. Then the distinct boxes must be
// pairwise disjoint and their volumes must sum to the tensor's element count
// (disjoint + right total volume => exact cover). Disjointness is checked
// with a sweep along the dimension with the most distinct box starts (boxes
// sorted by start, compared only with boxes whose extent in that dimension
// is still open), O(rank · n log n + pairs open at once).
// Pure; thread-safe.
#pragma once

#include <span>
#include <string_view>

#include "shardsafe/status.h"
#include "shardsafe/types.h"

namespace shardsafe {

// OK if `slices` tile a tensor of `shape` exactly. InvalidArgument
// otherwise, naming `key` and the problem ("gap: ... elements of [4096, 4096]
// are not covered", "overlap between [0:512, 0:4096] and [256:768, 0:4096]").
// Slices without elements are ignored (they cover nothing); two equal
// non-empty slices are an overlap. Each slice must already be valid for the
// shape (ValidateSlice).
Status CheckTiling(std::string_view key, const Shape& shape, std::span<const Slice> slices);

// OK if no two of `slices` share an element (some of a tensor's chunks:
// with the load planner's count of the elements they give a request, this
// proves they cover it exactly once). InvalidArgument naming the overlap
// otherwise.
Status CheckNoOverlap(std::string_view key, std::span<const Slice> slices);

}  // namespace shardsafe
