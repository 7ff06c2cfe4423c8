// What the Comm backends share: the elementwise maximum of gathered
// AllReduceMax contributions (each rank's uint64 values as raw bytes), and
// the checks of a Scatter's and an AllToAll's parts.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "shardsafe/status.h"

namespace shardsafe {

// A rank's AllReduceMax values as the raw bytes MaxOfGathered reads.
std::string PackValues(std::span<const uint64_t> values);

// InvalidArgument, naming the rank, when the ranks passed different counts.
Result<std::vector<uint64_t>> MaxOfGathered(const std::vector<std::string>& gathered);

// InvalidArgument unless a Scatter's root passed one part per rank.
Status CheckScatterParts(const std::vector<std::string>& parts, int size);

// InvalidArgument unless a rank passed AllToAll one part per rank.
Status CheckAllToAllParts(const std::vector<std::string>& parts, int size);

}  // namespace shardsafe
