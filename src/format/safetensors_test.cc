// Reader tests: one per way a header can be damaged (formats.md §1.5 and
// the serde schema rules of §1.2), each asserting the code and the rule's
// message; then a run over the hostile files in tests/attacks/. The writer
// is tested in safetensors_writer_test.cc.
#include "format/safetensors.h"

#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <gtest/gtest.h>

namespace shardsafe {
namespace {

std::string Prefix(uint64_t n) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[i] = static_cast<char>((n >> (8 * i)) & 0xFF);
  return s;
}

// A whole file: length prefix, `json` verbatim, `data_bytes` zero bytes.
std::string File(std::string_view json, uint64_t data_bytes = 0) {
  return Prefix(json.size()) + std::string(json) + std::string(data_bytes, '\0');
}

// Runs both parsing stages over a whole file, as a reader would.
Result<SafetensorsHeader> ParseFile(std::string_view file) {
  auto prefix = std::as_bytes(std::span(file.data(), std::min<size_t>(file.size(), 8)));
  SS_ASSIGN_OR_RETURN(uint64_t n, ParseSafetensorsHeaderLength(prefix, file.size()));
  return ParseSafetensorsHeader(file.substr(8, n), file.size());
}

Result<SafetensorsHeader> Parse(std::string_view json, uint64_t data_bytes = 0) {
  return ParseFile(File(json, data_bytes));
}

// A one-tensor header: F32 [2] at [0, 8) unless overridden.
std::string One(std::string_view info = R"("dtype":"F32","shape":[2],"data_offsets":[0,8])") {
  return "{\"a\":{" + std::string(info) + "}}";
}

#define EXPECT_DATA_LOSS(result, substring)                                 \
  do {                                                                      \
    auto r_ = (result);                                                     \
    ASSERT_FALSE(r_.ok());                                                  \
    EXPECT_EQ(r_.status().code(), StatusCode::kDataLoss) << r_.status().ToString(); \
    EXPECT_NE(r_.status().message().find(substring), std::string::npos)     \
        << r_.status().message();                                           \
  } while (0)

#define EXPECT_PARSES(result)                                    \
  do {                                                           \
    auto r_ = (result);                                          \
    EXPECT_TRUE(r_.ok()) << r_.status().ToString();              \
  } while (0)

// --- Steps 1-3: the length prefix ---------------------------------------

TEST(SafetensorsParserTest, RejectsFileShorterThanPrefix) {
  EXPECT_DATA_LOSS(ParseFile(std::string(7, '\0')), "header too small");
}

TEST(SafetensorsParserTest, RejectsHeaderLengthOverLimit) {
  EXPECT_DATA_LOSS(ParseFile(Prefix(100'000'001) + "{}"), "header too large");
}

TEST(SafetensorsParserTest, RejectsHeaderLengthNearU64Max) {
  EXPECT_DATA_LOSS(ParseFile(Prefix(~uint64_t{0}) + "{}"), "header too large");
}

TEST(SafetensorsParserTest, HeaderLengthAtLimitPassesSizeCheck) {
  EXPECT_DATA_LOSS(ParseFile(Prefix(100'000'000) + "{}"), "invalid header length");
}

TEST(SafetensorsParserTest, RejectsHeaderLengthPastEndOfFile) {
  EXPECT_DATA_LOSS(ParseFile(Prefix(9) + "{}      "), "invalid header length");
}

TEST(SafetensorsParserTest, RejectsHeaderLongerThanFileGivenDirectly) {
  EXPECT_DATA_LOSS(ParseSafetensorsHeader("{}", 9), "invalid header length");
}

// --- Step 4: UTF-8 ---------------------------------------------------------

TEST(SafetensorsParserTest, RejectsInvalidUtf8) {
  EXPECT_DATA_LOSS(Parse("{\"\xff\":1}"), "invalid UTF-8 in header: invalid utf-8 sequence of 1 bytes from index 2");
}

TEST(SafetensorsParserTest, RejectsOverlongUtf8) {
  EXPECT_DATA_LOSS(Parse("{\"\xc0\xaf\":1}"), "invalid UTF-8 in header");
}

TEST(SafetensorsParserTest, RejectsEncodedSurrogate) {
  EXPECT_DATA_LOSS(Parse("{\"\xed\xa0\x80\":1}"), "invalid utf-8 sequence of 1 bytes from index 2");
}

TEST(SafetensorsParserTest, RejectsTruncatedUtf8) {
  EXPECT_DATA_LOSS(Parse("{}\xe2\x82"), "incomplete utf-8 byte sequence from index 2");
}

// --- Step 5: JSON into the schema ------------------------------------------

TEST(SafetensorsParserTest, RejectsEmptyHeader) {
  EXPECT_DATA_LOSS(Parse(""), "invalid JSON in header");
}

TEST(SafetensorsParserTest, RejectsByteOrderMark) {
  EXPECT_DATA_LOSS(Parse("\xEF\xBB\xBF{}"), "invalid JSON in header");
}

TEST(SafetensorsParserTest, RejectsNulPadding) {
  EXPECT_DATA_LOSS(Parse(std::string("{}\0\0\0\0\0\0", 8)), "invalid JSON in header: NUL byte");
}

TEST(SafetensorsParserTest, RejectsNonObjectTopLevel) {
  EXPECT_DATA_LOSS(Parse("[]"), "invalid JSON in header: invalid type: sequence");
}

TEST(SafetensorsParserTest, RejectsSyntaxError) {
  EXPECT_DATA_LOSS(Parse("{\"a\":}"), "invalid JSON in header: parse error");
}

TEST(SafetensorsParserTest, RejectsTrailingCharacters) {
  EXPECT_DATA_LOSS(Parse("{}x"), "invalid JSON in header");
}

TEST(SafetensorsParserTest, RejectsSecondTopLevelValue) {
  EXPECT_DATA_LOSS(Parse("{} {}"), "invalid JSON in header");
}

TEST(SafetensorsParserTest, AcceptsWhitespacePadding) {
  EXPECT_PARSES(Parse(" \t\r\n" + One() + "\n \t ", 8));
}

TEST(SafetensorsParserTest, RejectsUnknownDtype) {
  EXPECT_DATA_LOSS(Parse(One(R"("dtype":"F128","shape":[2],"data_offsets":[0,8])"), 8),
                   "unknown variant `F128`");
}

TEST(SafetensorsParserTest, RejectsLowercaseDtype) {
  EXPECT_DATA_LOSS(Parse(One(R"("dtype":"f32","shape":[2],"data_offsets":[0,8])"), 8),
                   "unknown variant `f32`");
}

TEST(SafetensorsParserTest, RejectsNonStringDtype) {
  EXPECT_DATA_LOSS(Parse(One(R"("dtype":17,"shape":[2],"data_offsets":[0,8])"), 8),
                   "invalid type: integer `17`, expected string or map");
}

TEST(SafetensorsParserTest, RejectsFloatShape) {
  EXPECT_DATA_LOSS(Parse(One(R"("dtype":"F32","shape":[2.0],"data_offsets":[0,8])"), 8),
                   "invalid type: floating point `2.0`, expected usize (tensor `a`)");
}

TEST(SafetensorsParserTest, RejectsExponentShape) {
  EXPECT_DATA_LOSS(Parse(One(R"("dtype":"F32","shape":[2e0],"data_offsets":[0,8])"), 8),
                   "floating point");
}

TEST(SafetensorsParserTest, RejectsNegativeShape) {
  EXPECT_DATA_LOSS(Parse(One(R"("dtype":"F32","shape":[-2],"data_offsets":[0,8])"), 8),
                   "invalid value: integer `-2`, expected usize");
}

TEST(SafetensorsParserTest, RejectsNegativeZeroShape) {
  EXPECT_DATA_LOSS(Parse(One(R"("dtype":"F32","shape":[-0],"data_offsets":[0,0])")),
                   "expected usize");
}

TEST(SafetensorsParserTest, RejectsLeadingZeroShape) {
  EXPECT_DATA_LOSS(Parse(One(R"("dtype":"F32","shape":[02],"data_offsets":[0,8])"), 8),
                   "invalid JSON in header");
}

TEST(SafetensorsParserTest, RejectsNullShape) {
  EXPECT_DATA_LOSS(Parse(One(R"("dtype":"F32","shape":[null],"data_offsets":[0,8])"), 8),
                   "invalid type: null, expected usize");
}

TEST(SafetensorsParserTest, RejectsShapeDimensionAboveU64) {
  EXPECT_DATA_LOSS(
      Parse(One(R"("dtype":"F32","shape":[18446744073709551616,0],"data_offsets":[0,0])")),
      "expected usize");
}

TEST(SafetensorsParserTest, RejectsShapeNotArray) {
  EXPECT_DATA_LOSS(Parse(One(R"("dtype":"F32","shape":2,"data_offsets":[0,8])"), 8),
                   "expected a sequence");
}

TEST(SafetensorsParserTest, RejectsThreeElementDataOffsets) {
  EXPECT_DATA_LOSS(Parse(One(R"("dtype":"F32","shape":[2],"data_offsets":[0,8,8])"), 8),
                   "expected a tuple of size 2");
}

TEST(SafetensorsParserTest, RejectsOneElementDataOffsets) {
  EXPECT_DATA_LOSS(Parse(One(R"("dtype":"F32","shape":[2],"data_offsets":[0])"), 8),
                   "invalid length 1, expected a tuple of size 2");
}

TEST(SafetensorsParserTest, RejectsObjectDataOffsets) {
  EXPECT_DATA_LOSS(
      Parse(One(R"("dtype":"F32","shape":[2],"data_offsets":{"begin":0,"end":8})"), 8),
      "invalid type: map, expected a tuple of size 2");
}

TEST(SafetensorsParserTest, RejectsFloatDataOffsets) {
  EXPECT_DATA_LOSS(Parse(One(R"("dtype":"F32","shape":[2],"data_offsets":[0,8.0])"), 8),
                   "floating point `8.0`");
}

TEST(SafetensorsParserTest, RejectsMissingDtype) {
  EXPECT_DATA_LOSS(Parse(One(R"("shape":[2],"data_offsets":[0,8])"), 8),
                   "missing field `dtype`");
}

TEST(SafetensorsParserTest, RejectsMissingShape) {
  EXPECT_DATA_LOSS(Parse(One(R"("dtype":"F32","data_offsets":[0,8])"), 8),
                   "missing field `shape`");
}

TEST(SafetensorsParserTest, RejectsMissingDataOffsets) {
  EXPECT_DATA_LOSS(Parse(One(R"("dtype":"F32","shape":[2])"), 8),
                   "missing field `data_offsets`");
}

TEST(SafetensorsParserTest, RejectsDuplicateFieldInTensorInfo) {
  EXPECT_DATA_LOSS(
      Parse(One(R"("dtype":"F32","dtype":"F32","shape":[2],"data_offsets":[0,8])"), 8),
      "duplicate field `dtype`");
}

TEST(SafetensorsParserTest, IgnoresUnknownTensorInfoField) {
  EXPECT_PARSES(Parse(
      One(R"("dtype":"F32","x":{"y":[1,2.5,null,"z"]},"shape":[2],"data_offsets":[0,8],"q":1)"),
      8));
}

TEST(SafetensorsParserTest, RejectsTensorInfoNotObject) {
  EXPECT_DATA_LOSS(Parse(R"({"a":5})"), "expected struct TensorInfo");
}

// serde accepts any struct as a sequence of its fields in order.
TEST(SafetensorsParserTest, AcceptsTensorInfoAsFieldSequence) {
  auto r = Parse(R"({"a":["F32",[2],[0,8]]})", 8);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->entries[0].dtype, DType::kF32);
}

