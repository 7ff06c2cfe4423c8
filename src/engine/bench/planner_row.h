// One row of the planner benchmark: what planning and metadata cost the
// ranks of a simulated job, measured on the engine's own code, on the path
// a save of the job runs (PlansTogether, its default threshold: 1,024
// ranks; or either path at any size: RowRunner::Planning). Two ranks run
// the engine's step 0,
// GatherAndPlan (engine/save/save_driver.h), each through a
// SimulatedRank whose collectives hand it what the others send.
//
// Under 1,024 ranks, planned on rank 0 (planner_row.cc). The job's ranks
// are simulated one at a time (their holdings computed, encoded as a save
// encodes them, and dropped):
//   rank 0        receives every rank's layout (Gather), decodes and checks
//                 them, plans the whole save (PlanSave), and cuts, encodes
//                 and scatters every other rank's part of the plan
//                 (PartOfPlan, EncodePlanMessage, Scatter): the whole job's
//                 cost, the most of any rank;
//   another rank  sends its layout, receives its part as rank 0's run
//                 scattered it (DecodePlanMessage) and caches it: the rank
//                 other than 0 that rank 0 sent the largest part (the lowest
//                 of equal ones), named in the row.
//
// From 1,024 ranks, planned together (planner_together.cc,
// engine/save/distributed_save.h). Every rank is simulated through the
// planning rounds 1-6 and the index rounds 7-8 (plan_simulation.h: the
// RankPlanner and IndexRounds calls a rank makes), recording what rank 0
// and the other rank receive; then each of the two runs its own step 0
// alone, all of it (the quick check, the agreement gathered and the
// planning's id broadcast, rounds 1-8 over its Comm), handed what the
// simulation recorded, and must end with the part, table part and (rank 0)
// index the simulation gave it:
//   rank 0        its own shards and keys like any rank, plus the
//                 agreement, round 4 (Coordinate: a few numbers per rank
//                 and per replicated chunk) and round 8's skeleton;
//   another rank  the rank other than 0 that receives the most bytes of
//                 shards from the others as a home in round 1 (the lowest
//                 of equal ones), named in the row with those bytes.
//
// What is measured, for each of the two (leader, other):
//
//   plan_s             GatherAndPlan of a first save (no cached plan): the
//                      quick check (ReduceMaxOrFail), then
//                      on rank 0: the layouts' gather (GatherToRootOrFail:
//                      unframing, DecodeHoldings of every message,
//                      CheckAgreement), PlanSave over all ranks, the
//                      digest, every part built and encoded, ScatterOrFail;
//                      on another rank: its layout's gather (sent only),
//                      ScatterOrFail and DecodePlanMessage of its part;
//                      planned together: PlanTogether (the agreement, the
//                      id, PlanOverComm, IndexOverComm);
//                      StorePlan.
//   repeat_plan_s      GatherAndPlan of the next save, layout unchanged:
//                      EncodeLayout, LookUpPlan, the comparison with the
//                      cached layout, the quick check; the plan is reused.
//                      After malloc_trim; best of max(iters, 5).
//   peak_rss_bytes     VmHWM during the first saves, less VmRSS before: on
//                      rank 0 the received layouts, their decoded form, the
//                      plan and every part (encoded, and framed); on
//                      another rank its received part and its decoded form;
//                      planned together, what the rank received and its
//                      planning state, part, table part and skeleton.
//   coord_bytes        bytes the rank sends plus receives in a first save,
//                      counted by SimulatedRank: step 0's collectives, then
//                      steps 1-3 as Save runs them with the collective
//                      helpers (comm/agree.h): the broadcast of the save's
//                      directories, the step-3 reports gathered to rank 0
//                      (EncodeReport of each rank's files and replica
//                      digest, from the whole plan, whose numbers a part's
//                      report uses too; compact when planned together;
//                      replicas that agree, so no copies' checksums), the
//                      outcome's broadcast.
//   repeat_coord_bytes the same for a repeated save, whose reports are
//                      compact (rank 0 kept the offsets, or the skeleton;
//                      with a chunk table no chunk checksums either: they
//                      are in the writers' checksum files).
// And once per row (rank 0's work):
//   repeat_commit_s    rank 0's commit work in a repeated save before it
//                      writes: on rank 0's path ReadReports of the compact
//                      reports, DigestsAddUp and MakeIndex (reusing the
//                      chunk table the first save's MakeIndex made);
//                      planned together DecodeCompactReports, DigestsAddUp,
//                      IndexOfSave and SerializeIndexToCommit. Best of
//                      max(iters, 5).
//   load_meta_bytes    what rank 0 reads to load its own shards again: the
//                      index as the commit writes it, with the files a
//                      loader reads beside it under /tmp: on rank 0's path
//                      (MakeIndex over the plan and the full reports) a
//                      chunk table from its default threshold on and every
//                      rank's checksum file; planned together every home's
//                      part of the table and every rank's checksum file, as
//                      each rank's save writes them. Then the bytes of the
//                      chunk table ReadChunksFor reads and of the checksum
//                      files it reads.
//   load_meta_s        ReadFileToString and ParseIndex of the index and
//                      ReadChunksFor (from the page cache: the files were
//                      just written).
//   load_meta_peak_bytes VmHWM during those, less VmRSS before: the index
//                      read and parsed, the table's parts and the checksum
//                      files read.
//   writer_balance     the busiest writer's bytes / IdealMaxRankBytes (from
//                      every rank's part when planned together).
//
// Timings are the best of `iters` runs. Synthesized, since no byte is
// written: file offsets (each file's chunks back to back after 4 KiB; from
// LayOutFile when planned together) and checksums. Writing, and rank 0's
// commit I/O, are left out.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include "engine/bench/planner_jobs.h"

