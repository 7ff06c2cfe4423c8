// `verify` reads the Python package's records as its loader does
// (docs/format.md §6): per-rank value blobs and the values' float tags.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>

#include "shardsafe/tools.h"
#include "testing/test_util.h"

namespace shardsafe {
namespace {

using ::testing::HasSubstr;

// A per-rank value blob holding `value` (JSON) and one F32 tensor "t0".
std::string ValueBlob(const std::string& value) {
  std::string quoted;
  for (char c : value) {
    if (c == '"' || c == '\\') quoted += '\\';
    quoted += c;
  }
  const std::string header = R"({"__metadata__":{"value":")" + quoted +
                             R"("},"t0":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  std::string blob(8, '\0');
  for (int i = 0; i < 8; ++i) blob[i] = static_cast<char>((header.size() >> (8 * i)) & 0xff);
  return blob + header + std::string(8, '\x01');
}

class VerifyTest : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = testing::MakeTempDir("verify"); }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  VerifyReport SaveAndVerify(const std::string& blob, const std::string& values = "") {
    auto comm = MakeSingleProcessComm();
    const float data[4] = {1, 2, 3, 4};
    SaveState state;
    state.tensors.push_back({"w", DType::kF32, {4}, {Box::Whole({4}), std::nullopt}, data});
    state.blobs.push_back({"rank/rng", blob.data(), blob.size(), /*per_rank=*/true});
    state.values = values;
    const std::string path = dir_ + "/step-" + std::to_string(++saves_);
    Status saved = Save(state, path, *comm, {}).status();
    EXPECT_TRUE(saved.ok()) << saved.ToString();
    return VerifyCheckpoint(path);
  }

  std::string dir_;
  int saves_ = 0;
};

TEST_F(VerifyTest, PerRankValuesAsThePackageWritesThemPass) {
  VerifyReport r = SaveAndVerify(
      ValueBlob(R"({"cpu":{"__shardsafe_tensor__":"t0"},"l":{"__shardsafe_float__":"nan"}})"),
      R"({"lr":{"__shardsafe_float__":"inf"}})");
  EXPECT_TRUE(r.ok()) << ::testing::PrintToString(r.faults);
}

TEST_F(VerifyTest, HostilePerRankValuesAreFaultsNamingFileBlobAndRank) {
  const std::pair<std::string, const char*> cases[] = {
      {ValueBlob(R"({"cpu":{"__shardsafe_tensor__":"t9"}})"), "tensor tag \"t9\""},
      {ValueBlob(R"({"cpu":{"__shardsafe_tensor__":5}})"), "tensor tag 5"},
      {ValueBlob(R"({"seed":{"__shardsafe_float__":"rm -rf"}})"), "float tag \"rm -rf\""},
      {ValueBlob("{"), "the value is not JSON"},
      {"rm -rf /", "header"},
  };
  for (const auto& [blob, why] : cases) {
    VerifyReport r = SaveAndVerify(blob);
    ASSERT_EQ(r.faults.size(), 1u) << why;
    EXPECT_THAT(r.faults[0], HasSubstr("data-00000-000.safetensors: blob \"rank/rng\" of rank 0"));
    EXPECT_THAT(r.faults[0], HasSubstr(why));
  }
}

TEST_F(VerifyTest, AHostileFloatTagInTheValuesIsAFault) {
  VerifyReport r = SaveAndVerify(ValueBlob("{}"), R"({"opt":{"__shardsafe_float__":"1e999x"}})");
  ASSERT_EQ(r.faults.size(), 1u);
  EXPECT_THAT(r.faults[0], HasSubstr("shardsafe.json: values: at opt: float tag \"1e999x\""));
}

}  // namespace
}  // namespace shardsafe