TEST(SafetensorsParserTest, RejectsTensorInfoSequenceOfWrongLength) {
  EXPECT_DATA_LOSS(Parse(R"({"a":["F32",[2]]})", 8), "invalid length 2");
  EXPECT_DATA_LOSS(Parse(R"({"a":["F32",[2],[0,8],1]})", 8), "invalid length");
}

// serde's externally tagged enum form: {"VARIANT": null} or {"VARIANT": {}}.
TEST(SafetensorsParserTest, AcceptsDtypeAsSingleKeyMap) {
  EXPECT_PARSES(Parse(One(R"("dtype":{"F32":null},"shape":[2],"data_offsets":[0,8])"), 8));
  EXPECT_PARSES(Parse(One(R"("dtype":{"F32":{}},"shape":[2],"data_offsets":[0,8])"), 8));
}

TEST(SafetensorsParserTest, RejectsDtypeMapNotSingleKeyUnit) {
  EXPECT_DATA_LOSS(Parse(One(R"("dtype":{},"shape":[2],"data_offsets":[0,8])"), 8),
                   "map with a single key");
  EXPECT_DATA_LOSS(
      Parse(One(R"("dtype":{"F32":null,"F16":null},"shape":[2],"data_offsets":[0,8])"), 8),
      "map with a single key");
  EXPECT_DATA_LOSS(Parse(One(R"("dtype":{"F32":1},"shape":[2],"data_offsets":[0,8])"), 8),
                   "expected unit");
}

