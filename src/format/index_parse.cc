// ParseIndex: reads shardsafe.json from untrusted bytes (docs/format.md §3,
// "Validation on read").
//
// Two passes. The first builds a DOM through nlohmann's SAX interface,
// rejecting a repeated key in any object (nlohmann would silently keep the
// last) and bounding nesting, after a byte pre-check for what nlohmann would
// otherwise let through (a leading BOM, which it skips, and NUL, which it
// takes for the end of input). The second walks the DOM field by field;
// every failure says where it is ("tensor "a": chunk 3: field "at": ...").
// Geometry is checked per chunk (ValidateSlice, byte count, byte range in
// its file), then across chunks: no two (of tensors or blobs) share a byte
// of a file. Whether a tensor's chunks tile it is left to the engine.
//
// Stricter than the list in the document, because the engine relies on it:
// file names must be unique, file and blob ranks must be < world_size, a
// global blob has exactly one chunk and a per-rank blob one per rank at
// most, a tensor's element count must fit in 64 bits, and JSON nesting is
// limited to kMaxNesting levels (deeper input would make later recursive
// walks of `values` or `metadata` overflow the stack).
#include <algorithm>
#include <climits>
#include <set>
#include <tuple>

#include "format/index.h"

namespace shardsafe {
namespace {

using json = nlohmann::json;

constexpr int kMaxNesting = 256;

Status Loss(const std::string& where, const std::string& message) {
  return DataLossError(where.empty() ? message : where + ": " + message);
}

std::string Join(const std::string& where, const std::string& more) {
  return where.empty() ? more : where + ": " + more;
}

// A short rendering of an unexpected value for error messages.
std::string Describe(const json& v) {
  if (v.is_structured()) return std::string("a JSON ") + v.type_name();
  std::string s = v.dump(-1, ' ', false, json::error_handler_t::replace);
  return s.size() > 40 ? s.substr(0, 40) + "..." : s;
}

// --- Pass 1: text to DOM -----------------------------------------------------

// Builds the DOM through nlohmann's SAX interface, so that a repeated key
// is caught (nlohmann's own parser would silently keep the last) with one
// O(log n) lookup, and nesting is bounded. (A parse callback would do the
// same but makes nlohmann rescan the parent object at every object end:
// quadratic in the number of tensors.)
class DomBuilder : public nlohmann::json_sax<json> {
 public:
  json& root() { return root_; }
  const std::optional<std::string>& problem() const { return problem_; }

  bool null() override { return Put(json()); }
  bool boolean(bool v) override { return Put(v); }
  bool number_integer(json::number_integer_t v) override { return Put(v); }
  bool number_unsigned(json::number_unsigned_t v) override { return Put(v); }
  bool number_float(json::number_float_t v, const json::string_t&) override { return Put(v); }
  bool string(json::string_t& v) override { return Put(std::move(v)); }
  bool binary(json::binary_t&) override { return Fail("binary values are not JSON"); }
  bool start_object(std::size_t) override { return Open(json::object()); }
  bool start_array(std::size_t) override { return Open(json::array()); }
  bool end_object() override { return Close(); }
  bool end_array() override { return Close(); }
  bool key(json::string_t& k) override {
    if (stack_.back()->contains(k)) return Fail("duplicate key \"" + k + "\" in " + Path());
    key_ = std::move(k);
    return true;
  }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& e) override {
    return Fail(std::string("invalid JSON: ") + e.what());
  }

