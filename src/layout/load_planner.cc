// The load planner, in four steps:
//   1. pieces: for each want and each saved chunk of its tensor, the runs of
//      elements they share (box_math.h: CommonRuns, which already groups
//      equal runs at constant strides), each turned into byte ranges of the
//      chunk's file and destination element indices; runs of equal length
//      at constant strides, apart by at most join_gap_bytes, form one piece
//      of many rows (and one segment of a read).
//      The run counts of a want must add up to its element count: the
//      chunks tile the tensor, so each element is then covered exactly once.
//   1b. chunk edges: filler pieces (read, not delivered) cover what the
//      pieces leave unread at a chunk's start or end when both are at most
//      join_gap_bytes, so the chunk is read whole and can be verified.
//   2. extents: pieces sorted by (file, offset); touching or overlapping
//      pieces, and pieces apart by at most join_gap_bytes, always join;
//      larger gaps join smallest first while their total stays within
//      max_overread_fraction x bytes needed. Extents are what may be read.
//   3. groups: an extent is cut at chunk boundaries into parts. A chunk whose
//      needed bytes form one part no longer than max_read_bytes is small:
//      consecutive small parts of one extent share one read (and group) up
//      to max_read_bytes. Any other chunk is large: its parts form one group,
//      a part of one piece is one read (it lands in one destination run),
//      other parts are cut into windows of max_read_bytes on element-group
//      boundaries, each trimmed to the pieces inside it.
//   4. whole chunks: the non-empty chunks of a group's files that lie inside
//      the union of its reads, so their checksums can be verified.
#include "layout/load_planner.h"

#include <algorithm>
#include <map>
#include <optional>
#include <string>
#include <tuple>

#include "layout/box_math.h"

namespace shardsafe {
namespace {

// The smallest byte-aligned group of elements: a cut between elements must
// fall on a multiple of it (1 element for byte-sized dtypes; F4: 2 in 1
// byte; F6: 4 in 3 bytes).
struct Unit {
  uint64_t bytes;
  uint64_t elems;
};

Unit UnitOf(DType dtype) {
  const int bits = DTypeBits(dtype);
  if (bits % 8 == 0) return {static_cast<uint64_t>(bits / 8), 1};
  return bits == 4 ? Unit{1, 2} : Unit{3, 4};
}

// The want of a piece that is read but lands nowhere (AddChunkEdges).
constexpr uint32_t kFiller = UINT32_MAX;

// `rows` runs of `length` bytes of `file`, run i at offset + i * stride,
// landing at element dst_elem + i * dst_stride of want `want`; they belong
// to chunk `chunk` of tensor `tensor`. A column slice of a row-major chunk
// is one piece of many rows rather than a piece per row (8 million of
// them for 20,000 tensors split by column). Rows are only gathered into a
// piece while the gaps between them are at most join_gap_bytes, which
// would always be read through anyway: a piece's byte span,
// [offset, end()), is read whole.
struct Piece {
  uint64_t offset;
  uint64_t length;
  uint64_t dst_elem;
  uint32_t file;
  uint32_t want;
  uint32_t tensor;
  uint32_t chunk;
  uint64_t rows = 1;
  uint64_t stride = 0;      // bytes from one run's start to the next
  uint64_t dst_stride = 0;  // elements from one run's destination to the next
  uint64_t row_at(uint64_t i) const { return offset + i * stride; }
  uint64_t dst_at(uint64_t i) const { return dst_elem + i * dst_stride; }
  uint64_t end() const { return row_at(rows - 1) + length; }
};

// Consecutive pieces [begin, end) of one extent and one chunk, spanning
// bytes [lo, hi) of their file.
struct Part {
  size_t begin;
  size_t end;
  uint64_t lo;
  uint64_t hi;
  uint32_t extent;
};

bool SameChunk(const Piece& a, const Piece& b) {
  return a.file == b.file && a.tensor == b.tensor && a.chunk == b.chunk;
}

class Planner {
 public:
  Planner(std::span<const SavedTensor> tensors, std::span<const Want> wants,
          const LoadPlanOptions& options)
      : tensors_(tensors), wants_(wants), options_(options),
        max_read_(std::max<uint64_t>(options.max_read_bytes, 1)),
        validated_(tensors.size(), false) {}

