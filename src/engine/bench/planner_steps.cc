#include "engine/bench/planner_steps.h"

#include <algorithm>
#include <cstdlib>

#include "comm/agree.h"
#include "comm/wire.h"
#include "engine/bench/proc_memory.h"
#include "engine/load/table_reads.h"
#include "engine/save/plan_cache.h"
#include "engine/save/save_messages.h"
#include "format/index.h"

namespace shardsafe::bench {
namespace {

// Steps 1-3 of a save after planning, as `comm`'s rank runs them: returns
// the bytes they moved through `comm` (AddStepsAfterPlanning).
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

// What rank `rank` loads again in the same layout: its own shards.
LoadRequest OwnShards(const SimulatedJob& job, int rank) {
  LoadRequest request;
  for (const ShardInfo& s : job.rank_shards(rank).shards) {
    request.tensors.push_back({s.key, s.dtype, s.shape, s.slice, nullptr});
  }
  return request;
}

}  // namespace

double Since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

void KeepBest(std::optional<double>& best, double seconds) {
  best = std::min(best.value_or(seconds), seconds);
}

void AddNote(Row* row, const std::string& note) {
  row->note += (row->note.empty() ? "" : "; ") + note;
}

uint64_t MadeUpDigest(int rank, int world) {
  constexpr uint64_t k = 0x9e3779b97f4a7c15u;
  const uint64_t n = static_cast<uint64_t>(world);
  const uint64_t all = k * (n % 2 == 0 ? n / 2 * (n + 1) : (n + 1) / 2 * n);  // k * (1 + ... + n)
  return k * static_cast<uint64_t>(rank + 1) - (rank == 0 ? all : 0);
}

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

std::string Agreement() { return EncodeAgreement(JoinPath(kRoot, kTag), {}); }

std::string Framed(std::string_view payload) {
  wire::Writer w;
  w.Status(Status());
  w.Str(payload);
  return w.Take();
}

std::vector<std::string> FramedReports(const std::vector<std::string>& reports) {
  std::vector<std::string> out;
  for (const std::string& report : reports) out.push_back(Framed(report));
  return out;
}

RankRun::RankRun(const SimulatedJob& job, int rank, bool together)
    : comm(rank, job.world), state(StateOf(job.rank_shards(rank))), together(together) {
  Forget();
}

Result<AgreedPlan> RankRun::Plan() {
  return GatherAndPlan(state, JoinPath(kRoot, kTag), comm, SaveOptions{}, Status(), json,
                       together);
}

void RankRun::Forget() {
  StorePlan(comm, CachedPlan{});
  agreed = AgreedPlan();
}

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
    run.agreed = std::move(agreed);
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

Status AddStepsAfterPlanning(SimulatedRank& comm, StepReports reports, RankCost* cost) {
  SS_ASSIGN_OR_RETURN(const uint64_t first,
                      StepsAfterPlanning(comm, reports.first, std::move(reports.framed_first),
                                         reports.first_compact, reports.chunk_table));
  SS_ASSIGN_OR_RETURN(const uint64_t repeated,
                      StepsAfterPlanning(comm, reports.repeated,
                                         std::move(reports.framed_repeated),
                                         /*compact=*/true, reports.chunk_table));
  *cost->coord_bytes += first;
  *cost->repeat_coord_bytes += repeated;
  return Status();
}

std::string IndexDir() {
  char dir[] = "/tmp/planner-index-XXXXXX";
  return mkdtemp(dir) != nullptr ? std::string(dir) : std::string();
}

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

}  // namespace shardsafe::bench