TEST(SafetensorsParserTest, RejectsDuplicateMetadataKey) {
  EXPECT_DATA_LOSS(Parse(R"({"__metadata__":{},"__metadata__":{}})"),
                   "duplicate field `__metadata__`");
  EXPECT_DATA_LOSS(Parse(R"({"__metadata__":null,"__metadata__":null})"),
                   "duplicate field `__metadata__`");
}

TEST(SafetensorsParserTest, AcceptsNullMetadata) {
  auto r = Parse(R"({"__metadata__":null})");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_FALSE(r->metadata.has_value());
}

TEST(SafetensorsParserTest, RejectsNonStringMetadataValue) {
  EXPECT_DATA_LOSS(Parse(R"({"__metadata__":{"a":1}})"), "invalid type: integer `1`, expected a string");
  EXPECT_DATA_LOSS(Parse(R"({"__metadata__":{"a":{}}})"), "expected a string");
  EXPECT_DATA_LOSS(Parse(R"({"__metadata__":{"a":null}})"), "expected a string");
}

TEST(SafetensorsParserTest, RejectsNonObjectMetadata) {
  EXPECT_DATA_LOSS(Parse(R"({"__metadata__":["a"]})"), "invalid type: sequence, expected a map");
}

TEST(SafetensorsParserTest, RejectsTensorNamedMetadata) {
  EXPECT_DATA_LOSS(Parse(R"({"__metadata__":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 8),
                   "expected a string");
}

TEST(SafetensorsParserTest, DuplicateMetadataKeysLastWins) {
  auto r = Parse(R"({"__metadata__":{"k":"1","k":"2"}})");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->metadata->at("k"), "2");
}

