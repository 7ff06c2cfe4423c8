#include "format/package_records.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

namespace shardsafe {
namespace {

using ::testing::HasSubstr;

// A per-rank value blob's safetensors header (the JSON after the length)
// with `value` as its metadata value and one F32 tensor "t0" of 2
// elements; `blob_bytes` set to the whole blob's size.
std::string Header(const std::string& value, uint64_t* blob_bytes) {
  std::string quoted;
  for (char c : value) {
    if (c == '"' || c == '\\') quoted += '\\';
    quoted += c;
  }
  std::string h = R"({"__metadata__":{"value":")" + quoted +
                  R"("},"t0":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  *blob_bytes = 8 + h.size() + 8;
  return h;
}

Status Check(const std::string& value) {
  uint64_t bytes = 0;
  const std::string header = Header(value, &bytes);
  return CheckPerRankValue(header, bytes);
}

TEST(PackageRecordsTest, AValueAsThePackageWritesItPasses) {
  EXPECT_TRUE(Check(R"({"cpu":{"__shardsafe_tensor__":"t0"},"seed":7,)"
                    R"("loss":{"__shardsafe_float__":"nan"},"hist":[1,{"__shardsafe_float__":"-inf"}]})")
                  .ok());
  EXPECT_TRUE(Check(R"({"__shardsafe_tensor__":"t0"})").ok());
  EXPECT_TRUE(Check("[]").ok());
}

TEST(PackageRecordsTest, HostileValuesAreDataLossSayingWhere) {
  const std::pair<const char*, const char*> cases[] = {
      {R"({"a":{"__shardsafe_tensor__":"t9"}})", "at a: tensor tag \"t9\" names no tensor"},
      {R"({"a":[0,{"__shardsafe_tensor__":5}]})", "at a.1: tensor tag 5 names no tensor"},
      {R"({"a":{"__shardsafe_float__":"rm -rf"}})",
       "at a: float tag \"rm -rf\" is none of \"nan\", \"inf\", \"-inf\""},
      {R"({"a":{"__shardsafe_float__":1.5}})", "float tag 1.5"},
      {R"({"a": )", "the value is not JSON"},
      {"not json", "the value is not JSON"},
  };
  for (const auto& [value, why] : cases) {
    Status s = Check(value);
    EXPECT_EQ(s.code(), StatusCode::kDataLoss) << value;
    EXPECT_THAT(s.message(), HasSubstr(why)) << value;
  }
}

TEST(PackageRecordsTest, DeepNestingIsRefusedWithoutBuildingIt) {
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  Status s = Check(deep);
  EXPECT_EQ(s.code(), StatusCode::kDataLoss);
  EXPECT_THAT(s.message(), HasSubstr("nests deeper than 256"));
  EXPECT_TRUE(Check(std::string(200, '[') + std::string(200, ']')).ok());
}

TEST(PackageRecordsTest, ABlobThatIsNoValueFileIsRefused) {
  std::string h = R"({"t0":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  Status s = CheckPerRankValue(h, 8 + h.size() + 8);
  EXPECT_EQ(s.code(), StatusCode::kDataLoss);
  EXPECT_THAT(s.message(), HasSubstr("no \"value\""));
  s = CheckPerRankValue("{\"t0\":", 100);
  EXPECT_EQ(s.code(), StatusCode::kDataLoss);
  h = R"({"__metadata__":{"value":"{}"},"t0":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  EXPECT_EQ(CheckPerRankValue(h, 8 + h.size() + 4).code(), StatusCode::kDataLoss)
      << "a blob shorter than its tensors";
}

TEST(PackageRecordsTest, ValuesFloatTagsAreCheckedAndTensorTagsAreData) {
  EXPECT_TRUE(CheckValuesJson(R"({"lr":{"__shardsafe_float__":"inf"},"x":[1,2]})").ok());
  // The values hold no tensors: such a dict is data there, as the loader reads it.
  EXPECT_TRUE(CheckValuesJson(R"({"d":{"__shardsafe_tensor__":"t0"}})").ok());
  Status s = CheckValuesJson(R"({"opt":{"lr":{"__shardsafe_float__":"rm -rf"}}})");
  EXPECT_EQ(s.code(), StatusCode::kDataLoss);
  EXPECT_THAT(s.message(), HasSubstr("at opt.lr: float tag \"rm -rf\""));
}

TEST(PackageRecordsTest, OnlyRankBlobsArePerRankValues) {
  EXPECT_TRUE(IsPerRankValueBlob("rank/rng"));
  EXPECT_FALSE(IsPerRankValueBlob("file/config.json"));
  EXPECT_FALSE(IsPerRankValueBlob("ranks"));
}

}  // namespace
}  // namespace shardsafe
