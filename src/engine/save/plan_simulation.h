// Every rank of a distributed plan (distributed_plan.h) in one process, for
// the tests and the planner benchmarks: each rank's RankPlanner runs the
// same methods PlanOverComm runs, the messages routed between them as the
// collectives route them. Nothing waits and no network is modelled; what is
// counted per rank is the time of its own calls and the bytes it sends and
// receives. A job of 16,384 ranks fits in a few GB: the messages to a rank
// are held back to back, not as a string each.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "engine/save/distributed_plan.h"
#include "engine/save/plan_home.h"

namespace shardsafe {

// What one simulated rank spent.
struct SimulatedRankCost {
  double seconds = 0;  // in its RankPlanner calls (rank 0's includes Coordinate)
  uint64_t sent = 0, received = 0;  // counted as PlanTraffic counts them
};

struct PlanSimulation {
  std::vector<SimulatedRankCost> ranks;
  double coordinate_seconds = 0;  // rank 0's round 4
  int busiest_home = 0;           // the most bytes received in round 1
  std::vector<std::string> busiest_home_received;  // those messages, by sender
};

// Plans a save of `world` ranks whose holdings `holdings_of(rank)` gives
// (called once per rank, in rank order; the shards are dropped after round
// 1). `on_part(rank, part)` gets each rank's result in rank order;
// `on_home(rank, home)`, when set, gets each rank's side as a home
// (RankPlanner::TakeHome) just before its part; `before_coordinate` /
// `after_coordinate`, when set, run around rank 0's
// round 4 (a benchmark measures its memory there).
PlanSimulation SimulatePlan(int world, const std::function<RankHoldings(int)>& holdings_of,
                            const SavePlanOptions& options,
                            const std::function<void(int, Result<SavePlan>)>& on_part,
                            const std::function<void()>& before_coordinate = {},
                            const std::function<void()>& after_coordinate = {},
                            const std::function<void(int, std::unique_ptr<KeyHome>)>& on_home = {});

}  // namespace shardsafe
