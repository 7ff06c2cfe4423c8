// Each object's checks, in the order the document lists them (see
// index_objects.h for the split between ReadX and CheckX).
#include "format/index_objects.h"

#include "format/chunk_table_sizes.h"
#include "format/index_packed.h"

#include <algorithm>
#include <climits>
#include <set>

namespace shardsafe::internal {
namespace {

using Kind = FieldValue::Kind;

std::string Join(const std::string& where, const std::string& more) {
  return where.empty() ? more : where + ": " + more;
}

Result<Shape> Numbers(const IndexObject& o, int field) {
  FieldValue& v = o[field];
  if (!o.Has(field)) return o.Missing(field);
  if (v.kind != Kind::kNumbers) return Loss(o.At(field), "expected a JSON array, got " + Describe(v));
  if (v.bad >= 0) {
    return Loss(o.At(field) + "[" + std::to_string(v.bad) + "]",
                "expected an integer in [0, 2^64), got " + v.text);
  }
  return std::move(v.numbers);
}

Status CheckFileName(const std::string& name, const Where& where) {
  const bool bad = name.empty() || name == "." || name == ".." ||
                   name.find_first_of(std::string("/\\\0", 3)) != std::string::npos;
  if (bad) return Loss(where, "\"" + name + "\" is not a plain file name");
  return Status();
}

Result<std::optional<uint32_t>> CrcOf(const IndexObject& c) {
  if (!c.Has(kCrc)) return std::optional<uint32_t>();
  SS_ASSIGN_OR_RETURN(uint64_t crc, U64(c, kCrc, UINT32_MAX));
  return std::optional<uint32_t>(static_cast<uint32_t>(crc));
}

// A chunk's `file`, `at` and `bytes`: the range must lie inside the file.
// Returns the file.
Result<uint32_t> CheckByteRange(uint64_t file, uint64_t at, uint64_t bytes,
                                const std::vector<IndexFile>& files, const Where& where) {
  if (files.empty()) return Loss(FieldAt(where, "file"), "the index lists no files");
  SS_RETURN_IF_ERROR(AtMost(where, "file", file, files.size() - 1));
  uint64_t end;
  if (__builtin_add_overflow(at, bytes, &end) || end > files[file].bytes) {
    const std::string end_text = end < at ? "2^64+" + std::to_string(end) : std::to_string(end);
    return Loss(where, "byte range [" + std::to_string(at) + ", " + end_text + ") exceeds file " +
                           files[file].name + " (" + std::to_string(files[file].bytes) +
                           " bytes)");
  }
  return static_cast<uint32_t>(file);
}

Result<Slice> SliceOf(const IndexObject& c) {
  Slice slice;
  SS_ASSIGN_OR_RETURN(slice.box.offset, Numbers(c, kOffset));
  SS_ASSIGN_OR_RETURN(slice.box.size, Numbers(c, kSize));
  if (c.Has(kFlat)) {
    SS_ASSIGN_OR_RETURN(Shape flat, Numbers(c, kFlat));
    if (flat.size() != 2) {
      return Loss(c.At(kFlat), "expected [begin, end], got " + std::to_string(flat.size()) +
                                   " numbers");
    }
    slice.flat = FlatRange{flat[0], flat[1]};
  }
  return slice;
}

}  // namespace

std::string Where::str() const {
  if (kind_ == nullptr) return std::string(text_);
  if (parent_ == nullptr) return std::string(kind_) + " \"" + std::string(text_) + "\"";
  return Join(parent_->str(), std::string(kind_) + " " + std::to_string(index_));
}

Status Loss(const Where& where, const std::string& message) {
  return DataLossError(Join(where.str(), message));
}

Status CheckKey(const char* kind, std::string_view name) {
  if (name.find('\0') == std::string_view::npos) return Status();
  return Loss(Where(kind, name), "the name holds a NUL byte");
}

std::string FieldAt(const Where& where, std::string_view name) {
  return Join(where.str(), "field \"" + std::string(name) + "\"");
}

Status AtMost(const Where& where, std::string_view field, uint64_t n, uint64_t max) {
  if (n <= max) return Status();
  return Loss(FieldAt(where, field),
              std::to_string(n) + " is out of range (at most " + std::to_string(max) + ")");
}

Result<uint64_t> U64(const IndexObject& o, int field, uint64_t max) {
  const FieldValue& v = o[field];
  if (!o.Has(field)) return o.Missing(field);
  if (v.kind != Kind::kNumber) {
    return Loss(o.At(field), "expected an integer in [0, 2^64), got " + Describe(v));
  }
  SS_RETURN_IF_ERROR(AtMost(o.where, o.spec[field].name, v.number, max));
  return v.number;
}

Result<std::string> String(const IndexObject& o, int field) {
  FieldValue& v = o[field];
  if (!o.Has(field)) return o.Missing(field);
  if (v.kind != Kind::kString) return Loss(o.At(field), "expected a string, got " + Describe(v));
  return std::move(v.text);
}

Result<bool> Bool(const IndexObject& o, int field) {
  const FieldValue& v = o[field];
  if (!o.Has(field)) return o.Missing(field);
  if (v.kind != Kind::kBool) return Loss(o.At(field), "expected a JSON boolean, got " + Describe(v));
  return v.number != 0;
}

Status Holder(const IndexObject& o, int field, const char* type) {
  const FieldValue& v = o[field];
  if (!o.Has(field)) return o.Missing(field);
  if (v.kind != Kind::kContainer) {
    return Loss(o.At(field), std::string("expected a JSON ") + type + ", got " + Describe(v));
  }
  return Status();
}

Result<std::string> Json(const IndexObject& o, int field, bool object) {
  FieldValue& v = o[field];
  if (!o.Has(field)) return o.Missing(field);
  if (object && v.json_type != 'o') {
    return Loss(o.At(field), "expected a JSON object, got " + Describe(v));
  }
  return std::move(v.text);
}

// --- Objects --------------------------------------------------------------------

Result<int> CheckFormatVersion(const IndexObject& root) {
  SS_ASSIGN_OR_RETURN(std::string format, String(root, kFormat));
  if (format != "shardsafe") {
    return Loss("field \"format\"", "\"" + format + "\" is not \"shardsafe\"");
  }
  SS_ASSIGN_OR_RETURN(uint64_t version, U64(root, kVersion));
  if (version > static_cast<uint64_t>(kFormatVersion)) {
    return FailedPreconditionError("format version " + std::to_string(version) +
                                   " is newer than this reader supports (" +
                                   std::to_string(kFormatVersion) + ")");
  }
  if (version == 0) return Loss("field \"version\"", "unsupported version 0");
  return static_cast<int>(version);
}

namespace {

// A 4-number `table` (before version 4) until CheckTableRefs checks it.
constexpr uint32_t kNoPart = UINT32_MAX;

// Ascending numbers of 32 bits in field `field`, not empty unless `may_be_empty`.
Result<std::vector<uint32_t>> FileNumbers(const IndexObject& root, int field, const char* what,
                                          bool may_be_empty = false) {
  SS_ASSIGN_OR_RETURN(std::vector<uint64_t> n, Numbers(root, field));
  if (n.empty() && !may_be_empty) {
    return Loss(root.At(field), std::string("an index of this version lists ") + what);
  }
  std::vector<uint32_t> files;
  for (uint64_t i : n) {
    if (i > UINT32_MAX || (!files.empty() && i <= files.back())) {
      return Loss(root.At(field), "expected ascending file numbers");
    }
    files.push_back(static_cast<uint32_t>(i));
  }
  return files;
}

}  // namespace

Result<std::vector<IndexChunkTable>> ReadChunkTables(const IndexObject& root, int version) {
  std::vector<IndexChunkTable> tables;
  if (version < 2 || version >= 4) {
    if (root.Has(kChunkTable) || root.Has(kChunkTableBytes)) {
      return Loss("field \"chunk_table\"", "a version-" + std::to_string(version) +
                                                " index has no single chunk table");
    }
    if (version < 4) return tables;  // "chunk_tables" before version 4: unknown, ignored
    SS_ASSIGN_OR_RETURN(std::vector<uint32_t> files,
                        FileNumbers(root, kChunkTables, "its chunk table's parts"));
    for (uint32_t f : files) tables.push_back({"", 0, f});
    return tables;
  }
  IndexChunkTable table;
  SS_ASSIGN_OR_RETURN(table.name, String(root, kChunkTable));
  SS_RETURN_IF_ERROR(CheckFileName(table.name, Where("field \"chunk_table\"")));
  SS_ASSIGN_OR_RETURN(table.bytes, U64(root, kChunkTableBytes));
  tables.push_back(std::move(table));
  return tables;
}

Result<std::vector<uint32_t>> ReadChecksumFiles(const IndexObject& root, int version) {
  if (version < 3) return std::vector<uint32_t>();  // an unknown field there: ignored
  // From version 4 none when every chunk is empty (an empty chunk has no
  // entry in a checksum file).
  return FileNumbers(root, kChecksumFiles, "checksum files", version >= 4);
}

Status CheckChecksumFiles(const CheckpointIndex& index) {
  const Where where("field \"checksum_files\"");
  std::set<int> ranks;
  for (uint32_t f : index.checksum_files) {
    if (f >= index.files.size()) {
      return Loss(where, "file " + std::to_string(f) + " is out of range");
    }
    if (!ranks.insert(index.files[f].rank).second) {
      return Loss(where, "two checksum files of rank " + std::to_string(index.files[f].rank));
    }
  }
  for (const auto& [name, blob] : index.blobs) {
    for (const IndexBlobChunk& c : blob.chunks) {
      if (IsChecksumFile(index, c.file)) {
        return Loss(Where("blob", name), "lies in a checksum file");
      }
    }
  }
  return Status();
}

Status CheckChunkTables(CheckpointIndex* index) {
  const Where where("field \"chunk_tables\"");
  for (IndexChunkTable& t : index->chunk_tables) {
    if (!t.file) continue;  // the one table of a version-2 or 3 index
    if (*t.file >= index->files.size()) {
      return Loss(where, "file " + std::to_string(*t.file) + " is out of range");
    }
    if (IsChecksumFile(*index, *t.file)) {
      return Loss(where, "file " + std::to_string(*t.file) + " is a checksum file");
    }
    t.name = index->files[*t.file].name;
    t.bytes = index->files[*t.file].bytes;
  }
  for (const auto& [name, blob] : index->blobs) {
    for (const IndexBlobChunk& c : blob.chunks) {
      if (IsChunkTableFile(*index, c.file)) {
        return Loss(Where("blob", name), "lies in a chunk table file");
      }
    }
  }
  return Status();
}

bool IsChecksumFile(const CheckpointIndex& index, uint32_t file) {
  return std::binary_search(index.checksum_files.begin(), index.checksum_files.end(), file);
}

bool IsChunkTableFile(const CheckpointIndex& index, uint32_t file) {
  const auto& t = index.chunk_tables;  // files ascending (ReadChunkTables)
  auto it = std::lower_bound(t.begin(), t.end(), file, [](const IndexChunkTable& c, uint32_t f) {
    return c.file.value_or(0) < f;
  });
  return it != t.end() && it->file == file;
}

Status ReadTensorChunksField(const IndexObject& v, IndexTensor* t) {
  if (!v.Has(kTable)) return Holder(v, kChunks, "array");
  if (v.Has(kChunks)) return Loss(v.where, "has both \"chunks\" and \"table\"");
  SS_ASSIGN_OR_RETURN(std::vector<uint64_t> n, Numbers(v, kTable));
  const bool with_part = n.size() == 5;
  if ((n.size() != 4 && !with_part) || (with_part && n[0] >= kNoPart) || n.back() > UINT32_MAX) {
    return Loss(v.At(kTable), "expected [part, count, directory_at, records_at, "
                              "directory_crc32c] ([count, ...] before version 4)");
  }
  const uint64_t* f = n.data() + (with_part ? 1 : 0);
  IndexTableRef ref;
  ref.part = with_part ? static_cast<uint32_t>(n[0]) : kNoPart;
  ref.count = f[0];
  ref.directory_at = f[1];
  ref.records_at = f[2];
  ref.directory_crc32c = static_cast<uint32_t>(f[3]);
  t->table = ref;
  return Status();
}

namespace {

// One tensor's table ref (`r`, null when it has none), its part numbered
// in index.chunk_tables.
Status CheckTableRef(const CheckpointIndex& index, std::string_view key, size_t ndim,
                     IndexTableRef* r) {
  const bool parts = index.version >= 4;
  const Where where("tensor", key);
  if ((r != nullptr) != !index.chunk_tables.empty()) {
    return Loss(where, r ? "has a \"table\" in a version-1 index"
                         : "has no \"table\" in an index with a chunk table");
  }
  if (r == nullptr) return Status();
  if ((r->part == kNoPart) == parts) {
    return Loss(FieldAt(where, "table"), parts ? "names no part in a version-4 index"
                                               : "names a part before version 4");
  }
  if (!parts) r->part = 0;
  if (r->part >= index.chunk_tables.size()) {
    return Loss(FieldAt(where, "table"), "names part " + std::to_string(r->part) + " of " +
                                             std::to_string(index.chunk_tables.size()));
  }
  const uint64_t size = index.chunk_tables[r->part].bytes;
  const uint64_t magic = kChunkTableMagic.size();
  uint64_t records = 0, records_end = 0;
  const bool fits =
      r->count <= size && r->directory_at >= magic && r->directory_at <= size &&
      BlockCount(r->count) * BlockEntryBytes(ndim) <= size - r->directory_at &&
      !__builtin_mul_overflow(r->count, ChunkRecordBytes(ndim), &records) &&
      r->records_at >= magic && !__builtin_add_overflow(r->records_at, records, &records_end) &&
      records_end <= size;
  if (!fits) return Loss(FieldAt(where, "table"), "lies outside the chunk table");
  return Status();
}

}  // namespace

Status CheckTableRefs(CheckpointIndex* index) {
  for (auto& [key, t] : index->tensors) {
    SS_RETURN_IF_ERROR(
        CheckTableRef(*index, key, t.shape.size(), t.table ? &*t.table : nullptr));
  }
  return Status();
}

Status CheckTableRefs(const CheckpointIndex& index, PackedTensors* tensors) {
  for (size_t t = 0; t < tensors->size(); ++t) {
    SS_RETURN_IF_ERROR(
        CheckTableRef(index, tensors->key(t), tensors->ndim(t), tensors->mutable_table(t)));
  }
  return Status();
}

Result<FileRead> ReadFile(const IndexObject& f, std::set<std::string>& names) {
  FileRead r;
  SS_ASSIGN_OR_RETURN(r.file.name, String(f, kName));
  SS_RETURN_IF_ERROR(CheckFileName(r.file.name, f.where));
  if (!names.insert(r.file.name).second) {
    return Loss(f.where, "\"" + r.file.name + "\" listed twice");
  }
  SS_ASSIGN_OR_RETURN(r.file.bytes, U64(f, kFileBytes));
  SS_ASSIGN_OR_RETURN(r.rank, U64(f, kFileRank));
  return r;
}

Status ReadTensorHeader(const IndexObject& v, IndexTensor* t) {
  SS_ASSIGN_OR_RETURN(std::string dtype, String(v, kDtype));
  Result<DType> parsed = ParseDType(dtype);
  if (!parsed.ok()) return Loss(v.At(kDtype), parsed.status().message());
  t->dtype = *parsed;
  SS_ASSIGN_OR_RETURN(t->shape, Numbers(v, kShape));
  Result<uint64_t> n = NumElements(t->shape);
  if (!n.ok()) return Loss(v.At(kShape), n.status().message());
  return Status();
}

Result<ChunkRead> ReadChunk(const IndexObject& c, size_t index) {
  ChunkRead r;
  r.index = index;
  SS_ASSIGN_OR_RETURN(r.chunk.slice, SliceOf(c));
  SS_ASSIGN_OR_RETURN(r.file, U64(c, kFileIndex));
  SS_ASSIGN_OR_RETURN(r.chunk.at, U64(c, kAt));
  SS_ASSIGN_OR_RETURN(r.chunk.bytes, U64(c, kBytes));
  SS_ASSIGN_OR_RETURN(r.chunk.crc32c, CrcOf(c));
  return r;
}

Result<IndexChunk> CheckChunk(ChunkRead& r, const IndexTensor& t,
                              const std::vector<IndexFile>& files, const Where& where) {
  IndexChunk& chunk = r.chunk;
  // Checked before ValidateSlice, whose message would print the box and so
  // must not see offset and size of different lengths.
  const size_t rank = t.shape.size();
  if (chunk.slice.box.offset.size() != rank || chunk.slice.box.size.size() != rank) {
    return Loss(where, "box has " + std::to_string(chunk.slice.box.offset.size()) +
                           " offsets and " + std::to_string(chunk.slice.box.size.size()) +
                           " sizes, but the tensor has rank " + std::to_string(rank));
  }
  Status valid = ValidateSlice(chunk.slice, t.shape, t.dtype);
  if (!valid.ok()) return Loss(where, valid.message());
  SS_ASSIGN_OR_RETURN(chunk.file, CheckByteRange(r.file, chunk.at, chunk.bytes, files, where));
  Result<uint64_t> want = NumBytes(t.dtype, chunk.slice.NumElements());
  if (!want.ok()) return Loss(where, want.status().message());
  if (chunk.bytes != *want) {
    return Loss(FieldAt(where, "bytes"),
                std::to_string(chunk.bytes) + " bytes recorded, but " +
                    std::to_string(chunk.slice.NumElements()) + " " +
                    std::string(DTypeName(t.dtype)) + " elements take " + std::to_string(*want));
  }
  return std::move(chunk);
}

Result<BlobChunkRead> ReadBlobChunk(const IndexObject& c, size_t index) {
  BlobChunkRead r;
  r.index = index;
  SS_ASSIGN_OR_RETURN(r.rank, U64(c, kRank));
  SS_ASSIGN_OR_RETURN(r.file, U64(c, kFileIndex));
  SS_ASSIGN_OR_RETURN(r.chunk.at, U64(c, kAt));
  SS_ASSIGN_OR_RETURN(r.chunk.bytes, U64(c, kBytes));
  SS_ASSIGN_OR_RETURN(r.chunk.crc32c, CrcOf(c));
  return r;
}

Result<IndexBlobChunk> CheckBlobChunk(const BlobChunkRead& r, const std::vector<IndexFile>& files,
                                      int world_size, const Where& where) {
  IndexBlobChunk chunk = r.chunk;
  SS_RETURN_IF_ERROR(AtMost(where, "rank", r.rank, world_size - 1));
  chunk.rank = static_cast<int>(r.rank);
  SS_ASSIGN_OR_RETURN(chunk.file, CheckByteRange(r.file, chunk.at, chunk.bytes, files, where));
  return chunk;
}

}  // namespace shardsafe::internal
