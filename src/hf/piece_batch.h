// A window's pieces of an export (hf/export.cc ShardWriter), read by a
// SourceReader a bounded batch at a time: a window of many small tensors,
// or of tensors of many chunks, is read in several Reads, which bounds the
// planner's memory (~0.3 KB a chunk of the pieces' tensors, ~0.5 KB a
// piece) whatever a window holds. Not thread-safe: one per window.
#pragma once

#include <cstdint>
#include <deque>
#include <string>
#include <vector>

#include "format/index_packed.h"
#include "shardsafe/source.h"

namespace shardsafe {

// What one SourceReader::Read of a window takes at most.
inline constexpr size_t kPiecesPerRead = 4096;
inline constexpr uint64_t kChunksPerRead = 1 << 16;

// Each piece names its source tensor by a key string held here (one per
// run of pieces of one tensor, so the reader plans them together).
class PieceBatch {
 public:
  PieceBatch(SourceReader& reader, const PackedTensors& tensors, uint64_t max_read_bytes)
      : reader_(reader), tensors_(tensors), max_read_bytes_(max_read_bytes) {}

  // A piece of source tensor t (of `tensors`): read by Flush, or by Add
  // once the batch is full.
  Status Add(uint32_t t, Slice slice, void* dst, DType dtype) {
    if (pieces_.empty() || t != last_) {
      const uint64_t chunks = tensors_.chunk_count(t);
      if (!pieces_.empty() && chunks_ + chunks > kChunksPerRead) SS_RETURN_IF_ERROR(Flush());
      keys_.emplace_back(tensors_.key(t));
      chunks_ += chunks;
      last_ = t;
    }
    pieces_.push_back({&keys_.back(), std::move(slice), dst, dtype});
    return pieces_.size() >= kPiecesPerRead ? Flush() : Status();
  }
  // Reads the pieces added since the last read.
  Status Flush() {
    Status s = pieces_.empty() ? Status() : reader_.Read(pieces_, max_read_bytes_);
    pieces_.clear();
    keys_.clear();
    chunks_ = 0;
    return s;
  }

 private:
  SourceReader& reader_;
  const PackedTensors& tensors_;
  const uint64_t max_read_bytes_;
  std::deque<std::string> keys_;  // stable: pieces point to them
  std::vector<SourcePiece> pieces_;
  uint64_t chunks_ = 0;  // of the pieces' tensors
  uint32_t last_ = 0;    // the last piece's tensor
};

}  // namespace shardsafe