  Result<LoadPlan> Plan() {
    for (uint32_t w = 0; w < wants_.size(); ++w) SS_RETURN_IF_ERROR(CollectPieces(w));
    AddChunkEdges();
    FormExtents();
    FormGroups();
    FindWholeChunks();
    for (const ReadGroup& g : plan_.groups) {
      for (const ReadOp& r : g.reads) plan_.bytes_read += r.length;
    }
    return std::move(plan_);
  }

 private:
  // Step 1.
  Status CollectPieces(uint32_t w) {
    const Want& want = wants_[w];
    // Built only for a message (a load has a want per tensor, 10^4 and more).
    auto where = [&] {
      return "want " + std::to_string(w) + " (tensor " + std::to_string(want.tensor) + " " +
             SliceToString(want.slice) + ")";
    };
    if (want.tensor >= tensors_.size()) {
      return InvalidArgumentError(where() + ": no such tensor (" +
                                  std::to_string(tensors_.size()) + " saved)");
    }
    const SavedTensor& t = tensors_[want.tensor];
    if (Status s = ValidateSlice(want.slice, t.shape, t.dtype); !s.ok()) {
      return s.WithContext(where());
    }
    SS_RETURN_IF_ERROR(ValidateChunks(want.tensor));
    uint64_t covered = 0;
    for (uint32_t c = 0; c < t.chunks.size(); ++c) {
      if (!Overlaps(t.chunks[c].slice.box, want.slice.box)) continue;
      runs_.clear();
      CommonRuns(t.chunks[c].slice, want.slice, &runs_);
      if (runs_.empty()) continue;
      block_starts_.push_back(pieces_.size());
      SS_RETURN_IF_ERROR(AddPieces(w, c, where));
      for (const ElementRun& run : runs_) covered += run.count * run.rows;
    }
    const uint64_t expected = want.slice.NumElements();
    if (covered == expected) return Status();
    return DataLossError(where() + ": the saved chunks cover " + std::to_string(covered) + " of " +
                         std::to_string(expected) + " elements");
  }

  Status ValidateChunks(uint32_t tensor) {
    if (validated_[tensor]) return Status();
    const SavedTensor& t = tensors_[tensor];
    for (const SavedChunk& c : t.chunks) {
      Status s = ValidateSlice(c.slice, t.shape, t.dtype);
      if (!s.ok()) {
        return DataLossError("saved chunk of tensor " + std::to_string(tensor) + ": " +
                             s.message());
      }
    }
    validated_[tensor] = true;
    return Status();
  }

  // The pieces of runs_, the runs of want `w` in chunk `c`. A run of many
  // rows is one piece while the gap between its rows is at most
  // join_gap_bytes, else a piece per row.
  template <typename Where>
  Status AddPieces(uint32_t w, uint32_t c, const Where& where) {
    const SavedTensor& t = tensors_[wants_[w].tensor];
    const SavedChunk& chunk = t.chunks[c];
    const Unit unit = UnitOf(t.dtype);
    const auto bytes = [&](uint64_t elems) { return elems / unit.elems * unit.bytes; };
    for (const ElementRun& run : runs_) {
      if (unit.elems > 1) SS_RETURN_IF_ERROR(CheckOnBytes(run, t.dtype, unit, where));
      Piece p{chunk.at + bytes(run.src), bytes(run.count), run.dst, chunk.file, w,
              wants_[w].tensor, c, run.rows, bytes(run.src_stride), run.dst_stride};
      plan_.bytes_needed += p.length * p.rows;
      if (p.rows > 1 && p.stride - p.length > options_.join_gap_bytes) {
        const Piece many = p;
        p.rows = 1;
        p.stride = p.dst_stride = 0;
        for (uint64_t i = 0; i < many.rows; ++i) {
          p.offset = many.row_at(i);
          p.dst_elem = many.dst_at(i);
          pieces_.push_back(p);
        }
      } else if (!ExtendRows(p)) {
        pieces_.push_back(p);
      }
    }
    return Status();
  }