namespace shardsafe::bench {

// What one rank's saves cost it (planner_row.h's list).
struct RankCost {
  std::optional<double> plan_s, repeat_plan_s;
  std::optional<uint64_t> peak_rss_bytes, coord_bytes, repeat_coord_bytes;
};

struct Row {
  std::string layout;
  int world = 0;
  bool together = false;  // planned by all ranks together (distributed_save.h)
  RankCost leader;  // rank 0
  RankCost other;   // rank other_rank
  int other_rank = 0;
  // Its part of the plan as scattered; planned together, the shards it
  // receives as a home in round 1.
  uint64_t other_part_bytes = 0;
  std::optional<double> repeat_commit_s, load_meta_s, writer_balance;
  std::optional<uint64_t> load_meta_bytes, load_meta_peak_bytes;
  uint64_t shards = 0;   // held by all ranks
  uint64_t chunks = 0;   // in the plan
  // Planned together: the homes' parts of the chunk table (the files each
  // save writes besides the data and checksum files) and the largest.
  uint64_t table_parts = 0, largest_table_part = 0;
  // VmHWM of the whole row less VmRSS before it (planned together: of the
  // simulation of every rank, the most the row holds).
  uint64_t row_peak = 0;
  uint64_t peak_before_load = 0;  // VmHWM before load_meta_peak_bytes reset it
  std::string note;      // why values are missing, or a caveat
  bool failed = false;   // the engine returned an error (in the note)
};

// Runs rows one after another. Before a row runs, its memory need is
// estimated: the shards its ranks hold (from an even sample of ranks) times
// the most bytes per held shard that a row of the same layout, planned the
// same way, needed so far in this process (before one has run, a default
// per layout measured so, planner_row.cc; the memory grows with the shards
// held: rank 0's planning on its path, the simulation of every rank when
// planned together). A row that would not fit in
// MemAvailable less a margin is not run but reported with its estimate. A
// row that needs more than the estimate stops with std::bad_alloc, reported
// as stopped: the process's heap is limited to MemAvailable less the margin
// while a row runs.
class RowRunner {
 public:
  // How the rows' saves plan: as a save of the job does (PlansTogether:
  // from SHARDSAFE_DISTRIBUTED_PLAN_MIN_RANKS ranks, by default 1,024), or
  // one way whatever the size (as SaveOptions::distributed_plan_min_ranks
  // can make a save plan).
  enum class Planning { kAsSaveDoes, kTogether, kOnRankZero };
  // `check_simulation`: a row planned together first compares the lean
  // simulation it runs with the full one (CheckSimulateSave), and fails on
  // a difference (noted "simulation checked" when none).
  RowRunner(int iters, Planning planning, bool check_simulation = false)
      : iters_(iters), planning_(planning), check_simulation_(check_simulation) {}
  Row Run(const SimulatedJob& job);

 private:
  int iters_;
  Planning planning_;
  bool check_simulation_;
  std::map<std::string, double> bytes_per_shard_;  // by layout and way of planning
};

}  // namespace shardsafe::bench
