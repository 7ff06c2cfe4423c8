// The objects of the index (docs/format.md §3) as ParseIndex reads them
// (internal to format/): the schema IndexSax streams them by, and each
// object's checks, from its field values, in the order the document lists
// them.
//
// Where a check needs what another object says (a file's rank needs
// world_size; a chunk, its tensor's dtype and shape and the files), ReadX
// does what the object alone decides and CheckX the rest: a chunk read
// before those are known is held as what it says (a ChunkRead), not as
// its field values or text.
//
// Every failure is DataLoss naming where it is (`tensor "k": chunk 3:
// field "at": ...`), but a newer format version (FailedPrecondition).
// Pure functions; thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "format/index_sax.h"
#include "shardsafe/index.h"
#include "shardsafe/status.h"

namespace shardsafe {
class PackedTensors;
}  // namespace shardsafe

namespace shardsafe::internal {

// Where in the index a value sits, as error messages name it: "" (the top
// level), "file 2", `tensor "k"`, `tensor "k": chunk 3`. Rendered only for
// a message, so reading a large index allocates nothing per tensor or
// chunk for it. Holds views: what it is made from must outlive it.
class Where {
 public:
  Where(const char* text) : text_(text) {}          // NOLINT: a fixed place
  Where(const std::string& text) : text_(text) {}   // NOLINT
  // `kind "name"`.
  Where(const char* kind, std::string_view name) : kind_(kind), text_(name) {}
  // `parent: kind index`.
  Where(const Where& parent, const char* kind, size_t index)
      : parent_(&parent), kind_(kind), index_(index) {}

  std::string str() const;

 private:
  const Where* parent_ = nullptr;
  const char* kind_ = nullptr;
  std::string_view text_;
  size_t index_ = 0;
};

// DataLoss "where: message".
Status Loss(const Where& where, const std::string& message);
// `where: field "name"`.
std::string FieldAt(const Where& where, std::string_view field);
// Field `field` at `where`, `n`, checked against a bound (for some
// numbers, known only later).
Status AtMost(const Where& where, std::string_view field, uint64_t n, uint64_t max);
// A tensor or blob name with a NUL byte, refused: it would be cut short
// wherever it becomes a C string (a file system path, a C API).
Status CheckKey(const char* kind, std::string_view name);

// --- The schema --------------------------------------------------------------------

// The index's objects by kind, the top level first, and the position of
// each field's value. Chunks and blob chunks list their byte range first,
// at the same positions.
enum ObjectKind { kRoot, kFile, kTensor, kChunk, kBlob, kBlobChunk };
enum RootField { kFormat, kVersion, kTag, kCreated, kWorldSize, kLayout, kMetadata, kFiles,
                 kTensors, kValues, kBlobs, kChunkTable, kChunkTableBytes, kChecksumFiles,
                 kChunkTables };
enum FileField { kName, kFileBytes, kFileRank };
enum TensorField { kDtype, kShape, kChunks, kTable };
enum ChunkField { kFileIndex, kAt, kBytes, kCrc, kOffset, kSize, kFlat, kRank = kOffset };
enum BlobField { kPerRank, kBlobChunks };

inline constexpr FieldSpec kRootSpec[] = {
    {"format"}, {"version"}, {"tag"}, {"created_unix"}, {"world_size"},
    {"layout", FieldKind::kJson}, {"metadata", FieldKind::kJson},
    {"files", FieldKind::kObjects, kFile}, {"tensors", FieldKind::kNamed, kTensor},
    {"values", FieldKind::kJson}, {"blobs", FieldKind::kNamed, kBlob}, {"chunk_table"},
    {"chunk_table_bytes"}, {"checksum_files", FieldKind::kNumbers},
    {"chunk_tables", FieldKind::kNumbers}};
inline constexpr FieldSpec kFileSpec[] = {{"name"}, {"bytes"}, {"rank"}};
inline constexpr FieldSpec kTensorSpec[] = {
    {"dtype"}, {"shape", FieldKind::kNumbers}, {"chunks", FieldKind::kObjects, kChunk},
    {"table", FieldKind::kNumbers}};
inline constexpr FieldSpec kChunkSpec[] = {
    {"file"}, {"at"}, {"bytes"}, {"crc32c"}, {"offset", FieldKind::kNumbers},
    {"size", FieldKind::kNumbers}, {"flat", FieldKind::kNumbers}};
inline constexpr FieldSpec kBlobSpec[] = {{"per_rank"},
                                          {"chunks", FieldKind::kObjects, kBlobChunk}};
inline constexpr FieldSpec kBlobChunkSpec[] = {{"file"}, {"at"}, {"bytes"}, {"crc32c"}, {"rank"}};
inline constexpr ObjectSpec kIndexSchema[] = {kRootSpec,  kFileSpec, kTensorSpec,
                                              kChunkSpec, kBlobSpec, kBlobChunkSpec};

// --- Field values ------------------------------------------------------------------

// An object's field values as read (the checks below may move from them),
// its spec, and where it is.
struct IndexObject {
  std::vector<FieldValue>& values;
  ObjectSpec spec;
  const Where& where;

