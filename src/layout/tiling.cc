#include "layout/tiling.h"

#include <algorithm>
#include <string>
#include <vector>

#include "layout/box_math.h"

namespace shardsafe {
namespace {

std::string Prefix(std::string_view key) { return "tensor \"" + std::string(key) + "\": "; }

Status OverlapError(std::string_view key, const Slice& a, const Slice& b) {
  return InvalidArgumentError(Prefix(key) + "overlap between " + SliceToString(a) + " and " +
                              SliceToString(b));
}

FlatRange FlatOf(const Slice& s) { return s.flat ? *s.flat : FlatRange{0, Volume(s.box)}; }

// Checks that the slices of one box (sorted by flat begin) do not overlap
// and, if `whole`, cover it exactly.
Status CheckOneBox(std::string_view key, std::span<const Slice* const> group, bool whole) {
  const Box& box = group.front()->box;
  uint64_t covered = 0;  // elements [0, covered) of the box are covered
  for (size_t i = 0; i < group.size(); ++i) {
    const FlatRange f = FlatOf(*group[i]);
    if (i > 0 && f.begin < FlatOf(*group[i - 1]).end) {
      return OverlapError(key, *group[i - 1], *group[i]);
    }
    if (f.begin == covered) covered = f.end;
  }
  if (covered == Volume(box) || !whole) return Status();
  uint64_t next = Volume(box);  // first covered element after the gap
  for (const Slice* s : group) {
    if (FlatOf(*s).begin > covered) next = std::min(next, FlatOf(*s).begin);
  }
  return InvalidArgumentError(Prefix(key) + "gap: elements [" + std::to_string(covered) + ":" +
                              std::to_string(next) + ") of box " + SliceToString(Slice{box, {}}) +
                              " are not covered");
}

// The dimension along which boxes start at the most distinct offsets: the
// sweep along it keeps the fewest boxes open at once.
size_t SweepDimension(std::span<const Box* const> boxes, size_t rank) {
  size_t best = 0, best_count = 0;
  std::vector<uint64_t> starts(boxes.size());
  for (size_t d = 0; d < rank; ++d) {
    for (size_t i = 0; i < boxes.size(); ++i) starts[i] = boxes[i]->offset[d];
    std::sort(starts.begin(), starts.end());
    const size_t count = std::unique(starts.begin(), starts.end()) - starts.begin();
    if (count > best_count) best = d, best_count = count;
  }
  return best;
}

// Checks that the distinct boxes are pairwise disjoint: a sweep along one
// dimension compares each box only with boxes still open at its start.
Status CheckDisjoint(std::string_view key, std::vector<const Box*> boxes) {
  if (boxes.size() < 2 || boxes.front()->rank() == 0) {
    if (boxes.size() < 2) return Status();
    return OverlapError(key, Slice{*boxes[0], {}}, Slice{*boxes[1], {}});
  }
  const size_t dim = SweepDimension(boxes, boxes.front()->rank());
  std::stable_sort(boxes.begin(), boxes.end(), [dim](const Box* a, const Box* b) {
    return a->offset[dim] < b->offset[dim];
  });
  std::vector<const Box*> open;
  for (const Box* box : boxes) {
    std::erase_if(open, [&](const Box* o) {
      return o->offset[dim] + o->size[dim] <= box->offset[dim];
    });
    for (const Box* o : open) {
      if (Overlaps(*o, *box)) return OverlapError(key, Slice{*o, {}}, Slice{*box, {}});
    }
    open.push_back(box);
  }
  return Status();
}

// Checks that `slices` do not overlap; the distinct boxes into *boxes.
Status CheckSlices(std::string_view key, std::span<const Slice> slices, bool whole,
                   std::vector<const Box*>* boxes) {
  // Slices without elements cover nothing and overlap nothing.
  std::vector<const Slice*> sorted;
  for (const Slice& s : slices) {
    if (s.NumElements() > 0) sorted.push_back(&s);
  }
  std::sort(sorted.begin(), sorted.end(),
            [](const Slice* a, const Slice* b) { return SliceLess(*a, *b); });
  for (size_t i = 0, j; i < sorted.size(); i = j) {
    for (j = i + 1; j < sorted.size() && sorted[j]->box == sorted[i]->box;) ++j;
    SS_RETURN_IF_ERROR(CheckOneBox(key, std::span(sorted).subspan(i, j - i), whole));
    boxes->push_back(&sorted[i]->box);
  }
  return CheckDisjoint(key, *boxes);
}

}  // namespace

Status CheckNoOverlap(std::string_view key, std::span<const Slice> slices) {
  std::vector<const Box*> boxes;
  return CheckSlices(key, slices, /*whole=*/false, &boxes);
}

Status CheckTiling(std::string_view key, const Shape& shape, std::span<const Slice> slices) {
  SS_ASSIGN_OR_RETURN(const uint64_t total, NumElements(shape));
  std::vector<const Box*> boxes;
  SS_RETURN_IF_ERROR(CheckSlices(key, slices, /*whole=*/true, &boxes));
  uint64_t volume = 0;
  for (const Box* b : boxes) volume += Volume(*b);  // disjoint: no overflow
  if (volume != total) {
    return InvalidArgumentError(Prefix(key) + "gap: " + std::to_string(total - volume) + " of " +
                                std::to_string(total) + " elements of " + ShapeToString(shape) +
                                " are not covered");
  }
  return Status();
}

}  // namespace shardsafe
