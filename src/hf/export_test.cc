// End-to-end export tests on real files: a checkpoint saved by several
// thread ranks is exported, and every output byte is compared with the
// oracle the shards were made from.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>

#include "format/safetensors.h"
#include "shardsafe/hf.h"
#include "testing/fault_injection.h"
#include "testing/test_util.h"

namespace shardsafe {
namespace {

using ::testing::HasSubstr;

// `n` F32 values as BF16, rounded to nearest even; a NaN stays a NaN (its
// quiet bit set), as every F32 -> BF16 cast in shardsafe does.
std::string F32ToBf16(const std::byte* f32, size_t n) {
  std::string out(n * 2, '\0');
  for (size_t i = 0; i < n; ++i) {
    uint32_t bits;
    std::memcpy(&bits, f32 + 4 * i, 4);
    uint16_t half;
    if ((bits & 0x7FFFFFFFu) > 0x7F800000u) {
      half = static_cast<uint16_t>((bits >> 16) | 0x40);
    } else {
      half = static_cast<uint16_t>((bits + 0x7FFFu + ((bits >> 16) & 1)) >> 16);
    }
    std::memcpy(&out[2 * i], &half, 2);
  }
  return out;
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

bool Exists(const std::string& path) { return DefaultFileSystem()->Stat(path).ok(); }

// The tensors of an output safetensors file: name -> (header entry, bytes).
std::map<std::string, std::pair<SafetensorsEntry, std::string>> ReadSafetensors(
    const std::string& path) {
  const std::string data = ReadAll(path);
  auto n = ParseSafetensorsHeaderLength(std::as_bytes(std::span(data.data(), 8)), data.size());
  EXPECT_TRUE(n.ok());
  auto header = ParseSafetensorsHeader(std::string_view(data).substr(8, *n), data.size());
  EXPECT_TRUE(header.ok()) << header.status().message();
  EXPECT_EQ(header->metadata, (std::map<std::string, std::string>{{"format", "pt"}}));
  std::map<std::string, std::pair<SafetensorsEntry, std::string>> out;
  for (const SafetensorsEntry& e : header->entries) {
    out[e.name] = {e, data.substr(header->data_start() + e.begin, e.end - e.begin)};
  }
  return out;
}

std::string Bytes(const std::vector<std::byte>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size());
}

// A training state of 3 ranks: a column-split F32 matrix bigger than the
// 1 MiB batch (read in pieces), a row-split BF16 matrix, ZeRO-flat F32
// moments, a grouped expert tensor, an I64 tensor, optimizer state to leave
// out, and a saved config.json.
class ExportTest : public ::testing::Test {
 protected:
  static constexpr int kRanks = 3;
  const std::string config_ = R"({"model_type": "llama", "hidden_size": 48})";

  void SetUp() override {
    dir_ = MakeTempDir("export");
    ckpt_ = dir_ + "/ckpt";
    std::vector<std::vector<OwnedShard>> shards(kRanks);
    for (int r = 0; r < kRanks; ++r) {
      const uint64_t cols = 512, c0 = r * cols / kRanks, c1 = (r + 1) * cols / kRanks;
      shards[r].push_back(MakeShard("model.embed.weight", DType::kF32, {1024, cols},
                                    {Box{{0, c0}, {1024, c1 - c0}}, std::nullopt}));
      shards[r].push_back(MakeShard("model.layers.0.w", DType::kBF16, {30, 20},
                                    {Box{{r * 10ull, 0}, {10, 20}}, std::nullopt}));
      const uint64_t f0 = r * 700 / kRanks, f1 = (r + 1) * 700 / kRanks;
      shards[r].push_back(MakeShard("model.layers.1.w", DType::kF32, {35, 20},
                                    {Box::Whole({35, 20}), FlatRange{f0, f1}}));
      shards[r].push_back(MakeShard("model.layers.1.mlp.experts.gate_up_proj", DType::kF32,
                                    {3, 8, 4}, {Box{{r * 1ull, 0, 0}, {1, 8, 4}}, std::nullopt}));
      shards[r].push_back(
          MakeShard("model.count", DType::kI64, {5}, {Box::Whole({5}), std::nullopt}));
      // Sub-byte, 1.5 MB: straddles a 1 MiB window, so it is read whole aside.
      shards[r].push_back(MakeShard("model.fp4", DType::kF4, {1500, 2000},
                                    {Box::Whole({1500, 2000}), std::nullopt}));
      shards[r].push_back(MakeShard("optim.m", DType::kF32, {6}, {Box::Whole({6}), std::nullopt}));
    }
    std::vector<Status> st(kRanks);
    RunRanks(kRanks, [&](int r, Comm& comm) {
      SaveState state;
      for (const OwnedShard& s : shards[r]) state.tensors.push_back(s.View());
      state.blobs.push_back({"file/config.json", config_.data(), config_.size(), false});
      st[r] = Save(state, ckpt_, comm, {}).status();
    });
    for (const Status& s : st) ASSERT_TRUE(s.ok()) << s.message();
  }
  void TearDown() override { DefaultFileSystem()->RemoveAll(dir_).IgnoreError(); }

