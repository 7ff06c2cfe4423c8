// Checkpoints whose index keeps its chunks in a chunk table
// (docs/format.md §3a): saved and loaded resharded bit-exact by thread
// ranks, read in part by each loading rank (counted), read whole by the
// tools, and refused with a named DataLoss when the table is damaged.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include <nlohmann/json.hpp>

#include "engine/load/table_reads.h"
#include "format/checksum_file.h"
#include "shardsafe/source.h"
#include "testing/test_util.h"

namespace shardsafe {
namespace {

using ::testing::HasSubstr;

const Shape kW{64, 48};   // F32: 2 row boxes (TP), each in 2 flat pieces (ZeRO)
const Shape kE{40, 16};   // BF16: 4 column boxes
const Shape kB{7};        // I64: replicated on every rank
const Shape kS{};         // F64 scalar

Slice Box2(uint64_t r0, uint64_t rows, uint64_t c0, uint64_t cols) {
  return {Box{{r0, c0}, {rows, cols}}, std::nullopt};
}
Slice Whole(const Shape& s) { return {Box::Whole(s), std::nullopt}; }

// Rank r of 4: TP rank r / 2, DP rank r % 2.
std::vector<OwnedShard> SavedBy(int r) {
  const uint64_t tp = r / 2, dp = r % 2;
  Slice w = Box2(32 * tp, 32, 0, 48);
  w.flat = FlatRange{dp * 768, dp * 768 + 768};
  return {MakeShard("w", DType::kF32, kW, w),
          MakeShard("e", DType::kBF16, kE, Box2(0, 40, 4 * r, 4)),
          MakeShard("b", DType::kI64, kB, Whole(kB)), MakeShard("s", DType::kF64, kS, Whole(kS))};
}

class ChunkTableTest : public ::testing::Test {
 protected:
  void SetUp() override { root_ = testing::MakeTempDir("chunktable"); }
  void TearDown() override { std::filesystem::remove_all(root_); }

  // Saves SavedBy(r) from 4 ranks as root_/TAG.
  void Save4(const std::string& tag, uint64_t min_chunks) {
    RunRanks(4, [&](int r, Comm& comm) {
      const std::vector<OwnedShard> shards = SavedBy(r);
      SaveState state;
      for (const OwnedShard& s : shards) state.tensors.push_back(s.View());
      SaveOptions options;
      options.chunk_table_min_chunks = min_chunks;
      Status s = Save(state, root_ + "/" + tag, comm, options).status();
      EXPECT_TRUE(s.ok()) << s.ToString();
    });
  }

  // Rank r of 3 loads: rows of w, columns of e (across the saved boxes), a
  // flat range of w, b and s whole.
  static std::vector<OwnedTarget> LoadedBy(int r) {
    Slice flat = Whole(kW);
    flat.flat = FlatRange{1000 * static_cast<uint64_t>(r), 1000 * static_cast<uint64_t>(r) + 900};
    return {MakeTarget("w", DType::kF32, kW, Box2(20 * r, 24, 0, 48)),
            MakeTarget("w", DType::kF32, kW, flat),
            MakeTarget("e", DType::kBF16, kE, Box2(0, 40, 5 * r, 6)),
            MakeTarget("b", DType::kI64, kB, Whole(kB)),
            MakeTarget("s", DType::kF64, kS, Whole(kS))};
  }

  std::vector<Status> Load3(const std::string& tag, std::vector<std::vector<OwnedTarget>>* out) {
    std::vector<Status> status(3);
    out->resize(3);
    RunRanks(3, [&](int r, Comm& comm) {
      (*out)[r] = LoadedBy(r);
      LoadRequest request;
      for (OwnedTarget& t : (*out)[r]) {
        t.target.data = t.buffer.data();  // the buffer was copied into the vector
        request.tensors.push_back(t.target);
      }
      status[r] = Load(request, root_ + "/" + tag, comm, {}).status();
    });
    return status;
  }

  nlohmann::json Index(const std::string& tag) {
    std::ifstream in(root_ + "/" + tag + "/shardsafe.json");
    return nlohmann::json::parse(in);
  }

