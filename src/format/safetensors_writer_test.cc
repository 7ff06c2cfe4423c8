// Writer tests: the upstream byte vectors W1-W8 (formats.md §1.4), the
// canonical order and escaping, the rejected inputs, and a header built and
// parsed back.
#include <gtest/gtest.h>

#include "format/safetensors.h"

namespace shardsafe {
namespace {

std::string Prefix(uint64_t n) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[i] = static_cast<char>((n >> (8 * i)) & 0xFF);
  return s;
}

std::string Built(std::span<const EntrySpec> entries,
                  std::optional<std::map<std::string, std::string>> metadata = std::nullopt) {
  auto r = BuildSafetensorsHeader(entries, metadata);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return r.ok() ? r->header : "";
}

std::string Padded(std::string json) {
  json.append((8 - json.size() % 8) % 8, ' ');
  return Prefix(json.size()) + json;
}

TEST(SafetensorsWriterTest, W1EmptyWithoutMetadata) {
  EXPECT_EQ(Built({}), Prefix(8) + "{}      ");
}

TEST(SafetensorsWriterTest, W2EmptyWithMetadata) {
  EXPECT_EQ(Built({}, {{{"framework", "pt"}}}),
            Prefix(40) + R"({"__metadata__":{"framework":"pt"}})" + "     ");
}

TEST(SafetensorsWriterTest, W3NoPaddingNeeded) {
  const EntrySpec e[] = {{"attn.0", DType::kF32, {1, 2, 3}, 24}};
  EXPECT_EQ(Built(e),
            Prefix(64) + R"({"attn.0":{"dtype":"F32","shape":[1,2,3],"data_offsets":[0,24]}})");
}

TEST(SafetensorsWriterTest, W4SevenSpaces) {
  const EntrySpec e[] = {{"attn0", DType::kF32, {1, 1, 2, 3}, 24}};
  EXPECT_EQ(Built(e), Prefix(72) +
                          R"({"attn0":{"dtype":"F32","shape":[1,1,2,3],"data_offsets":[0,24]}})" +
                          "       ");
}

TEST(SafetensorsWriterTest, W5F4) {
  const EntrySpec e[] = {{"attn.0", DType::kF4, {1, 2}, 1}};
  EXPECT_EQ(Built(e), Prefix(64) + R"({"attn.0":{"dtype":"F4","shape":[1,2],"data_offsets":[0,1]}})" +
                          "    ");
}

TEST(SafetensorsWriterTest, W6Python) {
  const EntrySpec e[] = {{"test", DType::kI32, {2, 2}, 16}};
  const std::string h = Built(e);
  EXPECT_EQ(h, Prefix(64) + R"({"test":{"dtype":"I32","shape":[2,2],"data_offsets":[0,16]}})" +
                   "    ");
  EXPECT_EQ(h[0], '@');
}

TEST(SafetensorsWriterTest, W7ForcedAlignment) {
  const EntrySpec e[] = {{"test2", DType::kF16, {2, 2}, 8}, {"test1", DType::kI32, {2, 2}, 16}};
  auto r = BuildSafetensorsHeader(e, std::nullopt);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->header, Prefix(128) +
                           R"({"test1":{"dtype":"I32","shape":[2,2],"data_offsets":[0,16]},)"
                           R"("test2":{"dtype":"F16","shape":[2,2],"data_offsets":[16,24]}})" +
                           "      ");
  EXPECT_EQ(r->order, (std::vector<uint32_t>{1, 0}));
  EXPECT_EQ(r->offsets, (std::vector<uint64_t>{136 + 16, 136}));
  EXPECT_EQ(r->file_size, 136u + 24);
}

TEST(SafetensorsWriterTest, W8WithMetadata) {
  const EntrySpec e[] = {{"test1", DType::kI32, {2, 2}, 16}};
  const std::string h = Built(e, {{{"framework", "pt"}}});
  EXPECT_EQ(h, Prefix(96) + R"({"__metadata__":{"framework":"pt"},)"
                            R"("test1":{"dtype":"I32","shape":[2,2],"data_offsets":[0,16]}})" +
                   " ");
  EXPECT_EQ(h[0], '`');
}

TEST(SafetensorsWriterTest, WritesEmptyMetadataObject) {
  EXPECT_EQ(Built({}, std::map<std::string, std::string>{}),
            Padded(R"({"__metadata__":{}})"));
}

TEST(SafetensorsWriterTest, SortsByDtypeDescendingThenName) {
  const EntrySpec e[] = {{"b", DType::kBool, {1}, 1},  {"x", DType::kU64, {1}, 8},
                         {"a", DType::kBF16, {1}, 2},  {"B", DType::kBF16, {1}, 2},
                         {"f", DType::kF4, {2}, 1},    {"c", DType::kC64, {1}, 8}};
  auto r = BuildSafetensorsHeader(e, std::nullopt);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->order, (std::vector<uint32_t>{1, 5, 3, 2, 4, 0}));
}

TEST(SafetensorsWriterTest, EscapesLikeSerdeJson) {
  const EntrySpec e[] = {{"q\"b\\s\n\t\r\b\f\x01\x1f\x7f\xc3\xa9", DType::kU8, {0}, 0}};
  EXPECT_EQ(Built(e, {{{"k", "\x02"}}}),
            Padded(R"({"__metadata__":{"k":"\u0002"},"q\"b\\s\n\t\r\b\f\u0001\u001f)"
                   "\x7f\xc3\xa9" R"(":{"dtype":"U8","shape":[0],"data_offsets":[0,0]}})"));
}

