// PackedTensors, and ParseIndex into it: the same index, the same checks
// and the same errors as ParseIndex into IndexTensors, whole or a piece at
// a time.
#include "format/index_packed.h"

#include <cctype>
#include <random>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "format/index.h"

namespace shardsafe {
namespace {

using ordered_json = nlohmann::ordered_json;

IndexChunk Chunk(Box box, std::optional<FlatRange> flat, uint32_t file, uint64_t at,
                 uint64_t bytes, std::optional<uint32_t> crc) {
  return IndexChunk{Slice{std::move(box), flat}, file, at, bytes, crc};
}

IndexTensors Sample() {
  IndexTensors t;
  t["b.whole"] = IndexTensor{DType::kF32, {4, 2}, {Chunk(Box::Whole({4, 2}), {}, 1, 8, 32, 7)}};
  t["a.rows"] = IndexTensor{
      DType::kBF16,
      {4, 8},
      {Chunk(Box{{0, 0}, {2, 8}}, {}, 0, 8, 32, 1),
       Chunk(Box{{2, 0}, {2, 8}}, FlatRange{0, 16}, 0, 40, 32, std::nullopt)}};
  t["c.flat"] = IndexTensor{DType::kU8, {16}, {Chunk(Box::Whole({16}), FlatRange{0, 16}, 2, 0, 16,
                                                     0)}};
  t["d.scalar"] = IndexTensor{DType::kI64, {}, {Chunk(Box::Whole({}), {}, 0, 72, 8, 3)}};
  t["e.pending"] = IndexTensor{DType::kF16, {2}, {}, IndexTableRef{1, 4, 8, 72, 99}};
  return t;
}

TEST(PackedTensorsTest, HoldsWhatItIsGivenInKeyOrder) {
  const IndexTensors sample = Sample();
  PackedTensors packed;
  for (auto it = sample.rbegin(); it != sample.rend(); ++it) packed.Add(it->first, it->second);
  packed.Seal();
  ASSERT_EQ(packed.size(), sample.size());
  size_t t = 0;
  for (const auto& [key, tensor] : sample) {
    EXPECT_EQ(packed.key(t), key);
    EXPECT_EQ(packed.Find(key), t);
    const IndexTensor got = packed.Tensor(t);
    EXPECT_EQ(got.dtype, tensor.dtype) << key;
    EXPECT_EQ(got.shape, tensor.shape) << key;
    EXPECT_EQ(got.table.has_value(), tensor.table.has_value()) << key;
    ASSERT_EQ(got.chunks.size(), tensor.chunks.size()) << key;
    for (size_t i = 0; i < got.chunks.size(); ++i) {
      const IndexChunk& a = got.chunks[i];
      const IndexChunk& b = tensor.chunks[i];
      EXPECT_EQ(a.slice, b.slice) << key << " " << i;
      EXPECT_EQ(a.file, b.file);
      EXPECT_EQ(a.at, b.at);
      EXPECT_EQ(a.bytes, b.bytes);
      EXPECT_EQ(a.crc32c, b.crc32c);
    }
    ++t;
  }
  EXPECT_FALSE(packed.Find("a"));
  EXPECT_FALSE(packed.Find("zz"));
  EXPECT_FALSE(packed.has_chunks(*packed.Find("e.pending")));
  EXPECT_EQ(packed.table(*packed.Find("e.pending"))->directory_crc32c, 99u);
}

TEST(PackedTensorsTest, ChunksAndChecksumsSetLater) {
  PackedTensors packed = PackedTensors::From(Sample());
  const size_t t = *packed.Find("e.pending");
  packed.SetChunks(t, std::vector<IndexChunk>{Chunk(Box::Whole({2}), {}, 0, 80, 4, {})});
  ASSERT_TRUE(packed.has_chunks(t));
  ASSERT_EQ(packed.chunk_count(t), 1u);
  const uint64_t c = packed.first_chunk(t);
  EXPECT_FALSE(packed.crc32c(c));
  packed.SetCrc(c, 5);
  EXPECT_EQ(packed.crc32c(c), 5u);
  EXPECT_EQ(packed.Unpack().at("e.pending").chunks[0].crc32c, 5u);
}

// A version-1 index of several tensors, in the writer's order.
ordered_json Index() {
  return ordered_json::parse(R"({
    "format": "shardsafe", "version": 1, "tag": "t", "created_unix": 1, "world_size": 2,
    "layout": null, "metadata": null,
    "files": [{"name": "a", "bytes": 200, "rank": 0}, {"name": "b", "bytes": 100, "rank": 1}],
    "tensors": {
      "m.0": {"dtype": "BF16", "shape": [4, 8], "chunks": [
        {"offset": [0, 0], "size": [2, 8], "file": 0, "at": 8, "bytes": 32, "crc32c": 7},
        {"offset": [2, 0], "size": [2, 8], "flat": [0, 16], "file": 1, "at": 8, "bytes": 32}]},
      "m.1": {"dtype": "F32", "shape": [2], "chunks": [
        {"offset": [0], "size": [2], "file": 0, "at": 40, "bytes": 8, "crc32c": 1}]},
      "m.2": {"dtype": "U8", "shape": [], "chunks": [
        {"offset": [], "size": [], "file": 1, "at": 40, "bytes": 1}]}},
    "values": {}, "blobs": {"r": {"per_rank": false, "chunks": [
      {"rank": 0, "file": 0, "at": 48, "bytes": 4}]}}})");
}

// ParseIndex into IndexTensors, and into PackedTensors from the whole
// text and from pieces of `piece` bytes: each one's status, and the
// index it read written out (the packed one unpacked).
std::vector<std::string> ParseAllWays(const std::string& text, size_t piece) {
  std::vector<std::string> out;
  auto describe = [&](const Result<CheckpointIndex>& r) {
    return r.ok() ? SerializeIndex(*r) : r.status().ToString();
  };
  out.push_back(describe(ParseIndex(text, "src")));
  auto packed = [&](Result<CheckpointIndex> r, const PackedTensors& tensors) {
    if (r.ok()) r->tensors = tensors.Unpack();
    return describe(r);
  };
  PackedTensors whole;
  out.push_back(packed(ParseIndex(text, "src", &whole), whole));
  size_t at = 0;
  const IndexTextReader next = [&]() -> Result<std::string_view> {
    const std::string_view p = std::string_view(text).substr(at, piece);
    at += p.size();
    return p;
  };
  PackedTensors pieces;
  out.push_back(packed(ParseIndex(next, "src", &pieces), pieces));
  return out;
}

// Returns the classic parse's verdict.
std::string ExpectParsedAlike(const std::string& text, size_t piece = 7) {
  const std::vector<std::string> ways = ParseAllWays(text, piece);
  EXPECT_EQ(ways[1], ways[0]) << "packed, whole text: " << text;
  EXPECT_EQ(ways[2], ways[0]) << "packed, in pieces of " << piece << ": " << text;
  return ways[0];
}

TEST(PackedParseTest, ReadsWhatParseIndexReads) {
  ExpectParsedAlike(Index().dump());
  ExpectParsedAlike(Index().dump(), 1);
  ExpectParsedAlike(Index().dump(), 1 << 20);
}

TEST(PackedParseTest, FieldsInAnyOrder) {
  ordered_json j = Index();
  ordered_json files = j["files"];
  j.erase("files");
  j["files"] = files;  // after the tensors: their chunks wait for the files
  ExpectParsedAlike(j.dump());
  ordered_json world = j["world_size"];
  j.erase("world_size");
  j["world_size"] = world;
  ExpectParsedAlike(j.dump());
}

TEST(PackedParseTest, KeysOutOfOrderAndRepeated) {
  std::string text = Index().dump();
  const auto swap = [&](const std::string& a, const std::string& b) {
    const size_t i = text.find(a), k = text.find(b);
    text.replace(k, b.size(), a);
    text.replace(i, a.size(), b);
  };
  swap("\"m.0\"", "\"m.2\"");
  ExpectParsedAlike(text);  // out of order
  std::string repeated = text;
  repeated.replace(repeated.find("\"m.1\""), 5, "\"m.0\"");
  ExpectParsedAlike(repeated);
  std::string again = Index().dump();
  again.replace(again.find("\"m.1\""), 5, "\"m.0\"");
  ExpectParsedAlike(again);  // in order, the repeat right after
}

TEST(PackedParseTest, DamagedTextsFailAlike) {
  for (const std::string& bad :
       {std::string("\xEF\xBB\xBF") + Index().dump(), Index().dump() + std::string("\0x", 2),
        std::string("{\"format\":\0", 11), Index().dump().substr(0, 100), std::string(),
        std::string("[]"), std::string("{\"format\":\"shardsafe\",\"version\":9}")}) {
    ExpectParsedAlike(bad);
    ExpectParsedAlike(bad, 1);
  }
}

// Random damage to the text: byte changes, cuts and repeats of a span.
TEST(PackedParseTest, RandomDamageFailsOrReadsAlike) {
  const std::string base = Index().dump();
  std::mt19937 rng(48);
  const std::string alphabet = "{}[]\",:0123456789abm.-e ";
  int read = 0, past_the_grammar = 0;  // how far the damaged texts got
  for (int round = 0; round < 3000; ++round) {
    std::string text = base;
    const int edits = 1 + static_cast<int>(rng() % 3);
    for (int e = 0; e < edits; ++e) {
      const size_t at = rng() % text.size();
      switch (rng() % 5) {
        case 0: text[at] = alphabet[rng() % alphabet.size()]; break;
        case 1: text.erase(at, 1 + rng() % 8); break;
        case 2: text.insert(at, text.substr(at, 1 + rng() % 40)); break;
        default:  // a digit for another: the grammar holds
          if (std::isdigit(static_cast<unsigned char>(text[at]))) text[at] = '0' + rng() % 10;
      }
      if (text.empty()) text = "{";
    }
    const std::string verdict = ExpectParsedAlike(text, 1 + rng() % 64);
    read += verdict.rfind("DATA_LOSS", 0) != 0;
    past_the_grammar += verdict.find("invalid JSON") == std::string::npos;
  }
  EXPECT_GT(read, 50);               // damage that leaves a valid index
  EXPECT_GT(past_the_grammar, 500);  // and the index's own checks, not JSON's
}

}  // namespace
}  // namespace shardsafe
