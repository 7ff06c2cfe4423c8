// The messages ranks exchange during a save: what each rank holds (step 1
// of the protocol) and what each rank wrote (step 3).
#pragma once

#include <string>
#include <vector>

#include "engine/save_writer.h"
#include "layout/save_planner.h"

namespace shardsafe {

std::string EncodeHoldings(const std::string& tag, const RankHoldings& holdings);
Result<RankHoldings> DecodeHoldings(std::string_view msg, std::string* tag);

std::string EncodeWritten(const std::vector<WrittenFile>& files);
Result<std::vector<WrittenFile>> DecodeWritten(std::string_view msg);

}  // namespace shardsafe
