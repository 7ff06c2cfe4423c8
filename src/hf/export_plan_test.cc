#include "hf/export_plan.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

namespace shardsafe {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

IndexTensor Tensor(DType dtype, Shape shape) { return IndexTensor{dtype, std::move(shape), {}}; }

std::vector<std::string> Names(const ExportPlan& plan, const PackedTensors& tensors) {
  std::vector<std::string> out;
  for (const ExportEntry& e : plan.entries) out.emplace_back(plan.Name(e, tensors));
  return out;
}

// PlanExport of `tensors`, packed (into `*packed`, which the plan refers to).
Result<ExportPlan> Plan(const IndexTensors& tensors, const ExportHfOptions& options,
                        PackedTensors* packed) {
  *packed = PackedTensors::From(tensors);
  return PlanExport(*packed, options);
}

TEST(NaturalLessTest, NumbersCompareAsNumbers) {
  EXPECT_TRUE(NaturalLess("layers.2.w", "layers.10.w"));
  EXPECT_FALSE(NaturalLess("layers.10.w", "layers.2.w"));
  EXPECT_TRUE(NaturalLess("a", "a.b"));
  EXPECT_TRUE(NaturalLess("a.b", "b"));
  EXPECT_TRUE(NaturalLess("x.01", "x.1"));  // equal as numbers: byte order
  EXPECT_FALSE(NaturalLess("x.1", "x.01"));
  EXPECT_FALSE(NaturalLess("same", "same"));
  EXPECT_TRUE(NaturalLess("l.99999999999999999999", "l.100000000000000000000"));
}

TEST(AssignShardsTest, GreedyAsHuggingFaceHub) {
  // The example of split_state_dict_into_shards_factory's docstring: limit
  // 10, sizes [6, 6, 2, 6, 2, 2] -> [6], [6+2], [6+2+2].
  EXPECT_THAT(AssignShards({6, 6, 2, 6, 2, 2}, 10),
              ElementsAre(ElementsAre(0), ElementsAre(1, 2), ElementsAre(3, 4, 5)));
  // An oversized tensor is its own shard, appended before the open one.
  EXPECT_THAT(AssignShards({2, 12, 3}, 10), ElementsAre(ElementsAre(1), ElementsAre(0, 2)));
  EXPECT_THAT(AssignShards({}, 10), ElementsAre());
}

TEST(PlanExportTest, SingleFileNoIndex) {
  IndexTensors t = {{"w", Tensor(DType::kF32, {2, 3})}};
  PackedTensors packed;
  auto plan = Plan(t, {}, &packed);
  ASSERT_TRUE(plan.ok()) << plan.status().message();
  ASSERT_EQ(plan->shards.size(), 1u);
  EXPECT_EQ(plan->shards[0].file, "model.safetensors");
  EXPECT_TRUE(plan->index_file.empty());
  EXPECT_EQ(plan->total_bytes, 24u);
  EXPECT_EQ(plan->total_parameters, 6u);
}

TEST(PlanExportTest, ShardsIndexAndNaturalOrder) {
  IndexTensors t;
  for (int i = 0; i < 12; ++i) {
    t["model.layers." + std::to_string(i) + ".w"] = Tensor(DType::kBF16, {10, 10});  // 200 B
  }
  t["model.embed"] = Tensor(DType::kF32, {100});  // 400 B: bigger than the cap
  ExportHfOptions o;
  o.max_shard_bytes = 450;
  PackedTensors packed;
  auto plan = Plan(t, o, &packed);
  ASSERT_TRUE(plan.ok()) << plan.status().message();
  const std::vector<std::string> names = Names(*plan, packed);
  EXPECT_EQ(names[0], "model.embed");
  EXPECT_EQ(names[1], "model.layers.0.w");
  EXPECT_EQ(names[3], "model.layers.2.w");
  EXPECT_EQ(names[11], "model.layers.10.w");
  ASSERT_EQ(plan->shards.size(), 7u);  // [embed] [0,1] [2,3] ... [10,11]
  EXPECT_EQ(plan->shards[0].file, "model-00001-of-00007.safetensors");
  EXPECT_EQ(plan->shards[6].file, "model-00007-of-00007.safetensors");
  EXPECT_EQ(plan->index_file, "model.safetensors.index.json");
  const std::string index_json = IndexJson(*plan, packed);
  auto index = nlohmann::json::parse(index_json);
  EXPECT_EQ(index["metadata"]["total_size"], 400 + 12 * 200);
  EXPECT_EQ(index["metadata"]["total_parameters"], 100 + 12 * 100);
  EXPECT_EQ(index["weight_map"]["model.layers.11.w"], "model-00007-of-00007.safetensors");
  EXPECT_EQ(index["weight_map"].size(), 13u);
  // json.dumps(indent=2, sort_keys=True) + "\n"
  EXPECT_EQ(index_json.substr(0, 40), "{\n  \"metadata\": {\n    \"total_parameters\"");
  EXPECT_EQ(index_json.back(), '\n');
}

TEST(PlanExportTest, PrefixExpertsRenameAndDtype) {
  IndexTensors t = {
      {"model.model.layers.0.mlp.experts.gate_up_proj", Tensor(DType::kF32, {2, 8, 4})},
      {"model.model.layers.0.mlp.experts.down_proj", Tensor(DType::kF32, {2, 4, 4})},
      {"model.model.layers.0.mlp.gate.weight", Tensor(DType::kI64, {2, 4})},
      {"optim.state.step", Tensor(DType::kF32, {})}};
  ExportHfOptions o;
  o.prefix = "model.";
  o.experts = Qwen2MoeExperts();
  o.rename = {{R"(\.mlp\.)", ".block_sparse_moe."}};
  o.dtype = DType::kBF16;
  PackedTensors packed;
  auto plan = Plan(t, o, &packed);
  ASSERT_TRUE(plan.ok()) << plan.status().message();
  EXPECT_THAT(Names(*plan, packed),
              ElementsAre("model.layers.0.block_sparse_moe.experts.0.down_proj.weight",
                          "model.layers.0.block_sparse_moe.experts.0.gate_proj.weight",
                          "model.layers.0.block_sparse_moe.experts.0.up_proj.weight",
                          "model.layers.0.block_sparse_moe.experts.1.down_proj.weight",
                          "model.layers.0.block_sparse_moe.experts.1.gate_proj.weight",
                          "model.layers.0.block_sparse_moe.experts.1.up_proj.weight",
                          "model.layers.0.block_sparse_moe.gate.weight"));
  const ExportEntry& up1 = plan->entries[5];
  EXPECT_EQ(plan->Key(up1, packed), "model.model.layers.0.mlp.experts.gate_up_proj");
  EXPECT_EQ(plan->BoxOf(up1, packed), (Box{{1, 4, 0}, {1, 4, 4}}));
  EXPECT_EQ(plan->ShapeOf(up1, packed), (Shape{4, 4}));
  EXPECT_EQ(up1.dtype, DType::kBF16);
  EXPECT_EQ(up1.bytes, 32u);
  EXPECT_EQ(plan->entries[6].dtype, DType::kI64);  // not a float: kept
}

TEST(PlanExportTest, CollisionNamesBothSources) {
  IndexTensors t = {{"a.w", Tensor(DType::kF32, {1})}, {"b.w", Tensor(DType::kF32, {1})}};
  ExportHfOptions o;
  o.rename = {{"^[ab]", "c"}};
  PackedTensors packed;
  auto plan = Plan(t, o, &packed);
  ASSERT_FALSE(plan.ok());
  EXPECT_EQ(plan.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(plan.status().message(), HasSubstr("\"c.w\": from \"a.w\" and \"b.w\""));
}

TEST(PlanExportTest, NothingSelectedAndBadDtypeAreErrors) {
  IndexTensors t = {{"a", Tensor(DType::kF32, {1})}};
  ExportHfOptions o;
  o.prefix = "model.";
  PackedTensors packed;
  auto plan = Plan(t, o, &packed);
  EXPECT_EQ(plan.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(plan.status().message(), HasSubstr("nothing to export"));
  ExportHfOptions d;
  d.dtype = DType::kI32;
  EXPECT_EQ(Plan(t, d, &packed).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace shardsafe
