// A rank's part of a save plan (layout/plan_part.h) as rank 0 sends it in
// the save's planning round, with the digest of the layouts it was made
// from (plan_cache.h).
#pragma once

#include <string>

#include "engine/save/plan_cache.h"
#include "layout/save_planner.h"

namespace shardsafe {

struct PlanMessage {
  SavePlan plan;  // a part (plan.part set)
  Digest digest{};
};

std::string EncodePlanMessage(const SavePlan& part, const Digest& digest);
// Internal error on a malformed message (it comes from rank 0 of the same
// build), or on a part whose numbers point outside it.
Result<PlanMessage> DecodePlanMessage(std::string_view msg);

}  // namespace shardsafe
