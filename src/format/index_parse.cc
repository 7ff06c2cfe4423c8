// ParseIndex: reads shardsafe.json from untrusted bytes (docs/format.md §3,
// "Validation on read").
//
// Three passes. simdjson parses the text into its tape (JSON syntax, UTF-8,
// nesting bounded at kMaxNesting levels), after a byte pre-check for what
// the old reader singled out (a leading BOM; NUL). A walk of the tape then
// rejects a key repeated in any object (simdjson, like most parsers, keeps
// both). The typed walk reads the fields; every failure says where it is
// ("tensor "a": chunk 3: field "at": ..."). Geometry is checked per chunk
// (ValidateSlice, byte count, byte range in its file), then across chunks:
// no two (of tensors or blobs) share a byte of a file. Whether a tensor's
// chunks tile it is left to the engine.
//
// Why simdjson: a 20,000-tensor index (3 MB) took ~100 ms to parse into an
// nlohmann DOM and ~60 ms more to free it; simdjson's tape takes ~3 ms and
// is one allocation. `values`, `layout` and `metadata` (user JSON) are kept
// as minified text: the engine passes them on without looking inside.
//
// Stricter than the list in the document, because the engine relies on it:
// file names must be unique, file and blob ranks must be < world_size, a
// global blob has exactly one chunk and a per-rank blob one per rank at
// most, a tensor's element count must fit in 64 bits, and JSON nesting is
// limited to kMaxNesting levels (deeper input would make later recursive
// walks of `values` or `metadata` overflow the stack).
#include <simdjson.h>

#include <algorithm>
#include <climits>
#include <set>
#include <tuple>

#include "format/index.h"

namespace shardsafe {
namespace {

namespace dom = simdjson::dom;
using Type = dom::element_type;

constexpr size_t kMaxNesting = 256;

std::string Join(const std::string& where, const std::string& more) {
  return where.empty() ? more : where + ": " + more;
}

// Where in the index a value sits, as error messages name it: "" (the top
// level), "file 2", `tensor "k"`, `tensor "k": chunk 3`. Rendered only for
// a message, so the walk of a large index allocates nothing per tensor or
// chunk. Holds views: what it is made from must outlive it.
class Where {
 public:
  Where(const char* text) : text_(text) {}          // NOLINT: a fixed place
  Where(const std::string& text) : text_(text) {}   // NOLINT
  // `kind "name"`.
  Where(const char* kind, std::string_view name) : kind_(kind), text_(name) {}
  // `parent: kind index`.
  Where(const Where& parent, const char* kind, size_t index)
      : parent_(&parent), kind_(kind), index_(index) {}

  std::string str() const {
    if (kind_ == nullptr) return std::string(text_);
    if (parent_ == nullptr) return std::string(kind_) + " \"" + std::string(text_) + "\"";
    return Join(parent_->str(), std::string(kind_) + " " + std::to_string(index_));
  }

