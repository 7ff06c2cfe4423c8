// Chunk table tests (docs/format.md §3a): bounds against brute force, the
// round trip through a version-2 index and its table, and one test per
// check on read.
#include "format/chunk_table.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstring>
#include <random>

#include "base/crc32c.h"
#include "format/index.h"

namespace shardsafe {
namespace {

using ::testing::HasSubstr;

// Elements of `slice` (row-major in its box, then its flat range) as
// indices of the whole tensor.
std::vector<uint64_t> Elements(const Slice& slice, const Shape& shape) {
  std::vector<uint64_t> out;
  std::vector<uint64_t> c(shape.size(), 0);
  uint64_t volume = 1;
  for (uint64_t n : slice.box.size) volume *= n;
  for (uint64_t i = 0; i < volume; ++i) {
    uint64_t rest = i, lin = 0;
    for (size_t d = shape.size(); d-- > 0;) {
      c[d] = slice.box.offset[d] + rest % slice.box.size[d];
      rest /= slice.box.size[d];
    }
    for (size_t d = 0; d < shape.size(); ++d) lin = lin * shape[d] + c[d];
    if (!slice.flat || (i >= slice.flat->begin && i < slice.flat->end)) out.push_back(lin);
  }
  return out;
}

// Whether element `lin` of a tensor of `shape` lies in `b`.
bool Inside(const Bounds& b, const Shape& shape, uint64_t lin) {
  for (size_t d = shape.size(); d-- > 0;) {
    const uint64_t c = lin % shape[d];
    lin /= shape[d];
    if (c < b.lo[d] || c >= b.hi[d]) return false;
  }
  return true;
}

TEST(ChunkTableTest, BoundsHoldEverySliceElementAndAreTheBoxWithoutAFlatRange) {
  std::mt19937_64 rng(7);
  const Shape shape{5, 7, 3};
  Bounds reused;  // BoundsInto over the last trial's bounds
  for (int trial = 0; trial < 2000; ++trial) {
    Box box{{0, 0, 0}, {0, 0, 0}};
    for (size_t d = 0; d < 3; ++d) {
      box.offset[d] = rng() % shape[d];
      box.size[d] = rng() % (shape[d] - box.offset[d] + 1);
    }
    Slice slice{box, std::nullopt};
    const uint64_t volume = box.size[0] * box.size[1] * box.size[2];
    if (volume > 0 && trial % 2) {
      const uint64_t b = rng() % volume;
      slice.flat = FlatRange{b, b + rng() % (volume - b + 1)};
    }
    const std::vector<uint64_t> elements = Elements(slice, shape);
    const Bounds bounds = BoundsOf(slice);
    BoundsInto(slice, &reused);
    EXPECT_EQ(reused, bounds) << trial;
    EXPECT_EQ(bounds.empty, elements.empty());
    for (uint64_t e : elements) ASSERT_TRUE(Inside(bounds, shape, e)) << trial;
    if (!slice.flat && volume > 0) {
      EXPECT_EQ(bounds.lo, box.offset);
      for (size_t d = 0; d < 3; ++d) EXPECT_EQ(bounds.hi[d], box.offset[d] + box.size[d]);
    }
  }
}

TEST(ChunkTableTest, AFlatRangeWithinOneRowIsBoundedByThatRow) {
  // Elements 9-11 of the box rows 2-5 x cols 0-5: row 3, cols 3-5.
  const Bounds b = BoundsOf(Slice{Box{{2, 0}, {4, 6}}, FlatRange{9, 12}});
  EXPECT_EQ(b.lo, (Shape{3, 3}));
  EXPECT_EQ(b.hi, (Shape{4, 6}));
  // Elements 4-7: rows 2-3, all of the box's columns.
  const Bounds c = BoundsOf(Slice{Box{{2, 0}, {4, 6}}, FlatRange{4, 8}});
  EXPECT_EQ(c.lo, (Shape{2, 0}));
  EXPECT_EQ(c.hi, (Shape{4, 6}));
  EXPECT_FALSE(b.Meets(BoundsOf(Slice{Box{{0, 0}, {3, 6}}, std::nullopt})));
  EXPECT_TRUE(c.Meets(BoundsOf(Slice{Box{{0, 0}, {3, 6}}, std::nullopt})));
}

// An index of two tensors: "w" [8, 6] F32 in two row boxes of 12 flat
// pieces each (24 chunks: blocks of 16 and 8), and the scalar "s".
CheckpointIndex SampleIndex() {
  CheckpointIndex index;
  index.tag = "step-1";
  index.world_size = 2;
  index.files = {{"data-00000-000.safetensors", 1 << 20, 0},
                 {"data-00001-000.safetensors", 1 << 20, 1}};
  IndexTensor& w = index.tensors["w"];
  w.dtype = DType::kF32;
  w.shape = {8, 6};
  uint64_t at[2] = {4096, 4096};
  for (uint32_t box = 0; box < 2; ++box) {
    for (uint64_t piece = 0; piece < 12; ++piece) {
      Slice slice{Box{{4 * box, 0}, {4, 6}}, FlatRange{2 * piece, 2 * piece + 2}};
      w.chunks.push_back({slice, box, at[box], 8, 1000 * box + piece});
      at[box] += 8;
    }
  }
  IndexTensor& s = index.tensors["s"];
  s.dtype = DType::kI64;
  s.chunks.push_back({Slice{Box{}, std::nullopt}, 0, 8192, 8, 5});
  return index;
}

struct Written {
  std::string text;
  std::string table;
};

// `index` with its table as one file named shardsafe.chunks: version 2,
// or 3 with checksum files.
Written WriteWithTable(const CheckpointIndex& index) {
  const std::vector<int> ranks(index.tensors.size(), 0);
  const EncodedChunkTable table =
      EncodeChunkTable(index, ranks, [](int) { return "shardsafe.chunks"; });
  EXPECT_EQ(table.parts.size(), 1u);
  CheckpointIndex with = index;
  size_t i = 0;
  for (auto& [key, tensor] : with.tensors) {
    tensor.table = table.refs[i++];
    tensor.chunks.clear();
  }
  with.chunk_tables = {table.parts[0]};
  return {SerializeIndex(with), table.bytes[0]};
}

Status FillChunksFromTable(const std::string& table, const std::string& source,
                           CheckpointIndex* index) {
  return FillChunksFromTables(std::vector{table}, std::vector{source}, index);
}

void ExpectSameChunks(const IndexTensor& a, const IndexTensor& b) {
  ASSERT_EQ(a.chunks.size(), b.chunks.size());
  for (size_t i = 0; i < a.chunks.size(); ++i) {
    EXPECT_EQ(a.chunks[i].slice, b.chunks[i].slice) << i;
    EXPECT_EQ(a.chunks[i].file, b.chunks[i].file) << i;
    EXPECT_EQ(a.chunks[i].at, b.chunks[i].at) << i;
    EXPECT_EQ(a.chunks[i].bytes, b.chunks[i].bytes) << i;
    EXPECT_EQ(a.chunks[i].crc32c, b.chunks[i].crc32c) << i;
  }
}

TEST(ChunkTableTest, AVersion2IndexAndItsTableGiveBackEveryChunk) {
  const CheckpointIndex index = SampleIndex();
  const Written written = WriteWithTable(index);
  const auto j = nlohmann::json::parse(written.text);
  EXPECT_EQ(j["version"], 2);
  EXPECT_EQ(j["chunk_table"], "shardsafe.chunks");
  EXPECT_EQ(j["chunk_table_bytes"], written.table.size());
  EXPECT_FALSE(j["tensors"]["w"].contains("chunks"));
  EXPECT_EQ(j["tensors"]["w"]["table"][0], 24);
  EXPECT_TRUE(written.table.starts_with("SSCHUNKS"));

  auto parsed = ParseIndex(written.text, "ckpt/shardsafe.json");
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  EXPECT_EQ(parsed->version, 2);
  EXPECT_TRUE(parsed->tensors.at("w").chunks.empty());  // in the table, not read yet
  ASSERT_TRUE(FillChunksFromTable(written.table, "ckpt/shardsafe.chunks", &*parsed).ok());
  ExpectSameChunks(parsed->tensors.at("w"), index.tensors.at("w"));
  ExpectSameChunks(parsed->tensors.at("s"), index.tensors.at("s"));
  // Written again, the summary is the same text.
  EXPECT_EQ(SerializeIndex(*parsed), written.text);
}

TEST(ChunkTableTest, WithoutATableNameTheIndexIsVersion1WithItsChunks) {
  auto written = SerializeIndexToCommit(SampleIndex(), nullptr);
  ASSERT_TRUE(written.ok());
  EXPECT_EQ(written->table, nullptr);
  const auto j = nlohmann::json::parse(written->text);
  EXPECT_EQ(j["version"], 1);
  EXPECT_FALSE(j.contains("chunk_table"));
  EXPECT_EQ(j["tensors"]["w"]["chunks"].size(), 24u);
}

TEST(ChunkTableTest, BlocksHoldTheRangesOfTheirChunks) {
  const CheckpointIndex index = SampleIndex();
  const Written written = WriteWithTable(index);
  auto parsed = ParseIndex(written.text, "i");
  ASSERT_TRUE(parsed.ok());
  const IndexTableRef& ref = *parsed->tensors.at("w").table;
  ASSERT_EQ(LevelSizes(ref.count), std::vector<uint64_t>{2});  // one level
  const ByteSpan dir = DirectoryBytes(ref, 2);
  auto entries = DecodeEntries(std::string_view(written.table).substr(dir.at, dir.bytes), 2,
                               ref.directory_crc32c, "w", "t");
  ASSERT_TRUE(entries.ok()) << entries.status().ToString();
  ASSERT_EQ(entries->size(), 2u);
  // Block 0: box 0 (rows 0-3) and box 1's first 4 pieces of 2 (row 4,
  // cols 0-5, and row 5, cols 0-1): rows 0-5. Block 1: the rest of box 1,
  // elements 32-47: rows 5-7.
  EXPECT_EQ((*entries)[0].bounds.lo, (Shape{0, 0}));
  EXPECT_EQ((*entries)[0].bounds.hi, (Shape{6, 6}));
  EXPECT_EQ((*entries)[1].bounds.lo, (Shape{5, 0}));
  EXPECT_EQ((*entries)[1].bounds.hi, (Shape{8, 6}));
  std::vector<IndexChunk> chunks;
  const ByteSpan block = BlockBytes(ref, 2, 1);
  ASSERT_TRUE(DecodeBlock(std::string_view(written.table).substr(block.at, block.bytes), 1,
                          (*entries)[1], parsed->tensors.at("w"), "w", *parsed, "t", &chunks)
                  .ok());
  ASSERT_EQ(chunks.size(), 8u);
  EXPECT_EQ(chunks[0].slice, index.tensors.at("w").chunks[16].slice);
}

TEST(ChunkTableTest, ADirectoryOfManyBlocksHasLevelsThatBoundTheirChildren) {
  EXPECT_EQ(LevelSizes(0), std::vector<uint64_t>{0});
  EXPECT_EQ(LevelSizes(256), std::vector<uint64_t>{16});
  EXPECT_EQ(LevelSizes(257), (std::vector<uint64_t>{17, 2}));
  EXPECT_EQ(LevelSizes(16 * 16 * 16 + 1), (std::vector<uint64_t>{257, 17, 2}));
  // "m" [4133, 3] in 4133 row chunks: three levels.
  CheckpointIndex index;
  index.files = {{"data-00000-000.safetensors", 1 << 20, 0}};
  IndexTensor& m = index.tensors["m"];
  m.dtype = DType::kU8;
  m.shape = {4133, 3};
  for (uint64_t r = 0; r < 4133; ++r) {
    m.chunks.push_back({Slice{Box{{r, 0}, {1, 3}}, std::nullopt}, 0, 3 * r, 3,
                        static_cast<uint32_t>(r)});
  }
  const Written written = WriteWithTable(index);
  auto parsed = ParseIndex(written.text, "i");
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  ASSERT_TRUE(FillChunksFromTable(written.table, "t", &*parsed).ok());
  ExpectSameChunks(parsed->tensors.at("m"), m);
  // The top level's two entries: blocks 0-255 (rows 0-4095) and the rest.
  const IndexTableRef& ref = *parsed->tensors.at("m").table;
  const ByteSpan top = EntryBytes(ref, 2, 2, 0, 2);
  EXPECT_EQ(TopBytes(ref, 2).at, top.at);
  EXPECT_EQ(TopBytes(ref, 2).bytes, top.bytes);
  auto entries = DecodeEntries(std::string_view(written.table).substr(top.at, top.bytes), 2,
                               ref.directory_crc32c, "m", "t");
  ASSERT_TRUE(entries.ok()) << entries.status().ToString();
  EXPECT_EQ((*entries)[0].bounds.hi, (Shape{4096, 3}));
  EXPECT_EQ((*entries)[1].bounds.lo, (Shape{4096, 0}));
  // A changed entry of the middle level fails its parent's checksum.
  std::string table = written.table;
  table[EntryBytes(ref, 2, 1, 5, 1).at] ^= 1;
  auto again = ParseIndex(written.text, "i");
  const Status s = FillChunksFromTable(table, "t", &*again);
  EXPECT_EQ(s.code(), StatusCode::kDataLoss);
  EXPECT_THAT(s.message(), HasSubstr("tensor \"m\": block directory checksum mismatch"));
}

// The table of SampleIndex with one change, and its index text.
class DamagedTableTest : public ::testing::Test {
 protected:
  void SetUp() override {
    written_ = WriteWithTable(SampleIndex());
    auto parsed = ParseIndex(written_.text, "i");
    ASSERT_TRUE(parsed.ok());
    ref_ = *parsed->tensors.at("w").table;
  }
  Status Fill(const std::string& table, const std::string& text) {
    auto parsed = ParseIndex(text, "ckpt/shardsafe.json");
    if (!parsed.ok()) return parsed.status();
    return FillChunksFromTable(table, "ckpt/shardsafe.chunks", &*parsed);
  }
  // Recomputes the CRCs of "w"'s blocks and directory after a change to
  // its records; returns the index text with the new directory CRC.
  std::string Reseal(std::string& table) {
    for (uint64_t b = 0; b < BlockCount(ref_.count); ++b) {
      const ByteSpan block = BlockBytes(ref_, 2, b);
      const uint32_t crc = Crc32c(table.data() + block.at, block.bytes);
      std::memcpy(table.data() + ref_.directory_at + (b + 1) * BlockEntryBytes(2) - 8, &crc, 4);
    }
    const ByteSpan dir = DirectoryBytes(ref_, 2);
    const uint32_t crc = Crc32c(table.data() + dir.at, dir.bytes);
    auto j = nlohmann::ordered_json::parse(written_.text);
    j["tensors"]["w"]["table"][3] = crc;
    return j.dump();
  }
  char* Record(std::string& table, uint64_t i) {
    return table.data() + ref_.records_at + i * ChunkRecordBytes(2);
  }

