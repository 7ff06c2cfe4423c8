// Index tests: a round trip, then one test per rule of docs/format.md §3
// "Validation on read", each asserting the code and where the error points;
// then the data-file entry names of §2.
#include "format/index.h"

#include <sys/mman.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

namespace shardsafe {
namespace {

using json = nlohmann::json;
using ordered_json = nlohmann::ordered_json;
using ::nlohmann::literals::operator""_json_pointer;

constexpr std::string_view kSource = "/ckpt/shardsafe.json";

// A valid index that each test damages in one place, its fields in the
// writer's order (as ValidInWriterOrder keeps them; Valid's text has every
// object's keys sorted).
constexpr const char* kValid = R"({
    "format": "shardsafe", "version": 1, "tag": "step-00000100",
    "created_unix": 1795305600, "world_size": 2, "layout": {"tp": 2},
    "metadata": {"run": "x"},
    "files": [{"name": "data-00000-000.safetensors", "bytes": 6000, "rank": 0},
              {"name": "data-00001-000.safetensors", "bytes": 100, "rank": 1}],
    "tensors": {"layers.0.w": {"dtype": "BF16", "shape": [4, 8], "chunks": [
        {"offset": [0, 0], "size": [2, 8], "file": 0, "at": 8, "bytes": 32, "crc32c": 7},
        {"offset": [2, 0], "size": [2, 8], "flat": [0, 16], "file": 1, "at": 8, "bytes": 32}]}},
    "values": {"step": 100, "config": {"lr": 0.0003}},
    "blobs": {
      "rng": {"per_rank": true, "chunks": [
        {"rank": 0, "file": 0, "at": 40, "bytes": 10, "crc32c": 1},
        {"rank": 1, "file": 1, "at": 40, "bytes": 10}]},
      "sampler": {"per_rank": false, "chunks": [{"rank": 0, "file": 0, "at": 50, "bytes": 5}]}}
  })";

json Valid() { return json::parse(kValid); }
ordered_json ValidInWriterOrder() { return ordered_json::parse(kValid); }

Result<CheckpointIndex> ParseJson(const json& j) { return ParseIndex(j.dump(), kSource); }

// Expects `result` to fail with `code` and a message containing `substring`
// after the source prefix.
#define EXPECT_INDEX_ERROR(result, code_, substring)                              \
  do {                                                                            \
    auto r_ = (result);                                                           \
    ASSERT_FALSE(r_.ok());                                                        \
    EXPECT_EQ(r_.status().code(), code_) << r_.status().ToString();               \
    EXPECT_EQ(r_.status().message().rfind(std::string(kSource) + ": ", 0), 0u)    \
        << r_.status().message();                                                 \
    EXPECT_NE(r_.status().message().find(substring), std::string::npos)           \
        << r_.status().message();                                                 \
  } while (0)

#define EXPECT_DATA_LOSS(result, substring) \
  EXPECT_INDEX_ERROR(result, StatusCode::kDataLoss, substring)

// Valid() with the value at `pointer` replaced by `value`.
json With(const char* pointer, json value) {
  json j = Valid();
  j[json::json_pointer(pointer)] = std::move(value);
  return j;
}

json Without(const char* parent, const char* field) {
  json j = Valid();
  j[json::json_pointer(parent)].erase(field);
  return j;
}

// Valid()'s compact text with `from` replaced by `to` (for what a DOM
// cannot express, like duplicate keys).
std::string Edited(const std::string& from, const std::string& to) {
  std::string text = Valid().dump();
  const size_t at = text.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  return text.replace(at, from.size(), to);
}

// --- Round trip ---------------------------------------------------------------

TEST(IndexTest, ParsesValidIndex) {
  auto r = ParseJson(Valid());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->world_size, 2);
  EXPECT_EQ(r->files[1].rank, 1);
  const IndexTensor& t = r->tensors.at("layers.0.w");
  EXPECT_EQ(t.dtype, DType::kBF16);
  ASSERT_EQ(t.chunks.size(), 2u);
  EXPECT_EQ(t.chunks[0].crc32c, std::optional<uint32_t>(7));
  EXPECT_FALSE(t.chunks[1].crc32c.has_value());
  EXPECT_EQ(t.chunks[1].slice.flat, (FlatRange{0, 16}));
  EXPECT_EQ(json::parse(r->values)["config"]["lr"], 0.0003);
  EXPECT_TRUE(r->blobs.at("rng").per_rank);
  EXPECT_EQ(r->blobs.at("sampler").chunks[0].at, 50u);
}

