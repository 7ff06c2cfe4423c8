#include "engine/save/user_json.h"

#include <nlohmann/json.hpp>

#include "base/crc32c.h"

namespace shardsafe {
namespace {

using Json = nlohmann::json;  // std::map objects: keys come out sorted

std::string Dump(const Json& j) {
  return j.dump(-1, ' ', false, Json::error_handler_t::replace);
}

// The canonical text of `text` (empty stays empty: none).
Result<std::string> Canonical(const std::string& text, const char* field, Json* parsed) {
  if (text.empty()) return std::string();
  *parsed = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (parsed->is_discarded()) {
    return InvalidArgumentError(std::string(field) + ": not valid JSON text");
  }
  return Dump(*parsed);
}

}  // namespace

Result<UserJson> ParseUserJson(const SaveState& state) {
  UserJson out;
  Json values = Json::object();
  SS_ASSIGN_OR_RETURN(std::string text, Canonical(state.values, "values", &values));
  if (!values.is_object()) return InvalidArgumentError("values: not a JSON object");
  if (!text.empty()) out.values = std::move(text);
  for (const auto& [key, value] : values.items()) {
    const std::string v = Dump(value);
    out.fingerprints.emplace_back(key, uint64_t{v.size()} << 32 | Crc32c(v.data(), v.size()));
  }
  Json scratch;
  SS_ASSIGN_OR_RETURN(out.metadata, Canonical(state.metadata, "metadata", &scratch));
  SS_ASSIGN_OR_RETURN(out.layout, Canonical(state.layout, "layout", &scratch));
  return out;
}

}  // namespace shardsafe