  // InvalidArgument naming the first row of `run` that starts or ends off
  // a byte boundary of a sub-byte dtype. (Rows repeat their alignment
  // every unit.elems rows.)
  template <typename Where>
  static Status CheckOnBytes(const ElementRun& run, DType dtype, Unit unit, const Where& where) {
    for (uint64_t i = 0; i < std::min(run.rows, unit.elems); ++i) {
      const uint64_t src = run.src + i * run.src_stride, dst = run.dst + i * run.dst_stride;
      if (src % unit.elems || dst % unit.elems || run.count % unit.elems) {
        return InvalidArgumentError(where() + ": a run of " + std::to_string(run.count) + " " +
                                    std::string(DTypeName(dtype)) + " elements at element " +
                                    std::to_string(dst) + " is off a byte boundary");
      }
    }
    return Status();
  }

  // Adds `p` (rows after the last piece's in its block) to the last piece,
  // if they continue that piece's strides (or set them), keep their own,
  // and the gap before `p` is at most join_gap_bytes.
  bool ExtendRows(const Piece& p) {
    if (pieces_.size() <= block_starts_.back()) return false;  // first of its block
    Piece& last = pieces_.back();
    const uint64_t last_row = last.row_at(last.rows - 1);
    const uint64_t last_dst = last.dst_at(last.rows - 1);
    if (p.length == 0 || p.length != last.length || p.offset < last_row + last.length ||
        p.offset - (last_row + last.length) > options_.join_gap_bytes || p.dst_elem <= last_dst) {
      return false;
    }
    const uint64_t stride = p.offset - last_row, dst_stride = p.dst_elem - last_dst;
    const auto keeps = [&](const Piece& q) {
      return q.rows == 1 || (q.stride == stride && q.dst_stride == dst_stride);
    };
    if (!keeps(last) || !keeps(p)) return false;
    last.stride = stride;
    last.dst_stride = dst_stride;
    last.rows += p.rows;
    return true;
  }

  // One past the last piece of block `b`.
  size_t BlockEnd(size_t b) const {
    return b + 1 < block_starts_.size() ? block_starts_[b + 1] : pieces_.size();
  }

  // Step 1b: where the pieces of a chunk leave at most join_gap_bytes
  // unread at its start or end, filler pieces (want kFiller: read, put
  // nowhere) cover them, so that the chunk is read whole and its checksum
  // verified (a column slice of a row-major chunk misses only part of its
  // first and last rows).
  void AddChunkEdges() {
    struct Span {
      uint64_t lo = UINT64_MAX, hi = 0;
      uint32_t file = 0;
    };
    std::map<std::pair<uint32_t, uint32_t>, Span> spans;  // (tensor, chunk)
    for (size_t b = 0; b < block_starts_.size(); ++b) {
      // A block is one want's pieces in one chunk, ascending by offset.
      const Piece& first = pieces_[block_starts_[b]];
      const Piece& last = pieces_[BlockEnd(b) - 1];
      Span& s = spans[{first.tensor, first.chunk}];
      s.lo = std::min(s.lo, first.offset);
      s.hi = std::max(s.hi, last.end());
      s.file = first.file;
    }
    for (const auto& [key, s] : spans) {
      const SavedTensor& t = tensors_[key.first];
      const SavedChunk& c = t.chunks[key.second];
      const auto bytes = NumBytes(t.dtype, c.slice.NumElements());  // validated: ok
      if (!bytes.ok()) continue;
      const uint64_t end = c.at + *bytes;
      if (s.lo == c.at && s.hi == end) continue;
      if (s.lo - c.at > options_.join_gap_bytes || end - s.hi > options_.join_gap_bytes) continue;
      if (s.lo > c.at) AddFiller(Filler(c.at, s.lo, s.file, key));
      if (end > s.hi) AddFiller(Filler(s.hi, end, s.file, key));
    }
  }

  void AddFiller(const Piece& p) {
    block_starts_.push_back(pieces_.size());
    pieces_.push_back(p);
  }

  static Piece Filler(uint64_t lo, uint64_t hi, uint32_t file,
                      std::pair<uint32_t, uint32_t> chunk) {
    return Piece{lo, hi - lo, 0, file, kFiller, chunk.first, chunk.second};
  }