TEST(IndexTest, RoundTripsThroughText) {
  CheckpointIndex index;
  index.tag = "step-00000007";
  index.created_unix = 1795305600;
  index.world_size = 3;
  index.metadata = json{{"n", 1}, {"run", "llama"}}.dump();
  index.files = {{"data-00000-000.safetensors", 1 << 20, 0}, {"data-00002-000.safetensors", 64, 2}};
  IndexTensor& t = index.tensors["w\"\xc3\xa9"];
  t.dtype = DType::kF4;
  t.shape = {4, 6};
  t.chunks.push_back({Slice{Box{{0, 0}, {4, 6}}, FlatRange{4, 10}}, 0, 8, 3, 0xFFFFFFFFu});
  t.chunks.push_back({Slice{Box::Whole({4, 6}), std::nullopt}, 1, 8, 12, std::nullopt});
  index.tensors["scalar"] = IndexTensor{DType::kF64, {}, {{Slice{}, 0, 100, 8, 5}}};
  index.values = json{{"step", 7}, {"nested", {{"a", json::array({1, "b", nullptr})}}}}.dump();
  index.blobs["rng"] = IndexBlob{true, {{0, 0, 200, 4, 9}, {2, 1, 20, 4, std::nullopt}}};

  const std::string text = SerializeIndex(index);
  auto back = ParseIndex(text, kSource);
  ASSERT_TRUE(back.ok()) << back.status().ToString() << "\n" << text;
  EXPECT_EQ(SerializeIndex(*back), text);
  EXPECT_EQ(back->tag, index.tag);
  EXPECT_EQ(back->layout, "null");
  EXPECT_EQ(back->metadata, index.metadata);
  EXPECT_EQ(back->values, index.values);
  const IndexTensor& t2 = back->tensors.at("w\"\xc3\xa9");
  ASSERT_EQ(t2.chunks.size(), 2u);
  EXPECT_EQ(t2.chunks[0].slice, t.chunks[0].slice);
  EXPECT_EQ(t2.chunks[0].crc32c, t.chunks[0].crc32c);
  EXPECT_EQ(t2.chunks[1].crc32c, std::nullopt);
  EXPECT_EQ(back->tensors.at("scalar").chunks[0].slice, Slice{});
  EXPECT_EQ(back->blobs.at("rng").chunks[1].rank, 2);
}

// A save never commits an index a load would refuse (kMaxIndexBytes).
TEST(IndexTest, AnIndexOverTheLimitIsNotSerializedToCommit) {
  CheckpointIndex index;
  index.tag = "step-00000009";
  index.world_size = 1;
  index.files = {{"data-00000-000.safetensors", 4096, 0}};
  IndexTensor& t = index.tensors["w"];
  t.shape = {100};
  for (uint64_t i = 0; i < 100; ++i) {
    t.chunks.push_back({Slice{Box{{i}, {1}}, std::nullopt}, 0, 8 + 4 * i, 4, 1});
  }
  const std::string text = SerializeIndex(index);
  auto fits = SerializeIndexToCommit(index, nullptr, text.size());
  ASSERT_TRUE(fits.ok());
  EXPECT_EQ(fits->text, text);
  auto over = SerializeIndexToCommit(index, nullptr, text.size() - 1);
  EXPECT_EQ(over.status().code(), StatusCode::kResourceExhausted);
  EXPECT_THAT(over.status().message(),
              ::testing::AllOf(::testing::HasSubstr("step-00000009"),
                               ::testing::HasSubstr(std::to_string(text.size()) + " bytes"),
                               ::testing::HasSubstr("100 chunks in 1 tensors"),
                               ::testing::HasSubstr("nothing was committed")));
}

