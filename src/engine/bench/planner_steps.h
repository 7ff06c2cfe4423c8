// The steps of a save and a load that the planner benchmark's rows run on
// one simulated rank (planner_row.h), whichever way the save plans: on
// rank 0 (planner_row.cc) or by all ranks together (planner_together.cc).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "engine/bench/planner_jobs.h"
#include "engine/bench/planner_row.h"
#include "engine/bench/simulated_rank.h"
#include "engine/save/save_driver.h"
#include "shardsafe/checkpoint.h"

namespace shardsafe::bench {

using Clock = std::chrono::steady_clock;

inline constexpr char kRoot[] = "/checkpoints";
inline constexpr char kTag[] = "step-00000100";
// Where rank 0 would put the data files (commit.h, PrepareSave).
inline constexpr char kTmpDir[] = "/checkpoints/.tmp-step-00000100.5f0c3a9e12b47d68";
// A repeated save takes milliseconds, where a pause of the machine weighs
// as much: its time is the best of at least this many.
inline constexpr int kRepeats = 5;

double Since(Clock::time_point start);
void KeepBest(std::optional<double>& best, double seconds);
void AddNote(Row* row, const std::string& note);

// Rank `rank`'s replica digest in a job of `world` ranks whose replicas
// agree: made up, the ranks' digests adding up to 0 (replica_check.h).
uint64_t MadeUpDigest(int rank, int world);

// What Save receives from a rank holding `h`. No data: planning reads none.
SaveState StateOf(const RankHoldings& h);

// What every rank's step 0 sends for ranks to agree on (EncodeAgreement):
// the destination, and no values.
std::string Agreement();

// `payload` as GatherToRootOrFail, ScatterOrFail and BroadcastOrFail
// (comm/agree.h) frame it from a rank that did not fail; and each of
// `reports` so.
std::string Framed(std::string_view payload);
std::vector<std::string> FramedReports(const std::vector<std::string>& reports);

// The simulated rank, its state and the engine's inputs for its saves,
// planned on rank 0 or `together` (as GatherAndPlan takes it). The plan
// cache entry of (world, rank) is dropped on destruction, so that no plan
// outlives its row.
struct RankRun {
  RankRun(const SimulatedJob& job, int rank, bool together);
  ~RankRun() { Forget(); }

  // Protocol step 0 of a save, as Save runs it.
  Result<AgreedPlan> Plan();
  // Drops the plan: the next save is a first save.
  void Forget();

  SimulatedRank comm;
  SaveState state;
  UserJson json;
  bool together;
  AgreedPlan agreed;  // the last first save's
};

// `cost`'s step 0: `iters` first saves of `run`'s rank, `queue(i)` queueing
// what the other ranks send it before save i (plan_s, peak_rss_bytes, the
// first's coord_bytes), then max(iters, kRepeats) saves with every layout
// unchanged (repeat_plan_s, repeat_coord_bytes). Keeps the plan in `run`.
Status MeasureStep0(int iters, const std::function<void(int)>& queue, RankRun& run,
                    RankCost* cost);

// A rank's step-3 report in a first and in a repeated save, and what rank
// 0 receives of every rank's (empty on another rank).
struct StepReports {
  std::string first, repeated;
  std::vector<std::string> framed_first, framed_repeated;
  bool first_compact = false;  // a save planned together reports compactly at once
  bool chunk_table = false;    // the save writes one (and checksum files)
};

// Adds the bytes of steps 1-3 to `cost`'s first and repeated saves: rank
// 0's broadcast of the save's directories, every rank's report gathered to
// rank 0, rank 0's broadcast of the outcome (no warnings), with the
// collective helpers Save calls. Writing and committing are left out.
Status AddStepsAfterPlanning(SimulatedRank& comm, StepReports reports, RankCost* cost);

// A fresh directory for the committed index files (removed by the caller).
std::string IndexDir();

// load_meta_*: what rank 0 reads to load its own shards again from the
// committed files in `dir`, `iters` times: the index parsed as
// OpenSourceCollective does, its part of the chunk table (ReadChunksFor:
// the block directories of its tensors and the blocks that can hold its
// slices) and the checksum files of the ranks that wrote them. Removes
// `dir`.
Status TimeLoadMetadata(const SimulatedJob& job, int iters, const std::string& dir, Row* row);

// A save planned together (distributed_save.h), measured on rank 0 and
// another rank replaying what every other rank sends them
// (planner_together.cc).
Status MeasureTogether(const SimulatedJob& job, int iters, Row* row);

}  // namespace shardsafe::bench