TEST(SafetensorsWriterTest, SortsMetadataKeys) {
  EXPECT_EQ(Built({}, {{{"b", "2"}, {"a", "1"}}}),
            Padded(R"({"__metadata__":{"a":"1","b":"2"}})"));
}

TEST(SafetensorsWriterTest, RejectsDuplicateNames) {
  const EntrySpec e[] = {{"a", DType::kU8, {1}, 1}, {"a", DType::kU8, {1}, 1}};
  auto r = BuildSafetensorsHeader(e, std::nullopt);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("given twice"), std::string::npos);
}

TEST(SafetensorsWriterTest, RejectsMetadataName) {
  const EntrySpec e[] = {{"__metadata__", DType::kU8, {1}, 1}};
  auto r = BuildSafetensorsHeader(e, std::nullopt);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("reserved"), std::string::npos);
}

TEST(SafetensorsWriterTest, RejectsByteCountMismatch) {
  const EntrySpec e[] = {{"a", DType::kF32, {2, 3}, 23}};
  auto r = BuildSafetensorsHeader(e, std::nullopt);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("takes 24"), std::string::npos);
}

TEST(SafetensorsWriterTest, RejectsF4OddElementCount) {
  const EntrySpec e[] = {{"a", DType::kF4, {3}, 1}};
  EXPECT_EQ(BuildSafetensorsHeader(e, std::nullopt).status().code(),
            StatusCode::kInvalidArgument);
}

TEST(SafetensorsWriterTest, RejectsShapeOverflow) {
  const EntrySpec e[] = {{"a", DType::kU8, {~uint64_t{0}, 2}, 0}};
  EXPECT_EQ(BuildSafetensorsHeader(e, std::nullopt).status().code(),
            StatusCode::kInvalidArgument);
}

TEST(SafetensorsWriterTest, RejectsHeaderTooLarge) {
  std::map<std::string, std::string> metadata = {{"big", std::string(100'000'000, 'x')}};
  auto r = BuildSafetensorsHeader({}, metadata);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("header too large"), std::string::npos);
}

TEST(SafetensorsWriterTest, PadsTheHeaderUntilTheDataStartsAligned) {
  const EntrySpec e[] = {{"w", DType::kBF16, {3, 5}, 30}, {"b", DType::kU8, {3}, 3}};
  auto ref = BuildSafetensorsHeader(e, std::nullopt);
  auto paged = BuildSafetensorsHeader(e, std::nullopt, kDataFileAlignment);
  ASSERT_TRUE(ref.ok() && paged.ok());
  EXPECT_EQ(paged->header.size(), kDataFileAlignment);
  EXPECT_EQ(paged->file_size, kDataFileAlignment + 33);
  EXPECT_EQ(paged->offsets, (std::vector<uint64_t>{kDataFileAlignment, kDataFileAlignment + 30}));
  // The same JSON, then only spaces: N counts them.
  const std::string json = ref->header.substr(8);
  EXPECT_EQ(paged->header.substr(8, json.size()), json);
  EXPECT_EQ(paged->header.find_first_not_of(' ', 8 + json.size()), std::string::npos);
  EXPECT_EQ(paged->header.substr(0, 8), Prefix(kDataFileAlignment - 8));
  auto parsed = ParseSafetensorsHeader(std::string_view(paged->header).substr(8),
                                       paged->file_size);
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  ASSERT_EQ(parsed->entries.size(), 2u);
}

TEST(SafetensorsWriterTest, RejectsAnAlignmentThatIsNotAPowerOfTwoFromEight) {
  const EntrySpec e[] = {{"b", DType::kU8, {3}, 3}};
  for (uint64_t bad : {0, 1, 4, 24, 4095}) {
    EXPECT_EQ(BuildSafetensorsHeader(e, std::nullopt, bad).status().code(),
              StatusCode::kInvalidArgument)
        << bad;
  }
}

TEST(SafetensorsWriterTest, BuiltHeaderParsesBack) {
  const EntrySpec e[] = {{"w", DType::kBF16, {3, 5}, 30},
                         {"scale", DType::kF32, {}, 4},
                         {"fp4", DType::kF4, {4, 2}, 4},
                         {"empty", DType::kI64, {0, 7}, 0},
                         {"\xe2\x82\xac \"q\"", DType::kU8, {3}, 3}};
  const std::map<std::string, std::string> meta = {{"format", "pt"}, {"x\ny", "\"z\""}};
  auto built = BuildSafetensorsHeader(e, meta);
  ASSERT_TRUE(built.ok()) << built.status().ToString();
  EXPECT_EQ(built->header.size() % 8, 0u);
  auto parsed = ParseSafetensorsHeader(std::string_view(built->header).substr(8), built->file_size);
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  EXPECT_EQ(parsed->metadata, meta);
  ASSERT_EQ(parsed->entries.size(), 5u);
  for (size_t k = 0; k < 5; ++k) {
    const SafetensorsEntry& got = parsed->entries[k];
    const EntrySpec& want = e[built->order[k]];
    EXPECT_EQ(got.name, want.name);
    EXPECT_EQ(got.dtype, want.dtype);
    EXPECT_EQ(got.shape, want.shape);
    EXPECT_EQ(parsed->data_start() + got.begin, built->offsets[built->order[k]]);
    EXPECT_EQ(got.end - got.begin, want.bytes);
  }
}

}  // namespace
}  // namespace shardsafe