TEST(IndexTest, SerializesInDocumentOrderAndOmitsAbsentOptionals) {
  CheckpointIndex index;
  index.files = {{"f", 100, 0}};
  index.tensors["t"] = IndexTensor{DType::kU8, {4}, {{Slice{Box::Whole({4}), {}}, 0, 8, 4, {}}}};
  EXPECT_EQ(SerializeIndex(index),
            R"({"format":"shardsafe","version":1,"tag":"","created_unix":0,"world_size":1,)"
            R"("layout":null,"metadata":null,"files":[{"name":"f","bytes":100,"rank":0}],)"
            R"("tensors":{"t":{"dtype":"U8","shape":[4],"chunks":[{"offset":[0],"size":[4],)"
            R"("file":0,"at":8,"bytes":4}]}},"values":{},"blobs":{}})");
}

// layout, metadata and values are kept as compact JSON text in the writer's
// canonical form (nlohmann's dump: keys sorted), whatever their spelling.
TEST(IndexTest, KeepsUserJsonAsCanonicalText) {
  auto r = ParseIndex(Edited("\"values\":{\"config\":{\"lr\":0.0003},\"step\":100}",
                             "\"values\": {\"z\": [1.50, -0, 1e2], \"a\": \"\\u00e9\"}"),
                      kSource);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->values, "{\"a\":\"\xc3\xa9\",\"z\":[1.5,0,100.0]}");
  EXPECT_EQ(r->layout, "{\"tp\":2}");
}

TEST(IndexTest, IgnoresUnknownFields) {
  json j = With("/future", {1, 2});
  j["/tensors/layers.0.w/chunks/0/note"_json_pointer] = "x";
  EXPECT_TRUE(ParseJson(j).ok());
}

// --- Field order ---------------------------------------------------------------

// JSON fields may come in any order. The writer's order lets the reader
// check each chunk as it streams by; in another, what cannot be checked yet
// is held, and the verdict is the same. (Valid()'s text has every object's
// keys sorted: blobs and tensors before files and world_size, a tensor's
// chunks before its dtype and shape, a blob's before its per_rank.)
TEST(IndexTest, VerdictsDoNotDependOnFieldOrder) {
  struct Damage {
    const char* pointer;
    json value;  // null: the field removed
  };
  const std::vector<std::vector<Damage>> cases = {
      {},
      {{"/tensors/layers.0.w/chunks/0/at", -8}},
      {{"/tensors/layers.0.w/dtype", "bf16"}},
      {{"/tensors/layers.0.w/chunks/1/offset", {0}}},
      {{"/tensors/layers.0.w/chunks/1", 5}},
      {{"/tensors/layers.0.w/shape", nullptr}},
      {{"/files/1/rank", 2}},
      {{"/files/0/bytes", 10}},
      {{"/files", nullptr}},
      {{"/world_size", 0}},
      {{"/world_size", nullptr}},
      {{"/blobs/rng/chunks/1/rank", 0}},
      {{"/blobs/sampler/per_rank", 1}},
      {{"/blobs/rng/chunks/0/at", 39}},  // overlaps the tensor's chunk 0
      {{"/tag", 5}, {"/tensors/layers.0.w/chunks/0/at", -8}},  // the tag comes first
      {{"/version", 3}, {"/tensors", json::array()}},          // a newer version first
  };
  for (const auto& damages : cases) {
    json sorted = Valid();
    ordered_json written = ValidInWriterOrder();
    for (const Damage& d : damages) {
      const json::json_pointer at(d.pointer);
      if (d.value.is_null()) {
        sorted[at.parent_pointer()].erase(at.back());
        written[ordered_json::json_pointer(d.pointer).parent_pointer()].erase(at.back());
      } else {
        sorted[at] = d.value;
        written[ordered_json::json_pointer(d.pointer)] = ordered_json::parse(d.value.dump());
      }
    }
    SCOPED_TRACE(written.dump());
    auto a = ParseIndex(sorted.dump(), kSource);
    auto b = ParseIndex(written.dump(), kSource);
    EXPECT_EQ(a.ok(), damages.empty()) << a.status().ToString();
    EXPECT_EQ(a.status().ToString(), b.status().ToString());
    if (a.ok() && b.ok()) {
      EXPECT_EQ(SerializeIndex(*a), SerializeIndex(*b));
    }
  }
}