  // The path of the chunk table part that holds `key`'s chunks.
  std::string PartOf(const std::string& tag, const std::string& key) {
    const nlohmann::json index = Index(tag);
    const size_t part = index["tensors"][key]["table"][0];
    const size_t file = index["chunk_tables"][part];
    return root_ + "/" + tag + "/" + index["files"][file]["name"].get<std::string>();
  }

  // Every part of the chunk table, by name.
  std::map<std::string, std::string> Parts(const std::string& tag) {
    const nlohmann::json index = Index(tag);
    std::map<std::string, std::string> parts;
    for (size_t file : index["chunk_tables"]) {
      const std::string name = index["files"][file]["name"];
      std::ifstream in(root_ + "/" + tag + "/" + name, std::ios::binary);
      parts[name] = std::string(std::istreambuf_iterator<char>(in), {});
    }
    return parts;
  }

  std::string root_;
};

TEST_F(ChunkTableTest, ATableCheckpointLoadsReshardedBitExact) {
  Save4("ck", /*min_chunks=*/1);
  std::vector<std::vector<OwnedTarget>> loaded;
  for (const Status& s : Load3("ck", &loaded)) ASSERT_TRUE(s.ok()) << s.ToString();
  for (const auto& rank : loaded) {
    for (const OwnedTarget& t : rank) EXPECT_TRUE(MatchesOracle(t)) << t.target.key;
  }
  const nlohmann::json index = Index("ck");
  EXPECT_EQ(index["version"], 4);
  EXPECT_FALSE(index.contains("chunk_table"));
  // Each rank's chunks' checksums in its checksum file, listed after the
  // data files.
  ASSERT_EQ(index["checksum_files"].size(), 4u);
  for (int r = 0; r < 4; ++r) {
    const nlohmann::json& f = index["files"][index["checksum_files"][r].get<size_t>()];
    EXPECT_EQ(f["rank"], r);
    EXPECT_EQ(f["name"], "checksums-0000" + std::to_string(r) + ".crc32c");
    EXPECT_EQ(std::filesystem::file_size(root_ + "/ck/" + f["name"].get<std::string>()),
              f["bytes"].get<uint64_t>());
  }
  // The table in parts, one per home rank of a tensor, listed after the
  // checksum files, each named after its rank and as large as listed.
  const std::map<std::string, std::string> parts = Parts("ck");
  ASSERT_FALSE(parts.empty());
  EXPECT_LE(parts.size(), 4u);
  size_t previous = index["checksum_files"][3];
  for (size_t file : index["chunk_tables"]) {
    EXPECT_EQ(file, ++previous);
    const nlohmann::json& f = index["files"][file];
    EXPECT_EQ(f["name"], "chunks-0000" + std::to_string(f["rank"].get<int>()) + ".chunks");
    EXPECT_EQ(parts.at(f["name"]).size(), f["bytes"].get<uint64_t>());
    EXPECT_TRUE(parts.at(f["name"]).starts_with("SSCHUNKS"));
  }
  std::set<size_t> named;
  for (const auto& [key, t] : index["tensors"].items()) named.insert(t["table"][0].get<size_t>());
  EXPECT_EQ(named.size(), parts.size());  // every part holds a tensor
  ASSERT_FALSE(index["tensors"]["w"].contains("chunks"));
  EXPECT_EQ(index["tensors"]["w"]["table"][1], 4);  // two boxes of two pieces
  // A tool's open reads the whole table: every chunk, tiling checked.
  auto src = OpenSource(root_ + "/ck");
  ASSERT_TRUE(src.ok()) << src.status().ToString();
  EXPECT_FALSE(src->chunks_pending);
  EXPECT_EQ(src->index.tensors.at("w").chunks.size(), 4u);
  EXPECT_EQ(src->index.tensors.at("e").chunks.size(), 4u);
}

TEST_F(ChunkTableTest, BelowTheThresholdTheIndexStaysVersion1) {
  Save4("ck", /*min_chunks=*/1000);
  const nlohmann::json index = Index("ck");
  EXPECT_EQ(index["version"], 1);
  EXPECT_FALSE(index.contains("chunk_tables"));
  for (const auto& e : std::filesystem::directory_iterator(root_ + "/ck")) {
    EXPECT_NE(e.path().extension(), ".chunks") << e.path();
  }
  EXPECT_EQ(index["tensors"]["w"]["chunks"].size(), 4u);
}

TEST_F(ChunkTableTest, ACollectiveOpenLeavesTheTableToEachRanksLoad) {
  Save4("ck", 1);
  auto comm = MakeSingleProcessComm();
  auto src = OpenSourceCollective(root_ + "/ck", *comm);
  ASSERT_TRUE(src.ok()) << src.status().ToString();
  EXPECT_TRUE(src->chunks_pending);
  EXPECT_TRUE(src->index.tensors.at("w").chunks.empty());
  EXPECT_EQ(src->index.tensors.at("w").shape, kW);
}

// One rank saves "m" [4096, 4] in 512 row boxes of 8 rows: 32 blocks,
// under a directory of two levels.
TEST_F(ChunkTableTest, ALoadReadsOnlyTheBlocksThatCanHoldItsSlices) {
  const Shape m{4096, 4};
  RunRanks(1, [&](int, Comm& comm) {
    std::vector<OwnedShard> shards;
    for (uint64_t b = 0; b < 512; ++b) {
      shards.push_back(MakeShard("m", DType::kF32, m, Box2(8 * b, 8, 0, 4)));
    }
    SaveState state;
    for (const OwnedShard& s : shards) state.tensors.push_back(s.View());
    SaveOptions options;
    options.chunk_table_min_chunks = 1;
    ASSERT_TRUE(Save(state, root_ + "/m", comm, options).ok());
  });
  auto comm = MakeSingleProcessComm();
  auto src = OpenSourceCollective(root_ + "/m", *comm);
  ASSERT_TRUE(src.ok());
  ASSERT_EQ(src->index.chunk_tables.size(), 1u);  // one tensor, one part
  const uint64_t table_bytes = src->index.chunk_tables[0].bytes;

  // Rows 1000-1039: chunks 125-129, all in block 7 (chunks 112-127) and
  // block 8 (128-143).
  OwnedTarget target = MakeTarget("m", DType::kF32, m, Box2(1000, 40, 0, 4));
  LoadRequest request{{target.target}};
  TableReadStats stats;
  auto filled = ReadChunksFor(*DefaultFileSystem(), *src, request, &stats);
  ASSERT_TRUE(filled.ok()) << filled.status().ToString();
  EXPECT_EQ(stats.chunks, 32u);  // two blocks of 16
  EXPECT_EQ(filled->index.tensors.at("m").chunks.size(), 32u);
  // The directory's top level (2 entries), the 16 entries under the first,
  // then the two adjacent blocks.
  EXPECT_EQ(stats.requests, 3u);
  EXPECT_LT(stats.bytes * 10, table_bytes);
  ASSERT_TRUE(Load(request, root_ + "/m", *comm, {}).ok());
  EXPECT_TRUE(MatchesOracle(target));
}

TEST_F(ChunkTableTest, ADamagedTableFailsTheLoadNamingTableAndTensor) {
  Save4("ck", 1);
  const std::string table = PartOf("ck", "e");
  const uint64_t records_at = Index("ck")["tensors"]["e"]["table"][3];
  testing::FlipByte(table, records_at + 1, 0x10);
  std::vector<std::vector<OwnedTarget>> loaded;
  for (const Status& s : Load3("ck", &loaded)) {
    EXPECT_EQ(s.code(), StatusCode::kDataLoss) << s.ToString();
    EXPECT_THAT(s.message(), HasSubstr(table));
    EXPECT_THAT(s.message(), HasSubstr("tensor \"e\": block 0: records checksum mismatch"));
  }
  auto src = OpenSource(root_ + "/ck");
  EXPECT_EQ(src.status().code(), StatusCode::kDataLoss);

  testing::FlipByte(table, records_at + 1, 0x10);  // put back
  std::filesystem::resize_file(table, std::filesystem::file_size(table) - 1);
  for (const Status& s : Load3("ck", &loaded)) {
    EXPECT_EQ(s.code(), StatusCode::kDataLoss) << s.ToString();
    EXPECT_THAT(s.message(), HasSubstr(table + ": chunk table is"));
  }
}

TEST_F(ChunkTableTest, ADamagedOrMissingChecksumFileFailsTheLoadNamingIt) {
  Save4("ck", 1);
  const std::string file = root_ + "/ck/checksums-00001.crc32c";
  testing::FlipByte(file, 20, 0x01);
  std::vector<std::vector<OwnedTarget>> loaded;
  for (const Status& s : Load3("ck", &loaded)) {
    EXPECT_EQ(s.code(), StatusCode::kDataLoss) << s.ToString();
    EXPECT_THAT(s.message(), HasSubstr(file + ": checksum file checksum mismatch"));
  }
  EXPECT_EQ(OpenSource(root_ + "/ck").status().code(), StatusCode::kDataLoss);

  testing::FlipByte(file, 20, 0x01);  // put back
  std::ofstream(file, std::ios::binary | std::ios::app) << "x";
  auto longer = OpenSource(root_ + "/ck");
  EXPECT_EQ(longer.status().code(), StatusCode::kDataLoss) << longer.status().ToString();
  EXPECT_THAT(longer.status().message(), HasSubstr(file + ": checksum file is larger"));

  std::filesystem::remove(file);
  for (const Status& s : Load3("ck", &loaded)) {
    EXPECT_FALSE(s.ok());
    EXPECT_THAT(s.message(), HasSubstr("checksums-00001.crc32c"));
  }
}

TEST_F(ChunkTableTest, AChecksumFileThatLacksAChunkIsDataLossNamingTheTensor) {
  Save4("ck", 1);
  // Rank 0's file rewritten without its last entry (a valid file of one
  // entry less): the chunk it held has no checksum.
  const std::string file = root_ + "/ck/checksums-00000.crc32c";
  std::ifstream in(file, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  in.close();
  auto entries = DecodeChecksumFile(bytes, file);
  ASSERT_TRUE(entries.ok()) << entries.status().ToString();
  ASSERT_FALSE(entries->empty());
  entries->pop_back();
  const std::string shorter = EncodeChecksumFile(*entries);
  std::ofstream(file, std::ios::binary | std::ios::trunc) << shorter;
  nlohmann::json index = Index("ck");
  for (auto& f : index["files"]) {
    if (f["name"] == "checksums-00000.crc32c") f["bytes"] = shorter.size();
  }
  std::ofstream(root_ + "/ck/shardsafe.json", std::ios::trunc) << index.dump();
  auto src = OpenSource(root_ + "/ck");
  EXPECT_EQ(src.status().code(), StatusCode::kDataLoss);
  EXPECT_THAT(src.status().message(), HasSubstr("checksums-00000.crc32c"));
  EXPECT_THAT(src.status().message(), HasSubstr("no checksum of its chunk"));
}

TEST_F(ChunkTableTest, ASaveOfTheSameLayoutWritesTheSameTableAndALayoutChangeANewOne) {
  Save4("a", 1);
  Save4("b", 1);  // the same layout: the plan and its chunk table reused
  EXPECT_EQ(Parts("a"), Parts("b"));
  for (const std::string tag : {"a", "b"}) {
    std::vector<std::vector<OwnedTarget>> loaded;
    for (const Status& s : Load3(tag, &loaded)) ASSERT_TRUE(s.ok()) << s.ToString();
    for (const auto& rank : loaded) {
      for (const OwnedTarget& t : rank) EXPECT_TRUE(MatchesOracle(t)) << tag << " " << t.target.key;
    }
  }
  // Another layout (w's ZeRO pieces swapped between the DP ranks) between
  // two saves: planned anew, its own table, loaded bit-exact.
  RunRanks(4, [&](int r, Comm& comm) {
    std::vector<OwnedShard> shards = SavedBy(r);
    shards[0] = SavedBy(r ^ 1)[0];
    SaveState state;
    for (const OwnedShard& s : shards) state.tensors.push_back(s.View());
    SaveOptions options;
    options.chunk_table_min_chunks = 1;
    auto saved = Save(state, root_ + "/c", comm, options);
    ASSERT_TRUE(saved.ok()) << saved.status().ToString();
    EXPECT_FALSE(saved->plan_reused);
  });
  EXPECT_NE(Parts("b"), Parts("c"));
  std::vector<std::vector<OwnedTarget>> loaded;
  for (const Status& s : Load3("c", &loaded)) ASSERT_TRUE(s.ok()) << s.ToString();
  for (const auto& rank : loaded) {
    for (const OwnedTarget& t : rank) EXPECT_TRUE(MatchesOracle(t)) << t.target.key;
  }
}

}  // namespace
}  // namespace shardsafe
