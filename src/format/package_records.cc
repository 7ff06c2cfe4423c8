#include "format/package_records.h"

#include <set>
#include <string>

#include <nlohmann/json.hpp>

#include "format/safetensors.h"

namespace shardsafe {
namespace {

using nlohmann::json;

constexpr std::string_view kTensorTag = "__shardsafe_tensor__";
constexpr std::string_view kFloatTag = "__shardsafe_float__";

// `text` parsed, with nesting beyond the bound refused (the parser discards
// what lies deeper, so no deep tree is built).
Result<json> ParseBounded(std::string_view text, std::string_view what) {
  bool too_deep = false;
  const json::parser_callback_t bound = [&](int depth, json::parse_event_t event, json&) {
    const bool opens =
        event == json::parse_event_t::object_start || event == json::parse_event_t::array_start;
    if (opens && static_cast<size_t>(depth) >= kMaxPackageJsonNesting) too_deep = true;
    return !too_deep;
  };
  json j = json::parse(text, bound, /*allow_exceptions=*/false);
  if (too_deep) {
    return DataLossError(std::string(what) + " nests deeper than " +
                         std::to_string(kMaxPackageJsonNesting) + " arrays and objects");
  }
  if (j.is_discarded()) return DataLossError(std::string(what) + " is not JSON");
  return j;
}

std::string Shown(const json& v) {
  std::string text = v.dump(-1, ' ', false, json::error_handler_t::replace);
  return text.size() > 40 ? text.substr(0, 40) + "..." : text;
}

// Every tag in `value` (at `at`, a dotted path) is one the loader reads:
// a tensor tag names one of `tensors` (a per-rank value's; the values have
// no tensors, and no tensor tags either), a float tag a non-finite float.
Status CheckTags(const json& value, const std::string& at, const std::set<std::string>* tensors) {
  const auto bad = [&](const std::string& why) {
    return DataLossError("at " + (at.empty() ? std::string("the top") : at) + ": " + why);
  };
  if (value.is_array()) {
    for (size_t i = 0; i < value.size(); ++i) {
      SS_RETURN_IF_ERROR(CheckTags(value[i], at.empty() ? std::to_string(i)
                                                         : at + "." + std::to_string(i), tensors));
    }
    return Status();
  }
  if (!value.is_object()) return Status();
  if (tensors && value.size() == 1 && value.contains(kTensorTag)) {
    const json& name = value.at(kTensorTag);
    if (!name.is_string() || !tensors->count(name.get<std::string>())) {
      return bad("tensor tag " + Shown(name) + " names no tensor of the value");
    }
    return Status();
  }
  if (value.size() == 1 && value.contains(kFloatTag)) {
    const json& f = value.at(kFloatTag);
    if (f != "nan" && f != "inf" && f != "-inf") {
      return bad("float tag " + Shown(f) + " is none of \"nan\", \"inf\", \"-inf\"");
    }
    return Status();
  }
  for (const auto& [key, item] : value.items()) {
    SS_RETURN_IF_ERROR(CheckTags(item, at.empty() ? key : at + "." + key, tensors));
  }
  return Status();
}

}  // namespace

bool IsPerRankValueBlob(std::string_view blob_name) {
  return blob_name.substr(0, kPerRankValuePrefix.size()) == kPerRankValuePrefix;
}

Status CheckPerRankValue(std::string_view header_json, uint64_t blob_bytes) {
  SS_ASSIGN_OR_RETURN(SafetensorsHeader header, ParseSafetensorsHeader(header_json, blob_bytes));
  if (!header.metadata || !header.metadata->count("value")) {
    return DataLossError("no \"value\" in the safetensors metadata");
  }
  std::set<std::string> tensors;
  for (const SafetensorsEntry& e : header.entries) tensors.insert(e.name);
  SS_ASSIGN_OR_RETURN(json value, ParseBounded(header.metadata->at("value"), "the value"));
  return CheckTags(value, "", &tensors);
}

Status CheckValuesJson(std::string_view values_json) {
  SS_ASSIGN_OR_RETURN(json values, ParseBounded(values_json, "the values"));
  return CheckTags(values, "", nullptr);
}

}  // namespace shardsafe