  FieldValue& operator[](int field) const { return values[field]; }
  bool Has(int field) const { return values[field].kind != FieldValue::Kind::kAbsent; }
  std::string At(int field) const { return FieldAt(where, spec[field].name); }
  Status Missing(int field) const {
    return Loss(where, "missing field \"" + std::string(spec[field].name) + "\"");
  }
};

Result<uint64_t> U64(const IndexObject& o, int field, uint64_t max = UINT64_MAX);
Result<std::string> String(const IndexObject& o, int field);
Result<bool> Bool(const IndexObject& o, int field);
// A field holding objects (a kObjects or kNamed one); `type`: "array" or
// "object".
Status Holder(const IndexObject& o, int field, const char* type);
// User JSON as compact text; if `object`, it must be a JSON object.
Result<std::string> Json(const IndexObject& o, int field, bool object = false);

// --- Objects -----------------------------------------------------------------------

// format and version, which come first: a newer version may change all
// else. The version read.
Result<int> CheckFormatVersion(const IndexObject& root);
// The chunk table files an index names: none in version 1, the one of a
// version-2 or 3 index, the parts of a version-4 one (their file numbers
// only, ascending; CheckChunkTables completes them).
Result<std::vector<IndexChunkTable>> ReadChunkTables(const IndexObject& root, int version);
// The checksum files of a version-3 or 4 index (none before), as numbers.
Result<std::vector<uint32_t>> ReadChecksumFiles(const IndexObject& root, int version);
// The checksum files of a parsed index name files in range, one per rank,
// and no blob lies in one.
Status CheckChecksumFiles(const CheckpointIndex& index);
// The parts of a parsed version-4 index name files in range that are no
// checksum files and hold no blob; their names and sizes taken from them.
Status CheckChunkTables(CheckpointIndex* index);
// Whether file `file` of `index` is one of its checksum files, or one of
// its chunk table's parts.
bool IsChecksumFile(const CheckpointIndex& index, uint32_t file);
bool IsChunkTableFile(const CheckpointIndex& index, uint32_t file);
// A tensor's chunks: its "chunks" holder, or its "table" (into t->table)
// for an index with a chunk table. Exactly one of them must be there.
Status ReadTensorChunksField(const IndexObject& v, IndexTensor* t);
// Each tensor of an index with a chunk table names a part of it (4
// numbers before version 4, 5 from it) and lies in that part; of a packed
// index, each of `tensors`.
Status CheckTableRefs(CheckpointIndex* index);
Status CheckTableRefs(const CheckpointIndex& index, PackedTensors* tensors);

struct FileRead {
  IndexFile file;
  uint64_t rank = 0;  // not yet checked against world_size
};
// `names`: the files' read so far (a name must not repeat).
Result<FileRead> ReadFile(const IndexObject& f, std::set<std::string>& names);

// A tensor's dtype and shape, into `t`.
Status ReadTensorHeader(const IndexObject& v, IndexTensor* t);

struct ChunkRead {
  size_t index = 0;  // in its tensor's chunks
  IndexChunk chunk;  // but its file
  uint64_t file = 0;  // not yet checked against the files
};
Result<ChunkRead> ReadChunk(const IndexObject& c, size_t index);
// Its geometry against its tensor, its byte range against its file.
Result<IndexChunk> CheckChunk(ChunkRead& read, const IndexTensor& t,
                              const std::vector<IndexFile>& files, const Where& where);

struct BlobChunkRead {
  size_t index = 0;       // in its blob's chunks
  IndexBlobChunk chunk;   // but its rank and file
  uint64_t rank = 0;      // not yet checked against world_size
  uint64_t file = 0;      // nor the files
};
Result<BlobChunkRead> ReadBlobChunk(const IndexObject& c, size_t index);
Result<IndexBlobChunk> CheckBlobChunk(const BlobChunkRead& read,
                                      const std::vector<IndexFile>& files, int world_size,
                                      const Where& where);

// No two chunks (of tensors or blobs, non-empty) share a byte of a file
// (ParseIndex's check across chunks; DataLoss naming both); of a packed
// index, `tensors`' and the blobs'.
Status CheckNoSharedBytes(const CheckpointIndex& index);
Status CheckNoSharedBytes(const CheckpointIndex& index, const PackedTensors& tensors);

}  // namespace shardsafe::internal
