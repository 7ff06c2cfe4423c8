#include "engine/bench/planner_row.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <new>

#include "comm/agree.h"
#include "comm/wire.h"
#include "engine/bench/planner_steps.h"
#include "engine/bench/proc_memory.h"
#include "engine/bench/simulated_rank.h"
#include "engine/load/table_reads.h"
#include "engine/save/commit.h"
#include "engine/save/distributed_save.h"
#include "engine/save/plan_cache.h"
#include "engine/save/save_driver.h"
#include "engine/save/save_messages.h"
#include "engine/testing/plan_simulation.h"
#include "format/chunk_table.h"
#include "format/index.h"
#include "testing/layout/simulated_layouts.h"

namespace shardsafe::bench {
namespace {

constexpr uint64_t kGiB = uint64_t{1} << 30;
// Memory kept free for the rest of the machine while a row runs.
constexpr uint64_t kMargin = 2 * kGiB;
// The estimate of a row's need per shard held before a row of its layout,
// planned the same way, has run: planned together, a tenth above what each
// layout needed at 16,384 ranks (row peak / shards: tp-pp-dp 387, fsdp 400,
// moe 376 bytes; bench/README.md); planned on rank 0, above the most any
// layout needed.
constexpr double kDefaultBytesPerShard = 1000;
double DefaultBytesPerShard(const std::string& layout, bool together) {
  if (!together) return kDefaultBytesPerShard;
  if (layout == "fsdp") return 440;
  if (layout == "moe") return 420;
  return 430;
}

// Every rank's step-0 message (EncodeHoldings), framed; *shards counts the
// shards they hold.
std::vector<std::string> Announcements(const SimulatedJob& job, std::string_view agreement,
                                       uint64_t* shards) {
  std::vector<std::string> out(job.world);
  for (int r = 0; r < job.world; ++r) {
    const RankHoldings h = job.rank_shards(r);
    *shards += h.shards.size();
    out[r] = Framed(EncodeHoldings(EncodeLayout(StateOf(h)), agreement));
  }
  return out;
}

// The files every rank reports in step 3 of a save of `plan` (by rank):
// chunks and blobs back to back after a 4 KiB header, checksums made up.
std::vector<std::vector<WrittenFile>> WrittenFiles(const SavePlan& plan) {
  std::vector<std::vector<WrittenFile>> out(plan.bytes_per_rank.size());
  uint32_t crc = 0x9e3779b9;
  for (uint32_t f = 0; f < plan.files.size(); ++f) {
    const PlannedFile& pf = plan.files[f];
    WrittenFile wf{f, 4096 + pf.payload_bytes, {}, {}};
    uint64_t at = 4096;
    for (uint32_t c : pf.chunks) {
      wf.chunks.push_back({at, crc *= 2654435761u});
      at += plan.chunks[c].bytes;
    }
    for (uint32_t b : pf.blobs) {
      wf.blobs.push_back({at, crc *= 2654435761u});
      at += plan.blobs[b].bytes;
    }
    out[pf.rank].push_back(std::move(wf));
  }
  return out;
}

// Every rank's step-3 report of a save of `plan` (EncodeReport, in full or
// compact, with or without chunk checksums) when the replicas agree: its
// files and its replica digest (replica_check.h).
std::vector<std::string> Reports(const std::vector<std::vector<WrittenFile>>& written,
                                 ReportForm form) {
  const int world = static_cast<int>(written.size());
  std::vector<std::string> out;
  for (int r = 0; r < world; ++r) {
    out.push_back(EncodeReport({written[r], {}, MadeUpDigest(r, world)}, form));
  }
  return out;
}

double WriterBalance(const SavePlan& plan) {
  const uint64_t busiest =
      *std::max_element(plan.bytes_per_rank.begin(), plan.bytes_per_rank.end());
  return static_cast<double>(busiest) / static_cast<double>(simulated::IdealMaxRankBytes(plan));
}

// Shards held by all of `job`'s ranks, from an even sample of 64 ranks.
uint64_t EstimatedShards(const SimulatedJob& job) {
  const int samples = std::min(job.world, 64);
  uint64_t n = 0;
  for (int k = 0; k < samples; ++k) {
    n += job.rank_shards(static_cast<int>(int64_t{k} * job.world / samples)).shards.size();
  }
  return n * job.world / samples;
}

// The committed files of the save, as the commit and the writers leave
// them: the index, its chunk table's parts and every rank's checksum file,
// into `dir`.
Status WriteCheckpointFiles(const SavePlan& plan, const CommitIndex& committed,
                            const std::vector<std::vector<WrittenFile>>& written,
                            const std::string& dir) {
  FileSystem& fs = *DefaultFileSystem();
  SS_RETURN_IF_ERROR(WriteFileAtomically(fs, JoinPath(dir, kIndexFileName), committed.text));
  if (!committed.table) return Status();
  SS_RETURN_IF_ERROR(WriteChunkTable(fs, dir, *committed.table));
  const SaveDirs dirs{dir, dir, ""};
  for (size_t r = 0; r < written.size(); ++r) {
    SS_RETURN_IF_ERROR(WriteChecksumFile(plan, static_cast<int>(r), written[r], dirs, fs));
  }
  return Status();
}

// Rank 0's costs, the row's plan-wide values and index; *sent: the largest
// part rank 0 scattered to another rank, *other_reports: that rank's step-3
// reports.
Status MeasureLeader(const SimulatedJob& job, int iters, Row* row, SimulatedRank::SentPart* sent,
                     StepReports* other_reports) {
  RankRun run(job, 0, /*together=*/false);
  const auto queue = [&](int i) {
    uint64_t shards = 0;
    run.comm.QueueGather(Announcements(job, Agreement(), &shards));
    if (i == 0) row->shards = shards;
  };
  SS_RETURN_IF_ERROR(MeasureStep0(iters, queue, run, &row->leader));
  *sent = run.comm.TakeLargestSentPart();
  malloc_trim(0);  // the heap planning freed, which later large blocks would not reuse

  row->chunks = run.agreed.plan->chunks.size();
  row->writer_balance = WriterBalance(*run.agreed.plan);
  SS_ASSIGN_OR_RETURN(const bool table, WritesChunkTable(run.agreed.plan->chunks.size(), 0));
  const std::vector<std::vector<WrittenFile>> written = WrittenFiles(*run.agreed.plan);
  const std::string dir = IndexDir();
  if (dir.empty()) return InternalError("no temporary directory for the index");
  {
    const std::vector<std::string> full = Reports(written, {false, !table});
    const std::vector<std::string> compact = Reports(written, {true, !table});
    *other_reports = {.first = full[sent->rank],
                      .repeated = compact[sent->rank],
                      .framed_first = {},
                      .framed_repeated = {},
                      .first_compact = false,
                      .chunk_table = table};
    SS_RETURN_IF_ERROR(AddStepsAfterPlanning(run.comm,
                                             {.first = full[0],
                                              .repeated = compact[0],
                                              .framed_first = FramedReports(full),
                                              .framed_repeated = FramedReports(compact),
                                              .first_compact = false,
                                              .chunk_table = table},
                                             &row->leader));
    // The first save's index from the full reports (the layouts and the
    // chunk table kept), then a repeated save's commit work on rank 0
    // before the writes (repeat_commit_s): the compact reports read, their
    // digests added, the index made.
    FileLayouts layouts;
    bool match = false;
    SS_ASSIGN_OR_RETURN(std::vector<RankReport> reports,
                        ReadReports(full, *run.agreed.plan, &layouts, &match));
    const SaveDirs dirs{kTmpDir, kTmpDir, ""};
    SS_ASSIGN_OR_RETURN(LeaderCommit first,
                        MakeIndex(*run.agreed.plan, FilesByRank(std::move(reports)), run.json, kTag,
                                  dirs, job.world, {table, &layouts, match}));
    SS_RETURN_IF_ERROR(WriteCheckpointFiles(*run.agreed.plan, first.written, written, dir));
    first = LeaderCommit();
    malloc_trim(0);
    for (int i = 0; i < std::max(iters, kRepeats); ++i) {
      const auto start = Clock::now();
      SS_ASSIGN_OR_RETURN(reports, ReadReports(compact, *run.agreed.plan, &layouts, &match));
      if (!DigestsAddUp(reports)) return InternalError("the simulated digests do not add up");
      SS_ASSIGN_OR_RETURN(LeaderCommit again,
                          MakeIndex(*run.agreed.plan, FilesByRank(std::move(reports)), run.json, kTag,
                                    dirs, job.world, {table, &layouts, match}));
      KeepBest(row->repeat_commit_s, Since(start));
    }
  }
  run.Forget();
  return TimeLoadMetadata(job, iters, dir, row);
}

// The other rank's costs: rank `sent.rank`, its part as rank 0 scattered it.
Status MeasureOther(const SimulatedJob& job, int iters, const SimulatedRank::SentPart& sent,
                    StepReports reports, Row* row) {
  row->other_rank = sent.rank;
  row->other_part_bytes = sent.part.size();
  RankRun run(job, sent.rank, /*together=*/false);
  const auto queue = [&](int) { run.comm.QueueScattered(sent.part); };
  SS_RETURN_IF_ERROR(MeasureStep0(iters, queue, run, &row->other));
  return AddStepsAfterPlanning(run.comm, std::move(reports), &row->other);
}

// A save planned on rank 0 (under distributed_plan_min_ranks ranks).
Status MeasureOnLeader(const SimulatedJob& job, int iters, Row* row) {
  malloc_trim(0);
  const uint64_t rss_before = StatusBytes("VmRSS:");
  SimulatedRank::SentPart sent;
  StepReports other_reports;
  SS_RETURN_IF_ERROR(MeasureLeader(job, iters, row, &sent, &other_reports));
  // Taken now: measuring the other rank resets the peak (as measuring the
  // load metadata did).
  row->row_peak = std::max(row->peak_before_load, StatusBytes("VmHWM:")) - rss_before;
  if (sent.rank == 0) return InternalError("rank 0 scattered no part to another rank");
  SS_RETURN_IF_ERROR(MeasureOther(job, iters, sent, std::move(other_reports), row));
  if (!row->leader.peak_rss_bytes) AddNote(row, "peak RSS unknown: /proc/self/clear_refs refused");
  return Status();
}


std::string Gigabytes(double bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f GB", bytes / 1e9);
  return buf;
}

}  // namespace

Row RowRunner::Run(const SimulatedJob& job) {
  Row empty;
  empty.layout = job.layout;
  empty.world = job.world;
  const Result<bool> together = planning_ == Planning::kAsSaveDoes
                                    ? PlansTogether(job.world, 0)
                                    : Result<bool>(planning_ == Planning::kTogether);
  if (!together.ok()) {
    empty.note = "failed: " + together.status().ToString();
    empty.failed = true;
    return empty;
  }
  empty.together = *together;
  // Rows of a layout planned the same way share their memory per shard.
  const std::string kind = job.layout + (*together ? " together" : "");
  const uint64_t shards = EstimatedShards(job);
  const auto calibrated = bytes_per_shard_.find(kind);
  const double per_shard = calibrated == bytes_per_shard_.end()
                               ? DefaultBytesPerShard(job.layout, *together)
                               : calibrated->second;
  const double need = static_cast<double>(shards) * per_shard;
  const uint64_t available = MemAvailableBytes();
  Row row = empty;
  if (available < kMargin || need > static_cast<double>(available - kMargin)) {
    row.shards = shards;
    row.note = "not run: needs ~" + Gigabytes(need) + ", " + Gigabytes(available) +
               " available less " + Gigabytes(kMargin) + " kept free";
    return row;
  }
  try {
    HeapLimit limit(available - kMargin);
    Status s;
    if (*together && check_simulation_) {
      s = CheckSimulateSave(job.world, job.rank_shards, SavePlanOptions{});
      if (s.ok()) AddNote(&row, "simulation checked");
      malloc_trim(0);
    }
    if (s.ok()) {
      s = *together ? MeasureTogether(job, iters_, &row) : MeasureOnLeader(job, iters_, &row);
    }
    if (!s.ok()) {
      row = empty;
      row.note = "failed: " + s.ToString();
      row.failed = true;
    }
  } catch (const std::bad_alloc&) {
    row = empty;
    row.note = "stopped: out of memory (the heap was limited to " +
               Gigabytes(static_cast<double>(available - kMargin)) + " more)";
  }
  const double grown = static_cast<double>(row.row_peak);
  if (grown > 0 && row.shards > 0) {
    double& known = bytes_per_shard_[kind];
    known = std::max(known, grown / static_cast<double>(row.shards));
  }
  return row;
}

}  // namespace shardsafe::bench