  Written written_;
  IndexTableRef ref_;
};

TEST_F(DamagedTableTest, AChangedRecordIsAChecksumMismatchOfItsBlock) {
  std::string table = written_.table;
  Record(table, 20)[0] ^= 1;
  const Status s = Fill(table, written_.text);
  EXPECT_EQ(s.code(), StatusCode::kDataLoss);
  EXPECT_THAT(s.message(), HasSubstr("ckpt/shardsafe.chunks: tensor \"w\": block 1: records checksum mismatch"));
}

TEST_F(DamagedTableTest, AChangedDirectoryIsAChecksumMismatch) {
  std::string table = written_.table;
  table[ref_.directory_at + 3] ^= 1;
  const Status s = Fill(table, written_.text);
  EXPECT_EQ(s.code(), StatusCode::kDataLoss);
  EXPECT_THAT(s.message(), HasSubstr("tensor \"w\": block directory checksum mismatch"));
}

TEST_F(DamagedTableTest, ATruncatedOrForeignTableIsDataLoss) {
  Status s = Fill(written_.table.substr(0, written_.table.size() - 1), written_.text);
  EXPECT_EQ(s.code(), StatusCode::kDataLoss);
  EXPECT_THAT(s.message(), HasSubstr("ckpt/shardsafe.chunks: is "));
  std::string table = written_.table;
  table[0] = 'X';
  s = Fill(table, written_.text);
  EXPECT_EQ(s.code(), StatusCode::kDataLoss);
  EXPECT_THAT(s.message(), HasSubstr("does not start with SSCHUNKS"));
}

TEST_F(DamagedTableTest, ResealedRecordsAreStillCheckedOneByOne) {
  std::string table = written_.table;
  uint64_t big = 1 << 30;  // "at" past the end of its file
  std::memcpy(Record(table, 3), &big, 8);
  Status s = Fill(table, Reseal(table));
  EXPECT_EQ(s.code(), StatusCode::kDataLoss);
  EXPECT_THAT(s.message(), HasSubstr("tensor \"w\": chunk 3"));

  table = written_.table;
  Record(table, 3)[40] = 2;  // an undefined flag
  s = Fill(table, Reseal(table));
  EXPECT_THAT(s.message(), HasSubstr("only flag bit 0 is defined"));

  // Chunk 17 (box 1, elements 10-11 of it: row 5; block 1: rows 5-7)
  // moved to box 0's rows: row 1, outside its block's bounds.
  table = written_.table;
  const uint64_t row = 0;
  std::memcpy(Record(table, 17) + 48, &row, 8);
  s = Fill(table, Reseal(table));
  EXPECT_EQ(s.code(), StatusCode::kDataLoss);
  EXPECT_THAT(s.message(), HasSubstr("outside the bounds its block directory gives"));
}

TEST_F(DamagedTableTest, TableFieldsOfTheIndexAreChecked) {
  auto j = nlohmann::ordered_json::parse(written_.text);
  auto expect_loss = [&](const nlohmann::ordered_json& damaged, const std::string& substring) {
    auto parsed = ParseIndex(damaged.dump(), "ckpt/shardsafe.json");
    ASSERT_FALSE(parsed.ok()) << substring;
    EXPECT_EQ(parsed.status().code(), StatusCode::kDataLoss);
    EXPECT_THAT(parsed.status().message(), HasSubstr(substring));
  };
  auto d = j;
  d["tensors"]["w"]["table"][2] = written_.table.size();
  expect_loss(d, "tensor \"w\": field \"table\": lies outside the chunk table");
  d = j;
  d["tensors"]["w"]["table"] = {1, 2, 3};
  expect_loss(d, "expected [part, count, directory_at, records_at, directory_crc32c]");
  d["tensors"]["w"]["table"] = {0, 24, 8, 100, 1};
  expect_loss(d, "names a part before version 4");
  d = j;
  d["tensors"]["w"]["chunks"] = nlohmann::json::array();
  expect_loss(d, "has both \"chunks\" and \"table\"");
  d = j;
  d["tensors"]["w"].erase("table");
  expect_loss(d, "missing field \"chunks\"");
  d = j;
  d["version"] = 1;
  expect_loss(d, "a version-1 index has no single chunk table");
  d = j;
  d["chunk_table"] = "../x";
  expect_loss(d, "chunk_table");
  d = j;
  d["version"] = 5;
  auto newer = ParseIndex(d.dump(), "i");
  EXPECT_EQ(newer.status().code(), StatusCode::kFailedPrecondition);
  // Version 3: the checksum files, listed by file number, one per rank.
  d = j;
  d["version"] = 3;
  expect_loss(d, "missing field \"checksum_files\"");
  d["checksum_files"] = nlohmann::json::array();
  expect_loss(d, "an index of this version lists checksum files");
  d["checksum_files"] = {7};
  expect_loss(d, "file 7 is out of range");
  d["files"].push_back({{"name", "checksums-00000.crc32c"}, {"bytes", 20}, {"rank", 0}});
  d["files"].push_back({{"name", "checksums-00000b.crc32c"}, {"bytes", 20}, {"rank", 0}});
  const size_t n = d["files"].size();
  d["checksum_files"] = {n - 1, n - 2};
  expect_loss(d, "expected ascending file numbers");
  d["checksum_files"] = {n - 2, n - 1};
  expect_loss(d, "two checksum files of rank 0");
}

TEST(ChunkTableTest, AVersion3TableHoldsNoChecksumAndNoChunkInAChecksumFile) {
  CheckpointIndex index = SampleIndex();
  for (auto& [key, t] : index.tensors) {
    for (IndexChunk& c : t.chunks) c.crc32c.reset();
  }
  const uint32_t checksums = static_cast<uint32_t>(index.files.size());
  index.files.push_back({"checksums-00000.crc32c", 100, 0});
  index.checksum_files = {checksums};
  Written written = WriteWithTable(index);
  auto parsed = ParseIndex(written.text, "i");
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  EXPECT_EQ(parsed->version, 3);
  EXPECT_EQ(parsed->checksum_files, std::vector<uint32_t>{checksums});
  ASSERT_TRUE(FillChunksFromTable(written.table, "t", &*parsed).ok());
  for (const auto& [key, t] : parsed->tensors) {
    for (const IndexChunk& c : t.chunks) EXPECT_FALSE(c.crc32c.has_value()) << key;
  }
  // A record with a checksum, or in the checksum file: DataLoss.
  const IndexTableRef ref = *parsed->tensors.at("s").table;
  std::string table = written.table;
  table[ref.records_at + 36] = 1;
  auto reparsed = ParseIndex(written.text, "i");
  Status s = FillChunksFromTable(table, "t", &*reparsed);
  EXPECT_EQ(s.code(), StatusCode::kDataLoss);
  index.tensors.at("s").chunks[0].file = checksums;
  written = WriteWithTable(index);
  reparsed = ParseIndex(written.text, "i");
  ASSERT_TRUE(reparsed.ok());
  s = FillChunksFromTable(written.table, "t", &*reparsed);
  EXPECT_EQ(s.code(), StatusCode::kDataLoss);
  EXPECT_THAT(s.message(), HasSubstr("lies in checksum file"));
}

// SampleIndex as a version-4 save writes it: no checksum in the chunks,
// a checksum file, and the table in two parts ("s" home to rank 0, "w"
// to rank 1).
const std::vector<std::string> kPartNames = {"p0", "p1"};

struct Version4 {
  CheckpointIndex index;  // with the table set (SetChunkTable)
  EncodedChunkTable table;
  std::string text;
};

Version4 WriteVersion4() {
  Version4 v;
  v.index = SampleIndex();
  for (auto& [key, t] : v.index.tensors) {
    for (IndexChunk& c : t.chunks) c.crc32c.reset();
  }
  v.index.checksum_files = {static_cast<uint32_t>(v.index.files.size())};
  v.index.files.push_back({"checksums-00000.crc32c", 100, 0});
  const std::vector<int> homes = {0, 1};  // "s", "w"
  v.table = EncodeChunkTable(v.index, homes, [](int rank) {
    return "chunks-0000" + std::to_string(rank) + ".chunks";
  });
  EXPECT_TRUE(SetChunkTable(v.table, &v.index).ok());
  auto written = SerializeIndexToCommit(v.index, nullptr);
  EXPECT_TRUE(written.ok());
  v.text = written->text;
  return v;
}

TEST(ChunkTableTest, AVersion4TableIsInPartsListedAsFilesThatTheTensorsName) {
  const Version4 v = WriteVersion4();
  ASSERT_EQ(v.table.parts.size(), 2u);
  EXPECT_EQ(v.table.ranks, (std::vector<int>{0, 1}));
  const auto j = nlohmann::json::parse(v.text);
  EXPECT_EQ(j["version"], 4);
  EXPECT_FALSE(j.contains("chunk_table"));
  EXPECT_EQ(j["chunk_tables"], nlohmann::json({3, 4}));
  EXPECT_EQ(j["files"][3]["name"], "chunks-00000.chunks");
  EXPECT_EQ(j["files"][4]["name"], "chunks-00001.chunks");
  EXPECT_EQ(j["files"][4]["rank"], 1);
  EXPECT_EQ(j["files"][4]["bytes"], v.table.bytes[1].size());
  EXPECT_EQ(j["tensors"]["w"]["table"][0], 1);  // part 1
  EXPECT_EQ(j["tensors"]["w"]["table"][1], 24);
  EXPECT_EQ(j["tensors"]["s"]["table"][0], 0);
  EXPECT_TRUE(v.table.bytes[0].starts_with("SSCHUNKS"));
  EXPECT_TRUE(v.table.bytes[1].starts_with("SSCHUNKS"));

  auto parsed = ParseIndex(v.text, "ckpt/shardsafe.json");
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  EXPECT_EQ(parsed->version, 4);
  ASSERT_EQ(parsed->chunk_tables.size(), 2u);
  EXPECT_EQ(parsed->chunk_tables[1].name, "chunks-00001.chunks");
  EXPECT_EQ(parsed->chunk_tables[1].bytes, v.table.bytes[1].size());
  EXPECT_EQ(parsed->chunk_tables[1].file, 4u);
  EXPECT_TRUE(IsDataFile(*parsed, 0));
  EXPECT_FALSE(IsDataFile(*parsed, 2));  // the checksum file
  EXPECT_FALSE(IsDataFile(*parsed, 4));
  ASSERT_TRUE(FillChunksFromTables(v.table.bytes, kPartNames, &*parsed).ok());
  const CheckpointIndex sample = SampleIndex();
  for (const char* key : {"w", "s"}) {
    const IndexTensor& got = parsed->tensors.at(key);
    ASSERT_EQ(got.chunks.size(), sample.tensors.at(key).chunks.size()) << key;
    for (size_t i = 0; i < got.chunks.size(); ++i) {
      EXPECT_EQ(got.chunks[i].slice, sample.tensors.at(key).chunks[i].slice);
      EXPECT_EQ(got.chunks[i].at, sample.tensors.at(key).chunks[i].at);
      EXPECT_FALSE(got.chunks[i].crc32c.has_value());
    }
  }
  EXPECT_EQ(SerializeIndex(*parsed), v.text);  // written again: the same text
  // The parts swapped: each has the other's size and magic, but not its
  // tensors' directories.
  const std::vector<std::string> swapped = {v.table.bytes[1], v.table.bytes[0]};
  auto again = ParseIndex(v.text, "i");
  const Status s = FillChunksFromTables(swapped, kPartNames, &*again);
  EXPECT_EQ(s.code(), StatusCode::kDataLoss);
  EXPECT_THAT(s.message(), HasSubstr("p0: is "));
}

TEST(ChunkTableTest, Version4PartsAndTheirReferencesAreChecked) {
  const Version4 v = WriteVersion4();
  const auto j = nlohmann::json::parse(v.text);
  auto expect_loss = [](const nlohmann::json& d, const std::string& substring) {
    auto parsed = ParseIndex(d.dump(), "i");
    EXPECT_EQ(parsed.status().code(), StatusCode::kDataLoss) << substring;
    EXPECT_THAT(parsed.status().message(), HasSubstr(substring));
  };
  auto d = j;
  d["tensors"]["w"]["table"][0] = 2;
  expect_loss(d, "tensor \"w\": field \"table\": names part 2 of 2");
  d = j;
  d["tensors"]["w"]["table"].erase(0);
  expect_loss(d, "names no part in a version-4 index");
  d = j;
  d["tensors"]["w"]["table"][3] = v.table.bytes[1].size();  // records past its part's end
  expect_loss(d, "lies outside the chunk table");
  d = j;
  d.erase("chunk_tables");
  expect_loss(d, "chunk_tables");
  d = j;
  d["chunk_tables"] = nlohmann::json::array();
  expect_loss(d, "an index of this version lists its chunk table's parts");
  d = j;
  d["chunk_tables"] = {4, 3};
  expect_loss(d, "expected ascending file numbers");
  d = j;
  d["chunk_tables"] = {3, 9};
  expect_loss(d, "field \"chunk_tables\": file 9 is out of range");
  d = j;
  d["chunk_tables"] = {2, 4};
  expect_loss(d, "file 2 is a checksum file");
  d = j;
  d["chunk_table"] = "shardsafe.chunks";
  d["chunk_table_bytes"] = 8;
  expect_loss(d, "a version-4 index has no single chunk table");
  d = j;
  d["blobs"]["b"] = {{"per_rank", false},
                     {"chunks", {{{"rank", 0}, {"file", 4}, {"at", 0}, {"bytes", 8},
                                  {"crc32c", 1}}}}};
  expect_loss(d, "blob \"b\": lies in a chunk table file");
  // A record naming a part as its data file.
  Version4 bad = WriteVersion4();
  CheckpointIndex in_part = SampleIndex();
  for (auto& [key, t] : in_part.tensors) {
    for (IndexChunk& c : t.chunks) c.crc32c.reset();
  }
  in_part.tensors.at("s").chunks[0] = {Slice{Box{}, std::nullopt}, 4, 0, 8, std::nullopt};
  in_part.checksum_files = {2};
  in_part.files.push_back({"checksums-00000.crc32c", 100, 0});
  const std::vector<int> homes = {0, 1};
  bad.table = EncodeChunkTable(in_part, homes, [](int rank) {
    return "chunks-0000" + std::to_string(rank) + ".chunks";
  });
  ASSERT_TRUE(SetChunkTable(bad.table, &in_part).ok());
  auto parsed = ParseIndex(SerializeIndex(in_part), "i");
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  const Status s = FillChunksFromTables(bad.table.bytes, kPartNames, &*parsed);
  EXPECT_EQ(s.code(), StatusCode::kDataLoss);
  EXPECT_THAT(s.message(), HasSubstr("lies in chunk table file 4"));
}

}  // namespace
}  // namespace shardsafe