  std::string Whole(const std::string& key, DType dtype, const Shape& shape) {
    return Bytes(OracleShard(key, dtype, shape, {Box::Whole(shape), std::nullopt}));
  }

  ExportHfOptions Options() {
    ExportHfOptions o;
    o.prefix = "model.";
    o.batch_bytes = 1 << 20;
    return o;
  }

  // Every tensor of the export of the setup's state (prefix "model."),
  // merged over its files.
  std::map<std::string, std::pair<SafetensorsEntry, std::string>> ReadExport(
      const std::string& out, const ExportHfStats& stats) {
    std::map<std::string, std::pair<SafetensorsEntry, std::string>> all;
    for (const std::string& f : stats.files) {
      if (!f.ends_with(".safetensors")) continue;
      auto one = ReadSafetensors(out + "/" + f);
      all.insert(one.begin(), one.end());
    }
    return all;
  }

  std::string dir_, ckpt_;
};

TEST_F(ExportTest, EveryByteMatchesAcrossShardsWithIndexAndConfig) {
  ExportHfOptions o = Options();
  o.max_shard_bytes = 1'000'000;  // the 2 MiB matrix and the fp4 alone, the rest together
  const std::string out = dir_ + "/hf";
  auto stats = ExportHf(ckpt_, out, o);
  ASSERT_TRUE(stats.ok()) << stats.status().message();
  EXPECT_EQ(stats->tensors, 6u);
  EXPECT_EQ(stats->files, (std::vector<std::string>{"model-00001-of-00003.safetensors",
                                                      "model-00002-of-00003.safetensors",
                                                      "model-00003-of-00003.safetensors",
                                                      "model.safetensors.index.json"}));
  EXPECT_EQ(stats->copied, std::vector<std::string>{"config.json"});
  EXPECT_EQ(ReadAll(out + "/config.json"), config_);
  // Every chunk of every exported tensor verified (9 column/row/flat chunks,
  // 3 experts, count and fp4 written once), plus any small chunk a coalesced
  // read happens to span; the column chunks that windows cut in pieces are
  // checked as they stream through, not read twice.
  EXPECT_GE(stats->chunks_verified, 3u + 3u + 3u + 3u + 1u + 1u);
  EXPECT_LT(stats->bytes_read, stats->bytes * 11 / 10);

  auto got = ReadExport(out, *stats);
  ASSERT_EQ(got.size(), 6u);
  EXPECT_EQ(got["fp4"].second, Whole("model.fp4", DType::kF4, {1500, 2000}));
  EXPECT_EQ(got["embed.weight"].second, Whole("model.embed.weight", DType::kF32, {1024, 512}));
  EXPECT_EQ(got["embed.weight"].first.shape, (Shape{1024, 512}));
  EXPECT_EQ(got["layers.0.w"].second, Whole("model.layers.0.w", DType::kBF16, {30, 20}));
  EXPECT_EQ(got["layers.1.w"].second, Whole("model.layers.1.w", DType::kF32, {35, 20}));
  EXPECT_EQ(got["layers.1.mlp.experts.gate_up_proj"].second,
            Whole("model.layers.1.mlp.experts.gate_up_proj", DType::kF32, {3, 8, 4}));
  EXPECT_EQ(got["count"].second, Whole("model.count", DType::kI64, {5}));

  auto index = nlohmann::json::parse(ReadAll(out + "/model.safetensors.index.json"));
  EXPECT_EQ(index["weight_map"]["embed.weight"], "model-00001-of-00003.safetensors");
  EXPECT_EQ(index["weight_map"]["fp4"], "model-00002-of-00003.safetensors");
  EXPECT_EQ(index["weight_map"]["count"], "model-00003-of-00003.safetensors");
  EXPECT_EQ(index["metadata"]["total_size"], stats->bytes);
  // Nothing but the published directory is left in the parent.
  auto entries = DefaultFileSystem()->ListDir(dir_);
  ASSERT_TRUE(entries.ok());
  EXPECT_EQ(entries->size(), 2u);  // ckpt, hf
}

TEST_F(ExportTest, ExpertsSplitAndDtypeCast) {
  ExportHfOptions o = Options();
  o.experts = Qwen2MoeExperts();
  o.dtype = DType::kBF16;
  const std::string out = dir_ + "/hf";
  auto stats = ExportHf(ckpt_, out, o);
  ASSERT_TRUE(stats.ok()) << stats.status().message();
  EXPECT_EQ(stats->files, std::vector<std::string>{"model.safetensors"});
  auto got = ReadExport(out, *stats);
  EXPECT_EQ(got.size(), 5u + 6u);
  const Shape grouped = {3, 8, 4};
  for (int e = 0; e < 3; ++e) {
    for (int part = 0; part < 2; ++part) {
      const Slice s{Box{{uint64_t(e), part * 4ull, 0}, {1, 4, 4}}, std::nullopt};
      auto f32 = OracleShard("model.layers.1.mlp.experts.gate_up_proj", DType::kF32, grouped, s);
      const std::string bf16 = F32ToBf16(f32.data(), f32.size() / 4);
      const std::string name = "layers.1.mlp.experts." + std::to_string(e) +
                               (part ? ".up_proj.weight" : ".gate_proj.weight");
      ASSERT_TRUE(got.count(name)) << name;
      EXPECT_EQ(got[name].first.dtype, DType::kBF16);
      EXPECT_EQ(got[name].first.shape, (Shape{4, 4}));
      EXPECT_EQ(got[name].second, bf16) << name;
    }
  }
  EXPECT_EQ(got["count"].first.dtype, DType::kI64);  // integers are not cast
}

TEST_F(ExportTest, CorruptChunkCutByBatchesFailsAndLeavesNothing) {
  // Flip one byte in the middle of rank 1's column chunk of embed.weight:
  // the batches read it in pieces, so only the re-read whole can catch it.
  const std::string data = ckpt_ + "/data-00001-000.safetensors";
  std::string bytes = ReadAll(data);
  auto index = nlohmann::json::parse(ReadAll(ckpt_ + "/shardsafe.json"));
  const auto& chunks = index["tensors"]["model.embed.weight"]["chunks"];
  uint64_t at = 0;
  for (const auto& c : chunks) {
    if (c["offset"][1] != 0) at = c["at"].get<uint64_t>() + 4096;
    if (at) break;
  }
  ASSERT_NE(at, 0u);
  const std::string file_of = index["files"][chunks[1]["file"].get<int>()]["name"];
  std::string target = ckpt_ + "/" + file_of;
  bytes = ReadAll(target);
  bytes[at] ^= 0x40;
  std::ofstream(target, std::ios::binary | std::ios::trunc) << bytes;

  const std::string out = dir_ + "/hf";
  auto stats = ExportHf(ckpt_, out, Options());
  ASSERT_FALSE(stats.ok());
  EXPECT_EQ(stats.status().code(), StatusCode::kDataLoss);
  EXPECT_THAT(stats.status().message(), HasSubstr("model.embed.weight"));
  EXPECT_THAT(stats.status().message(), HasSubstr("checksum mismatch"));
  EXPECT_FALSE(Exists(out));
  auto entries = DefaultFileSystem()->ListDir(dir_);
  ASSERT_TRUE(entries.ok());
  EXPECT_EQ(entries->size(), 1u);  // only ckpt: no temporary left
}

TEST_F(ExportTest, ExistingOutputNeedsOverwriteWhichReplacesIt) {
  const std::string out = dir_ + "/hf";
  ASSERT_TRUE(DefaultFileSystem()->CreateDir(out).ok());
  ASSERT_TRUE(WriteFileAtomically(*DefaultFileSystem(), out + "/old.txt", "old").ok());
  auto first = ExportHf(ckpt_, out, Options());
  ASSERT_FALSE(first.ok());
  EXPECT_EQ(first.status().code(), StatusCode::kAlreadyExists);
  EXPECT_TRUE(Exists(out + "/old.txt"));

  ExportHfOptions o = Options();
  o.overwrite = true;
  auto second = ExportHf(ckpt_, out, o);
  ASSERT_TRUE(second.ok()) << second.status().message();
  EXPECT_FALSE(Exists(out + "/old.txt"));
  EXPECT_TRUE(Exists(out + "/model.safetensors"));
  auto entries = DefaultFileSystem()->ListDir(dir_);
  ASSERT_TRUE(entries.ok());
  EXPECT_EQ(entries->size(), 2u);
}

TEST_F(ExportTest, EveryInjectedWriteFailureLeavesOutputUntouched) {
  // Count the operations of a clean export, then fail each one in turn.
  FaultInjectingFileSystem fs(DefaultFileSystem());
  ExportHfOptions o = Options();
  o.fs = &fs;
  o.max_shard_bytes = 1'000'000;
  ASSERT_TRUE(ExportHf(ckpt_, dir_ + "/probe", o).ok());
  const int64_t ops = fs.total_count();
  ASSERT_GT(ops, 10);
  ASSERT_TRUE(DefaultFileSystem()->RemoveAll(dir_ + "/probe").ok());
  for (int64_t n = 0; n < ops; ++n) {
    fs.Reset();
    fs.FailAfter(n, ResourceExhaustedError("injected: disk full"));
    const std::string out = dir_ + "/hf";
    auto stats = ExportHf(ckpt_, out, o);
    fs.ClearFaults();
    if (stats.ok()) {
      // Only failures after the publishing rename may be absorbed as warnings.
      EXPECT_TRUE(Exists(out + "/model.safetensors.index.json")) << n;
      ASSERT_TRUE(DefaultFileSystem()->RemoveAll(out).ok());
      continue;
    }
    EXPECT_FALSE(Exists(out)) << "crash point " << n;
  }
}

TEST_F(ExportTest, HuggingFaceDirectorySourceCopiesConfigAndRenames) {
  const std::string first = dir_ + "/hf1", second = dir_ + "/hf2";
  ASSERT_TRUE(ExportHf(ckpt_, first, Options()).ok());
  ExportHfOptions o;
  o.rename = {{"^", "model."}};
  o.include = {R"(\.weight$)", R"(^layers\.0\.)"};
  o.exclude = {"^layers\\.1"};
  auto stats = ExportHf(first, second, o);
  ASSERT_TRUE(stats.ok()) << stats.status().message();
  EXPECT_EQ(stats->copied, std::vector<std::string>{"config.json"});
  EXPECT_EQ(stats->chunks_verified, 0u);  // foreign files have no checksums
  auto got = ReadExport(second, *stats);
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got["model.embed.weight"].second,
            Whole("model.embed.weight", DType::kF32, {1024, 512}));
  EXPECT_EQ(got["model.layers.0.w"].second, Whole("model.layers.0.w", DType::kBF16, {30, 20}));
}

TEST_F(ExportTest, BadArgumentsAreClearErrors) {
  ExportHfOptions o = Options();
  o.weights_name = "a/b";
  EXPECT_EQ(ExportHf(ckpt_, dir_ + "/x", o).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ExportHf(dir_ + "/missing", dir_ + "/x", Options()).status().code(),
            StatusCode::kNotFound);
  ExportHfOptions bad = Options();
  bad.rename = {{"(", "x"}};
  auto s = ExportHf(ckpt_, dir_ + "/x", bad);
  EXPECT_EQ(s.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(s.status().message(), HasSubstr("rename pattern \"(\""));
  EXPECT_FALSE(Exists(dir_ + "/x"));
}

// ---- collective export: parts written by several processes, one publish --

std::vector<std::string> Listing(const std::string& dir) {
  auto entries = DefaultFileSystem()->ListDir(dir);
  EXPECT_TRUE(entries.ok());
  std::vector<std::string> names;
  for (const DirEntry& e : *entries) names.push_back(e.name);
  std::sort(names.begin(), names.end());
  return names;
}

TEST_F(ExportTest, PartsWrittenAtOnceGiveTheOneProcessExportByteForByte) {
  ExportHfOptions o = Options();
  o.max_shard_bytes = 1'000'000;  // 3 weight files
  const std::string one = dir_ + "/one", out = dir_ + "/hf";
  ASSERT_TRUE(ExportHf(ckpt_, one, o).ok());

  auto staging = ExportHfStaging::Create(ckpt_, out, o);
  ASSERT_TRUE(staging.ok()) << staging.status().message();
  EXPECT_EQ((*staging)->num_files(), 3u);
  EXPECT_EQ((*staging)->source(), ckpt_);
  EXPECT_FALSE(Exists(out));
  std::vector<Result<ExportHfStats>> parts(2, InternalError("not run"));
  std::vector<std::thread> threads;
  for (int p = 0; p < 2; ++p) {
    threads.emplace_back([&, p] { parts[p] = ExportHfPart(ckpt_, (*staging)->dir(), o, p, 2); });
  }
  for (std::thread& t : threads) t.join();
  for (const auto& part : parts) ASSERT_TRUE(part.ok()) << part.status().message();
  EXPECT_EQ(parts[0]->files, (std::vector<std::string>{"model-00001-of-00003.safetensors",
                                                         "model-00003-of-00003.safetensors"}));
  EXPECT_EQ(parts[1]->files, std::vector<std::string>{"model-00002-of-00003.safetensors"});
  EXPECT_EQ(parts[0]->tensors + parts[1]->tensors, 6u);
  EXPECT_GT(parts[1]->chunks_verified, 0u);
  EXPECT_FALSE(Exists(out));  // nothing is published before Finish

  auto stats = (*staging)->Finish();
  ASSERT_TRUE(stats.ok()) << stats.status().message();
  EXPECT_EQ(stats->bytes, parts[0]->bytes + parts[1]->bytes);
  EXPECT_EQ(stats->copied, std::vector<std::string>{"config.json"});
  EXPECT_EQ(stats->files.back(), "model.safetensors.index.json");
  const auto names = Listing(out);
  EXPECT_EQ(names, Listing(one));
  for (const std::string& name : names) {
    EXPECT_EQ(ReadAll(out + "/" + name), ReadAll(one + "/" + name)) << name;
  }
  EXPECT_EQ(Listing(dir_), (std::vector<std::string>{"ckpt", "hf", "one"}));
  EXPECT_EQ((*staging)->Finish().status().code(), StatusCode::kFailedPrecondition);
  staging->reset();
  EXPECT_TRUE(Exists(out + "/model.safetensors.index.json"));  // published stays

  // A process past the plan's files writes nothing.
  auto staging2 = ExportHfStaging::Create(ckpt_, dir_ + "/hf2", o);
  ASSERT_TRUE(staging2.ok());
  auto idle = ExportHfPart(ckpt_, (*staging2)->dir(), o, 3, 4);
  ASSERT_TRUE(idle.ok()) << idle.status().message();
  EXPECT_TRUE(idle->files.empty());
  EXPECT_EQ(idle->bytes_read, 0u);
}

TEST_F(ExportTest, FinishRefusesAMissingOrMismatchedShareAndLeavesNothing) {
  ExportHfOptions o = Options();
  o.max_shard_bytes = 1'000'000;
  const std::string out = dir_ + "/hf";
  {
    auto staging = ExportHfStaging::Create(ckpt_, out, o);
    ASSERT_TRUE(staging.ok());
    ASSERT_TRUE(ExportHfPart(ckpt_, (*staging)->dir(), o, 0, 2).ok());  // part 1 never runs
    auto stats = (*staging)->Finish();
    ASSERT_FALSE(stats.ok());
    EXPECT_EQ(stats.status().code(), StatusCode::kFailedPrecondition);
    EXPECT_THAT(stats.status().message(),
                HasSubstr("model-00002-of-00003.safetensors was not written"));
    EXPECT_FALSE(Exists(out));
    EXPECT_EQ(Listing(dir_), std::vector<std::string>{"ckpt"});
  }
  // A process that planned with other options (a dtype cast) is caught.
  auto staging = ExportHfStaging::Create(ckpt_, out, o);
  ASSERT_TRUE(staging.ok());
  ExportHfOptions cast = o;
  cast.dtype = DType::kBF16;
  ASSERT_TRUE(ExportHfPart(ckpt_, (*staging)->dir(), cast, 0, 2).ok());
  ASSERT_TRUE(ExportHfPart(ckpt_, (*staging)->dir(), o, 1, 2).ok());
  auto stats = (*staging)->Finish();
  ASSERT_FALSE(stats.ok());
  EXPECT_THAT(stats.status().message(),
              HasSubstr("model-00001-of-00003.safetensors differs from this process's plan"));
  EXPECT_FALSE(Exists(out));
  EXPECT_EQ(Listing(dir_), std::vector<std::string>{"ckpt"});
}

TEST_F(ExportTest, AbandonedStagingKeepsThePreviousOutput) {
  ExportHfOptions o = Options();
  o.max_shard_bytes = 1'000'000;
  const std::string out = dir_ + "/hf";
  ASSERT_TRUE(ExportHf(ckpt_, out, o).ok());
  const std::string before = ReadAll(out + "/model-00002-of-00003.safetensors");
  o.overwrite = true;
  o.dtype = DType::kBF16;
  auto staging = ExportHfStaging::Create(ckpt_, out, o);
  ASSERT_TRUE(staging.ok());
  ASSERT_TRUE(ExportHfPart(ckpt_, (*staging)->dir(), o, 1, 2).ok());
  staging->reset();  // another process failed: no Finish
  EXPECT_EQ(ReadAll(out + "/model-00002-of-00003.safetensors"), before);
  EXPECT_EQ(Listing(dir_), (std::vector<std::string>{"ckpt", "hf"}));
}

TEST_F(ExportTest, PartArgumentsAndUnsharedDirectoryAreClearErrors) {
  const ExportHfOptions o = Options();
  EXPECT_EQ(ExportHfPart(ckpt_, dir_, o, 2, 2).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ExportHfPart(ckpt_, dir_, o, 0, 0).status().code(), StatusCode::kInvalidArgument);
  auto s = ExportHfPart(ckpt_, dir_ + "/.tmp-export-hf.gone", o, 0, 1);
  EXPECT_EQ(s.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.status().message(), HasSubstr("every process shares"));
  EXPECT_EQ(ExportHfStaging::Create(dir_ + "/missing", dir_ + "/x", o).status().code(),
            StatusCode::kNotFound);
}

TEST(ParseByteSizeTest, UnitsAsHuggingFaceHubAndBinary) {
  EXPECT_EQ(*ParseByteSize("5GB"), 5'000'000'000u);
  EXPECT_EQ(*ParseByteSize("500MB"), 500'000'000u);
  EXPECT_EQ(*ParseByteSize("1.5kb"), 1500u);
  EXPECT_EQ(*ParseByteSize("2GiB"), uint64_t{2} << 30);
  EXPECT_EQ(*ParseByteSize("4096"), 4096u);
  EXPECT_EQ(*ParseByteSize("10 MB"), 10'000'000u);
  for (const char* bad : {"", "GB", "5XB", "-1GB", "0", "nan", "1e30TB"}) {
    EXPECT_EQ(ParseByteSize(bad).status().code(), StatusCode::kInvalidArgument) << bad;
  }
}

}  // namespace
}  // namespace shardsafe