// Tiling is the engine's job: chunks whose boxes overlap pass here.
TEST(IndexTest, DoesNotCheckTiling) {
  EXPECT_TRUE(ParseJson(With("/tensors/layers.0.w/chunks/1/offset", {0, 0})).ok());
}

// --- Text and JSON ---------------------------------------------------------

TEST(IndexTest, RejectsIndexOverSizeLimit) {
  const size_t size = kMaxIndexBytes + 1;  // mapped, never touched
  void* p = mmap(nullptr, size, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  ASSERT_NE(p, MAP_FAILED);
  EXPECT_DATA_LOSS(ParseIndex(std::string_view(static_cast<const char*>(p), size), kSource),
                   "over the 1073741824-byte limit");
  munmap(p, size);
}

TEST(IndexTest, RejectsInvalidUtf8) {
  EXPECT_DATA_LOSS(ParseIndex(Edited("\"step-00000100\"", "\"step-\xff\""), kSource),
                   "invalid JSON");
}

TEST(IndexTest, RejectsInvalidJson) {
  EXPECT_DATA_LOSS(ParseIndex("{\"format\":", kSource), "invalid JSON");
}

TEST(IndexTest, RejectsTrailingGarbage) {
  EXPECT_DATA_LOSS(ParseIndex(Valid().dump() + "x", kSource), "invalid JSON");
}

TEST(IndexTest, RejectsNulByte) {
  EXPECT_DATA_LOSS(ParseIndex(Valid().dump() + std::string("\0garbage", 8), kSource), "NUL byte");
}

TEST(IndexTest, RejectsByteOrderMark) {
  EXPECT_DATA_LOSS(ParseIndex("\xEF\xBB\xBF" + Valid().dump(), kSource), "byte order mark");
}

TEST(IndexTest, RejectsNonObject) {
  EXPECT_DATA_LOSS(ParseIndex("[]", kSource), "expected a JSON object");
}

TEST(IndexTest, RejectsDeepNesting) {
  EXPECT_DATA_LOSS(ParseIndex(Edited("\"values\":{", "\"values\":{\"deep\":" +
                                                        std::string(300, '[') +
                                                        std::string(300, ']') + ","),
                              kSource),
                   "nested deeper than 256");
}

// 256 levels (the top-level object, "values", then 254 arrays) parse; 257 do not.
TEST(IndexTest, NestingLimitIsExactly256Levels) {
  auto nested = [](int arrays) {
    return Edited("\"values\":{", "\"values\":{\"deep\":" + std::string(arrays, '[') +
                                      std::string(arrays, ']') + ",");
  };
  ASSERT_TRUE(ParseIndex(nested(254), kSource).ok());
  EXPECT_DATA_LOSS(ParseIndex(nested(255), kSource), "nested deeper than 256");
}

TEST(IndexTest, RejectsMissingField) {
  for (const char* field : {"format", "version", "tag", "created_unix", "world_size", "layout",
                            "metadata", "files", "tensors", "values", "blobs"}) {
    EXPECT_DATA_LOSS(ParseJson(Without("", field)),
                     "missing field \"" + std::string(field) + "\"");
  }
}

TEST(IndexTest, RejectsMissingChunkField) {
  EXPECT_DATA_LOSS(ParseJson(Without("/tensors/layers.0.w/chunks/0", "at")),
                   "tensor \"layers.0.w\": chunk 0: missing field \"at\"");
}

TEST(IndexTest, RejectsMistypedField) {
  EXPECT_DATA_LOSS(ParseJson(With("/tag", 5)), "field \"tag\": expected a string, got 5");
  EXPECT_DATA_LOSS(ParseJson(With("/files", json::object())), "field \"files\": expected a JSON array");
  EXPECT_DATA_LOSS(ParseJson(With("/values", json::array())), "field \"values\": expected a JSON object");
  EXPECT_DATA_LOSS(ParseJson(With("/blobs/rng/per_rank", 1)), "field \"per_rank\": expected a JSON boolean");
}

TEST(IndexTest, RejectsNegativeInteger) {
  EXPECT_DATA_LOSS(ParseJson(With("/tensors/layers.0.w/chunks/0/at", -8)),
                   "tensor \"layers.0.w\": chunk 0: field \"at\": expected an integer in [0, 2^64), got -8");
}

TEST(IndexTest, RejectsFractionalInteger) {
  EXPECT_DATA_LOSS(ParseJson(With("/files/0/bytes", 6000.5)), "file 0: field \"bytes\": expected an integer");
  EXPECT_DATA_LOSS(ParseJson(With("/tensors/layers.0.w/shape/0", 4.0)),
                   "field \"shape\"[0]: expected an integer");
}

TEST(IndexTest, RejectsIntegerAbove64Bits) {
  EXPECT_DATA_LOSS(ParseIndex(Edited("\"created_unix\":1795305600", "\"created_unix\":18446744073709551616"),
                              kSource),
                   "field \"created_unix\": expected an integer in [0, 2^64), got 18446744073709551616");
}

TEST(IndexTest, ReadsMinusZeroAsZero) {
  auto r = ParseIndex(Edited("\"created_unix\":1795305600", "\"created_unix\":-0"), kSource);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->created_unix, 0);
}