  // Step 2.
  void FormExtents() {
    SortPieces();
    std::vector<bool> join(pieces_.size(), false);
    std::vector<std::pair<uint64_t, size_t>> gaps;  // (gap bytes, piece after it), large ones
    uint64_t reach = 0;  // end of the pieces so far in this file
    for (size_t i = 0; i < pieces_.size(); ++i) {
      const Piece& p = pieces_[i];
      const bool same_file = i > 0 && pieces_[i - 1].file == p.file;
      if (same_file && p.offset <= reach + options_.join_gap_bytes) join[i] = true;
      else if (same_file) gaps.push_back({p.offset - reach, i});
      reach = same_file ? std::max(reach, p.end()) : p.end();
    }
    std::sort(gaps.begin(), gaps.end());  // the cheapest first, within the budget
    const auto budget = static_cast<uint64_t>(options_.max_overread_fraction *
                                              static_cast<double>(plan_.bytes_needed));
    uint64_t spent = 0;
    for (const auto& [bytes, i] : gaps) {
      if (spent + bytes > budget) break;
      spent += bytes;
      join[i] = true;
    }
    extent_.resize(pieces_.size());
    for (size_t i = 0; i < pieces_.size(); ++i) {
      extent_[i] = i == 0 ? 0 : extent_[i - 1] + (join[i] ? 0 : 1);
    }
  }

  // Sorts the pieces by (file, offset, want, dst_elem). They come in blocks
  // (one want's runs in one chunk, or a filler), each ascending by offset;
  // when the blocks' byte ranges do not overlap (wants reading different
  // bytes, the usual case), ordering the blocks orders the pieces, at the
  // cost of sorting a few thousand blocks instead of ~10^6 pieces.
  void SortPieces() {
    const auto less = [](const Piece& a, const Piece& b) {
      return std::tie(a.file, a.offset, a.want, a.dst_elem) <
             std::tie(b.file, b.offset, b.want, b.dst_elem);
    };
    struct Block {
      size_t begin, end;
    };
    std::vector<Block> blocks;
    bool ascending = true;
    for (size_t b = 0; b < block_starts_.size(); ++b) {
      const size_t begin = block_starts_[b];
      const size_t end = BlockEnd(b);
      for (size_t i = begin + 1; ascending && i < end; ++i) {
        ascending = pieces_[i - 1].end() <= pieces_[i].offset &&
                    pieces_[i - 1].offset < pieces_[i].offset;
      }
      blocks.push_back({begin, end});
    }
    std::sort(blocks.begin(), blocks.end(), [&](const Block& a, const Block& b) {
      return less(pieces_[a.begin], pieces_[b.begin]);
    });
    for (size_t b = 1; ascending && b < blocks.size(); ++b) {
      const Piece& last = pieces_[blocks[b - 1].end - 1];
      const Piece& next = pieces_[blocks[b].begin];
      ascending = last.file != next.file ||
                  (last.end() <= next.offset && last.offset < next.offset);
    }
    if (!ascending) {
      std::sort(pieces_.begin(), pieces_.end(), less);
      return;
    }
    std::vector<Piece> sorted;
    sorted.reserve(pieces_.size());
    for (const Block& b : blocks) {
      sorted.insert(sorted.end(), pieces_.begin() + b.begin, pieces_.begin() + b.end);
    }
    pieces_ = std::move(sorted);
  }

  // Step 3.
  void FormGroups() {
    const std::vector<Part> parts = CutParts();
    for (size_t i = 0, j; i < parts.size(); i = j) {
      for (j = i + 1; j < parts.size() && SameChunk(parts[j], parts[i]);) ++j;
      const bool small = j == i + 1 && parts[i].hi - parts[i].lo <= max_read_;
      if (small) {
        AddSmallPart(parts[i]);
        continue;
      }
      FlushSmall();
      ReadGroup& group = plan_.groups.emplace_back();
      for (size_t k = i; k < j; ++k) AddLargePart(parts[k], &group);
    }
    FlushSmall();
  }

  bool SameChunk(const Part& a, const Part& b) const {
    return shardsafe::SameChunk(pieces_[a.begin], pieces_[b.begin]);
  }

  std::vector<Part> CutParts() const {
    std::vector<Part> parts;
    for (size_t i = 0; i < pieces_.size(); ++i) {
      const Piece& p = pieces_[i];
      if (parts.empty() || parts.back().extent != extent_[i] ||
          !shardsafe::SameChunk(pieces_[parts.back().begin], p)) {
        parts.push_back(Part{i, i, p.offset, p.end(), extent_[i]});
      }
      parts.back().end = i + 1;
      parts.back().hi = std::max(parts.back().hi, p.end());
    }
    return parts;
  }