TEST(SafetensorsParserTest, DecodesEscapesInNames) {
  auto r = Parse(R"({"\u0041\n":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}})", 1);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->entries[0].name, "A\n");
}

TEST(SafetensorsParserTest, AcceptsEmptyName) {
  EXPECT_PARSES(Parse(R"({"":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}})", 1));
}

TEST(SafetensorsParserTest, RejectsLoneSurrogateEscape) {
  EXPECT_DATA_LOSS(Parse(R"({"\ud800":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}})", 1),
                   "invalid JSON in header");
}

TEST(SafetensorsParserTest, RejectsRawControlCharacterInName) {
  EXPECT_DATA_LOSS(Parse("{\"a\tb\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1),
                   "invalid JSON in header");
}

// serde_json's recursion limit: 127 open containers pass, 128 fail.
TEST(SafetensorsParserTest, RejectsNestingBeyondRecursionLimit) {
  auto nested = [](int depth) {  // top object + tensor info + `depth` arrays
    return One(R"("dtype":"F32","shape":[2],"data_offsets":[0,8],"x":)" +
               std::string(depth, '[') + std::string(depth, ']'));
  };
  EXPECT_PARSES(Parse(nested(125), 8));
  EXPECT_DATA_LOSS(Parse(nested(126), 8), "recursion limit exceeded");
}

TEST(SafetensorsParserTest, RejectsNumberOutOfRangeInIgnoredField) {
  EXPECT_DATA_LOSS(Parse(One(R"("dtype":"F32","shape":[2],"data_offsets":[0,8],"x":1e400)"), 8),
                   "invalid JSON in header: number overflow");
}

TEST(SafetensorsParserTest, DuplicateTensorNamesLastWins) {
  auto r = Parse(R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},)"
                 R"("a":{"dtype":"U8","shape":[16],"data_offsets":[0,16]}})", 16);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->entries.size(), 1u);
  EXPECT_EQ(r->entries[0].dtype, DType::kU8);
  EXPECT_EQ(r->duplicate_names, std::vector<std::string>{"a"});
}

