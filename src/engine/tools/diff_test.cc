// Tests of DiffCheckpoints on checkpoints saved by one process: what it says
// of each tensor (equal, differs with the count and the largest difference,
// only on one side, another shape or dtype), of the values (JSON pointers to
// what differs), across pieces, and when a side cannot be opened.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "shardsafe/checkpoint.h"
#include "shardsafe/comm.h"
#include "shardsafe/filesystem.h"
#include "shardsafe/tools.h"
#include "testing/status_matchers.h"
#include "testing/test_util.h"

namespace shardsafe {
namespace {

using ::testing::ElementsAre;

// One whole tensor to save: its bytes are the test's.
struct Whole {
  std::string key;
  DType dtype;
  Shape shape;
  std::vector<std::byte> bytes;
};

template <typename T>
Whole WholeOf(const std::string& key, DType dtype, const Shape& shape, const std::vector<T>& v) {
  Whole w{key, dtype, shape, std::vector<std::byte>(v.size() * sizeof(T))};
  std::memcpy(w.bytes.data(), v.data(), w.bytes.size());
  return w;
}

// The diff's verdict on `key`, or a TensorDiff named "missing".
TensorDiff Of(const DiffReport& report, const std::string& key) {
  for (const TensorDiff& t : report.tensors) {
    if (t.key == key) return t;
  }
  return {.key = "missing"};
}

class DiffTest : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = MakeTempDir("diff"); }
  void TearDown() override { DefaultFileSystem()->RemoveAll(dir_).IgnoreError(); }

  // Saves `tensors` and `values` as dir_/name; returns its path.
  std::string SaveAs(const std::string& name, const std::vector<Whole>& tensors,
                     const std::string& values = "") {
    SaveState state;
    for (const Whole& w : tensors) {
      state.tensors.push_back(
          {w.key, w.dtype, w.shape, {Box::Whole(w.shape), std::nullopt}, w.bytes.data()});
    }
    state.values = values;
    auto comm = MakeSingleProcessComm();
    const std::string path = dir_ + "/" + name;
    auto saved = Save(state, path, *comm, {});
    EXPECT_TRUE(saved.ok()) << saved.status().ToString();
    return path;
  }

  std::string dir_;
};

TEST_F(DiffTest, CheckpointsOfTheSameStateAreIdentical) {
  const std::vector<Whole> state = {WholeOf<float>("w", DType::kF32, {2, 2}, {1, 2, 3, 4}),
                                    WholeOf<int32_t>("n", DType::kI32, {3}, {7, 8, 9})};
  const std::string a = SaveAs("a", state, R"({"lr": 0.1, "cfg": {"k": [1, 2]}})");
  const std::string b = SaveAs("b", state, R"({"cfg": {"k": [1, 2]}, "lr": 0.1})");
  auto report = DiffCheckpoints(a, b);
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  EXPECT_TRUE(report->identical());
  EXPECT_TRUE(report->values_equal) << "equal as JSON, in another key order";
  EXPECT_TRUE(report->differing_values.empty());
  ASSERT_EQ(report->tensors.size(), 2u);
  EXPECT_EQ(report->tensors[0].key, "n") << "sorted by key";
  for (const TensorDiff& t : report->tensors) {
    EXPECT_EQ(t.status, "equal") << t.key;
    EXPECT_EQ(t.differing_elements, 0u) << t.key;
    EXPECT_EQ(t.max_abs_diff, std::nullopt) << t.key;
  }
  EXPECT_EQ(Of(*report, "w").elements, 4u);
  EXPECT_EQ(Of(*report, "n").elements, 3u);
}

