// The elementwise maximum of gathered AllReduceMax contributions (each
// rank's uint64 values as raw bytes), shared by the backends that reduce
// what they gathered.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "shardsafe/status.h"

namespace shardsafe {

// InvalidArgument, naming the rank, when the ranks passed different counts.
Result<std::vector<uint64_t>> MaxOfGathered(const std::vector<std::string>& gathered);

}  // namespace shardsafe
