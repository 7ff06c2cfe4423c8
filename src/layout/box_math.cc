#include "layout/box_math.h"

#include <algorithm>

namespace shardsafe {
namespace {

// Row-major strides of a box of `size`: stride[d] = prod(size[d+1:]).
std::vector<uint64_t> Strides(const Shape& size) {
  std::vector<uint64_t> stride(size.size(), 1);
  for (size_t d = size.size(); d-- > 1;) stride[d - 1] = stride[d] * size[d];
  return stride;
}

uint64_t SubOrZero(uint64_t a, uint64_t b) { return a > b ? a - b : 0; }

// The runs of I = S ∩ R laid out as a grid: dimensions [0, r) are walked
// one index at a time, dimensions [r, rank) form one run of `length`.
struct RunGrid {
  size_t r = 0;
  uint64_t length = 1;
  uint64_t runs = 1;
  std::vector<uint64_t> extent, src_stride, dst_stride;  // for d < r
  uint64_t src_base = 0, dst_base = 0;                   // run 0's start

  RunGrid(const Box& s, const Box& d, const Box& i) {
    size_t k = i.rank();
    while (k > 0 && i.size[k - 1] == s.size[k - 1] && i.size[k - 1] == d.size[k - 1]) --k;
    r = k == 0 ? 0 : k - 1;
    const std::vector<uint64_t> ss = Strides(s.size), ds = Strides(d.size);
    for (size_t x = 0; x < i.rank(); ++x) {
      src_base += (i.offset[x] - s.offset[x]) * ss[x];
      dst_base += (i.offset[x] - d.offset[x]) * ds[x];
      if (x < r) runs *= i.size[x];
      else length *= i.size[x];
    }
    extent.assign(i.size.begin(), i.size.begin() + r);
    src_stride.assign(ss.begin(), ss.begin() + r);
    dst_stride.assign(ds.begin(), ds.begin() + r);
  }

  // Start of run j in the source and destination numberings.
  std::pair<uint64_t, uint64_t> Start(uint64_t j) const {
    uint64_t src = src_base, dst = dst_base;
    for (size_t x = r; x-- > 0;) {
      const uint64_t idx = j % extent[x];
      j /= extent[x];
      src += idx * src_stride[x];
      dst += idx * dst_stride[x];
    }
    return {src, dst};
  }

  // First j in [0, runs) for which pred(src_j, dst_j) holds; pred must be
  // monotone in j (false ... false true ... true).
  template <typename Pred>
  uint64_t FirstWhere(Pred pred) const {
    uint64_t lo = 0, hi = runs;
    while (lo < hi) {
      const uint64_t mid = lo + (hi - lo) / 2;
      const auto [src, dst] = Start(mid);
      if (pred(src, dst)) hi = mid;
      else lo = mid + 1;
    }
    return lo;
  }
};

// Three-way row-major comparison: offsets, then sizes (hot in sorts, so one
// pass without temporaries).
int CompareBoxes(const Box& a, const Box& b) {
  for (size_t d = 0; d < a.offset.size() && d < b.offset.size(); ++d) {
    if (a.offset[d] != b.offset[d]) return a.offset[d] < b.offset[d] ? -1 : 1;
  }
  if (a.offset.size() != b.offset.size()) return a.offset.size() < b.offset.size() ? -1 : 1;
  for (size_t d = 0; d < a.size.size() && d < b.size.size(); ++d) {
    if (a.size[d] != b.size[d]) return a.size[d] < b.size[d] ? -1 : 1;
  }
  if (a.size.size() != b.size.size()) return a.size.size() < b.size.size() ? -1 : 1;
  return 0;
}

FlatRange FlatOf(const Slice& s) { return s.flat ? *s.flat : FlatRange{0, Volume(s.box)}; }

}  // namespace

uint64_t Volume(const Box& box) {
  uint64_t n = 1;
  for (uint64_t s : box.size) n *= s;
  return n;
}

std::optional<Box> Intersect(const Box& a, const Box& b) {
  Box out;
  out.offset.resize(a.rank());
  out.size.resize(a.rank());
  for (size_t d = 0; d < a.rank(); ++d) {
    const uint64_t lo = std::max(a.offset[d], b.offset[d]);
    const uint64_t hi = std::min(a.offset[d] + a.size[d], b.offset[d] + b.size[d]);
    if (hi <= lo) return std::nullopt;
    out.offset[d] = lo;
    out.size[d] = hi - lo;
  }
  return out;
}

bool Overlaps(const Box& a, const Box& b) {
  for (size_t d = 0; d < a.rank(); ++d) {
    const uint64_t lo = std::max(a.offset[d], b.offset[d]);
    const uint64_t hi = std::min(a.offset[d] + a.size[d], b.offset[d] + b.size[d]);
    if (hi <= lo) return false;
  }
  return true;
}

bool SliceLess(const Slice& a, const Slice& b) {
  if (const int c = CompareBoxes(a.box, b.box)) return c < 0;
  if (a.flat.has_value() != b.flat.has_value()) return !a.flat.has_value();
  if (!a.flat) return false;
  if (a.flat->begin != b.flat->begin) return a.flat->begin < b.flat->begin;
  return a.flat->end < b.flat->end;
}

void CommonRuns(const Slice& src, const Slice& dst, std::vector<ElementRun>* out) {
  const std::optional<Box> inter = Intersect(src.box, dst.box);
  if (!inter) return;
  const RunGrid grid(src.box, dst.box, *inter);
  const FlatRange fs = FlatOf(src), fd = FlatOf(dst);
  if (fs.begin >= fs.end || fd.begin >= fd.end) return;
  const uint64_t len = grid.length;
  // Runs [first, last) are the only ones that can meet both flat ranges;
  // runs [inside, past) lie wholly inside both.
  const uint64_t first = grid.FirstWhere(
      [&](uint64_t s, uint64_t d) { return s + len > fs.begin && d + len > fd.begin; });
  const uint64_t last =
      grid.FirstWhere([&](uint64_t s, uint64_t d) { return s >= fs.end || d >= fd.end; });
  if (first >= last) return;
  const uint64_t inside = std::clamp(
      grid.FirstWhere([&](uint64_t s, uint64_t d) { return s >= fs.begin && d >= fd.begin; }),
      first, last);
  const uint64_t past = std::clamp(grid.FirstWhere([&](uint64_t s, uint64_t d) {
    return s + len > fs.end || d + len > fd.end;
  }), inside, last);
  const auto clipped = [&](uint64_t j) {
    const auto [s, d] = grid.Start(j);
    const uint64_t lo = std::max(SubOrZero(fs.begin, s), SubOrZero(fd.begin, d));
    const uint64_t hi = std::min({len, fs.end - s, fd.end - d});
    if (lo < hi) out->push_back(ElementRun{s + lo - fs.begin, d + lo - fd.begin, hi - lo});
  };
  for (uint64_t j = first; j < inside; ++j) clipped(j);
  // Along the last walked dimension, the runs of one line form one ElementRun.
  const uint64_t line = grid.r > 0 ? grid.extent[grid.r - 1] : 1;
  for (uint64_t j = inside; j < past;) {
    const uint64_t rows = std::min(past - j, line - j % line);
    const auto [s, d] = grid.Start(j);
    ElementRun run{s - fs.begin, d - fd.begin, len};
    if (rows > 1) {
      run.rows = rows;
      run.src_stride = grid.src_stride[grid.r - 1];
      run.dst_stride = grid.dst_stride[grid.r - 1];
    }
    out->push_back(run);
    j += rows;
  }
  for (uint64_t j = past; j < last; ++j) clipped(j);
}

}  // namespace shardsafe