// A double's range is JSON's in practice: beyond it, even in user JSON.
TEST(IndexTest, RejectsNumberBeyondADouble) {
  EXPECT_DATA_LOSS(ParseIndex(Edited("\"step\":100", "\"step\":1e400"), kSource),
                   "invalid JSON: number overflow parsing '1e400'");
}

// The parser's message names the byte, and shows a bounded part of what it
// read (a torn index can end inside a string of any length).
TEST(IndexTest, InvalidJsonMessageNamesTheByteAndStaysShort) {
  const std::string text = Edited("\"step-00000100\"", "\"" + std::string(1 << 20, 'x') + "\xff\"");
  auto r = ParseIndex(text, kSource);
  EXPECT_DATA_LOSS(r, "invalid JSON: syntax error while parsing value - invalid string: "
                      "ill-formed UTF-8 byte; last read: '\"xxxx");
  EXPECT_DATA_LOSS(r, "(byte " + std::to_string(text.find('\xff') + 1) + ")");
  EXPECT_LT(r.status().message().size(), 300u);
}

TEST(IndexTest, RejectsCreatedUnixAboveInt64) {
  EXPECT_DATA_LOSS(ParseJson(With("/created_unix", uint64_t{1} << 63)), "out of range");
}

TEST(IndexTest, RejectsUnknownFormat) {
  EXPECT_DATA_LOSS(ParseJson(With("/format", "safetensors")), "\"safetensors\" is not \"shardsafe\"");
}

TEST(IndexTest, RejectsNewerVersionAsFailedPrecondition) {
  EXPECT_INDEX_ERROR(ParseJson(With("/version", 5)), StatusCode::kFailedPrecondition,
                     "format version 5 is newer");
}

TEST(IndexTest, RejectsVersionZero) {
  EXPECT_DATA_LOSS(ParseJson(With("/version", 0)), "unsupported version 0");
}

TEST(IndexTest, RejectsZeroWorldSize) {
  EXPECT_DATA_LOSS(ParseJson(With("/world_size", 0)), "world_size");
}

TEST(IndexTest, RejectsUnknownDtype) {
  EXPECT_DATA_LOSS(ParseJson(With("/tensors/layers.0.w/dtype", "bf16")),
                   "tensor \"layers.0.w\": field \"dtype\": unknown dtype \"bf16\"");
}

TEST(IndexTest, RejectsShapeWhoseElementCountOverflows) {
  EXPECT_DATA_LOSS(ParseJson(With("/tensors/layers.0.w/shape", {uint64_t{1} << 32, uint64_t{1} << 32})),
                   "field \"shape\": element count");
}

TEST(IndexTest, RejectsFileNamesThatAreNotPlain) {
  for (std::string bad : std::vector<std::string>{"../x", "a/b", "a\\b", std::string("a\0b", 3),
                                                  ".", "..", ""}) {
    SCOPED_TRACE(bad);
    EXPECT_DATA_LOSS(ParseJson(With("/files/0/name", bad)), "is not a plain file name");
  }
}

