#include <gtest/gtest.h>
#include <gmock/gmock.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "engine/load/source.h"
#include "format/index.h"
#include "shardsafe/source.h"
#include "testing/test_util.h"

namespace shardsafe {
namespace {

using ::testing::HasSubstr;
using Json = nlohmann::json;

Slice Rows(uint64_t begin, uint64_t end, uint64_t cols) {
  return {Box{{begin, 0}, {end - begin, cols}}, std::nullopt};
}
Slice Cols(uint64_t rows, uint64_t begin, uint64_t end) {
  return {Box{{0, begin}, {rows, end - begin}}, std::nullopt};
}
Slice Whole(const Shape& s) { return {Box::Whole(s), std::nullopt}; }
Slice Flat(const Shape& s, uint64_t b, uint64_t e) { return {Box::Whole(s), FlatRange{b, e}}; }

std::vector<std::string> ListNames(const std::string& dir) {
  std::vector<std::string> out;
  for (auto& e : std::filesystem::directory_iterator(dir)) out.push_back(e.path().filename());
  std::sort(out.begin(), out.end());
  return out;
}

class SaveLoadTest : public ::testing::Test {
 protected:
  void SetUp() override { root_ = testing::MakeTempDir("saveload"); }
  void TearDown() override { std::filesystem::remove_all(root_); }
  std::string Path(const std::string& tag) { return root_ + "/" + tag; }

  // Saves `shards[r]` from rank r, returning each rank's status.
  std::vector<Status> SaveFromRanks(const std::vector<std::vector<OwnedShard>>& shards,
                                    const std::string& path, SaveOptions options = {}) {
    std::vector<Status> out(shards.size());
    RunRanks(static_cast<int>(shards.size()), [&](int r, Comm& comm) {
      SaveState state;
      for (const auto& s : shards[r]) state.tensors.push_back(s.View());
      state.values = R"({"step": 7})";
      out[r] = Save(state, path, comm, options).status();
    });
    return out;
  }

  // Loads targets[r] on rank r; returns each rank's result status.
  std::vector<Status> LoadToRanks(std::vector<std::vector<OwnedTarget>>& targets,
                                  const std::string& path, LoadOptions options = {},
                                  std::vector<LoadResult>* results = nullptr) {
    std::vector<Status> out(targets.size());
    if (results) results->resize(targets.size());
    RunRanks(static_cast<int>(targets.size()), [&](int r, Comm& comm) {
      LoadRequest req;
      for (auto& t : targets[r]) req.tensors.push_back(t.target);
      auto res = Load(req, path, comm, options);
      out[r] = res.status();
      if (res.ok() && results) (*results)[r] = std::move(*res);
    });
    return out;
  }

  // Saves the F32 tensor "w" of shape `s`, whole from one rank, as Path("ck").
  Status SaveWholeW(const Shape& s) {
    std::vector<std::vector<OwnedShard>> save(1);
    save[0].push_back(MakeShard("w", DType::kF32, s, Whole(s)));
    return SaveFromRanks(save, Path("ck"))[0];
  }

  // Options for a round of `for (bool cached : {false, true})`: the cold
  // round reads buffered, filling the page cache for the cached one.
  static LoadOptions ColdThenCached(bool cached) {
    LoadOptions options;
    options.direct_io = !cached;
    return options;
  }

  // Whether the page cache holds all of the data buffer of safetensors file
  // `file` (its header, read once at open, need not be there).
  static bool DataCached(const std::string& file) {
    uint64_t size = 0;
    auto header = ReadSafetensorsHeader(*DefaultFileSystem(), file, &size);
    const ReadOptions direct{.direct = true, .within = ""};
    auto reader = DefaultFileSystem()->NewRandomAccessFile(file, direct);
    if (!header.ok() || !reader.ok()) return false;
    return (*reader)->FullyCached(header->data_start(), size - header->data_start());
  }

  // Whether `file`'s data is in the page cache, after reading it through
  // the cache again (a few times at most) where some of it was evicted in
  // the meantime (memory pressure; a host that reclaims idle file pages).
  static bool EnsureDataCached(const std::string& file) {
    for (int attempt = 0; attempt < 5; ++attempt) {
      if (DataCached(file)) return true;
      std::ifstream in(file, std::ios::binary);
      std::vector<char> block(1 << 20);
      while (in.read(block.data(), static_cast<std::streamsize>(block.size()))) {
      }
    }
    return DataCached(file);
  }

  // Loads `slice` of the F32 tensor "w" of shape `s` from Path("ck") as F64
  // on one rank and expects the values of `narrow` (the same slice loaded as
  // F32), NaN where it has NaN (the oracle's bytes make some).
  void ExpectWidenedLoadMatches(const Shape& s, const Slice& slice, const OwnedTarget& narrow,
                                LoadOptions options) {
    std::vector<double> wide(slice.NumElements());
    LoadRequest req;
    req.tensors.push_back({"w", DType::kF64, s, slice, wide.data()});
    options.convert_dtypes = true;
    auto comm = MakeSingleProcessComm();
    ASSERT_TRUE(Load(req, Path("ck"), *comm, options).ok());
    const auto* f32 = reinterpret_cast<const float*>(narrow.buffer.data());
    for (size_t i = 0; i < wide.size(); ++i) {
      ASSERT_TRUE(wide[i] == f32[i] || (std::isnan(wide[i]) && std::isnan(f32[i])))
          << i << ": " << wide[i] << " vs " << f32[i];
    }
  }

