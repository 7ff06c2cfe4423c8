// Writing the index (docs/format.md §3) and naming data-file entries (§2).
// ParseIndex lives in index_parse.cc.
//
// The index is written as compact text with fields in the order of the
// format document; user JSON (layout, metadata, values) as the text the
// index holds. Optional fields (a chunk's `flat` and `crc32c`) are omitted
// when absent, never written as null. Strings that
// are not valid UTF-8 (a caller bug: keys come from Python str or C++ code)
// are written with U+FFFD in place of the bad bytes rather than throwing.
#include "format/index.h"

#include <charconv>
#include <cstdio>

#include <nlohmann/json.hpp>

#include "format/chunk_table.h"
#include "format/json_text.h"

namespace shardsafe {
namespace {

using ordered_json = nlohmann::ordered_json;

std::string Dump(const ordered_json& j) {
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

// Appends index text to one string: the per-tensor part is written
// directly (a 20,000-tensor index took ~50 ms through ordered_json
// objects, most of it allocating and freeing them).
// JSON text, built whole (Take) or handed to a sink a piece at a time, so
// that a large index is written without a copy of it in memory.
class Text {
 public:
  using Sink = std::function<void(std::string_view)>;
  Text() = default;
  explicit Text(const Sink* sink) : sink_(sink) {}

  std::string Take() { return std::move(out_); }
  void Flush() {
    if (sink_ != nullptr && !out_.empty()) (*sink_)(out_);
    out_.clear();
  }

  Text& Raw(std::string_view s) {
    out_ += s;
    if (!s.empty()) last_ = s.back();
    if (sink_ != nullptr && out_.size() >= kPieceBytes) Flush();
    return *this;
  }
  // A JSON string: as nlohmann writes it (JsonQuote), U+FFFD for bad UTF-8.
  Text& Str(std::string_view s) {
    if (internal::CheckUtf8(s)) return Raw(Dump(ordered_json(std::string(s))));
    return Raw(internal::JsonQuote(s));
  }
  template <typename Int>
  Text& Num(Int n) {
    char digits[24];
    auto end = std::to_chars(digits, digits + sizeof(digits), n).ptr;
    return Raw(std::string_view(digits, end - digits));
  }
  Text& Nums(const std::vector<uint64_t>& v) {
    Raw("[");
    for (size_t i = 0; i < v.size(); ++i) {
      if (i) Raw(",");
      Num(v[i]);
    }
    return Raw("]");
  }
  // `,"name":` (no comma before the first field of an object).
  Text& Field(std::string_view name) {
    if (last_ != '{') Raw(",");
    return Raw("\"").Raw(name).Raw("\":");
  }

 private:
  static constexpr size_t kPieceBytes = size_t{1} << 20;
  const Sink* sink_ = nullptr;
  std::string out_;
  char last_ = '\0';
};

void ChunkText(const IndexChunk& c, Text& t) {
  t.Raw("{").Field("offset").Nums(c.slice.box.offset).Field("size").Nums(c.slice.box.size);
  if (c.slice.flat) t.Field("flat").Nums({c.slice.flat->begin, c.slice.flat->end});
  t.Field("file").Num(c.file).Field("at").Num(c.at).Field("bytes").Num(c.bytes);
  if (c.crc32c) t.Field("crc32c").Num(*c.crc32c);
  t.Raw("}");
}

void TensorText(const IndexTensor& tensor, const IndexTableRef* ref, Text& t) {
  t.Raw("{").Field("dtype").Str(DTypeName(tensor.dtype)).Field("shape").Nums(tensor.shape);
  if (ref != nullptr) {
    t.Field("table").Nums({ref->count, ref->directory_at, ref->records_at, ref->directory_crc32c});
    t.Raw("}");
    return;
  }
  t.Field("chunks").Raw("[");
  for (size_t i = 0; i < tensor.chunks.size(); ++i) {
    if (i) t.Raw(",");
    ChunkText(tensor.chunks[i], t);
  }
  t.Raw("]}");
}

void BlobText(const IndexBlob& blob, Text& t) {
  t.Raw("{").Field("per_rank").Raw(blob.per_rank ? "true" : "false").Field("chunks").Raw("[");
  for (size_t i = 0; i < blob.chunks.size(); ++i) {
    const IndexBlobChunk& c = blob.chunks[i];
    if (i) t.Raw(",");
    t.Raw("{").Field("rank").Num(c.rank).Field("file").Num(c.file).Field("at").Num(c.at);
    t.Field("bytes").Num(c.bytes);
    if (c.crc32c) t.Field("crc32c").Num(*c.crc32c);
    t.Raw("}");
  }
  t.Raw("]}");
}

// A JSON object from (key, value) pairs that are already unique and in order.
template <typename Map, typename ValueText>
void ObjectText(const Map& map, ValueText value_text, Text& t) {
  t.Raw("{");
  bool first = true;
  for (const auto& [key, value] : map) {
    if (!first) t.Raw(",");
    first = false;
    t.Str(key).Raw(":");
    value_text(value, t);
  }
  t.Raw("}");
}

std::string Range(uint64_t begin, uint64_t end) {
  return std::to_string(begin) + ":" + std::to_string(end);
}

}  // namespace

namespace {

// `table`: the chunk table whose refs (in key order) the tensors name, or
// null for chunks in the index (version 1).
void WriteIndex(const CheckpointIndex& index, const EncodedChunkTable* table,
                std::string_view table_name, Text& t) {
  const bool checksum_files = table != nullptr && !index.checksum_files.empty();
  const int version = checksum_files ? 3 : table ? 2 : 1;
  t.Raw("{").Field("format").Str("shardsafe").Field("version").Num(version);
  t.Field("tag").Str(index.tag).Field("created_unix").Num(index.created_unix);
  t.Field("world_size").Num(index.world_size);
  t.Field("layout").Raw(index.layout);
  t.Field("metadata").Raw(index.metadata);
  t.Field("files").Raw("[");
  for (size_t i = 0; i < index.files.size(); ++i) {
    const IndexFile& f = index.files[i];
    if (i) t.Raw(",");
    t.Raw("{").Field("name").Str(f.name).Field("bytes").Num(f.bytes);
    t.Field("rank").Num(f.rank).Raw("}");
  }
  t.Raw("]");
  if (table != nullptr) {
    t.Field("chunk_table").Str(table_name).Field("chunk_table_bytes").Num(table->file.bytes);
  }
  if (checksum_files) {
    t.Field("checksum_files").Nums({index.checksum_files.begin(), index.checksum_files.end()});
  }
  t.Field("tensors");
  size_t i = 0;
  ObjectText(index.tensors, [&](const IndexTensor& tensor, Text& out) {
    TensorText(tensor, table ? &table->refs[i++] : nullptr, out);
  }, t);
  t.Field("values").Raw(index.values);
  t.Field("blobs");
  ObjectText(index.blobs, BlobText, t);
  t.Raw("}");
}

// The table a read version-2 index names, as its refs.
std::optional<EncodedChunkTable> TableOf(const CheckpointIndex& index) {
  if (!index.chunk_table) return std::nullopt;
  EncodedChunkTable table{*index.chunk_table, {}, {}};
  for (const auto& [key, tensor] : index.tensors) {
    table.refs.push_back(tensor.table.value_or(IndexTableRef()));
  }
  return table;
}

}  // namespace

std::string SerializeIndex(const CheckpointIndex& index) {
  const std::optional<EncodedChunkTable> table = TableOf(index);
  Text t;
  WriteIndex(index, table ? &*table : nullptr, table ? table->file.name : "", t);
  return t.Take();
}

Result<CommitIndex> SerializeIndexToCommit(const CheckpointIndex& index,
                                           std::optional<std::string> table_name,
                                           uint64_t limit) {
  std::shared_ptr<const EncodedChunkTable> table;
  std::string name = table_name.value_or("");
  if (table_name) table = std::make_shared<const EncodedChunkTable>(EncodeChunkTable(index, name));
  return SerializeIndexWithTable(index, std::move(table), std::move(name), limit);
}

Result<CommitIndex> SerializeIndexWithTable(const CheckpointIndex& index,
                                            std::shared_ptr<const EncodedChunkTable> table,
                                            std::string table_name, uint64_t limit) {
  if (table && table->refs.size() != index.tensors.size()) {
    return InternalError("a chunk table of " + std::to_string(table->refs.size()) +
                         " tensors for an index of " + std::to_string(index.tensors.size()));
  }
  CommitIndex out;
  Text t;
  WriteIndex(index, table.get(), table_name, t);
  out.text = t.Take();
  if (table) out.table_name = std::move(table_name);
  out.table = std::move(table);
  if (out.text.size() <= limit) return out;
  return ResourceExhaustedError(
      "the index of checkpoint " + index.tag + " would be " + std::to_string(out.text.size()) +
      " bytes, over the " + std::to_string(limit) + "-byte limit a load reads (" +
      std::to_string(ChunkCount(index)) + " chunks in " + std::to_string(index.tensors.size()) +
      " tensors); nothing was committed: save fewer, larger shards per tensor" +
      (out.table ? "" : ", or write a chunk table (SaveOptions::chunk_table_min_chunks)"));
}

uint64_t ChunkCount(const CheckpointIndex& index) {
  uint64_t chunks = 0;
  for (const auto& [key, tensor] : index.tensors) chunks += tensor.chunks.size();
  return chunks;
}

void SerializeIndex(const CheckpointIndex& index,
                    const std::function<void(std::string_view)>& sink) {
  Text t(&sink);
  WriteIndex(index, nullptr, "", t);
  t.Flush();
}

std::string ChunkEntryName(std::string_view key, const Slice& slice, const Shape& shape) {
  if (!slice.flat && slice.box == Box::Whole(shape)) return std::string(key);
  std::string name(key);
  name += '[';
  for (size_t d = 0; d < slice.box.rank(); ++d) {
    if (d) name += ',';
    name += Range(slice.box.offset[d], slice.box.offset[d] + slice.box.size[d]);
  }
  name += ']';
  if (slice.flat) name += ".flat[" + Range(slice.flat->begin, slice.flat->end) + "]";
  return name;
}

std::string BlobEntryName(std::string_view name, std::optional<int> rank) {
  std::string entry = "__blob__/" + std::string(name);
  if (rank) {
    char digits[16];
    std::snprintf(digits, sizeof(digits), "%05d", *rank);
    entry += "/rank-" + std::string(digits);
  }
  return entry;
}

}  // namespace shardsafe