TEST(IndexTest, RejectsDuplicateFileName) {
  EXPECT_DATA_LOSS(ParseJson(With("/files/1/name", "data-00000-000.safetensors")),
                   "file 1: \"data-00000-000.safetensors\" listed twice");
}

TEST(IndexTest, RejectsFileRankOutOfRange) {
  EXPECT_DATA_LOSS(ParseJson(With("/files/1/rank", 2)), "file 1: field \"rank\": 2 is out of range");
}

TEST(IndexTest, RejectsChunkFileOutOfRange) {
  EXPECT_DATA_LOSS(ParseJson(With("/tensors/layers.0.w/chunks/1/file", 2)),
                   "tensor \"layers.0.w\": chunk 1: field \"file\": 2 is out of range");
}

TEST(IndexTest, RejectsChunkBoxOfWrongRank) {
  EXPECT_DATA_LOSS(ParseJson(With("/tensors/layers.0.w/chunks/0/offset", {0})),
                   "tensor \"layers.0.w\": chunk 0: box has 1 offsets and 2 sizes, but the "
                   "tensor has rank 2");
  json j = With("/tensors/layers.0.w/chunks/0/offset", {0, 0, 0});
  j["/tensors/layers.0.w/chunks/0/size"_json_pointer] = {2, 8, 1};
  EXPECT_DATA_LOSS(ParseJson(j), "box has 3 offsets and 3 sizes");
}

TEST(IndexTest, RejectsChunkOutsideShape) {
  EXPECT_DATA_LOSS(ParseJson(With("/tensors/layers.0.w/chunks/1/offset", {3, 0})),
                   "chunk 1: slice [3:5, 0:8].flat[0:16] exceeds shape [4, 8]");
}

TEST(IndexTest, RejectsBoxEndOverflow) {
  json j = With("/tensors/layers.0.w/chunks/1/offset", {~uint64_t{0}, 0});
  EXPECT_DATA_LOSS(ParseJson(j), "chunk 1: slice");
}

TEST(IndexTest, RejectsInvertedFlatRange) {
  EXPECT_DATA_LOSS(ParseJson(With("/tensors/layers.0.w/chunks/1/flat", {16, 0})),
                   "chunk 1: flat range of slice");
}

TEST(IndexTest, RejectsFlatRangeBeyondBox) {
  EXPECT_DATA_LOSS(ParseJson(With("/tensors/layers.0.w/chunks/1/flat", {0, 17})),
                   "exceeds the box's 16 elements");
}

TEST(IndexTest, RejectsFlatWithWrongArity) {
  EXPECT_DATA_LOSS(ParseJson(With("/tensors/layers.0.w/chunks/1/flat", {0, 8, 16})),
                   "field \"flat\": expected [begin, end]");
}

TEST(IndexTest, RejectsSubByteChunkOffByteBoundary) {
  json j = Valid();
  j["/tensors/layers.0.w/dtype"_json_pointer] = "F4";
  j["/tensors/layers.0.w/chunks/0/bytes"_json_pointer] = 8;
  j["/tensors/layers.0.w/chunks/1/bytes"_json_pointer] = 8;
  ASSERT_TRUE(ParseJson(j).ok());
  j["/tensors/layers.0.w/chunks/1/flat"_json_pointer] = {1, 16};
  EXPECT_DATA_LOSS(ParseJson(j), "chunk 1: slice [2:4, 0:8].flat[1:16] cuts F4 elements");
}

TEST(IndexTest, RejectsBytesNotMatchingElementCount) {
  EXPECT_DATA_LOSS(ParseJson(With("/tensors/layers.0.w/chunks/0/bytes", 31)),
                   "chunk 0: field \"bytes\": 31 bytes recorded, but 16 BF16 elements take 32");
}

TEST(IndexTest, RejectsByteRangeOutsideFile) {
  json j = Valid();
  j["tensors"]["layers.0.w"] = json::parse(R"({"dtype": "U8", "shape": [4096], "chunks": [
      {"offset": [0], "size": [4096], "file": 0, "at": 4096, "bytes": 4096}]})");
  auto r = ParseJson(j);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kDataLoss);
  EXPECT_EQ(r.status().message(),
            "/ckpt/shardsafe.json: tensor \"layers.0.w\": chunk 0: byte range [4096, 8192) "
            "exceeds file data-00000-000.safetensors (6000 bytes)");
}

