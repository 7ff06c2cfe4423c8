// The tensors of an index held packed (docs/format.md §3, §3a-3c): what the
// read paths keep of an index (the tools, Load, the Python package), at
// tens of bytes a tensor and a chunk where IndexTensors takes hundreds (per
// tensor a map node, its key and shape; per chunk two vectors for its box).
//
// Storage, in a few arrays that grow by blocks (no copy of the whole when
// they grow; the dimensions, 8 bytes a tensor's dimension, in a vector):
// the keys' bytes one after another; per tensor a 40-byte
// record (its key, dtype, rank, where its dimensions and chunks lie, its
// chunk table ref if any); the dimensions; per chunk a 32-byte record (at,
// bytes, file, crc32c, flags, and where its flat range and box lie among
// the numbers, only when it has a flat range or is not the whole tensor).
//
// Numbering. Tensors are numbered in key order once sealed; chunks by one
// number across the index: tensor t's are first_chunk(t) ... first_chunk(t)
// + chunk_count(t) - 1. A tensor whose chunks lie in a chunk table not
// read holds none (has_chunks false) until SetChunks gives them.
//
// Built by one thread (Add, Seal, SetChunks, SetCrc), then read by any
// number of threads at once.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "shardsafe/index.h"

namespace shardsafe {

class PackedTensors {
 public:
  // --- Reading (after Seal) ------------------------------------------------
  size_t size() const { return tensors_.size(); }
  std::string_view key(size_t t) const;
  DType dtype(size_t t) const { return static_cast<DType>(tensors_[t].dtype); }
  size_t ndim(size_t t) const { return tensors_[t].ndim; }
  std::span<const uint64_t> dims(size_t t) const {
    return std::span<const uint64_t>(dims_).subspan(tensors_[t].dims_at, tensors_[t].ndim);
  }
  Shape shape(size_t t) const;
  // Its chunks are held (false: they lie in a chunk table not read).
  bool has_chunks(size_t t) const { return tensors_[t].first_chunk != kNone; }
  // Chunks held (0 when none is), and the number of the first.
  uint64_t chunk_count(size_t t) const { return tensors_[t].chunk_count; }
  uint64_t first_chunk(size_t t) const { return tensors_[t].first_chunk; }
  // Where its chunks lie in the chunk table, or null (a version-1 index).
  const IndexTableRef* table(size_t t) const;
  // The tensor of key `key`, by a binary search (no string built).
  std::optional<size_t> Find(std::string_view key) const;

  // Chunk `c` (a number across the index), its fields without building it.
  uint32_t file(uint64_t c) const { return chunks_[c].file; }
  uint64_t at(uint64_t c) const { return chunks_[c].at; }
  uint64_t bytes(uint64_t c) const { return chunks_[c].bytes; }
  std::optional<uint32_t> crc32c(uint64_t c) const;
  // Chunk `c` of tensor `t` (whose shape gives a whole box), built.
  Slice slice(size_t t, uint64_t c) const;
  IndexChunk chunk(size_t t, uint64_t c) const;
  // Tensor t as IndexTensor: dtype, shape, table ref and the chunks held.
  IndexTensor Tensor(size_t t) const;

  // --- Building --------------------------------------------------------------
  // Appends tensor `key` (in any order: Seal sorts; keys must be unique)
  // with `tensor`'s dtype, shape, table ref and chunks (none held when it
  // has a table ref and no chunks). Returns its number before Seal.
  size_t Add(std::string_view key, const IndexTensor& tensor);
  // Numbers the tensors in key order (a no-op when added in order).
  void Seal();
  // Gives tensor t, which holds none, `chunks` (copied).
  void SetChunks(size_t t, std::span<const IndexChunk> chunks);
  void SetCrc(uint64_t c, uint32_t crc);
  // Tensor t's table ref, to complete it (ParseIndex), or null.
  IndexTableRef* mutable_table(size_t t);

  // The packed form of `tensors`, and the reverse (every tensor with the
  // chunks held).
  static PackedTensors From(const IndexTensors& tensors);
  IndexTensors Unpack() const;

 private:
  static constexpr uint64_t kNone = UINT64_MAX;
  static constexpr uint32_t kNoTable = UINT32_MAX;
  enum : uint8_t { kHasCrc = 1, kFlat = 2, kBoxed = 4 };

  struct TensorRec {
    const char* key = nullptr;      // in keys_
    uint64_t first_chunk = kNone;   // into chunks_
    uint64_t chunk_count = 0;
    uint32_t dims_at = 0;           // into dims_
    uint32_t key_size = 0;
    uint32_t table = kNoTable;      // into tables_
    uint8_t dtype = 0;
    uint8_t ndim = 0;
  };
  struct ChunkRec {
    uint64_t at = 0;
    uint64_t bytes = 0;
    // Low 56 bits: where in numbers_ its flat range [begin, end] (kFlat),
    // then its box's offsets and sizes (kBoxed) lie; high 8: the flags.
    uint64_t extra = 0;
    uint32_t file = 0;
    uint32_t crc = 0;
  };

  // Keys' bytes in blocks of kKeyBlock (a longer key has a block of its
  // own): a key's place never moves, so key() is a view.
  class KeyArena {
   public:
    const char* Add(std::string_view key);
    uint64_t bytes() const { return bytes_; }

   private:
    static constexpr size_t kKeyBlock = size_t{1} << 16;
    std::vector<std::unique_ptr<char[]>> blocks_;
    char* open_ = nullptr;  // the block keys go into
    size_t used_ = 0;       // of it
    uint64_t bytes_ = 0;
  };

  void PackChunk(const IndexChunk& c, const Shape& shape);
  // Sets the flags of chunk `c` (ORed in), or reads them.
  static uint8_t Flags(const ChunkRec& c) { return static_cast<uint8_t>(c.extra >> 56); }
  static uint64_t Extra(const ChunkRec& c) { return c.extra & ((uint64_t{1} << 56) - 1); }

  KeyArena keys_;
  std::deque<TensorRec> tensors_;
  std::vector<uint64_t> dims_;  // a tensor's contiguous (dims())
  std::deque<ChunkRec> chunks_;
  std::deque<uint64_t> numbers_;
  std::deque<IndexTableRef> tables_;
  bool sorted_ = true;  // tensors_ in key order
};

}  // namespace shardsafe
