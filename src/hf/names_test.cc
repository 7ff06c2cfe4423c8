#include "hf/names.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace shardsafe {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

ExportHfOptions WithFilter(std::string prefix, std::vector<std::string> include,
                           std::vector<std::string> exclude) {
  ExportHfOptions o;
  o.prefix = std::move(prefix);
  o.include = std::move(include);
  o.exclude = std::move(exclude);
  return o;
}

TEST(KeyFilterTest, PrefixSelectsAndStrips) {
  auto f = KeyFilter::Create(WithFilter("model.", {}, {}));
  ASSERT_TRUE(f.ok());
  EXPECT_EQ(f->Select("model.lm_head.weight"), "lm_head.weight");
  EXPECT_EQ(f->Select("optim.state.x"), std::nullopt);
  EXPECT_EQ(f->Select("model"), std::nullopt);
}

TEST(KeyFilterTest, IncludeAndExcludeSearchAnywhereAfterThePrefix) {
  auto f = KeyFilter::Create(WithFilter("", {R"(\.weight$)", "^embed"}, {"norm"}));
  ASSERT_TRUE(f.ok());
  EXPECT_TRUE(f->Select("layers.0.q.weight"));
  EXPECT_TRUE(f->Select("embed.bias"));
  EXPECT_FALSE(f->Select("layers.0.q.bias"));
  EXPECT_FALSE(f->Select("layers.0.norm.weight"));
}

TEST(KeyFilterTest, BadPatternNamesIt) {
  auto f = KeyFilter::Create(WithFilter("", {"("}, {}));
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(f.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(f.status().message(), HasSubstr("include pattern \"(\""));
}

TEST(RenamerTest, RulesApplyInOrderToEveryMatchWithGroups) {
  ExportHfOptions o;
  o.rename = {{R"(^)", "model."}, {R"(\.attn\.w([qkv])\.)", R"(.self_attn.\1_proj.)"},
              {"x", "y"}};
  auto r = Renamer::Create(o);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(*r->Apply("layers.0.attn.wq.weight"), "model.layers.0.self_attn.q_proj.weight");
  EXPECT_EQ(*r->Apply("xax"), "model.yay");
}

TEST(RenamerTest, RewriteReferringToAMissingGroupIsRejected) {
  ExportHfOptions o;
  o.rename = {{"a(b)", R"(\2)"}};
  auto r = Renamer::Create(o);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(), HasSubstr("rename rule \"a(b)\""));
}

TEST(RenamerTest, FunctionTakesPrecedence) {
  ExportHfOptions o;
  o.rename = {{"a", "b"}};
  o.rename_fn = [](const std::string& s) -> Result<std::string> { return "fn:" + s; };
  auto r = Renamer::Create(o);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(*r->Apply("a"), "fn:a");
}

TEST(ExpertRulesTest, ValidatesStars) {
  EXPECT_TRUE(ValidateExpertRules(Qwen2MoeExperts()).ok());
  EXPECT_TRUE(ValidateExpertRules(MixtralExperts()).ok());
  EXPECT_EQ(ValidateExpertRules({{{"experts.w1"}, "experts.g", 1}}).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(ValidateExpertRules({{{"experts.*.*.w1"}, "experts.g", 1}}).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(ValidateExpertRules({{{"experts.*.w1"}, "experts.*", 1}}).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(ValidateExpertRules({{{}, "experts.g", 1}}).code(), StatusCode::kInvalidArgument);
}

TEST(SplitExpertsTest, FusedGateUpSplitsAlongDimOneGateFirst) {
  // [E=2, 2I=6, H=4]: expert e, gate rows [0, 3), up rows [3, 6).
  auto parts =
      SplitExperts("model.layers.3.mlp.experts.gate_up_proj", {2, 6, 4}, Qwen2MoeExperts());
  ASSERT_TRUE(parts.ok());
  ASSERT_EQ(parts->size(), 4u);
  EXPECT_EQ((*parts)[0].name, "model.layers.3.mlp.experts.0.gate_proj.weight");
  EXPECT_EQ((*parts)[0].box, (Box{{0, 0, 0}, {1, 3, 4}}));
  EXPECT_EQ((*parts)[1].name, "model.layers.3.mlp.experts.0.up_proj.weight");
  EXPECT_EQ((*parts)[1].box, (Box{{0, 3, 0}, {1, 3, 4}}));
  EXPECT_EQ((*parts)[3].name, "model.layers.3.mlp.experts.1.up_proj.weight");
  EXPECT_EQ((*parts)[3].box, (Box{{1, 3, 0}, {1, 3, 4}}));
  EXPECT_EQ((*parts)[3].shape, (Shape{3, 4}));
}

TEST(SplitExpertsTest, SingleSourceTakesWholeExperts) {
  auto parts = SplitExperts("layers.0.mlp.experts.down_proj", {3, 4, 5}, Qwen2MoeExperts());
  ASSERT_TRUE(parts.ok());
  ASSERT_EQ(parts->size(), 3u);
  EXPECT_EQ((*parts)[2].name, "layers.0.mlp.experts.2.down_proj.weight");
  EXPECT_EQ((*parts)[2].box, (Box{{2, 0, 0}, {1, 4, 5}}));
}

TEST(SplitExpertsTest, NegativeDimAndTransposedLayouts) {
  // [E, H, 2I] with gate/up concatenated on the last dim.
  std::vector<ExpertRule> rules = {
      {{"experts.*.gate.weight", "experts.*.up.weight"}, "experts.gate_and_up", -1}};
  auto parts = SplitExperts("experts.gate_and_up", {1, 2, 8}, rules);
  ASSERT_TRUE(parts.ok());
  ASSERT_EQ(parts->size(), 2u);
  EXPECT_EQ((*parts)[1].box, (Box{{0, 0, 4}, {1, 2, 4}}));
}

TEST(SplitExpertsTest, MatchesWholePartsOnly) {
  auto parts = SplitExperts("layers.0.mlp.experts.gate_up_projx", {2, 6, 4}, Qwen2MoeExperts());
  ASSERT_TRUE(parts.ok());
  EXPECT_TRUE(parts->empty());
  parts = SplitExperts("layers.0.xmlp.experts.gate_up_proj", {2, 6, 4}, Qwen2MoeExperts());
  ASSERT_TRUE(parts.ok());
  EXPECT_TRUE(parts->empty());
}

TEST(SplitExpertsTest, ShapesThatDoNotFitAreErrors) {
  auto odd = SplitExperts("mlp.experts.gate_up_proj", {2, 5, 4}, Qwen2MoeExperts());
  ASSERT_FALSE(odd.ok());
  EXPECT_THAT(odd.status().message(), HasSubstr("mlp.experts.gate_up_proj"));
  EXPECT_THAT(odd.status().message(), HasSubstr("equal parts"));
  auto scalar = SplitExperts("mlp.experts.down_proj", {}, Qwen2MoeExperts());
  EXPECT_EQ(scalar.status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace shardsafe