 private:
  // Places `v` where the parser is and returns a pointer to it.
  json* Place(json v) {
    if (stack_.empty()) {
      root_ = std::move(v);
      return &root_;
    }
    json& top = *stack_.back();
    if (top.is_array()) {
      top.push_back(std::move(v));
      return &top.back();
    }
    auto& object = top.get_ref<json::object_t&>();
    auto it = object.emplace(std::move(key_), std::move(v)).first;  // key() ruled out repeats
    path_.back() = &it->first;  // map nodes do not move
    return &it->second;
  }
  bool Put(json v) {
    Place(std::move(v));
    return true;
  }
  bool Open(json container) {
    if (stack_.size() >= kMaxNesting) {
      return Fail("JSON nested deeper than " + std::to_string(kMaxNesting) + " levels");
    }
    stack_.push_back(Place(std::move(container)));
    path_.push_back(nullptr);
    return true;
  }
  bool Close() {
    stack_.pop_back();
    path_.pop_back();
    return true;
  }
  bool Fail(std::string message) {
    if (!problem_) problem_ = std::move(message);
    return false;
  }
  std::string Path() const {
    std::string path;
    for (size_t i = 0; i + 1 < path_.size(); ++i) path += "/" + (path_[i] ? *path_[i] : "");
    return path.empty() ? "the top-level object" : "object " + path;
  }

