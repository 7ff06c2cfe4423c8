// ScanSafetensorsHeader: the same verdict and error as
// ParseSafetensorsHeader on every header (hand-made, randomly damaged, the
// hostile files of tests/attacks), and the entries the parser keeps.
#include <filesystem>
#include <fstream>
#include <cctype>
#include <random>
#include <sstream>

#include <gtest/gtest.h>

#include "format/safetensors.h"

namespace shardsafe {
namespace {

// ParseSafetensorsHeader's verdict on `json` (of a file with `data_bytes`
// after it) and the entries it keeps (sorted by name) with the repeated
// names; then ScanSafetensorsHeader's.
std::string Parsed(std::string_view json, uint64_t data_bytes) {
  auto r = ParseSafetensorsHeader(json, 8 + json.size() + data_bytes);
  if (!r.ok()) return r.status().ToString();
  std::vector<std::string> names;
  for (const SafetensorsEntry& e : r->entries) {
    names.push_back(e.name + "@" + std::to_string(e.begin) + "-" + std::to_string(e.end) + ":" +
                    std::string(DTypeName(e.dtype)) + ShapeToString(e.shape));
  }
  std::sort(names.begin(), names.end());
  std::string out;
  for (const std::string& n : names) out += n + ";";
  for (const std::string& d : r->duplicate_names) out += "dup " + d + ";";
  return out;
}

std::string Scanned(std::string_view json, uint64_t data_bytes) {
  std::vector<std::string> names, duplicates;
  Status s = ScanSafetensorsHeader(
      json, 8 + json.size() + data_bytes,
      [&](const SafetensorsEntry& e) {
        names.push_back(e.name + "@" + std::to_string(e.begin) + "-" + std::to_string(e.end) +
                        ":" + std::string(DTypeName(e.dtype)) + ShapeToString(e.shape));
      },
      &duplicates);
  if (!s.ok()) return s.ToString();
  std::sort(names.begin(), names.end());
  std::string out;
  for (const std::string& n : names) out += n + ";";
  for (const std::string& d : duplicates) out += "dup " + d + ";";
  return out;
}

// Returns the parser's verdict.
std::string ExpectScannedAsParsed(std::string_view json, uint64_t data_bytes) {
  const std::string parsed = Parsed(json, data_bytes);
  EXPECT_EQ(Scanned(json, data_bytes), parsed) << json;
  return parsed;
}

// Entries of 8 bytes each, at [8i, 8i + 8), named as given.
std::string Header(const std::vector<std::string>& names) {
  std::string json = "{\"__metadata__\":{\"format\":\"pt\"}";
  for (size_t i = 0; i < names.size(); ++i) {
    json += ",\"" + names[i] + "\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[" +
            std::to_string(8 * i) + "," + std::to_string(8 * i + 8) + "]}";
  }
  return json + "}";
}

TEST(ScanSafetensorsHeaderTest, ValidHeadersGiveTheEntriesTheParserKeeps) {
  ExpectScannedAsParsed(Header({"a", "b", "c"}), 24);
  ExpectScannedAsParsed("{}", 0);
  // Empty tensors tied at one offset (ordered by name), between others.
  ExpectScannedAsParsed(
      R"({"z":{"dtype":"F32","shape":[0],"data_offsets":[8,8]},)"
      R"("a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
      R"("y":{"dtype":"F32","shape":[0],"data_offsets":[8,8]},)"
      R"("b":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})",
      16);
}

TEST(ScanSafetensorsHeaderTest, RepeatedNamesTheLastWins) {
  // "a" twice: the second's range is kept, so the first's bytes are a gap.
  ExpectScannedAsParsed(Header({"a", "b", "a"}), 24);
  // Repeated over the same range: valid, one entry kept, one repeat named.
  ExpectScannedAsParsed(
      R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
      R"("b":{"dtype":"F32","shape":[2],"data_offsets":[8,16]},)"
      R"("a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
      R"("b":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})",
      16);
}

TEST(ScanSafetensorsHeaderTest, DamagedHeadersFailAlike) {
  for (const std::string& json : {
           std::string(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})"),
           std::string(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})"),
           std::string(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})"),
           std::string(R"({"a":{"dtype":"F4","shape":[3],"data_offsets":[0,2]}})"),
           std::string(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                       R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})"),
           std::string(R"({"a":{"dtype":"F32","shape":[2]}})"),
           std::string("{\"a\":\0}", 7), std::string("\xEF\xBB\xBF{}"), std::string("{\xff}"),
       }) {
    for (uint64_t data : {0, 8, 16}) ExpectScannedAsParsed(json, data);
  }
}

TEST(ScanSafetensorsHeaderTest, RandomDamageScansAsItParses) {
  // Valid: a repeat over the same range, empty tensors tied at one offset.
  const std::string base = Header({"w.0", "w.1", "b", "w.10"}).substr(
                               0, Header({"w.0", "w.1", "b", "w.10"}).size() - 1) +
                           R"(,"w.0":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                           R"("e":{"dtype":"F32","shape":[0],"data_offsets":[8,8]},)"
                           R"("d":{"dtype":"F32","shape":[0],"data_offsets":[8,8]}})";
  ASSERT_EQ(Parsed(base, 32).rfind("DATA_LOSS", 0), std::string::npos) << Parsed(base, 32);
  std::mt19937 rng(48);
  const std::string alphabet = "{}[]\",:012345678 abwe.";
  int read = 0, past_the_schema = 0;  // how far the damaged headers got
  for (int round = 0; round < 3000; ++round) {
    std::string json = base;
    for (int e = 0, n = 1 + static_cast<int>(rng() % 3); e < n && !json.empty(); ++e) {
      const size_t at = rng() % json.size();
      switch (rng() % 5) {
        case 0: json[at] = alphabet[rng() % alphabet.size()]; break;
        case 1: json.erase(at, 1 + rng() % 6); break;
        case 2: json.insert(at, json.substr(at, 1 + rng() % 30)); break;
        default:  // a digit or a letter of a name for another: the grammar holds
          if (std::isdigit(static_cast<unsigned char>(json[at]))) json[at] = '0' + rng() % 10;
          if (std::islower(static_cast<unsigned char>(json[at]))) json[at] = 'a' + rng() % 3;
      }
    }
    const std::string verdict = ExpectScannedAsParsed(json, rng() % 4 ? 32 : 8 * (rng() % 8));
    read += verdict.rfind("DATA_LOSS", 0) != 0;
    past_the_schema += verdict.find("invalid JSON") == std::string::npos;
  }
  EXPECT_GT(read, 50);              // damage that leaves a valid header
  EXPECT_GT(past_the_schema, 250);  // and steps 6-7 (ranges and sizes), not JSON's
}

TEST(ScanSafetensorsHeaderTest, AttackFilesFailAlike) {
  const std::filesystem::path dir =
      std::filesystem::path(__FILE__).parent_path().parent_path().parent_path() / "tests" /
      "attacks";
  int files = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (entry.path().extension() != ".safetensors") continue;
    std::ifstream in(entry.path(), std::ios::binary);
    std::stringstream bytes;
    bytes << in.rdbuf();
    const std::string file = bytes.str();
    auto prefix = std::as_bytes(std::span(file.data(), std::min<size_t>(file.size(), 8)));
    auto n = ParseSafetensorsHeaderLength(prefix, file.size());
    if (!n.ok()) continue;  // rejected before a header is read
    ExpectScannedAsParsed(std::string_view(file).substr(8, *n), file.size() - 8 - *n);
    ++files;
  }
  EXPECT_GT(files, 10);
}

}  // namespace
}  // namespace shardsafe