TEST_F(DiffTest, NamesEachTensorsDifference) {
  const std::string a =
      SaveAs("a", {WholeOf<float>("w", DType::kF32, {4}, {1, 2, 3, 4}),
                   WholeOf<int32_t>("n", DType::kI32, {2}, {5, 6}),
                   WholeOf<float>("reshaped", DType::kF32, {4}, {0, 0, 0, 0}),
                   WholeOf<float>("recast", DType::kF32, {2}, {0, 0}),
                   WholeOf<float>("gone", DType::kF32, {1}, {0})});
  const std::string b =
      SaveAs("b", {WholeOf<float>("w", DType::kF32, {4}, {1, 2.5f, 3, 2}),
                   WholeOf<int32_t>("n", DType::kI32, {2}, {5, -6}),
                   WholeOf<float>("reshaped", DType::kF32, {2, 2}, {0, 0, 0, 0}),
                   WholeOf<double>("recast", DType::kF64, {2}, {0, 0}),
                   WholeOf<float>("new", DType::kF32, {1}, {0})});
  auto report = DiffCheckpoints(a, b);
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  EXPECT_FALSE(report->identical());
  EXPECT_TRUE(report->values_equal);
  const TensorDiff w = Of(*report, "w");
  EXPECT_EQ(w.status, "differs");
  EXPECT_EQ(w.elements, 4u);
  EXPECT_EQ(w.differing_elements, 2u);
  EXPECT_EQ(w.max_abs_diff, std::optional<double>(2.0));
  const TensorDiff n = Of(*report, "n");
  EXPECT_EQ(n.status, "differs");
  EXPECT_EQ(n.differing_elements, 1u);
  EXPECT_EQ(n.max_abs_diff, std::nullopt) << "integers have no largest difference";
  EXPECT_EQ(Of(*report, "reshaped").status, "shape differs");
  EXPECT_EQ(Of(*report, "recast").status, "dtype differs");
  EXPECT_EQ(Of(*report, "gone").status, "only in A");
  EXPECT_EQ(Of(*report, "new").status, "only in B");
  std::vector<std::string> keys;
  for (const TensorDiff& t : report->tensors) keys.push_back(t.key);
  EXPECT_THAT(keys, ElementsAre("gone", "n", "new", "recast", "reshaped", "w"));
}

TEST_F(DiffTest, CountsEveryDifferenceAcrossPieces) {
  std::vector<float> v(100);
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i);
  const std::string a = SaveAs("a", {WholeOf<float>("w", DType::kF32, {100}, v)});
  v[0] += 1;       // the first piece
  v[37] -= 0.25f;  // one in the middle
  v[99] = std::numeric_limits<float>::quiet_NaN();  // the last, cut short
  const std::string b = SaveAs("b", {WholeOf<float>("w", DType::kF32, {100}, v)});
  // 32-byte pieces: 8 elements each, 13 pieces.
  auto report = DiffCheckpoints(a, b, nullptr, 32);
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  const TensorDiff w = Of(*report, "w");
  EXPECT_EQ(w.status, "differs");
  EXPECT_EQ(w.elements, 100u);
  EXPECT_EQ(w.differing_elements, 3u);
  ASSERT_TRUE(w.max_abs_diff.has_value());
  EXPECT_TRUE(std::isnan(*w.max_abs_diff)) << "a NaN on one side is the largest difference";
}

TEST_F(DiffTest, NamesWhereTheValuesDiffer) {
  const std::vector<Whole> state = {WholeOf<float>("w", DType::kF32, {1}, {1})};
  const std::string a = SaveAs("a", state, R"({"lr": 0.1, "cfg": {"k": [1, 2]}, "old": 1})");
  const std::string b = SaveAs("b", state, R"({"lr": 0.2, "cfg": {"k": [1, 3], "x": 0}})");
  auto report = DiffCheckpoints(a, b);
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  EXPECT_FALSE(report->values_equal);
  EXPECT_FALSE(report->identical()) << "its tensors are equal, its values not";
  EXPECT_EQ(Of(*report, "w").status, "equal");
  EXPECT_THAT(report->differing_values, ElementsAre("/cfg/k/1", "/cfg/x", "/lr", "/old"));
}

TEST_F(DiffTest, ASideThatCannotBeOpenedFailsTheDiff) {
  const std::string a = SaveAs("a", {WholeOf<float>("w", DType::kF32, {1}, {1})});
  EXPECT_TRUE(IsError(DiffCheckpoints(a, dir_ + "/missing"), StatusCode::kNotFound, "missing"));
  EXPECT_TRUE(IsError(DiffCheckpoints(dir_ + "/missing", a), StatusCode::kNotFound, "missing"));
}

}  // namespace
}  // namespace shardsafe