TEST(SafetensorsParserTest, DuplicateTensorNameLeavingHoleIsInvalidOffset) {
  EXPECT_DATA_LOSS(Parse(R"({"a":{"dtype":"U8","shape":[16],"data_offsets":[0,16]},)"
                         R"("a":{"dtype":"U8","shape":[16],"data_offsets":[16,32]}})", 32),
                   "invalid offset for tensor `a`");
}

// --- Step 6: offsets and sizes ----------------------------------------------

TEST(SafetensorsParserTest, RejectsOverlappingOffsets) {
  EXPECT_DATA_LOSS(Parse(R"({"a":{"dtype":"U8","shape":[8],"data_offsets":[0,8]},)"
                         R"("b":{"dtype":"U8","shape":[8],"data_offsets":[4,12]}})", 12),
                   "invalid offset for tensor `b`");
}

TEST(SafetensorsParserTest, RejectsGapBetweenTensors) {
  EXPECT_DATA_LOSS(Parse(R"({"a":{"dtype":"U8","shape":[8],"data_offsets":[0,8]},)"
                         R"("b":{"dtype":"U8","shape":[8],"data_offsets":[9,17]}})", 17),
                   "invalid offset for tensor `b`");
}

TEST(SafetensorsParserTest, RejectsFirstTensorNotAtZero) {
  EXPECT_DATA_LOSS(Parse(One(R"("dtype":"U8","shape":[8],"data_offsets":[1,9])"), 9),
                   "invalid offset for tensor `a`");
}

TEST(SafetensorsParserTest, RejectsEndBeforeBegin) {
  EXPECT_DATA_LOSS(Parse(R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},)"
                         R"("b":{"dtype":"U8","shape":[0],"data_offsets":[4,2]}})", 4),
                   "invalid offset for tensor `b`");
}

TEST(SafetensorsParserTest, AcceptsOrderDependentOverflowEndingInZero) {
  EXPECT_PARSES(Parse(One(R"("dtype":"F32","shape":[18446744073709551615,0],"data_offsets":[0,0])")));
}

TEST(SafetensorsParserTest, RejectsShapeProductOverflow) {
  EXPECT_DATA_LOSS(
      Parse(One(R"("dtype":"F32","shape":[18446744073709551615,2,0],"data_offsets":[0,0])")),
      "overflow computing buffer size from shape and/or element type");
}

TEST(SafetensorsParserTest, RejectsBitCountOverflow) {
  EXPECT_DATA_LOSS(Parse(One(R"("dtype":"U8","shape":[2305843009213693952],"data_offsets":[0,0])")),
                   "overflow computing buffer size");
}

TEST(SafetensorsParserTest, RejectsF4OddElementCount) {
  EXPECT_DATA_LOSS(Parse(One(R"("dtype":"F4","shape":[3],"data_offsets":[0,1])"), 1),
                   "misaligned slice for tensor `a`");
}

TEST(SafetensorsParserTest, RejectsF4Scalar) {
  EXPECT_DATA_LOSS(Parse(One(R"("dtype":"F4","shape":[],"data_offsets":[0,1])"), 1),
                   "misaligned slice");
}

