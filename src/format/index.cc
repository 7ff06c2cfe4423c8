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
#include "format/index_objects.h"
#include "format/index_packed.h"
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

// A tensor of an index written as `version`: its chunks (version 1) or
// its table ref (version 4: naming its part).
void TensorText(const IndexTensor& tensor, int version, Text& t) {
  t.Raw("{").Field("dtype").Str(DTypeName(tensor.dtype)).Field("shape").Nums(tensor.shape);
  if (const std::optional<IndexTableRef>& ref = tensor.table; ref && version > 1) {
    std::vector<uint64_t> n = {ref->count, ref->directory_at, ref->records_at,
                               ref->directory_crc32c};
    if (version == 4) n.insert(n.begin(), ref->part);
    t.Field("table").Nums(n).Raw("}");
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

// The version `index` is written as (CheckpointIndex::version).
int VersionOf(const CheckpointIndex& index) {
  if (index.chunk_tables.empty()) return 1;
  if (index.chunk_tables[0].file) return 4;
  return index.checksum_files.empty() ? 2 : 3;
}

// `inline_chunks`: every tensor's chunks in the index, none in a table.
// `tensors(version, t)` writes the "tensors" object.
template <typename Tensors>
void WriteIndex(const CheckpointIndex& index, bool inline_chunks, Text& t, Tensors tensors) {
  const int version = inline_chunks ? 1 : VersionOf(index);
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
  if (version == 2 || version == 3) {
    const IndexChunkTable& table = index.chunk_tables[0];
    t.Field("chunk_table").Str(table.name).Field("chunk_table_bytes").Num(table.bytes);
  }
  if (version >= 3) {
    t.Field("checksum_files").Nums({index.checksum_files.begin(), index.checksum_files.end()});
  }
  if (version == 4) {
    std::vector<uint64_t> parts;
    for (const IndexChunkTable& p : index.chunk_tables) parts.push_back(*p.file);
    t.Field("chunk_tables").Nums(parts);
  }
  t.Field("tensors");
  tensors(version, t);
  t.Field("values").Raw(index.values);
  t.Field("blobs");
  ObjectText(index.blobs, BlobText, t);
  t.Raw("}");
}

void WriteIndex(const CheckpointIndex& index, bool inline_chunks, Text& t) {
  WriteIndex(index, inline_chunks, t, [&](int version, Text& out) {
    ObjectText(index.tensors, [&](const IndexTensor& tensor, Text& o) {
      TensorText(tensor, version, o);
    }, out);
  });
}

}  // namespace

std::string SerializeIndex(const CheckpointIndex& index) {
  Text t;
  WriteIndex(index, false, t);
  return t.Take();
}

Result<CommitIndex> SerializeIndexToCommit(const CheckpointIndex& index,
                                           std::shared_ptr<const EncodedChunkTable> table,
                                           uint64_t limit) {
  CommitIndex out;
  Text t;
  WriteIndex(index, false, t);
  out.text = t.Take();
  out.table = std::move(table);
  if (out.text.size() <= limit) return out;
  return ResourceExhaustedError(
      "the index of checkpoint " + index.tag + " would be " + std::to_string(out.text.size()) +
      " bytes, over the " + std::to_string(limit) + "-byte limit a load reads (" +
      std::to_string(ChunkCount(index)) + " chunks in " + std::to_string(index.tensors.size()) +
      " tensors); nothing was committed: save fewer, larger shards per tensor" +
      (out.table ? "" : ", or write a chunk table (SaveOptions::chunk_table_min_chunks)"));
}

bool IsDataFile(const CheckpointIndex& index, uint32_t file) {
  return !internal::IsChecksumFile(index, file) && !internal::IsChunkTableFile(index, file);
}

uint64_t ChunkCount(const CheckpointIndex& index) {
  uint64_t chunks = 0;
  for (const auto& [key, tensor] : index.tensors) {
    chunks += tensor.table ? tensor.table->count : tensor.chunks.size();
  }
  return chunks;
}

void SerializeIndex(const CheckpointIndex& index,
                    const std::function<void(std::string_view)>& sink) {
  Text t(&sink);
  WriteIndex(index, true, t);
  t.Flush();
}

void SerializeIndex(const CheckpointIndex& index, const PackedTensors& tensors,
                    const std::function<void(std::string_view)>& sink) {
  Text t(&sink);
  WriteIndex(index, true, t, [&](int version, Text& out) {
    out.Raw("{");
    for (size_t i = 0; i < tensors.size(); ++i) {
      if (i) out.Raw(",");
      out.Str(tensors.key(i)).Raw(":");
      TensorText(tensors.Tensor(i), version, out);  // one tensor's chunks built at a time
    }
    out.Raw("}");
  });
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
