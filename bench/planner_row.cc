#include "planner_row.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <new>

#include "comm/agree.h"
#include "comm/wire.h"
#include "engine/load/table_reads.h"
#include "engine/save/commit.h"
#include "engine/save/plan_cache.h"
#include "engine/save/save_internal.h"
#include "engine/save/save_messages.h"
#include "format/chunk_table.h"
#include "format/index.h"
#include "layout/simulated_layouts.h"
#include "proc_memory.h"
#include "simulated_rank.h"

namespace shardsafe::bench {
namespace {

using Clock = std::chrono::steady_clock;

constexpr char kRoot[] = "/checkpoints";
constexpr char kTag[] = "step-00000100";
// Where rank 0 would put the data files (commit.h, PrepareSave).
constexpr char kTmpDir[] = "/checkpoints/.tmp-step-00000100.5f0c3a9e12b47d68";
constexpr uint64_t kGiB = uint64_t{1} << 30;
// Memory kept free for the rest of the machine while a row runs.
constexpr uint64_t kMargin = 2 * kGiB;
// The estimate of a row's need per shard held before a
// row of its layout has run: above the 690-930 bytes the three layouts
// needed at 1,024 to 16,384 ranks.
constexpr double kDefaultBytesPerShard = 1000;

double Since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

void KeepBest(std::optional<double>& best, double seconds) {
  best = std::min(best.value_or(seconds), seconds);
}

void AddNote(Row* row, const std::string& note) {
  row->note += (row->note.empty() ? "" : "; ") + note;
}

// What Save receives from a rank holding `h`. No data: planning reads none.
SaveState StateOf(const RankHoldings& h) {
  SaveState state;
  for (const ShardInfo& s : h.shards) {
    state.tensors.push_back(TensorShard{s.key, s.dtype, s.shape, s.slice});
  }
  for (const BlobInfo& b : h.blobs) {
    state.blobs.push_back(BlobRef{b.name, nullptr, b.bytes, b.per_rank});
  }
  return state;
}

// What every rank's step 0 sends for ranks to agree on (EncodeAgreement):
// the destination, and no values.
std::string Agreement() { return EncodeAgreement(JoinPath(kRoot, kTag), {}); }

// `payload` as GatherToRootOrFail, ScatterOrFail and BroadcastOrFail
// (comm/agree.h) frame it from a rank that did not fail.
std::string Framed(std::string_view payload) {
  wire::Writer w;
  w.Status(Status());
  w.Str(payload);
  return w.Take();
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
  std::vector<RankReport> reports(written.size());
  uint64_t sum = 0;
  for (size_t r = 0; r < written.size(); ++r) {
    reports[r].files = written[r];
    reports[r].replica_digest = 0x9e3779b97f4a7c15u * (r + 1);
    sum += reports[r].replica_digest;
  }
  if (!reports.empty()) reports[0].replica_digest -= sum;  // the digests add up to 0
  std::vector<std::string> out;
  for (const RankReport& report : reports) out.push_back(EncodeReport(report, form));
  return out;
}

// Every rank's step-3 report, as GatherToRootOrFail frames it.
std::vector<std::string> FramedReports(const std::vector<std::string>& reports) {
  std::vector<std::string> out;
  for (const std::string& report : reports) out.push_back(Framed(report));
  return out;
}

// Steps 1-3 of a save after planning, as `comm`'s rank runs them (with the
// collective helpers Save calls): rank 0's broadcast of the save's
// directories, every rank's report (this rank's: `report`; compact in a
// repeated save) gathered to rank 0 (which receives `framed_reports`), and
// rank 0's broadcast of the outcome (no warnings). Returns the bytes they
// moved through `comm`. Writing and committing are left out.
Result<uint64_t> StepsAfterPlanning(SimulatedRank& comm, const std::string& report,
                                    std::vector<std::string> framed_reports, bool compact,
                                    bool chunk_table) {
  const bool leader = comm.rank() == 0;
  const std::string dirs =
      EncodeSaveStart({SaveDirs{kTmpDir, kTmpDir, ""}, compact, chunk_table});
  comm.TakeBytes();
  if (!leader) comm.QueueBroadcast(Framed(dirs));
  SS_RETURN_IF_ERROR(BroadcastOrFail(comm, 0, dirs).status());
  if (leader) comm.QueueGather(std::move(framed_reports));
  SS_RETURN_IF_ERROR(GatherToRootOrFail(comm, 0, Status(), report).status());
  if (!leader) comm.QueueBroadcast(Framed(""));
  SS_RETURN_IF_ERROR(BroadcastOrFail(comm, 0, std::string(), /*name_root=*/false).status());
  return comm.TakeBytes();
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

// The simulated rank, its state and the engine's inputs for its saves. The
// plan cache entry of (world, rank) is dropped on destruction, so that no
// plan outlives its row.
struct RankRun {
  RankRun(const SimulatedJob& job, int rank)
      : comm(rank, job.world), state(StateOf(job.rank_shards(rank))) {
    Forget();
  }
  ~RankRun() { Forget(); }

  // Protocol step 0 of a save, as Save runs it.
  Result<AgreedPlan> Plan() {
    return GatherAndPlan(state, JoinPath(kRoot, kTag), comm, SaveOptions{}, Status(), json);
  }
  // Drops the plan: the next save is a first save.
  void Forget() {
    StorePlan(comm, CachedPlan{});
    plan.reset();
  }

  SimulatedRank comm;
  SaveState state;
  UserJson json;
  std::shared_ptr<const SavePlan> plan;
};

// A repeated save takes milliseconds, where a pause of the machine weighs
// as much: its time is the best of at least this many.
constexpr int kRepeats = 5;

// `cost`'s step 0: `iters` first saves of `run`'s rank, `queue(i)` queueing
// what the other ranks send it before save i (plan_s, peak_rss_bytes, the
// first's coord_bytes), then max(iters, kRepeats) saves with every layout
// unchanged (repeat_plan_s, repeat_coord_bytes). Keeps the plan in `run`.
Status MeasureStep0(int iters, const std::function<void(int)>& queue, RankRun& run,
                    RankCost* cost) {
  const bool peak_known = ResetPeakRss();
  const uint64_t rss_before = StatusBytes("VmRSS:");
  for (int i = 0; i < iters; ++i) {
    run.Forget();
    queue(i);
    const auto start = Clock::now();
    SS_ASSIGN_OR_RETURN(AgreedPlan agreed, run.Plan());
    KeepBest(cost->plan_s, Since(start));
    if (agreed.reused) return InternalError("a first save reused a cached plan");
    run.plan = std::move(agreed.plan);
    const uint64_t bytes = run.comm.TakeBytes();
    if (i == 0) cost->coord_bytes = bytes;
  }
  if (peak_known) cost->peak_rss_bytes = StatusBytes("VmHWM:") - rss_before;
  // What the first save freed is consolidated first (as the training steps
  // between two saves would): glibc consolidates millions of freed small
  // blocks at the next large allocation, which is not the repeated save's
  // work.
  malloc_trim(0);
  for (int i = 0; i < std::max(iters, kRepeats); ++i) {
    const auto start = Clock::now();
    SS_ASSIGN_OR_RETURN(AgreedPlan agreed, run.Plan());
    KeepBest(cost->repeat_plan_s, Since(start));
    if (!agreed.reused) return InternalError("a repeated save did not reuse its plan");
    cost->repeat_coord_bytes = run.comm.TakeBytes();
  }
  return Status();
}

// A rank's step-3 report in full (a first save) and compact (a repeated
// one), and what rank 0 receives of every rank's (empty on another rank).
struct StepReports {
  std::string full, compact;
  std::vector<std::string> framed_full, framed_compact;
  bool chunk_table = false;  // the save writes one (and checksum files)
};

// Adds the bytes of steps 1-3 to `cost`'s first and repeated saves.
Status AddStepsAfterPlanning(SimulatedRank& comm, StepReports reports, RankCost* cost) {
  SS_ASSIGN_OR_RETURN(const uint64_t first,
                      StepsAfterPlanning(comm, reports.full, std::move(reports.framed_full),
                                         /*compact=*/false, reports.chunk_table));
  SS_ASSIGN_OR_RETURN(const uint64_t repeated,
                      StepsAfterPlanning(comm, reports.compact, std::move(reports.framed_compact),
                                         /*compact=*/true, reports.chunk_table));
  *cost->coord_bytes += first;
  *cost->repeat_coord_bytes += repeated;
  return Status();
}

// What rank `rank` loads again in the same layout: its own shards.
LoadRequest OwnShards(const SimulatedJob& job, int rank) {
  LoadRequest request;
  for (const ShardInfo& s : job.rank_shards(rank).shards) {
    request.tensors.push_back({s.key, s.dtype, s.shape, s.slice, nullptr});
  }
  return request;
}

// A fresh directory for the committed index files (removed by the caller).
std::string IndexDir() {
  char dir[] = "/tmp/planner-index-XXXXXX";
  return mkdtemp(dir) != nullptr ? std::string(dir) : std::string();
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

// load_meta_*: what rank 0 reads to load its own shards again from the
// files in `dir`, `iters` times: the index parsed as OpenSourceCollective
// does, its part of the chunk table (ReadChunksFor: the block directories
// of its tensors and the blocks that can hold its slices) and the checksum
// files of the ranks that wrote them. Removes `dir`.
Status TimeLoadMetadata(const SimulatedJob& job, int iters, const std::string& dir, Row* row) {
  malloc_trim(0);  // as in a loader, which has planned no save
  FileSystem& fs = *DefaultFileSystem();
  Status s;
  const LoadRequest request = OwnShards(job, 0);
  row->peak_before_load = StatusBytes("VmHWM:");
  const bool peak_known = ResetPeakRss();
  const uint64_t rss_before = StatusBytes("VmRSS:");
  for (int i = 0; s.ok() && i < iters; ++i) {
    const auto start = Clock::now();
    Result<std::string> text = ReadFileToString(fs, JoinPath(dir, kIndexFileName), kMaxIndexBytes);
    Result<CheckpointIndex> parsed =
        text.ok() ? ParseIndex(*text, "simulated index") : Result<CheckpointIndex>(text.status());
    if (!parsed.ok()) {
      s = parsed.status();
      break;
    }
    CheckpointSource src{dir, dir, true, std::move(*parsed)};
    src.chunks_pending = !src.index.chunk_tables.empty();
    TableReadStats table;
    if (src.chunks_pending) s = ReadChunksFor(fs, src, request, &table).status();
    KeepBest(row->load_meta_s, Since(start));
    row->load_meta_bytes = text->size() + table.bytes + table.checksum_bytes;
  }
  if (peak_known && s.ok()) row->load_meta_peak_bytes = StatusBytes("VmHWM:") - rss_before;
  fs.RemoveAll(dir).IgnoreError();
  return s;
}

// Rank 0's costs, the row's plan-wide values and index; *sent: the largest
// part rank 0 scattered to another rank, *other_reports: that rank's step-3
// reports.
Status MeasureLeader(const SimulatedJob& job, int iters, Row* row, SimulatedRank::SentPart* sent,
                     StepReports* other_reports) {
  RankRun run(job, 0);
  const auto queue = [&](int i) {
    uint64_t shards = 0;
    run.comm.QueueGather(Announcements(job, Agreement(), &shards));
    if (i == 0) row->shards = shards;
  };
  SS_RETURN_IF_ERROR(MeasureStep0(iters, queue, run, &row->leader));
  *sent = run.comm.TakeLargestSentPart();
  malloc_trim(0);  // the heap planning freed, which later large blocks would not reuse

  row->chunks = run.plan->chunks.size();
  row->writer_balance = WriterBalance(*run.plan);
  SS_ASSIGN_OR_RETURN(const bool table, WritesChunkTable(run.plan->chunks.size(), 0));
  const std::vector<std::vector<WrittenFile>> written = WrittenFiles(*run.plan);
  const std::string dir = IndexDir();
  if (dir.empty()) return InternalError("no temporary directory for the index");
  {
    const std::vector<std::string> full = Reports(written, {false, !table});
    const std::vector<std::string> compact = Reports(written, {true, !table});
    *other_reports = {full[sent->rank], compact[sent->rank], {}, {}, table};
    SS_RETURN_IF_ERROR(AddStepsAfterPlanning(
        run.comm, {full[0], compact[0], FramedReports(full), FramedReports(compact), table},
        &row->leader));
    // The first save's index from the full reports (the layouts and the
    // chunk table kept), then a repeated save's commit work on rank 0
    // before the writes (repeat_commit_s): the compact reports read, their
    // digests added, the index made.
    FileLayouts layouts;
    bool match = false;
    SS_ASSIGN_OR_RETURN(std::vector<RankReport> reports,
                        ReadReports(full, *run.plan, &layouts, &match));
    const SaveDirs dirs{kTmpDir, kTmpDir, ""};
    SS_ASSIGN_OR_RETURN(LeaderCommit first,
                        MakeIndex(*run.plan, FilesByRank(std::move(reports)), run.json, kTag,
                                  dirs, job.world, {table, &layouts, match}));
    SS_RETURN_IF_ERROR(WriteCheckpointFiles(*run.plan, first.written, written, dir));
    first = LeaderCommit();
    malloc_trim(0);
    for (int i = 0; i < std::max(iters, kRepeats); ++i) {
      const auto start = Clock::now();
      SS_ASSIGN_OR_RETURN(reports, ReadReports(compact, *run.plan, &layouts, &match));
      if (!DigestsAddUp(reports)) return InternalError("the simulated digests do not add up");
      SS_ASSIGN_OR_RETURN(LeaderCommit again,
                          MakeIndex(*run.plan, FilesByRank(std::move(reports)), run.json, kTag,
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
  RankRun run(job, sent.rank);
  const auto queue = [&](int) { run.comm.QueueScattered(sent.part); };
  SS_RETURN_IF_ERROR(MeasureStep0(iters, queue, run, &row->other));
  return AddStepsAfterPlanning(run.comm, std::move(reports), &row->other);
}

Status Measure(const SimulatedJob& job, int iters, Row* row) {
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
  const uint64_t shards = EstimatedShards(job);
  const auto calibrated = bytes_per_shard_.find(job.layout);
  const double per_shard =
      calibrated == bytes_per_shard_.end() ? kDefaultBytesPerShard : calibrated->second;
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
    const Status s = Measure(job, iters_, &row);
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
    double& known = bytes_per_shard_[job.layout];
    known = std::max(known, grown / static_cast<double>(row.shards));
  }
  return row;
}

}  // namespace shardsafe::bench