TEST(SafetensorsParserTest, RejectsF6ThreeElements) {
  EXPECT_DATA_LOSS(Parse(One(R"("dtype":"F6_E2M3","shape":[3],"data_offsets":[0,2])"), 2),
                   "misaligned slice");
}

TEST(SafetensorsParserTest, AcceptsF6FourElementsInThreeBytes) {
  EXPECT_PARSES(Parse(One(R"("dtype":"F6_E3M2","shape":[2,2],"data_offsets":[0,3])"), 3));
}

TEST(SafetensorsParserTest, RejectsSizeMismatch) {
  EXPECT_DATA_LOSS(Parse(One(R"("dtype":"F32","shape":[2],"data_offsets":[0,7])"), 7),
                   "invalid shape, data type, or offset for tensor `a`");
}

// --- Step 7: coverage of the file -------------------------------------------

TEST(SafetensorsParserTest, RejectsTrailingBytes) {
  EXPECT_DATA_LOSS(Parse(One(), 9), "incomplete metadata, file not fully covered");
}

TEST(SafetensorsParserTest, RejectsTruncatedData) {
  EXPECT_DATA_LOSS(Parse(One(), 7), "incomplete metadata, file not fully covered");
}

TEST(SafetensorsParserTest, RejectsDataAfterEmptyHeader) {
  EXPECT_DATA_LOSS(Parse("{}", 1), "incomplete metadata");
}

TEST(SafetensorsParserTest, AcceptsZeroSizeTensorsSharingOffsets) {
  auto r = Parse(R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},)"
                 R"("z2":{"dtype":"F32","shape":[0,3],"data_offsets":[4,4]},)"
                 R"("z1":{"dtype":"F64","shape":[0],"data_offsets":[4,4]},)"
                 R"("b":{"dtype":"U8","shape":[4],"data_offsets":[4,8]}})", 8);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->entries.size(), 4u);
  EXPECT_EQ(r->entries[1].name, "z1");
  EXPECT_EQ(r->entries[3].name, "b");
}

TEST(SafetensorsParserTest, SortsEntriesByOffsets) {
  auto r = Parse(R"({"b":{"dtype":"U8","shape":[4],"data_offsets":[4,8]},)"
                 R"("a":{"dtype":"F32","shape":[],"data_offsets":[0,4]}})", 8);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->entries[0].name, "a");
  EXPECT_EQ(r->entries[0].shape, Shape{});
  EXPECT_EQ(r->entries[1].begin, 4u);
  EXPECT_EQ(r->data_start(), 8 + r->header_bytes);
}

TEST(SafetensorsParserTest, AcceptsEmptyHeaderObject) {
  auto r = Parse("{}");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE(r->entries.empty());
  EXPECT_FALSE(r->metadata.has_value());
}

// --- tests/attacks: hostile files, each named after the rule it breaks -------

std::filesystem::path AttacksDir() {
  return std::filesystem::path(__FILE__).parent_path().parent_path().parent_path() / "tests" /
         "attacks";
}

TEST(SafetensorsAttacksTest, EveryAttackFileIsRejectedForItsRule) {
  std::ifstream expected(AttacksDir() / "expected.tsv");
  ASSERT_TRUE(expected) << "missing " << (AttacksDir() / "expected.tsv");
  std::string line;
  int count = 0;
  while (std::getline(expected, line)) {
    if (line.empty() || line[0] == '#') continue;
    const size_t tab = line.find('\t');
    ASSERT_NE(tab, std::string::npos) << line;
    const std::string name = line.substr(0, tab), want = line.substr(tab + 1);
    std::ifstream in(AttacksDir() / name, std::ios::binary);
    ASSERT_TRUE(in) << name;
    std::stringstream bytes;
    bytes << in.rdbuf();
    auto r = ParseFile(bytes.str());
    ASSERT_FALSE(r.ok()) << name << " was accepted";
    EXPECT_EQ(r.status().code(), StatusCode::kDataLoss) << name;
    EXPECT_NE(r.status().message().find(want), std::string::npos)
        << name << ": " << r.status().message();
    ++count;
  }
  EXPECT_GE(count, 20);
}

}  // namespace
}  // namespace shardsafe
