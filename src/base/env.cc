#include "base/env.h"

#include <charconv>
#include <cstdlib>
#include <string>
#include <string_view>

namespace shardsafe {

Result<int64_t> EnvInteger(const char* name, int64_t fallback, int64_t min, int64_t max) {
  const char* text = std::getenv(name);
  if (text == nullptr) return fallback;
  int64_t value = 0;
  const std::string_view s(text);
  auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), value);
  if (ec != std::errc() || ptr != s.data() + s.size() || value < min || value > max) {
    return InvalidArgumentError(std::string(name) + "=\"" + std::string(s) +
                                "\": expected an integer in [" + std::to_string(min) + ", " +
                                std::to_string(max) + "]");
  }
  return value;
}

}  // namespace shardsafe
