// Integer settings from environment variables.
#pragma once

#include <cstdint>

#include "shardsafe/status.h"

namespace shardsafe {

// The integer in environment variable `name`, or `fallback` when it is
// unset; InvalidArgument, naming the variable, its text and the range, when
// it is not a whole decimal integer in [min, max].
Result<int64_t> EnvInteger(const char* name, int64_t fallback, int64_t min, int64_t max);

}  // namespace shardsafe
