// The JSON a save carries (SaveState::values, metadata, layout: JSON text
// from the caller), parsed once per rank and written back in one canonical
// form: compact, object keys sorted, invalid UTF-8 in strings replaced by
// U+FFFD. The canonical text is what the index stores and what ranks compare.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "shardsafe/checkpoint.h"

namespace shardsafe {

struct UserJson {
  std::string values = "{}";  // a JSON object
  std::string metadata;       // JSON text; empty: none
  std::string layout;         // JSON text; empty: none
  // Per value key: (canonical text size << 32) | CRC-32C of it, so ranks can
  // check that they pass the same values without sending them.
  std::vector<std::pair<std::string, uint64_t>> fingerprints;
};

// InvalidArgument naming the field ("values", "metadata", "layout") for
// text that is not JSON, or values that are not an object.
Result<UserJson> ParseUserJson(const SaveState& state);

}  // namespace shardsafe