TEST(IndexTest, RejectsByteRangeOverflow) {
  json j = Valid();
  j["/files/0/bytes"_json_pointer] = ~uint64_t{0};
  j["/tensors/layers.0.w/chunks/0/at"_json_pointer] = ~uint64_t{0} - 8;
  EXPECT_DATA_LOSS(ParseJson(j), "chunk 0: byte range");
}

TEST(IndexTest, RejectsCrcAbove32Bits) {
  EXPECT_DATA_LOSS(ParseJson(With("/tensors/layers.0.w/chunks/0/crc32c", uint64_t{1} << 32)),
                   "field \"crc32c\": 4294967296 is out of range");
}

TEST(IndexTest, RejectsDuplicateTensorKey) {
  EXPECT_DATA_LOSS(ParseIndex(Edited("\"tensors\":{", "\"tensors\":{\"layers.0.w\":{},"), kSource),
                   "duplicate key \"layers.0.w\" in object /tensors");
}

// Objects of more than 16 keys are checked by sorting them, or not at all
// when they come strictly increasing: a repeat right after itself, or out
// of order, must still be found.
TEST(IndexTest, RejectsDuplicateKeyAmongManyTensors) {
  std::string many;
  for (int i = 0; i < 20; ++i) many += "\"a" + std::to_string(10 + i) + "\":{},";
  for (const char* repeat : {"a29", "a15"}) {
    const std::string keys = many + "\"" + repeat + "\":{},";
    EXPECT_DATA_LOSS(ParseIndex(Edited("\"tensors\":{", "\"tensors\":{" + keys), kSource),
                     "duplicate key \"" + std::string(repeat) + "\" in object /tensors");
  }
}

TEST(IndexTest, RejectsDuplicateValuesKey) {
  EXPECT_DATA_LOSS(ParseIndex(Edited("\"step\":100", "\"step\":100,\"step\":101"), kSource),
                   "duplicate key \"step\" in object /values");
}

TEST(IndexTest, RejectsDuplicateBlobName) {
  EXPECT_DATA_LOSS(ParseIndex(Edited("\"blobs\":{", "\"blobs\":{\"sampler\":1,"), kSource),
                   "duplicate key \"sampler\" in object /blobs");
}

TEST(IndexTest, RejectsDuplicateKeyInChunkNamingItsPath) {
  EXPECT_DATA_LOSS(ParseIndex(Edited("\"crc32c\":7", "\"crc32c\":7,\"at\":8"), kSource),
                   "duplicate key \"at\" in object /tensors/layers.0.w/chunks/0");
}

TEST(IndexTest, RejectsDuplicateKeyInUserJsonNamingItsPath) {
  EXPECT_DATA_LOSS(ParseIndex(Edited("\"lr\":0.0003", "\"lr\":0.0003,\"lr\":1"), kSource),
                   "duplicate key \"lr\" in object /values/config");
  EXPECT_DATA_LOSS(ParseIndex(Edited("\"step\":100", "\"l\":[0,{\"a\":1,\"a\":2}],\"step\":100"),
                              kSource),
                   "duplicate key \"a\" in object /values/l/1");
  EXPECT_DATA_LOSS(ParseIndex(Edited("\"layout\":{\"tp\":2}", "\"layout\":{\"tp\":2,\"tp\":2}"), kSource),
                   "duplicate key \"tp\" in object /layout");
}

// Unknown fields are skipped, but their keys are checked like any others.
TEST(IndexTest, RejectsDuplicateKeyInsideAnUnknownField) {
  EXPECT_DATA_LOSS(ParseIndex(Edited("\"tag\":", "\"future\":{\"a\":[{\"b\":1,\"b\":2}]},\"tag\":"),
                              kSource),
                   "duplicate key \"b\" in object /future/a/0");
  EXPECT_DATA_LOSS(ParseIndex(Edited("\"tag\":", "\"future\":1,\"future\":2,\"tag\":"), kSource),
                   "duplicate key \"future\" in the top-level object");
}

