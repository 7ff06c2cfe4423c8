// The messages ranks exchange during a save: what each rank holds (step 1
// of the protocol) and what each rank wrote (step 3).
#pragma once

#include <string>
#include <vector>

#include "engine/save_writer.h"
#include "layout/save_planner.h"

namespace shardsafe {

// What `state` holds, as its rank announces it: decoded, shard i is
// state.tensors[i] and blob j is state.blobs[j] (their keys, dtypes, shapes,
// slices and sizes; no data).
std::string EncodeHoldings(const std::string& tag, const SaveState& state);
Result<RankHoldings> DecodeHoldings(std::string_view msg, std::string* tag);

std::string EncodeWritten(const std::vector<WrittenFile>& files);
Result<std::vector<WrittenFile>> DecodeWritten(std::string_view msg);

}  // namespace shardsafe