  json root_;
  std::vector<json*> stack_;
  std::vector<const std::string*> path_;  // the key each open container sits under
  std::string key_;
  std::optional<std::string> problem_;
};

Result<json> ParseJsonText(std::string_view text) {
  if (text.size() > kMaxIndexBytes) {
    return DataLossError("index is " + std::to_string(text.size()) + " bytes, over the " +
                         std::to_string(kMaxIndexBytes) + "-byte limit");
  }
  const size_t nul = text.find('\0');
  if (nul != std::string_view::npos) {
    return DataLossError("invalid JSON: NUL byte at offset " + std::to_string(nul));
  }
  if (text.starts_with("\xEF\xBB\xBF")) return DataLossError("invalid JSON: byte order mark");
  DomBuilder builder;
  const bool ok = json::sax_parse(text.begin(), text.end(), &builder);
  if (builder.problem()) return DataLossError(*builder.problem());
  if (!ok) return DataLossError("invalid JSON");
  return std::move(builder.root());
}

// --- Pass 2: typed fields ------------------------------------------------------

Result<const json*> Get(const json& obj, const char* field, const std::string& where) {
  auto it = obj.find(field);
  if (it == obj.end()) return Loss(where, "missing field \"" + std::string(field) + "\"");
  return &*it;
}

std::string FieldWhere(const std::string& where, const char* field) {
  return Join(where, "field \"" + std::string(field) + "\"");
}

// Where a number sits: `where`, its field, and its position in an array
// field (-1: not in one). The text is built only for an error message, so
// that the walk of a large index allocates nothing per number.
struct NumberAt {
  const std::string& where;
  const char* field;
  int64_t index = -1;
  std::string str() const {
    const std::string f = FieldWhere(where, field);
    return index < 0 ? f : f + "[" + std::to_string(index) + "]";
  }
};

Result<uint64_t> AsU64(const json& v, const NumberAt& at) {
  if (!v.is_number_unsigned()) {
    return Loss(at.str(), "expected an integer in [0, 2^64), got " + Describe(v));
  }
  return v.get<uint64_t>();
}

Result<uint64_t> U64Field(const json& obj, const char* field, const std::string& where,
                          uint64_t max = UINT64_MAX) {
  SS_ASSIGN_OR_RETURN(const json* v, Get(obj, field, where));
  SS_ASSIGN_OR_RETURN(uint64_t n, AsU64(*v, NumberAt{where, field}));
  if (n > max) {
    return Loss(FieldWhere(where, field),
                std::to_string(n) + " is out of range (at most " + std::to_string(max) + ")");
  }
  return n;
}

Result<std::string> StringField(const json& obj, const char* field, const std::string& where) {
  SS_ASSIGN_OR_RETURN(const json* v, Get(obj, field, where));
  if (!v->is_string()) return Loss(FieldWhere(where, field), "expected a string, got " + Describe(*v));
  return v->get<std::string>();
}

Result<const json*> TypedField(const json& obj, const char* field, const std::string& where,
                               json::value_t type) {
  SS_ASSIGN_OR_RETURN(const json* v, Get(obj, field, where));
  if (v->type() != type) {
    return Loss(FieldWhere(where, field),
                std::string("expected a JSON ") + json(type).type_name() + ", got " + Describe(*v));
  }
  return v;
}

Result<Shape> U64ArrayField(const json& obj, const char* field, const std::string& where) {
  SS_ASSIGN_OR_RETURN(const json* v, TypedField(obj, field, where, json::value_t::array));
  Shape out;
  out.reserve(v->size());
  for (size_t i = 0; i < v->size(); ++i) {
    SS_ASSIGN_OR_RETURN(uint64_t n, AsU64((*v)[i], NumberAt{where, field, static_cast<int64_t>(i)}));
    out.push_back(n);
  }
  return out;
}

Result<std::optional<uint32_t>> OptionalCrc(const json& obj, const std::string& where) {
  if (!obj.contains("crc32c")) return std::optional<uint32_t>();
  SS_ASSIGN_OR_RETURN(uint64_t crc, U64Field(obj, "crc32c", where, UINT32_MAX));
  return std::optional<uint32_t>(static_cast<uint32_t>(crc));
}

Status CheckFileName(const std::string& name, const std::string& where) {
  const bool bad = name.empty() || name == "." || name == ".." ||
                   name.find_first_of(std::string("/\\\0", 3)) != std::string::npos;
  if (bad) return Loss(where, "\"" + name + "\" is not a plain file name");
  return Status();
}

Result<std::vector<IndexFile>> ParseFiles(const json& root, int world_size) {
  SS_ASSIGN_OR_RETURN(const json* files, TypedField(root, "files", "", json::value_t::array));
  std::vector<IndexFile> out;
  std::set<std::string> names;
  for (size_t i = 0; i < files->size(); ++i) {
    const std::string where = "file " + std::to_string(i);
    const json& f = (*files)[i];
    if (!f.is_object()) return Loss(where, "expected a JSON object, got " + Describe(f));
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
Result<ByteRange> ParseByteRange(const json& c, const std::vector<IndexFile>& files,
                                 const std::string& where) {
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

Result<Slice> ParseSlice(const json& c, const std::string& where) {
  Slice slice;
  SS_ASSIGN_OR_RETURN(slice.box.offset, U64ArrayField(c, "offset", where));
  SS_ASSIGN_OR_RETURN(slice.box.size, U64ArrayField(c, "size", where));
  if (c.contains("flat")) {
    SS_ASSIGN_OR_RETURN(Shape flat, U64ArrayField(c, "flat", where));
    if (flat.size() != 2) {
      return Loss(FieldWhere(where, "flat"), "expected [begin, end], got " +
                                                 std::to_string(flat.size()) + " numbers");
    }
    slice.flat = FlatRange{flat[0], flat[1]};
  }
  return slice;
}

Result<IndexChunk> ParseChunk(const json& c, const IndexTensor& t,
                              const std::vector<IndexFile>& files, const std::string& where) {
  if (!c.is_object()) return Loss(where, "expected a JSON object, got " + Describe(c));
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

Result<IndexTensor> ParseTensor(const json& v, const std::vector<IndexFile>& files,
                                const std::string& where) {
  if (!v.is_object()) return Loss(where, "expected a JSON object, got " + Describe(v));
  IndexTensor t;
  SS_ASSIGN_OR_RETURN(std::string dtype, StringField(v, "dtype", where));
  Result<DType> parsed = ParseDType(dtype);
  if (!parsed.ok()) return Loss(FieldWhere(where, "dtype"), parsed.status().message());
  t.dtype = *parsed;
  SS_ASSIGN_OR_RETURN(t.shape, U64ArrayField(v, "shape", where));
  Result<uint64_t> n = NumElements(t.shape);
  if (!n.ok()) return Loss(FieldWhere(where, "shape"), n.status().message());
  SS_ASSIGN_OR_RETURN(const json* chunks, TypedField(v, "chunks", where, json::value_t::array));
  for (size_t i = 0; i < chunks->size(); ++i) {
    SS_ASSIGN_OR_RETURN(IndexChunk c, ParseChunk((*chunks)[i], t, files,
                                                 Join(where, "chunk " + std::to_string(i))));
    t.chunks.push_back(std::move(c));
  }
  return t;
}

Result<IndexBlobChunk> ParseBlobChunk(const json& c, const std::vector<IndexFile>& files,
                                      int world_size, const std::string& where) {
  if (!c.is_object()) return Loss(where, "expected a JSON object, got " + Describe(c));
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

Result<IndexBlob> ParseBlob(const json& v, const std::vector<IndexFile>& files, int world_size,
                            const std::string& where) {
  if (!v.is_object()) return Loss(where, "expected a JSON object, got " + Describe(v));
  IndexBlob blob;
  SS_ASSIGN_OR_RETURN(const json* per_rank, TypedField(v, "per_rank", where, json::value_t::boolean));
  blob.per_rank = per_rank->get<bool>();
  SS_ASSIGN_OR_RETURN(const json* chunks, TypedField(v, "chunks", where, json::value_t::array));
  std::set<int> ranks;
  for (size_t i = 0; i < chunks->size(); ++i) {
    const std::string at = Join(where, "chunk " + std::to_string(i));
    SS_ASSIGN_OR_RETURN(IndexBlobChunk c, ParseBlobChunk((*chunks)[i], files, world_size, at));
    if (!ranks.insert(c.rank).second) return Loss(at, "rank " + std::to_string(c.rank) + " given twice");
    blob.chunks.push_back(c);
  }
  if (!blob.per_rank && blob.chunks.size() != 1) {
    return Loss(where, "a global blob needs exactly one chunk, found " +
                           std::to_string(blob.chunks.size()));
  }
  return blob;
}

// format and version come first: a newer version may change everything else.
Status CheckFormatVersion(const json& root) {
  SS_ASSIGN_OR_RETURN(std::string format, StringField(root, "format", ""));
  if (format != "shardsafe") return Loss("field \"format\"", "\"" + format + "\" is not \"shardsafe\"");
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

Result<CheckpointIndex> ParseRoot(const json& root) {
  if (!root.is_object()) return Loss("", "expected a JSON object, got " + Describe(root));
  SS_RETURN_IF_ERROR(CheckFormatVersion(root));
  CheckpointIndex index;
  SS_ASSIGN_OR_RETURN(index.tag, StringField(root, "tag", ""));
  SS_ASSIGN_OR_RETURN(uint64_t created, U64Field(root, "created_unix", "", INT64_MAX));
  index.created_unix = static_cast<int64_t>(created);
  SS_ASSIGN_OR_RETURN(uint64_t world, U64Field(root, "world_size", "", INT_MAX));
  if (world == 0) return Loss("field \"world_size\"", "must be at least 1");
  index.world_size = static_cast<int>(world);
  SS_ASSIGN_OR_RETURN(const json* layout, Get(root, "layout", ""));
  index.layout = *layout;
  SS_ASSIGN_OR_RETURN(const json* metadata, Get(root, "metadata", ""));
  index.metadata = *metadata;
  SS_ASSIGN_OR_RETURN(index.files, ParseFiles(root, index.world_size));
  SS_ASSIGN_OR_RETURN(const json* tensors, TypedField(root, "tensors", "", json::value_t::object));
  for (const auto& [key, v] : tensors->items()) {
    SS_ASSIGN_OR_RETURN(index.tensors[key], ParseTensor(v, index.files, "tensor \"" + key + "\""));
  }
  SS_ASSIGN_OR_RETURN(const json* values, TypedField(root, "values", "", json::value_t::object));
  index.values = *values;
  SS_ASSIGN_OR_RETURN(const json* blobs, TypedField(root, "blobs", "", json::value_t::object));
  for (const auto& [name, v] : blobs->items()) {
    SS_ASSIGN_OR_RETURN(index.blobs[name],
                        ParseBlob(v, index.files, index.world_size, "blob \"" + name + "\""));
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
// (engine/stream_checksums.h) rely on it, and a hostile index could
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
  Result<json> root = ParseJsonText(text);
  if (!root.ok()) return root.status().WithContext(source);
  Result<CheckpointIndex> index = ParseRoot(*root);
  if (!index.ok()) return index.status().WithContext(source);
  if (Status s = CheckNoSharedBytes(*index); !s.ok()) return s.WithContext(source);
  return index;
}

}  // namespace shardsafe