  std::string root_;
};

TEST_F(SaveLoadTest, SingleRankCheckpointIsAPlainSafetensorsFile) {
  const Shape a{4, 6}, b{5};
  auto comm = MakeSingleProcessComm();
  std::vector<OwnedShard> shards = {MakeShard("a", DType::kF32, a, Whole(a)),
                                    MakeShard("b", DType::kBF16, b, Whole(b))};
  SaveState state;
  for (auto& s : shards) state.tensors.push_back(s.View());
  ASSERT_TRUE(Save(state, Path("one"), *comm, {}).ok());
  EXPECT_THAT(ListNames(Path("one")),
              ::testing::ElementsAre("commit.json", "data-00000-000.safetensors",
                                     "shardsafe.json"));
  uint64_t size = 0;
  auto header = ReadSafetensorsHeader(*DefaultFileSystem(),
                                      Path("one") + "/data-00000-000.safetensors", &size);
  ASSERT_TRUE(header.ok()) << header.status().ToString();
  ASSERT_EQ(header->entries.size(), 2u);
  EXPECT_EQ(header->entries[0].name, "a");  // F32 sorts before BF16
  EXPECT_EQ(header->entries[1].name, "b");
  EXPECT_EQ(header->metadata->at("format"), "pt");
}

TEST_F(SaveLoadTest, TensorParallelSaveLoadsIntoOtherSplit) {
  const Shape s{8, 6};
  // Save: 4 ranks, TP=2 by rows x DP=2 (replicas).
  std::vector<std::vector<OwnedShard>> save(4);
  for (int r = 0; r < 4; ++r) {
    const uint64_t tp = r % 2;
    save[r].push_back(MakeShard("w", DType::kF32, s, Rows(tp * 4, tp * 4 + 4, 6)));
  }
  for (const Status& st : SaveFromRanks(save, Path("tp"))) ASSERT_TRUE(st.ok()) << st.ToString();
  // Load: 3 ranks, uneven column split.
  std::vector<std::vector<OwnedTarget>> load(3);
  const uint64_t cuts[] = {0, 1, 4, 6};
  for (int r = 0; r < 3; ++r) load[r].push_back(MakeTarget("w", DType::kF32, s, Cols(8, cuts[r], cuts[r + 1])));
  std::vector<LoadResult> results;
  for (const Status& st : LoadToRanks(load, Path("tp"), {}, &results)) ASSERT_TRUE(st.ok()) << st.ToString();
  for (auto& ranks : load) EXPECT_TRUE(MatchesOracle(ranks[0]));
  EXPECT_EQ(Json::parse(results[0].values)["step"], 7);
  EXPECT_EQ(results[0].saved_world_size, 4);
}

TEST_F(SaveLoadTest, ReplicasAreWrittenOnceAndSpreadOverHolders) {
  const Shape s{64, 64};
  std::vector<std::vector<OwnedShard>> save(4);
  for (int r = 0; r < 4; ++r) {
    for (int t = 0; t < 8; ++t) {
      save[r].push_back(MakeShard("t" + std::to_string(t), DType::kF32, s, Whole(s)));
    }
  }
  std::vector<SaveStats> stats(4);
  RunRanks(4, [&](int r, Comm& comm) {
    SaveState state;
    for (auto& sh : save[r]) state.tensors.push_back(sh.View());
    stats[r] = *Save(state, Path("rep"), comm, {});
  });
  const uint64_t one = 64 * 64 * 4;
  EXPECT_EQ(stats[0].unique_bytes, 8 * one);
  for (int r = 0; r < 4; ++r) EXPECT_EQ(stats[r].bytes_written, 2 * one) << r;
}

// A replica larger than the split size (4 MiB here) is written in pieces,
// one per holder, and loads back whole; a holder whose copy differs fails
// the save, naming the slice and the ranks.
TEST_F(SaveLoadTest, ALargeReplicaIsWrittenInPiecesByItsHolders) {
  const Shape s{2048, 4096};  // F32: 32 MiB
  std::vector<std::vector<OwnedShard>> save(2);
  for (int r = 0; r < 2; ++r) save[r].push_back(MakeShard("big", DType::kF32, s, Whole(s)));
  std::vector<SaveStats> stats(2);
  RunRanks(2, [&](int r, Comm& comm) {
    SaveState state;
    state.tensors.push_back(save[r][0].View());
    stats[r] = *Save(state, Path("cut"), comm, {});
  });
  for (int r = 0; r < 2; ++r) EXPECT_EQ(stats[r].bytes_written, uint64_t{16} << 20) << r;
  auto src = OpenSource(*DefaultFileSystem(), Path("cut"));
  ASSERT_TRUE(src.ok()) << src.status().ToString();
  const CheckpointIndex* index = &src->index;
  const IndexTensor& big = index->tensors.at("big");
  ASSERT_EQ(big.chunks.size(), 2u);
  EXPECT_NE(index->files[big.chunks[0].file].rank, index->files[big.chunks[1].file].rank);
  std::vector<std::vector<OwnedTarget>> load(1);
  load[0].push_back(MakeTarget("big", DType::kF32, s, Whole(s)));
  for (const Status& st : LoadToRanks(load, Path("cut"), {})) ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_TRUE(MatchesOracle(load[0][0]));

  save[1][0].bytes[(uint64_t{24} << 20) + 3] ^= std::byte{1};  // in the second piece
  for (const Status& st : SaveFromRanks(save, Path("differ"))) {
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.ToString();
    EXPECT_THAT(st.message(), HasSubstr("tensor \"big\": ranks 0, 1 hold different bytes for "
                                        "the same slice [0:2048, 0:4096]"));
  }
  EXPECT_THAT(ListNames(root_), ::testing::ElementsAre("cut"));
}

// A save whose layout is every rank's previous one reuses the plan after one
// small agreement; any change on any rank (a slice, a blob's size, the file
// cap) plans again, and disagreements are still named.
TEST_F(SaveLoadTest, RepeatedSavesOfAnUnchangedLayoutReuseThePlan) {
  const Shape s{12, 8};
  std::vector<int> reused(3);
  int saves = 0;
  auto save = [&](const std::string& tag, auto edit) {
    ++saves;
    std::vector<Status> out(3);
    RunRanks(3, [&](int r, Comm& comm) {
      std::vector<OwnedShard> shards;
      shards.push_back(MakeShard("w", DType::kF32, s, Rows(4 * r, 4 * r + 4, 8)));
      shards.push_back(MakeShard("b", DType::kF32, {8}, Whole({8})));
      std::string blob(16, char('a' + r));
      SaveState state;
      for (auto& sh : shards) state.tensors.push_back(sh.View());
      state.blobs.push_back({"rng", blob.data(), blob.size(), true});
      state.values = R"({"step": 1})";
      SaveOptions options;
      std::string path = Path(tag);
      edit(r, state, options, blob, path);
      auto stats = Save(state, path, comm, options);
      out[r] = stats.status();
      reused[r] = stats.ok() ? stats->plan_reused : -1;
    });
    return out;
  };
  auto same = [](int, SaveState&, SaveOptions&, std::string&, std::string&) {};
  auto expect = [&](const std::vector<Status>& out, int want) {
    SCOPED_TRACE("save " + std::to_string(saves));
    for (int r = 0; r < 3; ++r) {
      EXPECT_TRUE(out[r].ok()) << out[r].ToString();
      EXPECT_EQ(reused[r], want) << "rank " << r;
    }
  };
  expect(save("a", same), 0);
  expect(save("b", same), 1);
  // Rank 2 saves one tensor more, then rank 1 a longer blob, then all ranks
  // change the file cap: each plans again, and so does the save after.
  std::vector<OwnedShard> extra;
  extra.push_back(MakeShard("extra", DType::kF32, {4}, Whole({4})));
  expect(save("c", [&](int r, SaveState& st, SaveOptions&, std::string&, std::string&) {
    if (r == 2) st.tensors.push_back(extra[0].View());
  }), 0);
  expect(save("d", same), 0);
  expect(save("e", [](int r, SaveState& st, SaveOptions&, std::string& blob, std::string&) {
    if (r == 1) {
      blob += "x";  // may move its bytes: the blob is described again
      st.blobs[0] = {"rng", blob.data(), blob.size(), true};
    }
  }), 0);
  expect(save("f", same), 0);
  expect(save("g", same), 1);
  expect(save("h", [](int, SaveState&, SaveOptions& o, std::string&, std::string&) {
    o.max_file_bytes = 1 << 20;
  }), 0);
  expect(save("h2", same), 0);  // the default cap again
  // Values that differ, and destinations that differ, are still caught and
  // named, though every rank's layout is the cached one.
  for (const Status& st : save("i", [](int r, SaveState& state, SaveOptions&, std::string&,
                                        std::string&) {
         if (r == 1) state.values = R"({"step": 2})";
       })) {
    EXPECT_THAT(st.message(), HasSubstr("value \"step\" differs between ranks 0 and 1"));
  }
  for (const Status& st : save("j", [&](int r, SaveState&, SaveOptions&, std::string&,
                                        std::string& path) { path = Path("j" + std::to_string(r)); })) {
    EXPECT_THAT(st.message(), HasSubstr("rank 0 saves to"));
  }
  expect(save("k", same), 1);  // the failed saves left the cached plan as it was
  // Every checkpoint holds what was saved.
  std::vector<std::vector<OwnedTarget>> load(1);
  load[0].push_back(MakeTarget("w", DType::kF32, s, Whole(s)));
  for (const char* tag : {"b", "g"}) {
    for (const Status& st : LoadToRanks(load, Path(tag), {})) ASSERT_TRUE(st.ok()) << st.ToString();
    EXPECT_TRUE(MatchesOracle(load[0][0])) << tag;
  }
}

// Four ranks, each passing the whole of "same" and "embed": replicas.
std::vector<std::vector<OwnedShard>> FourReplicas() {
  const Shape s{64, 16};
  std::vector<std::vector<OwnedShard>> save(4);
  for (int r = 0; r < 4; ++r) {
    save[r].push_back(MakeShard("same", DType::kF32, s, Whole(s)));
    save[r].push_back(MakeShard("embed", DType::kF32, s, Whole(s)));
  }
  return save;
}

TEST_F(SaveLoadTest, ReplicasThatDifferFailTheSaveNamingTheKeyAndRanks) {
  std::vector<std::vector<OwnedShard>> save = FourReplicas();
  save[2][1].bytes[100] ^= std::byte{1};  // rank 2's "replica" holds other data
  for (bool verify : {true, false}) {
    SaveOptions options;
    options.verify_replicas = verify;
    const std::string path = Path(verify ? "checked" : "unchecked");
    for (const Status& st : SaveFromRanks(save, path, options)) {
      if (!verify) {
        EXPECT_TRUE(st.ok()) << st.ToString();  // the caller vouched for its replicas
        continue;
      }
      EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.ToString();
      EXPECT_THAT(st.message(), HasSubstr("tensor \"embed\": ranks 0 and 2 hold different bytes"));
    }
  }
  EXPECT_THAT(ListNames(root_), ::testing::ElementsAre("unchecked"));
}

// The same on a repeated save, whose reports are compact.
TEST_F(SaveLoadTest, ReplicasThatDifferFailARepeatedSaveToo) {
  std::vector<std::vector<OwnedShard>> save = FourReplicas();
  for (const Status& st : SaveFromRanks(save, Path("first"), {})) {
    EXPECT_TRUE(st.ok()) << st.ToString();
  }
  save[2][1].bytes[100] ^= std::byte{1};
  for (const Status& st : SaveFromRanks(save, Path("second"), {})) {
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.ToString();
    EXPECT_THAT(st.message(), HasSubstr("tensor \"embed\": ranks 0 and 2 hold different bytes"));
  }
  EXPECT_THAT(ListNames(root_), ::testing::ElementsAre("first"));
}

TEST_F(SaveLoadTest, ValuesThatDifferAndDestinationsThatDifferFailTheSave) {
  std::vector<Status> out(3);
  auto save_with = [&](auto edit) {
    RunRanks(3, [&](int r, Comm& comm) {
      SaveState state;
      Json values = {{"step", 7}};
      std::string path = Path("v");
      edit(r, values, path);
      state.values = values.dump();
      out[r] = Save(state, path, comm, {}).status();
    });
  };
  save_with([](int r, Json& values, std::string&) { values["loader"] = r == 2 ? 5 : 4; });
  for (const Status& st : out) {
    EXPECT_THAT(st.message(), HasSubstr("value \"loader\" differs between ranks 0 and 2"));
  }
  save_with([](int r, Json& values, std::string&) {
    if (r == 1) values["rank1_only"] = 1;
  });
  for (const Status& st : out) {
    EXPECT_THAT(st.message(),
                HasSubstr("value \"rank1_only\" is passed by rank 1 but not by rank 0"));
  }
  save_with([&](int r, Json&, std::string& path) { path = Path("v" + std::to_string(r)); });
  for (const Status& st : out) {
    EXPECT_THAT(st.message(), HasSubstr("rank 0 saves to \"" + Path("v0") + "\", rank 1 to \"" +
                                        Path("v1") + "\""));
  }
  EXPECT_TRUE(ListNames(root_).empty());
  // Ranks that pass fewer values than rank 0 lose nothing: allowed.
  save_with([](int r, Json& values, std::string&) {
    if (r == 0) values["only_rank0"] = true;
  });
  for (const Status& st : out) EXPECT_TRUE(st.ok()) << st.ToString();
}

// User JSON is text at the API: checked on every rank, saved in one
// canonical form (compact, keys sorted), returned as that text.
TEST_F(SaveLoadTest, UserJsonIsCheckedAndSavedCanonically) {
  auto save = [&](const std::string& values, const std::string& metadata, const std::string& tag) {
    SaveState state;
    state.values = values;
    state.metadata = metadata;
    return Save(state, Path(tag), *MakeSingleProcessComm(), {}).status();
  };
  Status st = save(R"({"step": 1)", "", "a");
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(st.message(), HasSubstr("values: not valid JSON text"));
  EXPECT_THAT(save("[1, 2]", "", "a").message(), HasSubstr("values: not a JSON object"));
  EXPECT_THAT(save("{}", "{'a': 1}", "a").message(), HasSubstr("metadata: not valid JSON text"));
  EXPECT_TRUE(ListNames(root_).empty());

  ASSERT_TRUE(save(R"( {"z": [1, 2.5], "a": {"y": null, "b": "\u00e9"}} )", "", "b").ok());
  auto res = Load({}, Path("b"), *MakeSingleProcessComm(), {});
  ASSERT_TRUE(res.ok()) << res.status().ToString();
  EXPECT_EQ(res->values,
            std::string(R"({"a":{"b":")") + "\xc3\xa9" + R"(","y":null},"z":[1,2.5]})");
  EXPECT_EQ(res->metadata, "null");
  EXPECT_EQ(res->layout, "null");
}

TEST_F(SaveLoadTest, FlatZeroShardsLoadAsBoxesAndBack) {
  const Shape s{10, 7};
  std::vector<std::vector<OwnedShard>> save(3);
  const uint64_t cuts[] = {0, 13, 50, 70};
  for (int r = 0; r < 3; ++r) save[r].push_back(MakeShard("m", DType::kF64, s, Flat(s, cuts[r], cuts[r + 1])));
  for (const Status& st : SaveFromRanks(save, Path("flat"))) ASSERT_TRUE(st.ok()) << st.ToString();
  std::vector<std::vector<OwnedTarget>> load(2);
  load[0].push_back(MakeTarget("m", DType::kF64, s, Rows(0, 3, 7)));
  load[0].push_back(MakeTarget("m", DType::kF64, s, Flat(s, 5, 66)));
  load[1].push_back(MakeTarget("m", DType::kF64, s, Cols(10, 2, 5)));
  for (const Status& st : LoadToRanks(load, Path("flat"))) ASSERT_TRUE(st.ok()) << st.ToString();
  for (auto& ranks : load) for (auto& t : ranks) EXPECT_TRUE(MatchesOracle(t));
}

TEST_F(SaveLoadTest, ScalarsAndZeroSizeTensors) {
  const Shape scalar{}, empty{3, 0, 2};
  std::vector<std::vector<OwnedShard>> save(2);
  for (int r = 0; r < 2; ++r) {
    save[r].push_back(MakeShard("step", DType::kI64, scalar, Whole(scalar)));
    save[r].push_back(MakeShard("empty", DType::kF16, empty, Whole(empty)));
  }
  for (const Status& st : SaveFromRanks(save, Path("tiny"))) ASSERT_TRUE(st.ok()) << st.ToString();
  std::vector<std::vector<OwnedTarget>> load(1);
  load[0].push_back(MakeTarget("step", DType::kI64, scalar, Whole(scalar)));
  load[0].push_back(MakeTarget("empty", DType::kF16, empty, Whole(empty)));
  for (const Status& st : LoadToRanks(load, Path("tiny"))) ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_TRUE(MatchesOracle(load[0][0]));
  EXPECT_TRUE(MatchesOracle(load[0][1]));
}

TEST_F(SaveLoadTest, OverlapIsAnErrorOnEveryRankAndNothingIsCommitted) {
  const Shape s{8, 4};
  std::vector<std::vector<OwnedShard>> save(2);
  save[0].push_back(MakeShard("w", DType::kF32, s, Rows(0, 5, 4)));
  save[1].push_back(MakeShard("w", DType::kF32, s, Rows(4, 8, 4)));
  for (const Status& st : SaveFromRanks(save, Path("bad"))) {
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
    EXPECT_THAT(st.message(), HasSubstr("overlap"));
  }
  EXPECT_TRUE(ListNames(root_).empty());
}

TEST_F(SaveLoadTest, GapAndDtypeDisagreementAreErrors) {
  const Shape s{8, 4};
  std::vector<std::vector<OwnedShard>> gap(2);
  gap[0].push_back(MakeShard("w", DType::kF32, s, Rows(0, 3, 4)));
  gap[1].push_back(MakeShard("w", DType::kF32, s, Rows(4, 8, 4)));
  for (const Status& st : SaveFromRanks(gap, Path("gap"))) {
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
    EXPECT_THAT(st.message(), HasSubstr("\"w\""));
  }
  std::vector<std::vector<OwnedShard>> dtypes(2);
  dtypes[0].push_back(MakeShard("w", DType::kF32, s, Rows(0, 4, 4)));
  dtypes[1].push_back(MakeShard("w", DType::kBF16, s, Rows(4, 8, 4)));
  for (const Status& st : SaveFromRanks(dtypes, Path("dt"))) {
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  }
  EXPECT_TRUE(ListNames(root_).empty());
}

TEST_F(SaveLoadTest, ExistingCheckpointIsNotOverwrittenUnlessAsked) {
  const Shape s{4};
  std::vector<std::vector<OwnedShard>> save(1);
  save[0].push_back(MakeShard("x", DType::kU8, s, Whole(s)));
  ASSERT_TRUE(SaveFromRanks(save, Path("ck"))[0].ok());
  EXPECT_EQ(SaveFromRanks(save, Path("ck"))[0].code(), StatusCode::kAlreadyExists);
  // The overwrite holds another tensor: the new checkpoint must be the one
  // in place, the old one gone, and nothing else left in the root.
  std::vector<std::vector<OwnedShard>> replacement(1);
  replacement[0].push_back(MakeShard("y", DType::kU8, s, Whole(s)));
  SaveOptions over;
  over.overwrite = true;
  Status st = SaveFromRanks(replacement, Path("ck"), over)[0];
  EXPECT_TRUE(st.ok()) << st.ToString();
  EXPECT_THAT(ListNames(root_), ::testing::ElementsAre("ck"));
  std::vector<std::vector<OwnedTarget>> load(1);
  load[0].push_back(MakeTarget("y", DType::kU8, s, Whole(s)));
  LoadOptions partial;
  partial.allow_partial = true;
  std::vector<LoadResult> results;
  ASSERT_TRUE(LoadToRanks(load, Path("ck"), partial, &results)[0].ok());
  EXPECT_TRUE(MatchesOracle(load[0][0]));
  EXPECT_TRUE(results[0].unexpected.empty()) << "old tensor \"x\" still there";
}

TEST_F(SaveLoadTest, BadTagsAreRejected) {
  std::vector<std::vector<OwnedShard>> save(1);
  for (std::string tag : {"..", ".hidden", "a b", "latest", "x\ny"}) {
    EXPECT_EQ(SaveFromRanks(save, Path(tag))[0].code(), StatusCode::kInvalidArgument) << tag;
  }
}

TEST_F(SaveLoadTest, MissingShapeAndDtypeMismatchesAreClearErrors) {
  const Shape s{4, 4};
  ASSERT_TRUE(SaveWholeW(s).ok());

  std::vector<std::vector<OwnedTarget>> missing(1);
  missing[0].push_back(MakeTarget("nope", DType::kF32, s, Whole(s)));
  Status st = LoadToRanks(missing, Path("ck"))[0];
  EXPECT_EQ(st.code(), StatusCode::kNotFound);
  EXPECT_THAT(st.message(), HasSubstr("nope"));

  LoadOptions partial;
  partial.allow_partial = true;
  std::vector<LoadResult> results;
  ASSERT_TRUE(LoadToRanks(missing, Path("ck"), partial, &results)[0].ok());
  EXPECT_THAT(results[0].missing, ::testing::ElementsAre("nope"));
  EXPECT_THAT(results[0].unexpected, ::testing::ElementsAre("w"));

  std::vector<std::vector<OwnedTarget>> shape(1);
  shape[0].push_back(MakeTarget("w", DType::kF32, {4, 5}, Whole({4, 5})));
  st = LoadToRanks(shape, Path("ck"))[0];
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(st.message(), HasSubstr("[4, 4]"));
  EXPECT_THAT(st.message(), HasSubstr("[4, 5]"));
  EXPECT_EQ(st.detail(), ErrorDetail::kShapeMismatch);

  std::vector<std::vector<OwnedTarget>> dtype(1);
  dtype[0].push_back(MakeTarget("w", DType::kF64, s, Whole(s)));
  st = LoadToRanks(dtype, Path("ck"))[0];
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(st.message(), HasSubstr("dtype mismatch"));
  EXPECT_EQ(st.detail(), ErrorDetail::kDTypeMismatch);
  // Refused before any read: no target was touched, and none is named.
  EXPECT_THAT(st.message(), ::testing::Not(HasSubstr("may be partly overwritten")));
}

TEST_F(SaveLoadTest, DtypeConversionOnLoadWhenAllowed) {
  const Shape s{3};
  const float values[3] = {1.5f, -2.25f, 1e30f};
  SaveState state;
  state.tensors.push_back({"f", DType::kF32, s, Whole(s), values});
  auto comm = MakeSingleProcessComm();
  ASSERT_TRUE(Save(state, Path("conv"), *comm, {}).ok());
  double out[3];
  int32_t ints[3];
  LoadRequest req;
  req.tensors.push_back({"f", DType::kF64, s, Whole(s), out});
  LoadOptions opts;
  opts.convert_dtypes = true;
  ASSERT_TRUE(Load(req, Path("conv"), *comm, opts).ok());
  EXPECT_EQ(out[0], 1.5);
  EXPECT_EQ(out[1], -2.25);
  req.tensors[0] = {"f", DType::kI32, s, Whole(s), ints};
  ASSERT_TRUE(Load(req, Path("conv"), *comm, opts).ok());
  EXPECT_EQ(ints[0], 1);
  EXPECT_EQ(ints[1], -2);
  EXPECT_EQ(ints[2], INT32_MAX);  // saturated
}

TEST_F(SaveLoadTest, ConversionOfALargeTensorStreamsThroughBoundedScratch) {
  const Shape s{1 << 18};
  std::vector<float> values(s[0]);
  for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(i) * 0.5f - 7;
  SaveState state;
  state.tensors.push_back({"f", DType::kF32, s, Whole(s), values.data()});
  auto comm = MakeSingleProcessComm();
  ASSERT_TRUE(Save(state, Path("big"), *comm, {}).ok());
  std::vector<double> out(s[0]);
  LoadRequest req;
  req.tensors.push_back({"f", DType::kF64, s, Whole(s), out.data()});
  LoadOptions opts;
  opts.convert_dtypes = true;
  opts.scratch_bytes = 4096;  // far smaller than the 1 MiB tensor
  auto res = Load(req, Path("big"), *comm, opts);
  ASSERT_TRUE(res.ok()) << res.status().ToString();
  EXPECT_EQ(res->chunks_verified, 1u);
  for (size_t i = 0; i < values.size(); ++i) ASSERT_EQ(out[i], values[i]) << i;
}

TEST_F(SaveLoadTest, CorruptByteIsDetectedAndNamed) {
  const Shape s{256};
  ASSERT_TRUE(SaveWholeW(s).ok());
  const std::string file = Path("ck") + "/data-00000-000.safetensors";
  {
    std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-10, std::ios::end);
    f.put('\x5a');
  }
  std::vector<std::vector<OwnedTarget>> load(1);
  load[0].push_back(MakeTarget("w", DType::kF32, s, Whole(s)));
  Status st = LoadToRanks(load, Path("ck"))[0];
  EXPECT_EQ(st.code(), StatusCode::kDataLoss);
  EXPECT_THAT(st.message(), HasSubstr("checksum mismatch"));
  EXPECT_THAT(st.message(), HasSubstr("data-00000-000.safetensors"));
  EXPECT_THAT(st.message(), HasSubstr("\"w\""));
  LoadOptions unverified;
  unverified.verify_checksums = false;
  EXPECT_TRUE(LoadToRanks(load, Path("ck"), unverified)[0].ok());
}

// Data wholly in the page cache is read in cache-sized steps, each
// checksummed right after its copy: straight reads of one large tensor, and
// batches of a scattered read over many tensors. A corrupt byte in the
// first, a middle or the last step is found.
TEST_F(SaveLoadTest, CorruptByteInCachedDataIsFoundInEveryStep) {
  struct Layout {
    int tensors;
    uint64_t elems;  // F32 per tensor
  };
  for (const Layout l : {Layout{1, 3 << 18}, Layout{48, 16 << 10}}) {  // 3 MiB either way
    const std::string ck = Path("ck" + std::to_string(l.tensors));
    const Shape s{l.elems};
    std::vector<std::vector<OwnedShard>> save(1);
    std::vector<std::vector<OwnedTarget>> load(1);
    for (int i = 0; i < l.tensors; ++i) {
      save[0].push_back(MakeShard("w" + std::to_string(i), DType::kF32, s, Whole(s)));
      load[0].push_back(MakeTarget("w" + std::to_string(i), DType::kF32, s, Whole(s)));
    }
    ASSERT_TRUE(SaveFromRanks(save, ck)[0].ok());
    LoadOptions buffered;  // fills the page cache
    buffered.direct_io = false;
    std::vector<LoadResult> results;
    ASSERT_TRUE(LoadToRanks(load, ck, buffered, &results)[0].ok());
    EXPECT_EQ(results[0].chunks_verified, static_cast<uint64_t>(l.tensors));
    for (const OwnedTarget& t : load[0]) EXPECT_TRUE(MatchesOracle(t));
    const std::string file = ck + "/data-00000-000.safetensors";
    const auto size = std::filesystem::file_size(file);
    ASSERT_TRUE(EnsureDataCached(file)) << "the stepped path would not run";
    for (uint64_t from_end : {uint64_t{3} << 20, uint64_t{3} << 19, uint64_t{5}}) {
      FlipByte(file, size - from_end, 0x10);
      Status st = LoadToRanks(load, ck)[0];
      EXPECT_EQ(st.code(), StatusCode::kDataLoss) << l.tensors << " " << from_end;
      EXPECT_THAT(st.message(), HasSubstr("checksum mismatch"));
      // A load that failed midway names the targets it may have changed.
      EXPECT_THAT(st.message(), HasSubstr("; this rank's targets may be partly overwritten: w0"));
      FlipByte(file, size - from_end, 0x10);
    }
    results.clear();
    ASSERT_TRUE(LoadToRanks(load, ck, {}, &results)[0].ok());  // restored: all verified again
    EXPECT_EQ(results[0].chunks_verified, static_cast<uint64_t>(l.tensors));
  }
}

// Many small tensors share one coalesced read (one group, many whole
// chunks, a scattered read into every destination): a corrupt byte in any
// of them is still found and the right tensor named.
TEST_F(SaveLoadTest, CorruptByteAmongManySmallTensorsIsNamed) {
  constexpr int kTensors = 300;
  const Shape s{7, 5};  // 140 bytes: chunks straddle each other's alignment
  std::vector<std::vector<OwnedShard>> save(1);
  for (int i = 0; i < kTensors; ++i) {
    save[0].push_back(MakeShard("t" + std::to_string(1000 + i), DType::kF32, s, Whole(s)));
  }
  ASSERT_TRUE(SaveFromRanks(save, Path("ck"))[0].ok());
  const std::string file = Path("ck") + "/data-00000-000.safetensors";
  const auto file_size = std::filesystem::file_size(file);
  const uint64_t payload = uint64_t{kTensors} * 140;
  for (int victim : {0, 151, kTensors - 1}) {
    const uint64_t at = file_size - payload + static_cast<uint64_t>(victim) * 140 + 77;
    FlipByte(file, at, 0x40);
    std::vector<std::vector<OwnedTarget>> load(1);
    for (int i = 0; i < kTensors; ++i) {
      load[0].push_back(MakeTarget("t" + std::to_string(1000 + i), DType::kF32, s, Whole(s)));
    }
    Status st = LoadToRanks(load, Path("ck"))[0];
    EXPECT_EQ(st.code(), StatusCode::kDataLoss) << victim;
    EXPECT_THAT(st.message(), HasSubstr("\"t" + std::to_string(1000 + victim) + "\""));
    FlipByte(file, at, 0x40);
  }
  std::vector<std::vector<OwnedTarget>> load(1);
  for (int i = 0; i < kTensors; ++i) {
    load[0].push_back(MakeTarget("t" + std::to_string(1000 + i), DType::kF32, s, Whole(s)));
  }
  std::vector<LoadResult> results;
  ASSERT_TRUE(LoadToRanks(load, Path("ck"), {}, &results)[0].ok());
  EXPECT_EQ(results[0].chunks_verified, uint64_t{kTensors});
}

// A column split of row-split chunks reads each chunk whole (the gaps
// between its rows are narrow), so every chunk is verified: a corrupt byte
// is found even by the rank whose columns do not hold it.
TEST_F(SaveLoadTest, ColumnSplitLoadVerifiesEveryChunk) {
  const Shape s{64, 512};  // 2 KiB rows
  std::vector<std::vector<OwnedShard>> save(2);
  for (int r = 0; r < 2; ++r) {
    save[r].push_back(MakeShard("w", DType::kF32, s, Rows(r * 32, r * 32 + 32, 512)));
  }
  ASSERT_TRUE(SaveFromRanks(save, Path("ck"))[0].ok());
  std::vector<std::vector<OwnedTarget>> load(2);
  for (int r = 0; r < 2; ++r) {
    load[r].push_back(MakeTarget("w", DType::kF32, s, Cols(64, r * 256, r * 256 + 256)));
  }
  std::vector<LoadResult> results;
  for (const Status& st : LoadToRanks(load, Path("ck"), {}, &results)) {
    ASSERT_TRUE(st.ok()) << st.ToString();
  }
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(results[r].chunks_verified, 2u) << r;
    EXPECT_TRUE(MatchesOracle(load[r][0])) << r;
  }
  // Column 300 of row 40: rank 1's columns, rank 1's saved rows.
  const std::string file = Path("ck") + "/data-00001-000.safetensors";
  const uint64_t at = std::filesystem::file_size(file) - 32 * 2048 + 8 * 2048 + 300 * 4;
  FlipByte(file, at, 0x40);
  for (const Status& st : LoadToRanks(load, Path("ck"))) {
    EXPECT_EQ(st.code(), StatusCode::kDataLoss) << st.ToString();
    EXPECT_THAT(st.message(), HasSubstr("checksum mismatch"));
    EXPECT_THAT(st.message(), HasSubstr("data-00001-000.safetensors"));
  }
}

// Rows of a few hundred bytes (a column split of a narrow tensor) are read
// through scratch in steps, each checksummed and copied out: with the data
// in the page cache (several steps) or not (one), with and without dtype
// conversion; a corrupt byte in the last step is found.
TEST_F(SaveLoadTest, ShortRowsAreReadThroughScratchInSteps) {
  const Shape s{8192, 64};  // 256-byte rows, 2 MiB: four 512 KiB steps when cached
  ASSERT_TRUE(SaveWholeW(s).ok());
  const std::string file = Path("ck") + "/data-00000-000.safetensors";
  for (const bool cached : {false, true}) {
    LoadOptions options = ColdThenCached(cached);
    std::vector<std::vector<OwnedTarget>> load(1);
    load[0].push_back(MakeTarget("w", DType::kF32, s, Cols(8192, 16, 48)));
    std::vector<LoadResult> results;
    ASSERT_TRUE(LoadToRanks(load, Path("ck"), options, &results)[0].ok()) << cached;
    EXPECT_EQ(results[0].chunks_verified, 1u) << cached;
    EXPECT_TRUE(MatchesOracle(load[0][0])) << cached;
    SCOPED_TRACE(cached ? "cached" : "cold");
    ExpectWidenedLoadMatches(s, Cols(8192, 16, 48), load[0][0], options);
  }
  const auto size = std::filesystem::file_size(file);
  ASSERT_TRUE(EnsureDataCached(file)) << "the stepped path would not run";
  FlipByte(file, size - 3, 0x10);  // a column the load does not want, in the last step
  std::vector<std::vector<OwnedTarget>> load(1);
  load[0].push_back(MakeTarget("w", DType::kF32, s, Cols(8192, 16, 48)));
  Status st = LoadToRanks(load, Path("ck"))[0];
  EXPECT_EQ(st.code(), StatusCode::kDataLoss) << st.ToString();
  EXPECT_THAT(st.message(), HasSubstr("checksum mismatch"));
}

// Column splits of wide rows: each chunk's rows are one strided segment,
// expanded into a scattered read (runs of 4,100 bytes), cut by read windows
// mid-row (a 4.3 MB chunk, 1 MiB windows, 8,200-byte rows), cold and
// cached, and converted (F64) through scratch.
TEST_F(SaveLoadTest, WideColumnSplitThroughWindowsThatCutRows) {
  const Shape s{520, 2050};
  ASSERT_TRUE(SaveWholeW(s).ok());
  for (const bool cached : {false, true}) {
    LoadOptions options = ColdThenCached(cached);
    options.scratch_bytes = 1 << 20;
    std::vector<std::vector<OwnedTarget>> load(2);
    for (int r = 0; r < 2; ++r) {
      load[r].push_back(MakeTarget("w", DType::kF32, s, Cols(520, r * 1025, r * 1025 + 1025)));
    }
    std::vector<LoadResult> results;
    for (const Status& st : LoadToRanks(load, Path("ck"), options, &results)) {
      ASSERT_TRUE(st.ok()) << cached << ": " << st.ToString();
    }
    for (int r = 0; r < 2; ++r) {
      EXPECT_EQ(results[r].chunks_verified, 1u) << cached << " " << r;
      EXPECT_TRUE(MatchesOracle(load[r][0])) << cached << " " << r;
    }
    SCOPED_TRACE(cached ? "cached" : "cold");
    ExpectWidenedLoadMatches(s, Cols(520, 1025, 2050), load[1][0], options);
  }
}

// One rank wanting two column blocks of one chunk: the two wants' rows
// interleave in the file, so their strided segments do too, and the read
// goes through scratch whole, never in steps (which assume rows in file
// order), whether or not the 1 MiB chunk is cached.
TEST_F(SaveLoadTest, InterleavedColumnBlocksOfOneChunk) {
  const Shape s{512, 512};
  ASSERT_TRUE(SaveWholeW(s).ok());
  for (const bool cached : {false, true}) {
    LoadOptions options = ColdThenCached(cached);
    std::vector<std::vector<OwnedTarget>> load(1);
    load[0].push_back(MakeTarget("w", DType::kF32, s, Cols(512, 0, 200)));
    load[0].push_back(MakeTarget("w", DType::kF32, s, Cols(512, 200, 512)));
    std::vector<LoadResult> results;
    ASSERT_TRUE(LoadToRanks(load, Path("ck"), options, &results)[0].ok()) << cached;
    EXPECT_EQ(results[0].chunks_verified, 1u) << cached;
    EXPECT_TRUE(MatchesOracle(load[0][0])) << cached;
    EXPECT_TRUE(MatchesOracle(load[0][1])) << cached;
  }
}

TEST_F(SaveLoadTest, TruncatedDataFileIsDataLoss) {
  const Shape s{1024};
  ASSERT_TRUE(SaveWholeW(s).ok());
  std::filesystem::resize_file(Path("ck") + "/data-00000-000.safetensors", 2000);
  std::vector<std::vector<OwnedTarget>> load(1);
  load[0].push_back(MakeTarget("w", DType::kF32, s, Whole(s)));
  Status st = LoadToRanks(load, Path("ck"))[0];
  EXPECT_EQ(st.code(), StatusCode::kDataLoss) << st.ToString();
}

TEST_F(SaveLoadTest, ValuesAndBlobsRoundTrip) {
  const int n = 3;
  std::vector<std::string> rng(n);
  RunRanks(n, [&](int r, Comm& comm) {
    rng[r] = "rng-state-of-rank-" + std::to_string(r);
    const std::string sampler = "sampler-position";
    SaveState state;
    state.values = Json{{"step", 42}, {"config", {{"lr", 0.001}}}}.dump();
    state.metadata = Json{{"run", "test"}}.dump();
    state.layout = Json{{"dp", n}}.dump();
    state.blobs.push_back({"rng", rng[r].data(), rng[r].size(), true});
    state.blobs.push_back({"sampler", sampler.data(), sampler.size(), false});
    ASSERT_TRUE(Save(state, Path("obj"), comm, {}).ok());
  });
  RunRanks(n, [&](int r, Comm& comm) {
    auto res = Load({}, Path("obj"), comm, {});
    ASSERT_TRUE(res.ok()) << res.status().ToString();
    const Json values = Json::parse(res->values);
    EXPECT_EQ(values["step"], 42);
    EXPECT_EQ(values["config"]["lr"], 0.001);
    EXPECT_EQ(Json::parse(res->metadata)["run"], "test");
    EXPECT_EQ(Json::parse(res->layout)["dp"], n);
    EXPECT_EQ(res->blobs["rng"], rng[r]);
    EXPECT_EQ(res->blobs["sampler"], "sampler-position");
  });
}

TEST_F(SaveLoadTest, LoadsForeignSafetensorsFileAndReportsNotFound) {
  auto comm = MakeSingleProcessComm();
  auto res = Load({}, Path("does-not-exist"), *comm, {});
  EXPECT_EQ(res.status().code(), StatusCode::kNotFound);
  // A data file of a one-rank checkpoint is itself loadable as a file.
  const Shape s{4, 4};
  std::vector<std::vector<OwnedShard>> save(1);
  save[0].push_back(MakeShard("w", DType::kI16, s, Whole(s)));
  ASSERT_TRUE(SaveFromRanks(save, Path("ck"))[0].ok());
  std::vector<std::vector<OwnedTarget>> load(1);
  load[0].push_back(MakeTarget("w", DType::kI16, s, Cols(4, 1, 3)));
  ASSERT_TRUE(LoadToRanks(load, Path("ck") + "/data-00000-000.safetensors")[0].ok());
  EXPECT_TRUE(MatchesOracle(load[0][0]));
}

}  // namespace
}  // namespace shardsafe
