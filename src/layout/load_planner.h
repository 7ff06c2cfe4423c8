// The load planner: from "this rank wants these slices" to "read these byte
// ranges of these files, and put each piece here".
//
// Math. A saved chunk stores the elements of its Slice S (box B_s, optional
// flat range F_s) row-major and dense, starting at byte `at` of its file. A
// request wants Slice R (box B_r, optional flat F_r) into a dense row-major
// destination. The elements both hold are those of the box I = B_s ∩ B_r
// whose row-major index within B_s lies in F_s and within B_r lies in F_r.
// I is walked as runs that are contiguous in both B_s and B_r order:
// trailing dimensions that I spans fully in both boxes merge into one run,
// and each run is clipped to F_s and F_r (a contiguous run maps to a
// contiguous index interval, so clipping keeps it one run). Adjacent runs
// that are contiguous in source and destination merge.
//
// Each run becomes a source byte range of the file. Ranges of one file are
// sorted and coalesced: touching ranges always merge; a gap of at most
// join_gap_bytes always merges (reading it costs less than another request:
// 128 KiB is ~60 us at 2 GB/s, about one request's latency); larger gaps
// merge, smallest first, while their total stays within
// max_overread_fraction of the bytes needed. So bytes read <= bytes needed
// x (1 + max_overread_fraction) + the gaps of at most join_gap_bytes. A
// column slice of row-major chunks (Shard(0) saved, Shard(1) loaded) thus
// reads its chunks in large requests rather than one request per row; and
// where the wants leave at most join_gap_bytes of a chunk unread at its
// start and at its end, those bytes are read too, so that the chunk is read
// whole and its checksum verified (whole_chunks). A read longer than
// max_read_bytes is split, unless it goes straight into one destination
// (one segment of one row, src_byte 0, covering the whole read); a read is
// never shorter than one byte-aligned element group (F6: 4 elements in 3
// bytes). The segments of two wants whose rows interleave in one chunk may
// interleave too; otherwise each segment's rows end before the next begins.
//
// Sub-byte dtypes (F4, F6) are walked in elements and converted to bytes
// only at run boundaries, which must fall on whole bytes (else
// InvalidArgument); ValidateSlice makes that so except where a whole-tensor
// chunk of a tensor whose last dimension is not a multiple of the cut
// quantum meets a partial request.
//
// Guarantees: every requested element is covered exactly once (else
// DataLoss: the checkpoint does not cover the request); reads of a group
// are in increasing file offset order and do not overlap, and no two reads
// of the plan overlap.
// Pure; thread-safe.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "shardsafe/status.h"
#include "shardsafe/types.h"

namespace shardsafe {

struct SavedChunk {
  Slice slice;
  uint32_t file = 0;  // data file index
  uint64_t at = 0;    // byte offset of the chunk in its file
};

struct SavedTensor {
  DType dtype = DType::kF32;  // dtype on disk
  Shape shape;
  std::vector<SavedChunk> chunks;  // tile the tensor
};

// One request: `slice` of saved tensor `tensor`, into a dense destination.
struct Want {
  uint32_t tensor = 0;  // index into the SavedTensor span
  Slice slice;          // must be valid for the tensor's shape
};

// `rows` runs of `count` elements each, taken from the read's buffer (in
// the saved dtype) and landing in want `want`: row i from byte
// src_byte + i * src_stride, to element dst_elem + i * dst_stride. A column
// slice of row-major data is one segment, not one per row. Rows do not
// overlap, in the buffer or in the destination. For sub-byte dtypes,
// dst_elem and count are multiples of the cut quantum.
struct Segment {
  uint32_t want = 0;
  uint64_t dst_elem = 0;
  uint64_t src_byte = 0;
  uint64_t count = 0;
  uint64_t rows = 1;
  uint64_t src_stride = 0;  // bytes
  uint64_t dst_stride = 0;  // elements
  uint64_t row_src(uint64_t i) const { return src_byte + i * src_stride; }
  uint64_t row_dst(uint64_t i) const { return dst_elem + i * dst_stride; }
};

// One pread: `length` bytes at `offset` of data file `file`.
struct ReadOp {
  uint32_t file = 0;
  uint64_t offset = 0;
  uint64_t length = 0;
  std::vector<Segment> segments;  // sorted by src_byte (the first row's)
};

// A non-empty chunk whose every byte is read by one group, so its checksum
// can be verified while the group runs. Includes chunks no want touches
// that a coalesced read happens to span.
struct ChunkRef {
  uint32_t tensor = 0;
  uint32_t chunk = 0;
};

// Reads executed in order by one worker. A group holds either the reads of
// one large chunk, or one read spanning several small adjacent chunks.
struct ReadGroup {
  std::vector<ReadOp> reads;          // increasing offset, same file
  std::vector<ChunkRef> whole_chunks; // fully read by this group, ascending file offset
};

struct LoadPlan {
  std::vector<ReadGroup> groups;
  uint64_t bytes_needed = 0;  // bytes of saved data the wants cover, summed over wants
  uint64_t bytes_read = 0;    // sum of read lengths
};

struct LoadPlanOptions {
  uint64_t max_read_bytes = uint64_t{64} << 20;
  double max_overread_fraction = 0.05;
  uint64_t join_gap_bytes = uint64_t{128} << 10;
};

// Plans the reads for `wants`. DataLoss if the saved chunks do not cover a
// want; InvalidArgument if a want does not fit its tensor or cuts a sub-byte
// dtype off a byte boundary.
Result<LoadPlan> PlanLoad(std::span<const SavedTensor> tensors, std::span<const Want> wants,
                          const LoadPlanOptions& options);

}  // namespace shardsafe
