#include "format/index_packed.h"

#include <algorithm>
#include <cassert>
#include <cstring>

namespace shardsafe {

const char* PackedTensors::KeyArena::Add(std::string_view key) {
  bytes_ += key.size();
  char* at = nullptr;
  if (key.size() > kKeyBlock / 4) {  // a block of its own; the open one stays open
    blocks_.push_back(std::make_unique<char[]>(key.size()));
    at = blocks_.back().get();
  } else {
    if (open_ == nullptr || used_ + key.size() > kKeyBlock) {
      blocks_.push_back(std::make_unique<char[]>(kKeyBlock));
      open_ = blocks_.back().get();
      used_ = 0;
    }
    at = open_ + used_;
    used_ += key.size();
  }
  std::memcpy(at, key.data(), key.size());
  return at;
}

std::string_view PackedTensors::key(size_t t) const {
  return std::string_view(tensors_[t].key, tensors_[t].key_size);
}

Shape PackedTensors::shape(size_t t) const {
  const std::span<const uint64_t> d = dims(t);
  return Shape(d.begin(), d.end());
}

const IndexTableRef* PackedTensors::table(size_t t) const {
  const uint32_t i = tensors_[t].table;
  return i == kNoTable ? nullptr : &tables_[i];
}

IndexTableRef* PackedTensors::mutable_table(size_t t) {
  const uint32_t i = tensors_[t].table;
  return i == kNoTable ? nullptr : &tables_[i];
}

std::optional<size_t> PackedTensors::Find(std::string_view key) const {
  const auto it = std::lower_bound(
      tensors_.begin(), tensors_.end(), key, [](const TensorRec& r, std::string_view k) {
        return std::string_view(r.key, r.key_size) < k;
      });
  if (it == tensors_.end() || std::string_view(it->key, it->key_size) != key) return std::nullopt;
  return static_cast<size_t>(it - tensors_.begin());
}

std::optional<uint32_t> PackedTensors::crc32c(uint64_t c) const {
  if (!(Flags(chunks_[c]) & kHasCrc)) return std::nullopt;
  return chunks_[c].crc;
}

Slice PackedTensors::slice(size_t t, uint64_t c) const {
  const ChunkRec& rec = chunks_[c];
  const uint8_t flags = Flags(rec);
  auto n = numbers_.begin() + static_cast<ptrdiff_t>(Extra(rec));
  Slice s;
  if (flags & kFlat) {
    s.flat = FlatRange{n[0], n[1]};
    n += 2;
  }
  if (flags & kBoxed) {
    const size_t d = ndim(t);
    s.box.offset.assign(n, n + d);
    s.box.size.assign(n + d, n + 2 * d);
  } else {
    s.box = Box::Whole(shape(t));
  }
  return s;
}

IndexChunk PackedTensors::chunk(size_t t, uint64_t c) const {
  return IndexChunk{slice(t, c), file(c), at(c), bytes(c), crc32c(c)};
}

IndexTensor PackedTensors::Tensor(size_t t) const {
  IndexTensor out{dtype(t), shape(t), {}};
  if (const IndexTableRef* ref = table(t)) out.table = *ref;
  out.chunks.reserve(chunk_count(t));
  for (uint64_t i = 0; i < chunk_count(t); ++i) out.chunks.push_back(chunk(t, first_chunk(t) + i));
  return out;
}

void PackedTensors::PackChunk(const IndexChunk& c, const Shape& shape) {
  const bool boxed = c.slice.box.offset.size() != shape.size() ||
                     c.slice.box.size != shape ||
                     std::any_of(c.slice.box.offset.begin(), c.slice.box.offset.end(),
                                 [](uint64_t o) { return o != 0; });
  uint8_t flags = (c.crc32c ? kHasCrc : 0) | (c.slice.flat ? kFlat : 0) | (boxed ? kBoxed : 0);
  const uint64_t extra = numbers_.size();
  if (c.slice.flat) {
    numbers_.push_back(c.slice.flat->begin);
    numbers_.push_back(c.slice.flat->end);
  }
  if (boxed) {
    // A box of another rank than the tensor's is never packed: the
    // readers reject it first (index_objects.h CheckChunk, DecodeBlock).
    assert(c.slice.box.offset.size() == shape.size() && c.slice.box.size.size() == shape.size());
    numbers_.insert(numbers_.end(), c.slice.box.offset.begin(), c.slice.box.offset.end());
    numbers_.insert(numbers_.end(), c.slice.box.size.begin(), c.slice.box.size.end());
  }
  chunks_.push_back({c.at, c.bytes, extra | (uint64_t{flags} << 56), c.file, c.crc32c.value_or(0)});
}

size_t PackedTensors::Add(std::string_view key, const IndexTensor& tensor) {
  TensorRec r;
  r.key = keys_.Add(key);
  r.key_size = static_cast<uint32_t>(key.size());
  r.dtype = static_cast<uint8_t>(tensor.dtype);
  r.ndim = static_cast<uint8_t>(tensor.shape.size());
  r.dims_at = static_cast<uint32_t>(dims_.size());
  dims_.insert(dims_.end(), tensor.shape.begin(), tensor.shape.end());
  if (tensor.table) {
    r.table = static_cast<uint32_t>(tables_.size());
    tables_.push_back(*tensor.table);
  }
  if (!tensor.table || !tensor.chunks.empty()) {
    r.first_chunk = chunks_.size();
    r.chunk_count = tensor.chunks.size();
    for (const IndexChunk& c : tensor.chunks) PackChunk(c, tensor.shape);
  }
  if (!tensors_.empty() && sorted_) sorted_ = this->key(tensors_.size() - 1) < key;
  tensors_.push_back(r);
  return tensors_.size() - 1;
}

void PackedTensors::Seal() {
  if (sorted_) return;
  std::sort(tensors_.begin(), tensors_.end(), [](const TensorRec& a, const TensorRec& b) {
    return std::string_view(a.key, a.key_size) < std::string_view(b.key, b.key_size);
  });
  sorted_ = true;
}

void PackedTensors::SetChunks(size_t t, std::span<const IndexChunk> chunks) {
  TensorRec& r = tensors_[t];
  assert(r.first_chunk == kNone);
  const Shape dims = shape(t);
  r.first_chunk = chunks_.size();
  r.chunk_count = chunks.size();
  for (const IndexChunk& c : chunks) PackChunk(c, dims);
}

void PackedTensors::SetCrc(uint64_t c, uint32_t crc) {
  chunks_[c].crc = crc;
  chunks_[c].extra |= uint64_t{kHasCrc} << 56;
}

PackedTensors PackedTensors::From(const IndexTensors& tensors) {
  PackedTensors out;
  for (const auto& [key, tensor] : tensors) out.Add(key, tensor);
  out.Seal();
  return out;
}

IndexTensors PackedTensors::Unpack() const {
  IndexTensors out;
  for (size_t t = 0; t < size(); ++t) out.emplace_hint(out.end(), std::string(key(t)), Tensor(t));
  return out;
}

}  // namespace shardsafe