  // Small parts accumulate into one read while they are in one extent and
  // the read stays within max_read_bytes.
  void AddSmallPart(const Part& part) {
    if (pending_ && pending_->extent == part.extent &&
        std::max(pending_->hi, part.hi) - pending_->lo <= max_read_) {
      pending_->end = part.end;
      pending_->hi = std::max(pending_->hi, part.hi);
      return;
    }
    FlushSmall();
    pending_ = part;
  }

  void FlushSmall() {
    if (!pending_) return;
    ReadOp read = MakeRead(*pending_, pending_->lo, pending_->hi);
    plan_.groups.emplace_back().reads.push_back(std::move(read));
    pending_.reset();
  }

  void AddLargePart(const Part& part, ReadGroup* group) {
    if (part.end - part.begin == 1 && pieces_[part.begin].rows == 1) {
      group->reads.push_back(MakeRead(part, part.lo, part.hi));
      return;
    }
    const Piece& first = pieces_[part.begin];
    const SavedTensor& t = tensors_[first.tensor];
    const uint64_t unit = UnitOf(t.dtype).bytes;
    const uint64_t at = t.chunks[first.chunk].at;  // piece offsets are at + k * unit
    // Windows [lo, e) follow each other without holes: the bytes between
    // pieces are in the extent, to be read anyway, and a chunk read in
    // windows is then read whole and can be verified.
    Part rest = part;
    while (rest.begin < rest.end) {
      uint64_t e = rest.hi;
      if (rest.lo + max_read_ < rest.hi) {
        e = at + (rest.lo + max_read_ - at) / unit * unit;
        if (e <= rest.lo) e = rest.lo + unit;
      }
      group->reads.push_back(MakeRead(rest, rest.lo, e));
      while (rest.begin < rest.end && pieces_[rest.begin].end() <= e) ++rest.begin;
      rest.lo = e;
    }
  }

  // The rows [begin, end) of `p` that have bytes in [lo, hi) (p.offset < hi).
  static std::pair<uint64_t, uint64_t> RowsIn(const Piece& p, uint64_t lo, uint64_t hi) {
    if (p.rows == 1) return {0, p.offset + p.length > lo ? 1 : 0};
    const uint64_t first_end = p.offset + p.length;  // end of row 0
    const uint64_t begin = lo >= first_end ? (lo - first_end) / p.stride + 1 : 0;
    const uint64_t end = std::min(p.rows, (hi - p.offset + p.stride - 1) / p.stride);
    return {begin, std::max(begin, end)};
  }

  // The read of [lo, hi) with the pieces of `part` clipped to it: a segment
  // per piece's rows inside, plus one for a row the window cuts at either
  // end. (A part's own lo and hi are its first piece's offset and its
  // furthest end, so only the windows of AddLargePart cut rows.)
  ReadOp MakeRead(const Part& part, uint64_t lo, uint64_t hi) const {
    ReadOp read{pieces_[part.begin].file, lo, hi - lo, {}};
    for (size_t i = part.begin; i < part.end && pieces_[i].offset < hi; ++i) {
      const Piece& p = pieces_[i];
      const auto [begin, end] = RowsIn(p, lo, hi);
      if (begin == end || p.want == kFiller) continue;
      const bool cut_first = p.row_at(begin) < lo;
      const bool cut_last = p.row_at(end - 1) + p.length > hi;
      const uint64_t whole_begin = begin + (cut_first ? 1 : 0);
      const uint64_t whole_end = std::max(whole_begin, end - (cut_last ? 1 : 0));
      if (cut_first) AddRows(p, begin, begin + 1, lo, hi, &read);
      if (whole_begin < whole_end) AddRows(p, whole_begin, whole_end, lo, hi, &read);
      if (cut_last && end - 1 >= whole_begin) AddRows(p, end - 1, end, lo, hi, &read);
    }
    // Rows of pieces of different wants in one chunk may interleave.
    const auto by_src = [](const Segment& x, const Segment& y) { return x.src_byte < y.src_byte; };
    if (!std::is_sorted(read.segments.begin(), read.segments.end(), by_src)) {
      std::sort(read.segments.begin(), read.segments.end(), by_src);
    }
    return read;
  }