TEST(IndexTest, RejectsDuplicateTopLevelKey) {
  EXPECT_DATA_LOSS(ParseIndex(Edited("\"version\":1", "\"version\":1,\"version\":1"), kSource),
                   "duplicate key \"version\" in the top-level object");
}

TEST(IndexTest, RejectsGlobalBlobWithTwoChunks) {
  json j = Valid();
  j["blobs"]["sampler"]["chunks"].push_back({{"rank", 1}, {"file", 1}, {"at", 0}, {"bytes", 1}});
  EXPECT_DATA_LOSS(ParseJson(j), "blob \"sampler\": a global blob needs exactly one chunk, found 2");
}

TEST(IndexTest, RejectsPerRankBlobWithRepeatedRank) {
  EXPECT_DATA_LOSS(ParseJson(With("/blobs/rng/chunks/1/rank", 0)),
                   "blob \"rng\": chunk 1: rank 0 given twice");
}

TEST(IndexTest, RejectsBlobRankOutOfRange) {
  EXPECT_DATA_LOSS(ParseJson(With("/blobs/rng/chunks/1/rank", 5)),
                   "blob \"rng\": chunk 1: field \"rank\": 5 is out of range");
}

TEST(IndexTest, RejectsBlobByteRangeOutsideFile) {
  EXPECT_DATA_LOSS(ParseJson(With("/blobs/rng/chunks/1/at", 95)),
                   "blob \"rng\": chunk 1: byte range [95, 105) exceeds file "
                   "data-00001-000.safetensors (100 bytes)");
}

TEST(IndexTest, RejectsChunksSharingBytesOfAFile) {
  json j = Valid();
  j["/blobs/rng/chunks/0/at"_json_pointer] = 39;  // the tensor's chunk 0 is [8, 40)
  EXPECT_DATA_LOSS(ParseJson(j),
                   "blob \"rng\": chunk 0: byte range [39, 49) of file "
                   "data-00000-000.safetensors overlaps [8, 40) of tensor \"layers.0.w\" chunk 0");
  // Between two chunks of one tensor, too.
  j = Valid();
  j["/tensors/layers.0.w/chunks/1/file"_json_pointer] = 0;
  j["/tensors/layers.0.w/chunks/1/at"_json_pointer] = 20;
  EXPECT_DATA_LOSS(ParseJson(j), "tensor \"layers.0.w\": chunk 1: byte range [20, 52) of file "
                                 "data-00000-000.safetensors overlaps [8, 40) of tensor "
                                 "\"layers.0.w\" chunk 0");
}

TEST(IndexTest, AcceptsTouchingAndEmptyChunks) {
  json j = Valid();
  j["/blobs/rng/chunks/0/bytes"_json_pointer] = 0;
  j["/blobs/rng/chunks/0/at"_json_pointer] = 10;  // empty: holds no byte
  EXPECT_TRUE(ParseJson(j).ok());
}

// --- Entry names (docs/format.md §2) --------------------------------------------

TEST(EntryNameTest, WholeTensorUsesKey) {
  EXPECT_EQ(ChunkEntryName("w", Slice{Box::Whole({4, 8}), {}}, {4, 8}), "w");
  EXPECT_EQ(ChunkEntryName("s", Slice{}, {}), "s");
}

TEST(EntryNameTest, BoxShard) {
  EXPECT_EQ(ChunkEntryName("layers.0.w", Slice{Box{{512, 0}, {512, 4096}}, {}}, {1024, 4096}),
            "layers.0.w[512:1024,0:4096]");
}

TEST(EntryNameTest, FlatShard) {
  EXPECT_EQ(ChunkEntryName("w", Slice{Box::Whole({4, 8}), FlatRange{8, 24}}, {4, 8}),
            "w[0:4,0:8].flat[8:24]");
}

TEST(EntryNameTest, Blob) {
  EXPECT_EQ(BlobEntryName("rng", std::nullopt), "__blob__/rng");
  EXPECT_EQ(BlobEntryName("rng", 3), "__blob__/rng/rank-00003");
  EXPECT_EQ(BlobEntryName("rng", 123456), "__blob__/rng/rank-123456");
}

}  // namespace
}  // namespace shardsafe
