// One row of the planner benchmark: what planning and metadata cost one
// rank of a simulated job, measured on the engine's own code.
//
// The job's ranks are simulated one at a time (their holdings computed,
// encoded as a save encodes them, and dropped), and rank 0 runs the
// engine's step 0, GatherAndPlan (engine/save/save_internal.h), through a
// SimulatedRank whose collectives hand it the other ranks' messages. Every
// rank plans the same way (but for encoding its own layout); rank 0 is the
// busiest in coordination, as it gathers every rank's report and roots the
// broadcasts. What it measures:
//
//   plan_s             GatherAndPlan of a first save (no cached plan): the
//                      quick check (ReduceMaxOrFail), the layout all-gather
//                      (GatherOrFail: unframing, then DecodeHoldings of every
//                      rank's message, CheckAgreement), PlanSave over all
//                      ranks, the plan's digest and StorePlan.
//   repeat_plan_s      GatherAndPlan of the next save, layout unchanged:
//                      EncodeLayout, LookUpPlan, the comparison with the
//                      cached layout, the quick check; the plan is reused.
//   peak_rss_bytes     VmHWM while the gathered messages are built and the
//                      first save is planned, less VmRSS before: the
//                      received messages, their decoded form and the plan.
//   coord_bytes        bytes rank 0 sends plus receives in a first save,
//                      counted by SimulatedRank: step 0's reduction and
//                      all-gather, then steps 1-3 as Save runs them with the
//                      collective helpers (comm/agree.h): the broadcast of
//                      the save's directories, every rank's report gathered
//                      to rank 0 (EncodeReport of its files and replica
//                      checksums, from the plan), the outcome's broadcast.
//   repeat_coord_bytes the same for a repeated save.
//   other_*            the same for the rank other than 0 with the largest
//                      report: step 0 as rank 0's, where its collectives
//                      are symmetric (all-gathers, reductions; else left
//                      out), steps 1-3 run as that rank.
//   load_meta_bytes    the index a loader reads: SerializeIndex of BuildIndex
//                      (the commit's own) over the plan and the reports.
//   load_meta_s        ParseIndex of it; none when it exceeds
//                      kMaxIndexBytes, which the loader refuses.
//   writer_balance     the busiest writer's bytes / IdealMaxRankBytes.
//
// Timings are the best of `iters` runs. Synthesized, since no byte is
// written: file offsets (each file's chunks back to back after 4 KiB) and
// checksums. Writing, and rank 0's commit, are left out.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include "planner_jobs.h"

namespace shardsafe::bench {

struct Row {
  std::string layout;
  int world = 0;
  std::optional<double> plan_s, repeat_plan_s, load_meta_s, writer_balance;
  std::optional<uint64_t> peak_rss_bytes, coord_bytes, repeat_coord_bytes, load_meta_bytes;
  // Coordination of the busiest rank other than 0 (rank 0 gathers every
  // report): its rank and bytes.
  int other_rank = 0;
  std::optional<uint64_t> other_coord_bytes, other_repeat_coord_bytes;
  bool rooted_step0 = false;  // step 0 ran a rooted collective: other_* unknown
  uint64_t shards = 0;   // held by all ranks
  uint64_t chunks = 0;   // in the plan
  uint64_t row_peak = 0; // VmHWM of the whole row less VmRSS before it
  std::string note;      // why values are missing, or a caveat
  bool failed = false;   // the engine returned an error (in the note)
};

// Runs rows one after another. Before a row runs, its memory need is
// estimated: the shards its ranks hold (from an even sample of ranks) times
// the most bytes per held shard that a row of the same layout needed so far
// in this process (kDefaultBytesPerShard before one has run; planning's
// memory grows with the shards held). A row that would not fit in
// MemAvailable less a margin is not run but reported with its estimate. A
// row that needs more than the estimate stops with std::bad_alloc, reported
// as stopped: the process's heap is limited to MemAvailable less the margin
// while a row runs.
class RowRunner {
 public:
  explicit RowRunner(int iters) : iters_(iters) {}
  Row Run(const SimulatedJob& job);

 private:
  int iters_;
  std::map<std::string, double> bytes_per_shard_;  // by layout
};

}  // namespace shardsafe::bench