  // Appends to `read` (which starts at lo) a segment for rows [begin, end)
  // of `p`, clipped to [lo, hi) (only a single row may be clipped).
  void AddRows(const Piece& p, uint64_t begin, uint64_t end, uint64_t lo, uint64_t hi,
               ReadOp* read) const {
    const Unit unit = UnitOf(tensors_[p.tensor].dtype);
    const uint64_t at = p.row_at(begin);
    const uint64_t a = std::max(at, lo), b = std::min(at + p.length, hi);
    const bool many = end - begin > 1;
    read->segments.push_back(Segment{p.want,
                                     p.dst_at(begin) +
                                         (a - at) / unit.bytes * unit.elems,
                                     a - lo, (b - a) / unit.bytes * unit.elems, end - begin,
                                     many ? p.stride : 0, many ? p.dst_stride : 0});
  }

  // Step 4.
  struct FileChunk {
    uint64_t at;
    uint64_t end;
    ChunkRef ref;
  };

  void FindWholeChunks() {
    std::vector<bool> touched;
    for (const Piece& p : pieces_) {
      if (p.file >= touched.size()) touched.resize(p.file + 1, false);
      touched[p.file] = true;
    }
    std::vector<std::vector<FileChunk>> by_file(touched.size());
    ListChunks(touched, &by_file);
    for (ReadGroup& g : plan_.groups) CollectWholeChunks(by_file[g.reads.front().file], &g);
  }

  // Lists the non-empty valid chunks of the touched files by offset.
  void ListChunks(const std::vector<bool>& touched, std::vector<std::vector<FileChunk>>* by_file) {
    for (uint32_t t = 0; t < tensors_.size(); ++t) {
      const SavedTensor& tensor = tensors_[t];
      for (uint32_t c = 0; c < tensor.chunks.size(); ++c) {
        const SavedChunk& chunk = tensor.chunks[c];
        if (chunk.file >= touched.size() || !touched[chunk.file]) continue;
        if (!ValidateSlice(chunk.slice, tensor.shape, tensor.dtype).ok()) continue;
        auto bytes = NumBytes(tensor.dtype, chunk.slice.NumElements());
        if (!bytes.ok() || *bytes == 0) continue;
        (*by_file)[chunk.file].push_back(FileChunk{chunk.at, chunk.at + *bytes, ChunkRef{t, c}});
      }
    }
    for (auto& list : *by_file) {
      std::sort(list.begin(), list.end(),
                [](const FileChunk& a, const FileChunk& b) { return a.at < b.at; });
    }
  }

  // Reads of a group ascend and do not overlap; touching reads merge into
  // one covered interval.
  static void CollectWholeChunks(const std::vector<FileChunk>& chunks, ReadGroup* group) {
    const auto& reads = group->reads;
    for (size_t i = 0, j; i < reads.size(); i = j) {
      uint64_t hi = reads[i].offset + reads[i].length;
      for (j = i + 1; j < reads.size() && reads[j].offset == hi; ++j) hi += reads[j].length;
      auto it = std::lower_bound(chunks.begin(), chunks.end(), reads[i].offset,
                                 [](const FileChunk& c, uint64_t at) { return c.at < at; });
      for (; it != chunks.end() && it->at < hi; ++it) {
        if (it->end <= hi) group->whole_chunks.push_back(it->ref);
      }
    }
  }

  std::span<const SavedTensor> tensors_;
  std::span<const Want> wants_;
  LoadPlanOptions options_;
  uint64_t max_read_;
  std::vector<bool> validated_;
  std::vector<ElementRun> runs_;  // scratch
  std::vector<Piece> pieces_;
  std::vector<size_t> block_starts_;  // where each block of pieces begins (SortPieces)
  std::vector<uint32_t> extent_;      // per piece
  std::optional<Part> pending_;   // the small read being formed
  LoadPlan plan_;
};

}  // namespace

Result<LoadPlan> PlanLoad(std::span<const SavedTensor> tensors, std::span<const Want> wants,
                          const LoadPlanOptions& options) {
  return Planner(tensors, wants, options).Plan();
}

}  // namespace shardsafe
