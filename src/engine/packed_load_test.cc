// Loads from a packed source (OpenSourcePacked): targets by key and
// whole-tensor targets by number, many tensors (several batches of the
// load), with and without a chunk table; and what a whole-tensor target
// refuses.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>

#include "format/index_packed.h"
#include "shardsafe/source.h"
#include "testing/test_util.h"

namespace shardsafe {
namespace {

using ::testing::HasSubstr;

// More chunks than one batch of a load plans (engine/load/load.cc).
constexpr int kTensors = 20000;

std::string Key(int i) {
  char key[32];
  std::snprintf(key, sizeof key, "t.%05d", i);
  return key;
}

class PackedLoadTest : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
    dir_ = testing::MakeTempDir("packed-load") + "/ck";
    std::vector<OwnedShard> shards;
    for (int i = 0; i < kTensors; ++i) {
      const Shape shape = {static_cast<uint64_t>(1 + i % 5)};
      shards.push_back(MakeShard(Key(i), DType::kF32, shape, {Box::Whole(shape), {}}));
    }
    SaveState state;
    for (const OwnedShard& s : shards) state.tensors.push_back(s.View());
    SaveOptions options;
    options.chunk_table_min_chunks = GetParam() ? 1 : uint64_t{1} << 40;
    auto comm = MakeSingleProcessComm();
    ASSERT_TRUE(Save(state, dir_, *comm, options).ok());
  }
  void TearDown() override {
    std::filesystem::remove_all(std::filesystem::path(dir_).parent_path());
  }

  std::string dir_;
};

// Half the tensors by key, the other half whole by number, from a source
// opened as a load opens it (a chunk table left unread, then read for the
// targets).
TEST_P(PackedLoadTest, TargetsByKeyAndWholeByNumberLoadEveryByte) {
  auto comm = MakeSingleProcessComm();
  auto src = OpenSourceCollectivePacked(dir_, *comm);
  ASSERT_TRUE(src.ok()) << src.status().ToString();
  ASSERT_NE(src->packed, nullptr);
  ASSERT_EQ(src->packed->size(), static_cast<size_t>(kTensors));
  LoadRequest request;
  std::vector<OwnedTarget> by_key;
  std::vector<std::vector<std::byte>> whole_bytes;
  std::vector<WholeTensorTarget> whole;
  for (int i = 0; i < kTensors; ++i) {
    const Shape shape = {static_cast<uint64_t>(1 + i % 5)};
    if (i % 2 == 0) {
      by_key.push_back(MakeTarget(Key(i), DType::kF32, shape, {Box::Whole(shape), {}}));
      continue;
    }
    whole_bytes.emplace_back(shape[0] * 4);
    const std::optional<size_t> t = src->packed->Find(Key(i));
    ASSERT_TRUE(t.has_value());
    whole.push_back({static_cast<uint32_t>(*t), whole_bytes.back().data()});
  }
  for (const OwnedTarget& t : by_key) request.tensors.push_back(t.target);
  EXPECT_EQ(src->chunks_pending, GetParam());
  auto loaded = LoadOpenedSource(request, whole, *src, *comm, {});
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  EXPECT_TRUE(loaded->unexpected.empty());
  for (const OwnedTarget& t : by_key) EXPECT_TRUE(MatchesOracle(t)) << t.target.key;
  for (size_t j = 0; j < whole.size(); ++j) {
    const std::string key(src->packed->key(whole[j].tensor));
    const Shape shape = src->packed->shape(whole[j].tensor);
    EXPECT_EQ(whole_bytes[j], OracleShard(key, DType::kF32, shape, {Box::Whole(shape), {}}))
        << key;
  }
}

TEST_P(PackedLoadTest, WholeTargetsNeedAPackedSourceATensorAndADestination) {
  auto comm = MakeSingleProcessComm();
  std::vector<std::byte> bytes(64);
  auto packed = OpenSourcePacked(dir_);
  ASSERT_TRUE(packed.ok());
  const WholeTensorTarget out_of_range[] = {{kTensors, bytes.data()}};
  auto r = LoadOpenedSource({}, out_of_range, *packed, *comm, {});
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(), HasSubstr("names tensor 20000 of 20000"));
  const WholeTensorTarget null[] = {{3, nullptr}};
  r = LoadOpenedSource({}, null, *packed, *comm, {});
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(), HasSubstr("null destination"));
  auto classic = OpenSource(dir_);
  ASSERT_TRUE(classic.ok());
  const WholeTensorTarget one[] = {{0, bytes.data()}};
  r = LoadOpenedSource({}, one, *classic, *comm, {});
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(), HasSubstr("packed source"));
}

INSTANTIATE_TEST_SUITE_P(Index, PackedLoadTest, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "Table" : "Json"; });

}  // namespace
}  // namespace shardsafe
