#include "format/chunk_table.h"

#include <bit>
#include <cstring>

#include "base/crc32c.h"
#include "format/index_objects.h"

namespace shardsafe {
namespace {

static_assert(std::endian::native == std::endian::little, "the table is read in place");

using internal::Loss;
using internal::Where;

constexpr uint32_t kHasFlat = 1;

template <typename T>
void Put(std::string& out, T v) {
  out.append(reinterpret_cast<const char*>(&v), sizeof(v));
}

template <typename T>
T Get(const char*& p) {
  T v;
  std::memcpy(&v, p, sizeof(v));
  p += sizeof(v);
  return v;
}

// lin() of the point `offset + coords` (coords may be null: the offset).
uint64_t Linear(const Shape& shape, const std::vector<uint64_t>& offset,
                const std::vector<uint64_t>* coords) {
  uint64_t lin = 0;
  for (size_t d = 0; d < shape.size(); ++d) {
    lin = lin * shape[d] + offset[d] + (coords ? (*coords)[d] : 0);
  }
  return lin;
}

// The coordinates, within `box`, of its row-major element `i`.
std::vector<uint64_t> Unravel(const Box& box, uint64_t i) {
  std::vector<uint64_t> c(box.rank());
  for (size_t d = box.rank(); d-- > 0;) {
    c[d] = i % box.size[d];
    i /= box.size[d];
  }
  return c;
}

void PutRecord(const IndexChunk& c, std::string& out) {
  Put<uint64_t>(out, c.at);
  Put<uint64_t>(out, c.bytes);
  Put<uint64_t>(out, c.slice.flat ? c.slice.flat->begin : 0);
  Put<uint64_t>(out, c.slice.flat ? c.slice.flat->end : 0);
  Put<uint32_t>(out, c.file);
  Put<uint32_t>(out, c.crc32c.value_or(0));
  Put<uint32_t>(out, c.slice.flat ? kHasFlat : 0);
  Put<uint32_t>(out, 0);
  for (uint64_t v : c.slice.box.offset) Put<uint64_t>(out, v);
  for (uint64_t v : c.slice.box.size) Put<uint64_t>(out, v);
}

ElementRange Hull(std::span<const IndexChunk> chunks, const Shape& shape) {
  ElementRange hull;
  for (const IndexChunk& c : chunks) {
    const ElementRange r = RangeOf(c.slice, shape);
    if (r.first == r.end) continue;
    if (hull.first == hull.end) {
      hull = r;
    } else {
      hull.first = std::min(hull.first, r.first);
      hull.end = std::max(hull.end, r.end);
    }
  }
  return hull;
}

// One record at `p` (ChunkRecordBytes(ndim) bytes), as the JSON reader
// checks a chunk.
Result<IndexChunk> DecodeRecord(const char* p, size_t index, const IndexTensor& tensor,
                                const std::vector<IndexFile>& files, const Where& owner) {
  internal::ChunkRead read;
  read.index = index;
  read.chunk.at = Get<uint64_t>(p);
  read.chunk.bytes = Get<uint64_t>(p);
  const uint64_t flat_begin = Get<uint64_t>(p), flat_end = Get<uint64_t>(p);
  read.file = Get<uint32_t>(p);
  read.chunk.crc32c = Get<uint32_t>(p);
  const uint32_t flags = Get<uint32_t>(p), zero = Get<uint32_t>(p);
  const Where where(owner, "chunk", index);
  if ((flags & ~kHasFlat) != 0 || zero != 0) {
    return Loss(where, "record has flags " + std::to_string(flags) + " and reserved word " +
                           std::to_string(zero) + " (only flag bit 0 is defined)");
  }
  if (flags & kHasFlat) {
    read.chunk.slice.flat = FlatRange{flat_begin, flat_end};
  } else if (flat_begin != 0 || flat_end != 0) {
    return Loss(where, "record has a flat range but not the flag that says so");
  }
  const size_t ndim = tensor.shape.size();
  read.chunk.slice.box.offset.resize(ndim);
  read.chunk.slice.box.size.resize(ndim);
  for (uint64_t& v : read.chunk.slice.box.offset) v = Get<uint64_t>(p);
  for (uint64_t& v : read.chunk.slice.box.size) v = Get<uint64_t>(p);
  return internal::CheckChunk(read, tensor, files, where);
}

Status WithSource(Status s, std::string_view source) {
  return s.ok() ? s : s.WithContext(std::string(source));
}

}  // namespace

ElementRange RangeOf(const Slice& slice, const Shape& shape) {
  const Box& box = slice.box;
  uint64_t volume = 1;  // fits: the slice is valid for the shape
  for (uint64_t n : box.size) volume *= n;
  const FlatRange flat = slice.flat ? *slice.flat : FlatRange{0, volume};
  if (flat.end <= flat.begin || volume == 0) return {};
  const std::vector<uint64_t> first = Unravel(box, flat.begin), last = Unravel(box, flat.end - 1);
  return {Linear(shape, box.offset, &first), Linear(shape, box.offset, &last) + 1};
}

EncodedChunkTable EncodeChunkTable(const CheckpointIndex& index, std::string name) {
  // Every directory first, then every record: the directories a load reads
  // first lie together, a few requests for all of them.
  EncodedChunkTable table;
  uint64_t directories = 0;
  for (const auto& [key, tensor] : index.tensors) {
    directories += BlockCount(tensor.chunks.size()) * kBlockEntryBytes;
  }
  std::string& out = table.bytes;
  out.append(kChunkTableMagic);
  std::string records;
  const uint64_t records_start = out.size() + directories;
  table.refs.reserve(index.tensors.size());
  for (const auto& [key, tensor] : index.tensors) {
    const std::span<const IndexChunk> chunks(tensor.chunks);
    const uint64_t record_bytes = ChunkRecordBytes(tensor.shape.size());
    IndexTableRef ref;
    ref.count = chunks.size();
    ref.directory_at = out.size();
    ref.records_at = records_start + records.size();
    const size_t first_record = records.size();
    for (const IndexChunk& c : chunks) PutRecord(c, records);
    for (uint64_t b = 0; b < BlockCount(ref.count); ++b) {
      const uint64_t first = b * kChunksPerBlock;
      const uint64_t n = std::min<uint64_t>(kChunksPerBlock, ref.count - first);
      const ElementRange hull = Hull(chunks.subspan(first, n), tensor.shape);
      const char* bytes = records.data() + first_record + first * record_bytes;
      Put<uint64_t>(out, hull.first);
      Put<uint64_t>(out, hull.end);
      Put<uint32_t>(out, Crc32c(bytes, n * record_bytes));
      Put<uint32_t>(out, 0);
    }
    ref.directory_crc32c = Crc32c(out.data() + ref.directory_at, out.size() - ref.directory_at);
    table.refs.push_back(ref);
  }
  out += records;
  table.file = IndexChunkTable{std::move(name), out.size()};
  return table;
}

ByteSpan DirectoryBytes(const IndexTableRef& ref) {
  return {ref.directory_at, BlockCount(ref.count) * kBlockEntryBytes};
}

ByteSpan BlockBytes(const IndexTableRef& ref, size_t ndim, uint64_t block) {
  const uint64_t first = block * kChunksPerBlock;
  const uint64_t n = std::min<uint64_t>(kChunksPerBlock, ref.count - first);
  return {ref.records_at + first * ChunkRecordBytes(ndim), n * ChunkRecordBytes(ndim)};
}

Result<std::vector<BlockEntry>> DecodeDirectory(std::string_view bytes, const IndexTableRef& ref,
                                                std::string_view key, std::string_view source) {
  const Where where("tensor", key);
  if (bytes.size() != DirectoryBytes(ref).bytes) {
    return WithSource(Loss(where, "block directory cut short"), source);
  }
  if (Crc32c(bytes.data(), bytes.size()) != ref.directory_crc32c) {
    return WithSource(Loss(where, "block directory checksum mismatch"), source);
  }
  std::vector<BlockEntry> entries(BlockCount(ref.count));
  const char* p = bytes.data();
  for (size_t b = 0; b < entries.size(); ++b) {
    entries[b].range.first = Get<uint64_t>(p);
    entries[b].range.end = Get<uint64_t>(p);
    entries[b].crc32c = Get<uint32_t>(p);
    const uint32_t zero = Get<uint32_t>(p);
    if (zero != 0 || entries[b].range.end < entries[b].range.first) {
      return WithSource(Loss(Where(where, "block", b), "bad block directory entry"), source);
    }
  }
  return entries;
}

Status DecodeBlock(std::string_view bytes, uint64_t block, const BlockEntry& entry,
                   const IndexTensor& tensor, std::string_view key,
                   const std::vector<IndexFile>& files, std::string_view source,
                   std::vector<IndexChunk>* out) {
  const Where owner("tensor", key);
  const IndexTableRef& ref = *tensor.table;
  const size_t ndim = tensor.shape.size();
  if (bytes.size() != BlockBytes(ref, ndim, block).bytes) {
    return WithSource(Loss(Where(owner, "block", block), "records cut short"), source);
  }
  if (Crc32c(bytes.data(), bytes.size()) != entry.crc32c) {
    return WithSource(Loss(Where(owner, "block", block), "records checksum mismatch"), source);
  }
  const uint64_t first = block * kChunksPerBlock;
  for (uint64_t i = 0; i * ChunkRecordBytes(ndim) < bytes.size(); ++i) {
    Result<IndexChunk> chunk =
        DecodeRecord(bytes.data() + i * ChunkRecordBytes(ndim), first + i, tensor, files, owner);
    if (!chunk.ok()) return WithSource(chunk.status(), source);
    const ElementRange r = RangeOf(chunk->slice, tensor.shape);
    if (r.first != r.end && (r.first < entry.range.first || r.end > entry.range.end)) {
      return WithSource(Loss(Where(owner, "chunk", first + i),
                             "lies outside the element range its block directory gives"),
                        source);
    }
    out->push_back(std::move(*chunk));
  }
  return Status();
}

Status FillChunksFromTable(std::string_view table, std::string_view source,
                           CheckpointIndex* index) {
  auto loss = [&](const std::string& message) {
    return DataLossError(std::string(source) + ": " + message);
  };
  if (!index->chunk_table || table.size() != index->chunk_table->bytes) {
    return loss("is " + std::to_string(table.size()) + " bytes, but the index records " +
                std::to_string(index->chunk_table ? index->chunk_table->bytes : 0));
  }
  if (!table.starts_with(kChunkTableMagic)) return loss("does not start with SSCHUNKS");
  for (auto& [key, tensor] : index->tensors) {
    const IndexTableRef& ref = *tensor.table;  // ParseIndex: every tensor has one, in bounds
    const ByteSpan dir = DirectoryBytes(ref);
    SS_ASSIGN_OR_RETURN(std::vector<BlockEntry> entries,
                        DecodeDirectory(table.substr(dir.at, dir.bytes), ref, key, source));
    tensor.chunks.clear();
    tensor.chunks.reserve(ref.count);
    for (uint64_t b = 0; b < entries.size(); ++b) {
      const size_t before = tensor.chunks.size();
      const ByteSpan span = BlockBytes(ref, tensor.shape.size(), b);
      SS_RETURN_IF_ERROR(DecodeBlock(table.substr(span.at, span.bytes), b, entries[b], tensor,
                                     key, index->files, source, &tensor.chunks));
      const ElementRange hull =
          Hull(std::span(tensor.chunks).subspan(before), tensor.shape);
      if (hull.first != entries[b].range.first || hull.end != entries[b].range.end) {
        return loss("tensor \"" + key + "\": block " + std::to_string(b) +
                    ": its directory range is not the range of its records");
      }
    }
  }
  return WithSource(internal::CheckNoSharedBytes(*index), source);
}

}  // namespace shardsafe
