#include "format/chunk_table.h"

#include "format/index_packed.h"
#include <map>

#include "base/crc32c.h"
#include "format/index_objects.h"
#include "format/index_packed.h"
#include "format/little_endian.h"

namespace shardsafe {
namespace {

using internal::Loss;
using internal::Where;
using le::Get;
using le::Put;

constexpr uint32_t kHasFlat = 1;

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

Bounds Hull(std::span<const IndexChunk> chunks) {
  Bounds hull, one;
  for (const IndexChunk& c : chunks) {
    BoundsInto(c.slice, &one);
    hull.Add(one);
  }
  return hull;
}

void PutBounds(const Bounds& b, size_t ndim, std::string& out) {
  for (size_t d = 0; d < ndim; ++d) Put<uint64_t>(out, b.empty ? 0 : b.lo[d]);
  for (size_t d = 0; d < ndim; ++d) Put<uint64_t>(out, b.empty ? 0 : b.hi[d]);
}

// One record at `p` (ChunkRecordBytes(ndim) bytes), as the JSON reader
// checks a chunk.
Result<IndexChunk> DecodeRecord(const char* p, size_t index, const IndexTensor& tensor,
                                const CheckpointIndex& checkpoint, const Where& owner) {
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
  if (checkpoint.version >= 3) {  // in the writer's checksum file
    if (*read.chunk.crc32c != 0) {
      return Loss(where, "record holds a checksum in a version-3 table");
    }
    read.chunk.crc32c.reset();
    if (internal::IsChecksumFile(checkpoint, read.file)) {
      return Loss(where, "lies in checksum file " + std::to_string(read.file));
    }
    if (internal::IsChunkTableFile(checkpoint, read.file)) {
      return Loss(where, "lies in chunk table file " + std::to_string(read.file));
    }
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
  return internal::CheckChunk(read, tensor, checkpoint.files, where);
}

Status WithSource(Status s, std::string_view source) {
  return s.ok() ? s : s.WithContext(std::string(source));
}

}  // namespace

bool Bounds::Meets(const Bounds& o) const {
  if (empty || o.empty) return false;
  for (size_t d = 0; d < lo.size(); ++d) {
    if (lo[d] >= o.hi[d] || o.lo[d] >= hi[d]) return false;
  }
  return true;
}

void Bounds::Add(const Bounds& o) {
  if (o.empty) return;
  if (empty) {
    *this = o;
    return;
  }
  for (size_t d = 0; d < lo.size(); ++d) {
    lo[d] = std::min(lo[d], o.lo[d]);
    hi[d] = std::max(hi[d], o.hi[d]);
  }
}

bool Bounds::Holds(const Bounds& o) const {
  if (o.empty) return true;
  if (empty) return false;
  for (size_t d = 0; d < lo.size(); ++d) {
    if (o.lo[d] < lo[d] || o.hi[d] > hi[d]) return false;
  }
  return true;
}

void BoundsInto(const Slice& slice, Bounds* b) {
  const Box& box = slice.box;
  const size_t rank = box.rank();
  uint64_t volume = 1;  // fits: the slice is valid for its tensor
  for (uint64_t n : box.size) volume *= n;
  const FlatRange flat = slice.flat ? *slice.flat : FlatRange{0, volume};
  if (flat.end <= flat.begin || volume == 0) {
    *b = Bounds();
    return;
  }
  b->empty = false;
  b->lo.resize(rank);
  b->hi.resize(rank);
  if (slice.flat) {
    // The coordinates within the box of the first and the last element.
    uint64_t first = flat.begin, last = flat.end - 1;
    for (size_t d = rank; d-- > 0;) {
      b->lo[d] = first % box.size[d];
      first /= box.size[d];
      b->hi[d] = last % box.size[d];
      last /= box.size[d];
    }
  }
  bool whole = !slice.flat;  // from the first dimension where they differ on
  for (size_t d = 0; d < rank; ++d) {
    if (whole) {
      b->lo[d] = box.offset[d];
      b->hi[d] = box.offset[d] + box.size[d];
      continue;
    }
    whole = b->lo[d] != b->hi[d];
    b->lo[d] += box.offset[d];
    b->hi[d] += box.offset[d] + 1;
  }
}

Bounds BoundsOf(const Slice& slice) {
  Bounds b;
  BoundsInto(slice, &b);
  return b;
}

std::vector<uint64_t> LevelSizes(uint64_t count) {
  std::vector<uint64_t> sizes = {BlockCount(count)};
  while (sizes.back() > kChunksPerBlock) sizes.push_back(BlockCount(sizes.back()));
  return sizes;
}

ByteSpan EntryBytes(const IndexTableRef& ref, size_t ndim, size_t level, uint64_t first,
                    uint64_t n) {
  const std::vector<uint64_t> sizes = LevelSizes(ref.count);
  uint64_t at = ref.directory_at;
  for (size_t above = sizes.size() - 1; above > level; --above) {
    at += sizes[above] * BlockEntryBytes(ndim);
  }
  return {at + first * BlockEntryBytes(ndim), n * BlockEntryBytes(ndim)};
}

ByteSpan DirectoryBytes(const IndexTableRef& ref, size_t ndim) {
  uint64_t entries = 0;
  for (uint64_t n : LevelSizes(ref.count)) entries += n;
  return {ref.directory_at, entries * BlockEntryBytes(ndim)};
}

ByteSpan TopBytes(const IndexTableRef& ref, size_t ndim) {
  return {ref.directory_at, LevelSizes(ref.count).back() * BlockEntryBytes(ndim)};
}

ByteSpan ChildBytes(const IndexTableRef& ref, size_t ndim, size_t level, uint64_t entry) {
  if (level == 0) return BlockBytes(ref, ndim, entry);
  const uint64_t below = LevelSizes(ref.count)[level - 1];
  const uint64_t first = entry * kChunksPerBlock;
  return EntryBytes(ref, ndim, level - 1, first, std::min(kChunksPerBlock, below - first));
}

namespace {

// Appends one directory entry.
void PutEntry(const Bounds& bounds, size_t ndim, uint32_t crc, std::string& out) {
  PutBounds(bounds, ndim, out);
  Put<uint32_t>(out, crc);
  Put<uint32_t>(out, 0);
}

// A tensor's directory, top level first, for records `records` (its own)
// of `chunks`.
std::string EncodeDirectory(std::span<const IndexChunk> chunks, size_t ndim,
                            std::string_view records) {
  const uint64_t record_bytes = ChunkRecordBytes(ndim);
  std::vector<std::string> levels(1);
  std::vector<Bounds> bounds;
  for (uint64_t b = 0; b < BlockCount(chunks.size()); ++b) {
    const uint64_t first = b * kChunksPerBlock;
    const uint64_t n = std::min<uint64_t>(kChunksPerBlock, chunks.size() - first);
    bounds.push_back(Hull(chunks.subspan(first, n)));
    const std::string_view bytes = records.substr(first * record_bytes, n * record_bytes);
    PutEntry(bounds.back(), ndim, Crc32c(bytes.data(), bytes.size()), levels.back());
  }
  while (bounds.size() > kChunksPerBlock) {
    const std::string& below = levels.back();
    std::string level;
    std::vector<Bounds> above;
    for (uint64_t g = 0; g < BlockCount(bounds.size()); ++g) {
      const uint64_t first = g * kChunksPerBlock;
      const uint64_t n = std::min<uint64_t>(kChunksPerBlock, bounds.size() - first);
      Bounds hull;
      for (uint64_t i = first; i < first + n; ++i) hull.Add(bounds[i]);
      const std::string_view bytes = std::string_view(below).substr(
          first * BlockEntryBytes(ndim), n * BlockEntryBytes(ndim));
      PutEntry(hull, ndim, Crc32c(bytes.data(), bytes.size()), level);
      above.push_back(std::move(hull));
    }
    levels.push_back(std::move(level));
    bounds = std::move(above);
  }
  std::string out;
  for (size_t l = levels.size(); l-- > 0;) out += levels[l];
  return out;
}

}  // namespace

std::string EncodeTablePart(std::span<const IndexTensor* const> tensors, uint32_t part,
                            std::vector<IndexTableRef>* refs) {
  // Every directory first, then every record: the directories a load reads
  // first lie together, a few requests for all of them.
  uint64_t directories = 0, record_bytes = 0;
  for (const IndexTensor* tensor : tensors) {
    IndexTableRef sized;
    sized.count = tensor->chunks.size();
    directories += DirectoryBytes(sized, tensor->shape.size()).bytes;
    record_bytes += tensor->chunks.size() * ChunkRecordBytes(tensor->shape.size());
  }
  // The records go straight after the directories' room; each tensor's
  // directory, made from its records, then goes into its place.
  std::string out;
  out.reserve(kChunkTableMagic.size() + directories + record_bytes);
  out.append(kChunkTableMagic);
  uint64_t directory_at = out.size();
  out.resize(directory_at + directories);
  for (const IndexTensor* tensor : tensors) {
    const size_t ndim = tensor->shape.size();
    IndexTableRef ref;
    ref.part = part;
    ref.count = tensor->chunks.size();
    ref.directory_at = directory_at;
    ref.records_at = out.size();
    for (const IndexChunk& c : tensor->chunks) PutRecord(c, out);
    const std::string directory =
        EncodeDirectory(tensor->chunks, ndim, std::string_view(out).substr(ref.records_at));
    out.replace(directory_at, directory.size(), directory);
    directory_at += directory.size();
    const ByteSpan top = TopBytes(ref, ndim);
    ref.directory_crc32c = Crc32c(out.data() + top.at, top.bytes);
    refs->push_back(ref);
  }
  return out;
}

EncodedChunkTable EncodeChunkTable(const CheckpointIndex& index, std::span<const int> part_ranks,
                                   const std::function<std::string(int)>& name) {
  std::map<int, std::vector<size_t>> by_rank;  // tensors (key order) of each part
  std::vector<const IndexTensor*> tensors;
  for (const auto& [key, tensor] : index.tensors) {
    by_rank[part_ranks[tensors.size()]].push_back(tensors.size());
    tensors.push_back(&tensor);
  }
  EncodedChunkTable table;
  table.refs.resize(tensors.size());
  std::vector<const IndexTensor*> mine;
  std::vector<IndexTableRef> refs;
  for (const auto& [rank, members] : by_rank) {
    mine.clear();
    refs.clear();
    for (size_t i : members) mine.push_back(tensors[i]);
    std::string bytes = EncodeTablePart(mine, static_cast<uint32_t>(table.parts.size()), &refs);
    for (size_t j = 0; j < members.size(); ++j) table.refs[members[j]] = refs[j];
    table.parts.push_back(IndexChunkTable{name(rank), bytes.size(), std::nullopt});
    table.ranks.push_back(rank);
    table.bytes.push_back(std::move(bytes));
  }
  return table;
}

Status SetChunkTable(const EncodedChunkTable& table, CheckpointIndex* index) {
  if (table.refs.size() != index->tensors.size()) {
    return InternalError("a chunk table of " + std::to_string(table.refs.size()) +
                         " tensors for an index of " + std::to_string(index->tensors.size()));
  }
  index->chunk_tables.clear();
  for (size_t p = 0; p < table.parts.size(); ++p) {
    const uint32_t file = static_cast<uint32_t>(index->files.size());
    index->files.push_back({table.parts[p].name, table.parts[p].bytes, table.ranks[p]});
    index->chunk_tables.push_back({table.parts[p].name, table.parts[p].bytes, file});
  }
  size_t i = 0;
  for (auto& [key, tensor] : index->tensors) {
    tensor.table = table.refs[i++];
    std::vector<IndexChunk>().swap(tensor.chunks);
  }
  return Status();
}

ByteSpan BlockBytes(const IndexTableRef& ref, size_t ndim, uint64_t block) {
  const uint64_t first = block * kChunksPerBlock;
  const uint64_t n = std::min<uint64_t>(kChunksPerBlock, ref.count - first);
  return {ref.records_at + first * ChunkRecordBytes(ndim), n * ChunkRecordBytes(ndim)};
}

Result<std::vector<BlockEntry>> DecodeEntries(std::string_view bytes, size_t ndim, uint32_t crc32c,
                                              std::string_view key, std::string_view source) {
  const Where where("tensor", key);
  if (bytes.size() % BlockEntryBytes(ndim) != 0) {
    return WithSource(Loss(where, "block directory cut short"), source);
  }
  if (Crc32c(bytes.data(), bytes.size()) != crc32c) {
    return WithSource(Loss(where, "block directory checksum mismatch"), source);
  }
  std::vector<BlockEntry> entries(bytes.size() / BlockEntryBytes(ndim));
  const char* p = bytes.data();
  for (size_t b = 0; b < entries.size(); ++b) {
    Bounds& bounds = entries[b].bounds;
    bounds.lo.resize(ndim);
    bounds.hi.resize(ndim);
    for (uint64_t& v : bounds.lo) v = Get<uint64_t>(p);
    for (uint64_t& v : bounds.hi) v = Get<uint64_t>(p);
    entries[b].crc32c = Get<uint32_t>(p);
    const uint32_t zero = Get<uint32_t>(p);
    bounds.empty = false;
    for (size_t d = 0; d < ndim; ++d) bounds.empty |= bounds.hi[d] <= bounds.lo[d];
    if (bounds.empty) bounds = Bounds();  // as BoundsOf gives it: written as zeros
    if (zero != 0) return WithSource(Loss(where, "bad block directory entry"), source);
  }
  return entries;
}

Status DecodeBlock(std::string_view bytes, uint64_t block, const BlockEntry& entry,
                   const IndexTensor& tensor, std::string_view key,
                   const CheckpointIndex& index, std::string_view source,
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
        DecodeRecord(bytes.data() + i * ChunkRecordBytes(ndim), first + i, tensor, index, owner);
    if (!chunk.ok()) return WithSource(chunk.status(), source);
    if (!entry.bounds.Holds(BoundsOf(chunk->slice))) {
      return WithSource(Loss(Where(owner, "chunk", first + i),
                             "lies outside the bounds its block directory gives"),
                        source);
    }
    out->push_back(std::move(*chunk));
  }
  return Status();
}

namespace {

// Checks the size and magic of `table`, part `p` of index.chunk_tables.
Status CheckTableFile(std::string_view table, size_t p, const std::string& source,
                      const CheckpointIndex& index) {
  if (table.size() != index.chunk_tables[p].bytes) {
    return DataLossError(source + ": is " + std::to_string(table.size()) +
                         " bytes, but the index records " +
                         std::to_string(index.chunk_tables[p].bytes));
  }
  if (!table.starts_with(kChunkTableMagic)) {
    return DataLossError(source + ": does not start with SSCHUNKS");
  }
  return Status();
}

// Checks the size and magic of each of `tables`, the files of
// index.chunk_tables.
Status CheckTableFiles(std::span<const std::string> tables, std::span<const std::string> sources,
                       const CheckpointIndex& index) {
  if (tables.size() != index.chunk_tables.size() || sources.size() != tables.size()) {
    return InternalError(std::to_string(tables.size()) + " chunk tables read of " +
                         std::to_string(index.chunk_tables.size()));
  }
  for (size_t p = 0; p < tables.size(); ++p) {
    SS_RETURN_IF_ERROR(CheckTableFile(tables[p], p, sources[p], index));
  }
  return Status();
}

// Fills `tensor`'s chunks from `table`, its part, checking every level of
// its directory to bound exactly what lies under it.
Status FillTensor(std::string_view key, IndexTensor& tensor, std::string_view table,
                  std::string_view source, const CheckpointIndex& index) {
  auto loss = [&](const std::string& message) {
    return DataLossError(std::string(source) + ": tensor \"" + std::string(key) + "\": " +
                         message);
  };
  const IndexTableRef& ref = *tensor.table;  // ParseIndex: every tensor has one, in bounds
  const size_t ndim = tensor.shape.size();
  ByteSpan span = TopBytes(ref, ndim);
  SS_ASSIGN_OR_RETURN(std::vector<BlockEntry> level,
                      DecodeEntries(table.substr(span.at, span.bytes), ndim,
                                    ref.directory_crc32c, key, source));
  // Each level's entries, each checked to bound exactly its children.
  for (size_t l = LevelSizes(ref.count).size() - 1; l > 0; --l) {
    std::vector<BlockEntry> below;
    for (uint64_t j = 0; j < level.size(); ++j) {
      span = ChildBytes(ref, ndim, l, j);
      SS_ASSIGN_OR_RETURN(std::vector<BlockEntry> children,
                          DecodeEntries(table.substr(span.at, span.bytes), ndim,
                                        level[j].crc32c, key, source));
      Bounds hull;
      for (const BlockEntry& c : children) hull.Add(c.bounds);
      if (hull != level[j].bounds) {
        return loss("a block directory entry's bounds are not those of the entries under it");
      }
      below.insert(below.end(), children.begin(), children.end());
    }
    level = std::move(below);
  }
  tensor.chunks.clear();
  tensor.chunks.reserve(ref.count);
  for (uint64_t b = 0; b < level.size(); ++b) {
    const size_t before = tensor.chunks.size();
    span = BlockBytes(ref, ndim, b);
    SS_RETURN_IF_ERROR(DecodeBlock(table.substr(span.at, span.bytes), b, level[b], tensor, key,
                                   index, source, &tensor.chunks));
    if (Hull(std::span(tensor.chunks).subspan(before)) != level[b].bounds) {
      return loss("block " + std::to_string(b) +
                  ": its directory bounds are not the bounds of its records");
    }
  }
  return Status();
}

}  // namespace

Status FillChunksFromTables(std::span<const std::string> tables,
                            std::span<const std::string> sources, CheckpointIndex* index) {
  SS_RETURN_IF_ERROR(CheckTableFiles(tables, sources, *index));
  for (auto& [key, tensor] : index->tensors) {
    const uint32_t part = tensor.table->part;  // ParseIndex: in range
    SS_RETURN_IF_ERROR(FillTensor(key, tensor, tables[part], sources[part], *index));
  }
  return WithSource(internal::CheckNoSharedBytes(*index),
                    sources.size() == 1 ? sources[0] : "the chunk table's parts");
}

Status FillChunksFromTables(const std::function<Result<std::string>(uint32_t)>& read_part,
                            std::span<const std::string> sources, const CheckpointIndex& index,
                            PackedTensors* tensors) {
  if (sources.size() != index.chunk_tables.size()) {
    return InternalError(std::to_string(sources.size()) + " chunk table names of " +
                         std::to_string(index.chunk_tables.size()));
  }
  std::vector<std::vector<size_t>> by_part(sources.size());
  for (size_t t = 0; t < tensors->size(); ++t) {
    by_part[tensors->table(t)->part].push_back(t);  // ParseIndex: every tensor has one, in range
  }
  for (uint32_t p = 0; p < by_part.size(); ++p) {
    SS_ASSIGN_OR_RETURN(const std::string table, read_part(p));
    SS_RETURN_IF_ERROR(CheckTableFile(table, p, sources[p], index));
    for (size_t t : by_part[p]) {
      IndexTensor tensor = tensors->Tensor(t);
      SS_RETURN_IF_ERROR(FillTensor(tensors->key(t), tensor, table, sources[p], index));
      tensors->SetChunks(t, tensor.chunks);
    }
  }
  return WithSource(internal::CheckNoSharedBytes(index, *tensors),
                    sources.size() == 1 ? sources[0] : "the chunk table's parts");
}

}  // namespace shardsafe
