// Writing the index (docs/format.md §3) and naming data-file entries (§2).
// ParseIndex lives in index_parse.cc.
//
// The index is written with nlohmann::ordered_json so fields appear in the
// order of the format document, compact. Optional fields (a chunk's `flat`
// and `crc32c`) are omitted when absent, never written as null. Strings that
// are not valid UTF-8 (a caller bug: keys come from Python str or C++ code)
// are written with U+FFFD in place of the bad bytes rather than throwing.
#include "format/index.h"

#include <cstdio>

namespace shardsafe {
namespace {

using ordered_json = nlohmann::ordered_json;

ordered_json FileJson(const IndexFile& f) {
  return ordered_json{{"name", f.name}, {"bytes", f.bytes}, {"rank", f.rank}};
}

ordered_json ChunkJson(const IndexChunk& c) {
  ordered_json j;
  j["offset"] = c.slice.box.offset;
  j["size"] = c.slice.box.size;
  if (c.slice.flat) j["flat"] = {c.slice.flat->begin, c.slice.flat->end};
  j["file"] = c.file;
  j["at"] = c.at;
  j["bytes"] = c.bytes;
  if (c.crc32c) j["crc32c"] = *c.crc32c;
  return j;
}

ordered_json TensorJson(const IndexTensor& t) {
  ordered_json chunks = ordered_json::array();
  for (const IndexChunk& c : t.chunks) chunks.push_back(ChunkJson(c));
  return ordered_json{{"dtype", DTypeName(t.dtype)}, {"shape", t.shape}, {"chunks", chunks}};
}

ordered_json BlobJson(const IndexBlob& b) {
  ordered_json chunks = ordered_json::array();
  for (const IndexBlobChunk& c : b.chunks) {
    ordered_json j{{"rank", c.rank}, {"file", c.file}, {"at", c.at}, {"bytes", c.bytes}};
    if (c.crc32c) j["crc32c"] = *c.crc32c;
    chunks.push_back(std::move(j));
  }
  return ordered_json{{"per_rank", b.per_rank}, {"chunks", chunks}};
}

std::string Range(uint64_t begin, uint64_t end) {
  return std::to_string(begin) + ":" + std::to_string(end);
}

std::string Dump(const ordered_json& j) {
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

// A JSON object from (key, value) pairs that are already unique and in
// order. Built as text: ordered_json looks keys up linearly, which would
// make an index of N tensors cost O(N^2) to build.
template <typename Map, typename ToJson>
std::string ObjectText(const Map& map, ToJson to_json) {
  std::string out = "{";
  for (const auto& [key, value] : map) {
    if (out.size() > 1) out += ',';
    out += Dump(ordered_json(key));
    out += ':';
    out += Dump(to_json(value));
  }
  return out + "}";
}

}  // namespace

std::string SerializeIndex(const CheckpointIndex& index) {
  ordered_json files = ordered_json::array();
  for (const IndexFile& f : index.files) files.push_back(FileJson(f));
  std::string out = "{";
  auto field = [&out](const char* name, const std::string& text) {
    if (out.size() > 1) out += ',';
    out += '"';
    out += name;
    out += "\":";
    out += text;
  };
  field("format", "\"shardsafe\"");
  field("version", std::to_string(index.version));
  field("tag", Dump(ordered_json(index.tag)));
  field("created_unix", std::to_string(index.created_unix));
  field("world_size", std::to_string(index.world_size));
  field("layout", Dump(ordered_json(index.layout)));
  field("metadata", Dump(ordered_json(index.metadata)));
  field("files", Dump(files));
  field("tensors", ObjectText(index.tensors, TensorJson));
  field("values", Dump(ordered_json(index.values)));
  field("blobs", ObjectText(index.blobs, BlobJson));
  return out + "}";
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
