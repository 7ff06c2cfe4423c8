// Every rank of a distributed plan (distributed_plan.h) and of its index
// (distributed_index.h) in one process, for the tests and the planner
// benchmarks: each rank's RankPlanner and IndexRounds run the same methods
// PlanOverComm and IndexOverComm run, the messages routed between them as
// the collectives route them. Nothing waits and no network is modelled; what is
// counted per rank is the time of its own calls and the bytes it sends and
// receives. The messages to a rank are held back to back, not as a string
// each; SimulatePlan then SimulateIndex hold every rank's part of the plan
// and every home's keys at once (at 16,384 ranks ~21 GB for FSDP, 4.8 GB
// for TP x PP x DP), and SimulateSave, the same in one, 35-40% less
// (12.7 GB, 3.1 GB; below).
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "engine/plan/distributed_plan.h"
#include "engine/plan/plan_home.h"
#include "engine/save/distributed_index.h"

namespace shardsafe {

// What one simulated rank spent.
struct SimulatedRankCost {
  double seconds = 0;  // in its RankPlanner calls (rank 0's includes Coordinate)
  uint64_t sent = 0, received = 0;  // counted as PlanTraffic counts them
};

// What one rank received from the other ranks in the rounds' collectives,
// by kind of collective, each in the rounds' order: enough for that rank to
// run its own rounds again, alone, over a Comm double that hands it these
// (engine/bench/simulated_rank.h; the planner benchmark times rank 0 so). A
// rank's own slot holds what it sent itself.
struct RankInbox {
  std::deque<std::vector<std::string>> all_to_all;  // by sender: rounds 1, 2, 5 (7)
  // By sender: rank 0's gather of round 3 (8), and round 6's all-gather.
  std::deque<std::vector<std::string>> gathered;
  std::deque<std::string> scattered;  // round 4: rank 0's message to this rank
};

struct PlanSimulation {
  std::vector<SimulatedRankCost> ranks;
  double coordinate_seconds = 0;  // rank 0's round 4
  // The busiest home: the rank other than 0 that received the most bytes
  // from the others in round 1 (the lowest of equal ones; -1 in a job of
  // one rank), and what it and rank 0 received in the six rounds.
  int other = -1;
  RankInbox rank0_inbox, other_inbox;
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

// Rounds 7 and 8 of the index made together, simulated the same way.
struct IndexSimulation {
  std::vector<SimulatedRankCost> ranks;  // rank 0's seconds include Assemble
  Result<IndexSkeleton> skeleton = IndexSkeleton();  // rank 0's, or the error
  RankInbox rank0_inbox, other_inbox;  // what rank 0 and rank `other` received
};

// Rounds 7 and 8 over every rank's part of the plan (`parts`, by rank) and
// side as a home (`homes`, null where none), recording what rank 0 and rank
// `other` receive (-1: none). `on_table_part(rank, bytes)`, when set, gets
// each home's part of the chunk table, in rank order.
IndexSimulation SimulateIndex(const std::vector<SavePlan>& parts,
                              const std::vector<std::unique_ptr<KeyHome>>& homes, int other,
                              const std::function<void(int, const std::string&)>& on_table_part = {});

// SimulatePlan and SimulateIndex in one, holding less: no rank
// holds its part of the plan in full except while it is handled (each
// part is kept as EncodePlanMessage encodes it, decoded for each of rounds
// 7 and 8), each rank's planner is dropped once it has its part, and each
// home once its round-8 summary is made. The price is time: rounds 1-6
// run twice (the first run gives every rank's round-6 message, which each
// rank's Finish needs before any part exists; the second must pack the
// same, or the skeleton is an InternalError), and round 8 makes each
// rank's round-7 messages again, uncounted. Costs, inboxes and results are
// those of SimulatePlan followed by SimulateIndex on the same job (the
// planner benchmark's --check-simulation compares them). `on_part(rank,
// part)` gets each rank's part (or the error every rank gets) in rank
// order, before round 7; a failed part leaves the index unmade, its
// skeleton that error.
struct SaveSimulation {
  PlanSimulation plan;
  IndexSimulation index;
  // The parts of rank 0 and rank plan.other, as EncodePlanMessage encodes
  // them (no digest), and their parts of the chunk table (empty: none).
  std::string rank0_part, other_part, rank0_table_part, other_table_part;
};
SaveSimulation SimulateSave(int world, const std::function<RankHoldings(int)>& holdings_of,
                            const SavePlanOptions& options,
                            const std::function<void(int, const Result<SavePlan>&)>& on_part,
                            const std::function<void(int, const std::string&)>& on_table_part = {});

// Runs SimulatePlan and SimulateIndex, then SimulateSave, on the same job
// and compares what they give: the busiest home, every rank's part and
// table part, the bytes every rank sends and receives, what rank 0 and the
// busiest home receive in every round (round 8's summaries, from which
// rank 0 assembles the skeleton, among them) and the skeleton's outcome.
// InternalError naming the first difference. Holds both at once: for
// small jobs (tests, the planner benchmark's --check-simulation).
Status CheckSimulateSave(int world, const std::function<RankHoldings(int)>& holdings_of,
                         const SavePlanOptions& options);

}  // namespace shardsafe