 private:
  const Where* parent_ = nullptr;
  const char* kind_ = nullptr;
  std::string_view text_;
  size_t index_ = 0;
};

Status Loss(const Where& where, const std::string& message) {
  return DataLossError(Join(where.str(), message));
}

// A tensor or blob name with a NUL byte would be cut short wherever it
// becomes a C string (a file system path, a C API): refused whole.
Status CheckKey(const char* kind, std::string_view name) {
  if (name.find('\0') == std::string_view::npos) return Status();
  return Loss(Where(kind, name), "the name holds a NUL byte");
}

const char* TypeName(Type t) {
  switch (t) {
    case Type::ARRAY: return "array";
    case Type::OBJECT: return "object";
    case Type::INT64:
    case Type::UINT64:
    case Type::DOUBLE: return "number";
    case Type::STRING: return "string";
    case Type::BOOL: return "boolean";
    case Type::NULL_VALUE: return "null";
  }
  return "value";
}

// The array or object an element known to be one is (by value: a view of
// the tape, valid while the parser lives).
dom::array ArrayOf(dom::element e) { return e.get_array().value_unsafe(); }
dom::object ObjectOf(dom::element e) { return e.get_object().value_unsafe(); }

// A short rendering of an unexpected value for error messages.
std::string Describe(dom::element v) {
  if (v.is_array() || v.is_object()) return std::string("a JSON ") + TypeName(v.type());
  std::string s = simdjson::minify(v);
  return s.size() > 40 ? s.substr(0, 40) + "..." : s;
}

// --- Pass 1: text to tape ------------------------------------------------------

Status ParseJsonText(std::string_view text, dom::parser& parser, dom::element* root) {
  if (text.size() > kMaxIndexBytes) {
    return DataLossError("index is " + std::to_string(text.size()) + " bytes, over the " +
                         std::to_string(kMaxIndexBytes) + "-byte limit");
  }
  const size_t nul = text.find('\0');
  if (nul != std::string_view::npos) {
    return DataLossError("invalid JSON: NUL byte at offset " + std::to_string(nul));
  }
  if (text.starts_with("\xEF\xBB\xBF")) return DataLossError("invalid JSON: byte order mark");
  if (parser.allocate(std::max<size_t>(text.size(), 1), kMaxNesting) != simdjson::SUCCESS) {
    return ResourceExhaustedError("no memory to parse an index of " +
                                  std::to_string(text.size()) + " bytes");
  }
  const simdjson::error_code err = parser.parse(text.data(), text.size()).get(*root);
  if (err == simdjson::DEPTH_ERROR) {
    return DataLossError("JSON nested deeper than " + std::to_string(kMaxNesting) + " levels");
  }
  if (err) return DataLossError(std::string("invalid JSON: ") + simdjson::error_message(err));
  return Status();
}

// --- Pass 2: no repeated keys ---------------------------------------------------

// Where a value sits: the chain of keys and array positions above it, on
// the stack of the recursive walk (rendered only for a message).
struct JsonPath {
  const JsonPath* parent;
  std::string_view key;
  int64_t index;  // position in an array, or -1: under `key`
};

std::string ObjectName(const JsonPath* at) {
  if (at == nullptr) return "the top-level object";
  std::vector<std::string> parts;  // innermost first
  for (; at != nullptr; at = at->parent) {
    parts.push_back(at->index >= 0 ? std::to_string(at->index) : std::string(at->key));
  }
  std::string name = "object ";
  for (auto part = parts.rbegin(); part != parts.rend(); ++part) name += "/" + *part;
  return name;
}

// A key that `keys` holds twice, if any. May reorder `keys`.
std::optional<std::string_view> Repeated(std::vector<std::string_view>& keys) {
  if (keys.size() <= 16) {  // the index's own objects: a few fields each
    for (size_t i = 1; i < keys.size(); ++i) {
      for (size_t j = 0; j < i; ++j) {
        if (keys[i] == keys[j]) return keys[i];
      }
    }
    return std::nullopt;
  }
  // Strictly increasing (as our writer's tensors and blobs are): no repeat.
  if (std::adjacent_find(keys.begin(), keys.end(), std::greater_equal<>()) == keys.end()) {
    return std::nullopt;
  }
  std::sort(keys.begin(), keys.end());
  auto it = std::adjacent_find(keys.begin(), keys.end());
  if (it == keys.end()) return std::nullopt;
  return *it;
}

bool IsContainer(dom::element e) { return e.is_array() || e.is_object(); }

// `scratch` is reused down the recursion: an object's keys are checked
// before its children are walked.
Status CheckUniqueKeys(dom::element e, const JsonPath* at, std::vector<std::string_view>& scratch) {
  if (e.is_array()) {
    int64_t i = 0;
    for (dom::element v : ArrayOf(e)) {
      const JsonPath here{at, {}, i++};
      if (IsContainer(v)) SS_RETURN_IF_ERROR(CheckUniqueKeys(v, &here, scratch));
    }
    return Status();
  }
  if (!e.is_object()) return Status();
  const dom::object object = ObjectOf(e);
  scratch.clear();
  for (dom::key_value_pair field : object) scratch.push_back(field.key);
  if (auto key = Repeated(scratch)) {
    return DataLossError("duplicate key \"" + std::string(*key) + "\" in " + ObjectName(at));
  }
  for (dom::key_value_pair field : object) {
    const JsonPath here{at, field.key, -1};
    if (IsContainer(field.value)) SS_RETURN_IF_ERROR(CheckUniqueKeys(field.value, &here, scratch));
  }
  return Status();
}

// --- Pass 3: typed fields ------------------------------------------------------

Result<dom::element> Get(dom::object obj, const char* field, const Where& where) {
  dom::element v;
  if (obj.at_key(field).get(v)) return Loss(where, "missing field \"" + std::string(field) + "\"");
  return v;
}

std::string FieldWhere(const Where& where, const char* field) {
  return Join(where.str(), "field \"" + std::string(field) + "\"");
}

// Where a number sits: `where`, its field, and its position in an array
// field (-1: not in one). The text is built only for an error message, so
// that the walk of a large index allocates nothing per number.
struct NumberAt {
  const Where& where;
  const char* field;
  int64_t index = -1;
  std::string str() const {
    const std::string f = FieldWhere(where, field);
    return index < 0 ? f : f + "[" + std::to_string(index) + "]";
  }
};

Result<uint64_t> AsU64(dom::element v, const NumberAt& at) {
  uint64_t n;
  if (v.get_uint64().get(n)) {
    return Loss(at.str(), "expected an integer in [0, 2^64), got " + Describe(v));
  }
  return n;
}

Result<uint64_t> U64Field(dom::object obj, const char* field, const Where& where,
                          uint64_t max = UINT64_MAX) {
  SS_ASSIGN_OR_RETURN(dom::element v, Get(obj, field, where));
  SS_ASSIGN_OR_RETURN(uint64_t n, AsU64(v, NumberAt{where, field}));
  if (n > max) {
    return Loss(FieldWhere(where, field),
                std::to_string(n) + " is out of range (at most " + std::to_string(max) + ")");
  }
  return n;
}

Result<std::string> StringField(dom::object obj, const char* field, const Where& where) {
  SS_ASSIGN_OR_RETURN(dom::element v, Get(obj, field, where));
  std::string_view s;
  if (v.get_string().get(s)) {
    return Loss(FieldWhere(where, field), "expected a string, got " + Describe(v));
  }
  return std::string(s);
}

Result<dom::element> TypedField(dom::object obj, const char* field, const Where& where,
                                Type type) {
  SS_ASSIGN_OR_RETURN(dom::element v, Get(obj, field, where));
  if (v.type() != type) {
    return Loss(FieldWhere(where, field),
                std::string("expected a JSON ") + TypeName(type) + ", got " + Describe(v));
  }
  return v;
}

// `v` as an object, or an error at `where` naming what it is instead.
Result<dom::object> AsObject(dom::element v, const Where& where) {
  if (!v.is_object()) return Loss(where, "expected a JSON object, got " + Describe(v));
  return ObjectOf(v);
}

Result<Shape> U64ArrayField(dom::object obj, const char* field, const Where& where) {
  SS_ASSIGN_OR_RETURN(dom::element v, TypedField(obj, field, where, Type::ARRAY));
  const dom::array array = ArrayOf(v);
  Shape out;
  out.reserve(array.size());
  for (dom::element n : array) {
    const NumberAt at{where, field, static_cast<int64_t>(out.size())};
    SS_ASSIGN_OR_RETURN(uint64_t u, AsU64(n, at));
    out.push_back(u);
  }
  return out;
}

Result<std::optional<uint32_t>> OptionalCrc(dom::object obj, const Where& where) {
  if (obj.at_key("crc32c").error()) return std::optional<uint32_t>();
  SS_ASSIGN_OR_RETURN(uint64_t crc, U64Field(obj, "crc32c", where, UINT32_MAX));
  return std::optional<uint32_t>(static_cast<uint32_t>(crc));
}

Status CheckFileName(const std::string& name, const Where& where) {
  const bool bad = name.empty() || name == "." || name == ".." ||
                   name.find_first_of(std::string("/\\\0", 3)) != std::string::npos;
  if (bad) return Loss(where, "\"" + name + "\" is not a plain file name");
  return Status();
}

Result<std::vector<IndexFile>> ParseFiles(dom::object root, int world_size) {
  SS_ASSIGN_OR_RETURN(dom::element files, TypedField(root, "files", "", Type::ARRAY));
  std::vector<IndexFile> out;
  std::set<std::string> names;
  for (dom::element v : ArrayOf(files)) {
    const std::string where = "file " + std::to_string(out.size());
    SS_ASSIGN_OR_RETURN(dom::object f, AsObject(v, where));
    IndexFile file;
    SS_ASSIGN_OR_RETURN(file.name, StringField(f, "name", where));
    SS_RETURN_IF_ERROR(CheckFileName(file.name, where));
    if (!names.insert(file.name).second) return Loss(where, "\"" + file.name + "\" listed twice");
    SS_ASSIGN_OR_RETURN(file.bytes, U64Field(f, "bytes", where));
    SS_ASSIGN_OR_RETURN(uint64_t rank, U64Field(f, "rank", where, world_size - 1));
    file.rank = static_cast<int>(rank);
    out.push_back(std::move(file));
  }
  return out;
}

struct ByteRange {
  uint32_t file = 0;
  uint64_t at = 0;
  uint64_t bytes = 0;
};

// A chunk's `file`, `at` and `bytes`: the range must lie inside the file.
Result<ByteRange> ParseByteRange(dom::object c, const std::vector<IndexFile>& files,
                                 const Where& where) {
  if (files.empty()) return Loss(FieldWhere(where, "file"), "the index lists no files");
  ByteRange r;
  SS_ASSIGN_OR_RETURN(uint64_t f, U64Field(c, "file", where, files.size() - 1));
  r.file = static_cast<uint32_t>(f);
  SS_ASSIGN_OR_RETURN(r.at, U64Field(c, "at", where));
  SS_ASSIGN_OR_RETURN(r.bytes, U64Field(c, "bytes", where));
  uint64_t end;
  if (__builtin_add_overflow(r.at, r.bytes, &end) || end > files[f].bytes) {
    const std::string end_text = end < r.at ? "2^64+" + std::to_string(end) : std::to_string(end);
    return Loss(where, "byte range [" + std::to_string(r.at) + ", " + end_text +
                           ") exceeds file " + files[f].name + " (" +
                           std::to_string(files[f].bytes) + " bytes)");
  }
  return r;
}

Result<Slice> ParseSlice(dom::object c, const Where& where) {
  Slice slice;
  SS_ASSIGN_OR_RETURN(slice.box.offset, U64ArrayField(c, "offset", where));
  SS_ASSIGN_OR_RETURN(slice.box.size, U64ArrayField(c, "size", where));
  if (!c.at_key("flat").error()) {
    SS_ASSIGN_OR_RETURN(Shape flat, U64ArrayField(c, "flat", where));
    if (flat.size() != 2) {
      return Loss(FieldWhere(where, "flat"), "expected [begin, end], got " +
                                                 std::to_string(flat.size()) + " numbers");
    }
    slice.flat = FlatRange{flat[0], flat[1]};
  }
  return slice;
}

Result<IndexChunk> ParseChunk(dom::element v, const IndexTensor& t,
                              const std::vector<IndexFile>& files, const Where& where) {
  SS_ASSIGN_OR_RETURN(dom::object c, AsObject(v, where));
  IndexChunk chunk;
  SS_ASSIGN_OR_RETURN(chunk.slice, ParseSlice(c, where));
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
  SS_ASSIGN_OR_RETURN(ByteRange range, ParseByteRange(c, files, where));
  chunk.file = range.file;
  chunk.at = range.at;
  chunk.bytes = range.bytes;
  Result<uint64_t> want = NumBytes(t.dtype, chunk.slice.NumElements());
  if (!want.ok()) return Loss(where, want.status().message());
  if (chunk.bytes != *want) {
    return Loss(FieldWhere(where, "bytes"),
                std::to_string(chunk.bytes) + " bytes recorded, but " +
                    std::to_string(chunk.slice.NumElements()) + " " +
                    std::string(DTypeName(t.dtype)) + " elements take " + std::to_string(*want));
  }
  SS_ASSIGN_OR_RETURN(chunk.crc32c, OptionalCrc(c, where));
  return chunk;
}

Result<IndexTensor> ParseTensor(dom::element value, const std::vector<IndexFile>& files,
                                const Where& where) {
  SS_ASSIGN_OR_RETURN(dom::object v, AsObject(value, where));
  IndexTensor t;
  SS_ASSIGN_OR_RETURN(std::string dtype, StringField(v, "dtype", where));
  Result<DType> parsed = ParseDType(dtype);
  if (!parsed.ok()) return Loss(FieldWhere(where, "dtype"), parsed.status().message());
  t.dtype = *parsed;
  SS_ASSIGN_OR_RETURN(t.shape, U64ArrayField(v, "shape", where));
  Result<uint64_t> n = NumElements(t.shape);
  if (!n.ok()) return Loss(FieldWhere(where, "shape"), n.status().message());
  SS_ASSIGN_OR_RETURN(dom::element chunks, TypedField(v, "chunks", where, Type::ARRAY));
  for (dom::element c : ArrayOf(chunks)) {
    const Where at(where, "chunk", t.chunks.size());
    SS_ASSIGN_OR_RETURN(IndexChunk chunk, ParseChunk(c, t, files, at));
    t.chunks.push_back(std::move(chunk));
  }
  return t;
}

Result<IndexBlobChunk> ParseBlobChunk(dom::element v, const std::vector<IndexFile>& files,
                                      int world_size, const Where& where) {
  SS_ASSIGN_OR_RETURN(dom::object c, AsObject(v, where));
  IndexBlobChunk chunk;
  SS_ASSIGN_OR_RETURN(uint64_t rank, U64Field(c, "rank", where, world_size - 1));
  chunk.rank = static_cast<int>(rank);
  SS_ASSIGN_OR_RETURN(ByteRange range, ParseByteRange(c, files, where));
  chunk.file = range.file;
  chunk.at = range.at;
  chunk.bytes = range.bytes;
  SS_ASSIGN_OR_RETURN(chunk.crc32c, OptionalCrc(c, where));
  return chunk;
}

Result<IndexBlob> ParseBlob(dom::element value, const std::vector<IndexFile>& files,
                            int world_size, const Where& where) {
  SS_ASSIGN_OR_RETURN(dom::object v, AsObject(value, where));
  IndexBlob blob;
  SS_ASSIGN_OR_RETURN(dom::element per_rank, TypedField(v, "per_rank", where, Type::BOOL));
  blob.per_rank = per_rank.get_bool().value_unsafe();
  SS_ASSIGN_OR_RETURN(dom::element chunks, TypedField(v, "chunks", where, Type::ARRAY));
  std::set<int> ranks;
  for (dom::element c : ArrayOf(chunks)) {
    const Where at(where, "chunk", blob.chunks.size());
    SS_ASSIGN_OR_RETURN(IndexBlobChunk chunk, ParseBlobChunk(c, files, world_size, at));
    if (!ranks.insert(chunk.rank).second) {
      return Loss(at, "rank " + std::to_string(chunk.rank) + " given twice");
    }
    blob.chunks.push_back(chunk);
  }
  if (!blob.per_rank && blob.chunks.size() != 1) {
    return Loss(where, "a global blob needs exactly one chunk, found " +
                           std::to_string(blob.chunks.size()));
  }
  return blob;
}

// format and version come first: a newer version may change everything else.
Status CheckFormatVersion(dom::object root) {
  SS_ASSIGN_OR_RETURN(std::string format, StringField(root, "format", ""));
  if (format != "shardsafe") {
    return Loss("field \"format\"", "\"" + format + "\" is not \"shardsafe\"");
  }
  SS_ASSIGN_OR_RETURN(uint64_t version, U64Field(root, "version", ""));
  if (version > static_cast<uint64_t>(kFormatVersion)) {
    return FailedPreconditionError("format version " + std::to_string(version) +
                                   " is newer than this reader supports (" +
                                   std::to_string(kFormatVersion) + ")");
  }
  if (version != static_cast<uint64_t>(kFormatVersion)) {
    return Loss("field \"version\"", "unsupported version " + std::to_string(version));
  }
  return Status();
}

Result<CheckpointIndex> ParseRoot(dom::element value) {
  SS_ASSIGN_OR_RETURN(dom::object root, AsObject(value, ""));
  SS_RETURN_IF_ERROR(CheckFormatVersion(root));
  CheckpointIndex index;
  SS_ASSIGN_OR_RETURN(index.tag, StringField(root, "tag", ""));
  SS_ASSIGN_OR_RETURN(uint64_t created, U64Field(root, "created_unix", "", INT64_MAX));
  index.created_unix = static_cast<int64_t>(created);
  SS_ASSIGN_OR_RETURN(uint64_t world, U64Field(root, "world_size", "", INT_MAX));
  if (world == 0) return Loss("field \"world_size\"", "must be at least 1");
  index.world_size = static_cast<int>(world);
  SS_ASSIGN_OR_RETURN(dom::element layout, Get(root, "layout", ""));
  index.layout = simdjson::minify(layout);
  SS_ASSIGN_OR_RETURN(dom::element metadata, Get(root, "metadata", ""));
  index.metadata = simdjson::minify(metadata);
  SS_ASSIGN_OR_RETURN(index.files, ParseFiles(root, index.world_size));
  SS_ASSIGN_OR_RETURN(dom::element tensors, TypedField(root, "tensors", "", Type::OBJECT));
  // Keys come sorted from our writer: each goes in at the end, unsearched.
  for (dom::key_value_pair t : ObjectOf(tensors)) {
    SS_RETURN_IF_ERROR(CheckKey("tensor", t.key));
    SS_ASSIGN_OR_RETURN(IndexTensor tensor, ParseTensor(t.value, index.files, {"tensor", t.key}));
    index.tensors.emplace_hint(index.tensors.end(), t.key, std::move(tensor));
  }
  SS_ASSIGN_OR_RETURN(dom::element values, TypedField(root, "values", "", Type::OBJECT));
  index.values = simdjson::minify(values);
  SS_ASSIGN_OR_RETURN(dom::element blobs, TypedField(root, "blobs", "", Type::OBJECT));
  for (dom::key_value_pair b : ObjectOf(blobs)) {
    SS_RETURN_IF_ERROR(CheckKey("blob", b.key));
    SS_ASSIGN_OR_RETURN(IndexBlob blob,
                        ParseBlob(b.value, index.files, index.world_size, {"blob", b.key}));
    index.blobs.emplace_hint(index.blobs.end(), b.key, std::move(blob));
  }
  return index;
}

// Where a chunk with data lies, and whose it is, for the overlap check.
struct Occupant {
  uint32_t file;
  uint64_t begin;
  uint64_t end;
  const std::string* owner;  // key of a tensor or name of a blob
  bool blob;
  size_t chunk;
};

// `tensor "k"<separator>chunk i`
std::string OccupantName(const Occupant& o, const char* separator) {
  return std::string(o.blob ? "blob" : "tensor") + " \"" + *o.owner + "\"" + separator +
         "chunk " + std::to_string(o.chunk);
}

// No byte of a data file belongs to two chunks: the streamed checksums
// (engine/load/stream_checksums.h) rely on it, and a hostile index could
// otherwise make one tensor's bytes pass for another's.
Status CheckNoSharedBytes(const CheckpointIndex& index) {
  std::vector<Occupant> all;
  for (const auto& [key, t] : index.tensors) {
    for (size_t i = 0; i < t.chunks.size(); ++i) {
      const IndexChunk& c = t.chunks[i];
      if (c.bytes > 0) all.push_back({c.file, c.at, c.at + c.bytes, &key, false, i});
    }
  }
  for (const auto& [name, b] : index.blobs) {
    for (size_t i = 0; i < b.chunks.size(); ++i) {
      const IndexBlobChunk& c = b.chunks[i];
      if (c.bytes > 0) all.push_back({c.file, c.at, c.at + c.bytes, &name, true, i});
    }
  }
  std::sort(all.begin(), all.end(), [](const Occupant& a, const Occupant& b) {
    return std::tie(a.file, a.begin) < std::tie(b.file, b.begin);
  });
  for (size_t i = 1; i < all.size(); ++i) {
    const Occupant& a = all[i - 1];
    const Occupant& b = all[i];
    if (a.file != b.file || a.end <= b.begin) continue;
    return Loss(OccupantName(b, ": "),
                "byte range [" + std::to_string(b.begin) + ", " + std::to_string(b.end) +
                    ") of file " + index.files[b.file].name + " overlaps [" +
                    std::to_string(a.begin) + ", " + std::to_string(a.end) + ") of " +
                    OccupantName(a, " "));
  }
  return Status();
}

}  // namespace

Result<CheckpointIndex> ParseIndex(std::string_view text, std::string_view source) {
  dom::parser parser;
  dom::element root;
  std::vector<std::string_view> scratch;
  Status parsed = ParseJsonText(text, parser, &root);
  if (parsed.ok()) parsed = CheckUniqueKeys(root, nullptr, scratch);
  if (!parsed.ok()) return parsed.WithContext(source);
  Result<CheckpointIndex> index = ParseRoot(root);
  if (!index.ok()) return index.status().WithContext(source);
  if (Status s = CheckNoSharedBytes(*index); !s.ok()) return s.WithContext(source);
  return index;
}

}  // namespace shardsafe
