// A row of the planner benchmark whose save plans together
// (engine/save/distributed_save.h: from distributed_plan_min_ranks ranks,
// the path a save of such a job runs):
//  1. every rank of the job is simulated (SimulateSave: the RankPlanner
//     and IndexRounds calls PlanOverComm and IndexOverComm make, holding
//     no more than one rank's whole part at a time; --check-simulation
//     compares it with SimulatePlan and SimulateIndex), recording what
//     rank 0 and the other rank receive in each
//     collective; meanwhile each rank's files are written as its save
//     leaves them for a loader (its checksum file; as a home, its part of
//     the chunk table) into a directory under /tmp, and its compact step-3
//     report is encoded (file offsets from LayOutFile, checksums made up);
//  2. the simulation's state dropped, rank 0 and then the other rank run a
//     save's step 0 (GatherAndPlan, planning together: the quick check, the
//     agreement, rounds 1-8) over a SimulatedRank that hands each what the
//     others sent it; each must end with the part, the table part and (rank
//     0) the index the simulation gave it, or the row fails;
//  3. steps 1-3 on both, rank 0's commit work (DecodeCompactReports,
//     DigestsAddUp, IndexOfSave, SerializeIndexToCommit) and the load
//     metadata (TimeLoadMetadata) over the files written in 1.
#include <cstring>

#include "engine/bench/planner_steps.h"
#include "engine/bench/proc_memory.h"
#include "engine/save/distributed_save.h"
#include "engine/save/plan_wire.h"
#include "engine/save/save_driver.h"
#include "engine/save/save_messages.h"
#include "engine/save/save_writer.h"
#include "engine/testing/plan_simulation.h"
#include "format/index.h"

namespace shardsafe::bench {
namespace {

// What the simulation of every rank leaves for the two measured ranks.
struct Simulated {
  int other = -1;                 // the rank other than 0 that receives the most in round 1
  uint64_t other_home_bytes = 0;  // what it receives there from the others
  // What rank 0 and the other receive: rounds 1-6, then rounds 7-8.
  std::vector<RankInbox> rank0_inboxes, other_inboxes;
  // What the replays must give: each one's part (EncodePlanMessage) and
  // part of the table, and rank 0's index (unstamped).
  std::string rank0_part, other_part, rank0_table_part, other_table_part, index_text;
  std::vector<std::string> reports;  // every rank's compact step-3 report
};

// The files rank `part` belongs to writes, as WriteRankFiles reports them:
// offsets as LayOutFile places the entries, checksums made up.
Result<std::vector<WrittenFile>> WrittenBy(const SavePlan& part) {
  std::vector<WrittenFile> out;
  uint32_t crc = 0x9e3779b9;
  for (uint32_t f = 0; f < part.files.size(); ++f) {
    SS_ASSIGN_OR_RETURN(const SafetensorsLayout layout, LayOutFile(part, f));
    const PlannedFile& pf = part.files[f];
    WrittenFile wf{f, layout.file_size, {}, {}};
    for (size_t i = 0; i < pf.chunks.size() + pf.blobs.size(); ++i) {
      auto& entries = i < pf.chunks.size() ? wf.chunks : wf.blobs;
      entries.push_back({layout.offsets[i], crc *= 2654435761u});
    }
    out.push_back(std::move(wf));
  }
  return out;
}

// What rank `rank`'s save leaves of its part `part` for a loader in `dirs`
// (its checksum file), and its compact report into *report.
Status SaveOutputs(const SavePlan& part, int rank, int world, const SaveDirs& dirs,
                   FileSystem& fs, std::string* report) {
  RankReport own;
  SS_ASSIGN_OR_RETURN(own.files, WrittenBy(part));
  SS_RETURN_IF_ERROR(WriteChecksumFile(part, rank, own.files, dirs, fs));
  own.replica_digest = MadeUpDigest(rank, world);
  NumberAsWhole(part, &own);
  *report = EncodeReport(own, {.compact = true, .chunk_checksums = false});
  return Status();
}

// Rank 0's commit work before its writes: the reports read, their digests
// added, the index of `skeleton` for this save made; `unstamped`: with no
// time, to compare two.
Result<std::string> CommitText(const IndexSkeleton& skeleton,
                               const std::vector<std::string>& reports, bool unstamped) {
  SS_ASSIGN_OR_RETURN(std::vector<RankReport> decoded, DecodeCompactReports(reports));
  if (!DigestsAddUp(decoded)) return InternalError("the simulated digests do not add up");
  SS_ASSIGN_OR_RETURN(CheckpointIndex index,
                      IndexOfSave(skeleton, FilesByRank(std::move(decoded)), UserJson{}, kTag, ""));
  if (unstamped) index.created_unix = 0;
  SS_ASSIGN_OR_RETURN(CommitIndex written, SerializeIndexToCommit(index, nullptr));
  return std::move(written.text);
}

// Part 1 (the file comment): every rank simulated, their files written
// into `dir`; the row's plan-wide values (shards, chunks, writer_balance).
Status Simulate(const SimulatedJob& job, const std::string& dir, Simulated* out, Row* row) {
  const int n = job.world;
  FileSystem& fs = *DefaultFileSystem();
  const SaveDirs dirs{dir, dir, ""};
  std::vector<uint64_t> own_bytes(n, 0);  // each rank's chunks no other holds, and blobs
  std::vector<uint32_t> shards(n, 0);     // each rank's (its holdings are made twice)
  uint64_t busiest = 0, unique = 0;
  Status failed;
  out->reports.resize(n);
  const auto on_part = [&](int r, const Result<SavePlan>& part) {
    if (!failed.ok()) return;
    if (!part.ok()) {
      failed = part.status().WithContext("rank " + std::to_string(r));
      return;
    }
    for (const PlannedChunk& c : part->chunks) own_bytes[r] += c.holders == 1 ? c.bytes : 0;
    for (const PlannedBlob& b : part->blobs) own_bytes[r] += b.bytes;
    row->chunks += part->chunks.size();
    busiest = part->part->max_rank_bytes;
    unique = part->unique_bytes;
    failed = SaveOutputs(*part, r, n, dirs, fs, &out->reports[r]);
  };
  const auto on_table_part = [&](int r, const std::string& bytes) {
    if (failed.ok()) failed = WriteTablePart(bytes, r, dirs, fs);
    ++row->table_parts;
    row->largest_table_part = std::max<uint64_t>(row->largest_table_part, bytes.size());
  };
  SaveSimulation sim = SimulateSave(
      n,
      [&](int r) {
        RankHoldings h = job.rank_shards(r);
        shards[r] = static_cast<uint32_t>(h.shards.size());
        return h;
      },
      SavePlanOptions{}, on_part, on_table_part);
  for (uint32_t s : shards) row->shards += s;
  SS_RETURN_IF_ERROR(failed);
  if (sim.plan.other <= 0) return InternalError("a job of one rank");
  // The busiest writer's share of the ideal (simulated::IdealMaxRankBytes).
  uint64_t ideal = (unique + n - 1) / n;
  for (uint64_t b : own_bytes) ideal = std::max(ideal, b);
  row->writer_balance = static_cast<double>(busiest) / static_cast<double>(ideal);

  out->other = sim.plan.other;
  const std::vector<std::string>& round1 = sim.plan.other_inbox.all_to_all.front();
  for (int r = 0; r < n; ++r) out->other_home_bytes += r == sim.plan.other ? 0 : round1[r].size();
  out->rank0_part = std::move(sim.rank0_part);
  out->other_part = std::move(sim.other_part);
  out->rank0_table_part = std::move(sim.rank0_table_part);
  out->other_table_part = std::move(sim.other_table_part);
  IndexSimulation& index = sim.index;
  SS_RETURN_IF_ERROR(failed);
  SS_RETURN_IF_ERROR(index.skeleton.status());
  SS_ASSIGN_OR_RETURN(out->index_text, CommitText(*index.skeleton, out->reports, true));
  out->rank0_inboxes = {std::move(sim.plan.rank0_inbox), std::move(index.rank0_inbox)};
  out->other_inboxes = {std::move(sim.plan.other_inbox), std::move(index.other_inbox)};
  return Status();
}

// InternalError unless the replay of `run`'s rank gave what the simulation
// gave it.
Status SameAsSimulated(const RankRun& run, const std::string& part, const std::string& table_part) {
  const AgreedPlan& agreed = run.agreed;
  const bool same = agreed.together && agreed.plan && agreed.table_part &&
                    EncodePlanMessage(*agreed.plan, Digest{}) == part &&
                    *agreed.table_part == table_part;
  if (same) return Status();
  return InternalError("rank " + std::to_string(run.comm.rank()) +
                       "'s save planned another part than its simulation");
}

// Rank 0: part 2 and 3 (the file comment).
Status MeasureRank0(const SimulatedJob& job, int iters, const Simulated& sim,
                    const std::string& dir, Row* row) {
  RankRun run(job, 0, /*together=*/true);
  const std::string agreement = Framed(EncodeHoldings(EncodeLayout(SaveState{}), Agreement()));
  const auto queue = [&](int) {
    run.comm.QueueGather(std::vector<std::string>(job.world, agreement));
    for (const RankInbox& inbox : sim.rank0_inboxes) run.comm.Queue(inbox);
  };
  SS_RETURN_IF_ERROR(MeasureStep0(iters, queue, run, &row->leader));
  SS_RETURN_IF_ERROR(SameAsSimulated(run, sim.rank0_part, sim.rank0_table_part));
  const IndexSkeleton& skeleton = *run.agreed.skeleton;
  SS_ASSIGN_OR_RETURN(const std::string unstamped, CommitText(skeleton, sim.reports, true));
  if (unstamped != sim.index_text) {
    return InternalError("rank 0's save made another index than its simulation");
  }
  const std::vector<std::string> framed = FramedReports(sim.reports);
  SS_RETURN_IF_ERROR(AddStepsAfterPlanning(run.comm,
                                           {.first = sim.reports[0],
                                            .repeated = sim.reports[0],
                                            .framed_first = framed,
                                            .framed_repeated = framed,
                                            .first_compact = true,
                                            .chunk_table = true},
                                           &row->leader));
  std::string text;
  for (int i = 0; i < std::max(iters, kRepeats); ++i) {
    const auto start = Clock::now();
    SS_ASSIGN_OR_RETURN(text, CommitText(skeleton, sim.reports, false));
    KeepBest(row->repeat_commit_s, Since(start));
  }
  run.Forget();
  SS_RETURN_IF_ERROR(
      WriteFileAtomically(*DefaultFileSystem(), JoinPath(dir, kIndexFileName), text));
  return Status();
}

// The other rank: part 2 and 3 (the file comment).
Status MeasureOther(const SimulatedJob& job, int iters, const Simulated& sim, Row* row) {
  row->other_rank = sim.other;
  row->other_part_bytes = sim.other_home_bytes;
  RankRun run(job, sim.other, /*together=*/true);
  const std::string id(sizeof(Digest), '\x5a');  // rank 0's name of the planning
  const auto queue = [&](int) {
    run.comm.QueueBroadcast(Framed(id));
    for (const RankInbox& inbox : sim.other_inboxes) run.comm.Queue(inbox);
    run.comm.QueueBroadcast(Framed(""));  // the index rounds' outcome
  };
  SS_RETURN_IF_ERROR(MeasureStep0(iters, queue, run, &row->other));
  SS_RETURN_IF_ERROR(SameAsSimulated(run, sim.other_part, sim.other_table_part));
  const std::string& report = sim.reports[sim.other];
  return AddStepsAfterPlanning(
      run.comm,
      {.first = report,
       .repeated = report,
       .framed_first = {},
       .framed_repeated = {},
       .first_compact = true,
       .chunk_table = true},
      &row->other);
}

}  // namespace

Status MeasureTogether(const SimulatedJob& job, int iters, Row* row) {
  ResetPeakRss();  // trims the heap too
  const uint64_t rss_before = StatusBytes("VmRSS:");
  const std::string dir = IndexDir();
  if (dir.empty()) return InternalError("no temporary directory for the checkpoint's metadata");
  Simulated sim;
  Status s = Simulate(job, dir, &sim, row);
  // The simulation's peak: the row's need (RowRunner), taken before the
  // measured ranks reset it.
  row->row_peak = StatusBytes("VmHWM:") - rss_before;
  malloc_trim(0);
  if (s.ok()) s = MeasureRank0(job, iters, sim, dir, row);
  if (s.ok()) s = MeasureOther(job, iters, sim, row);
  if (!s.ok()) {
    DefaultFileSystem()->RemoveAll(dir).IgnoreError();
    return s;
  }
  sim = Simulated();
  if (!row->leader.peak_rss_bytes) AddNote(row, "peak RSS unknown: /proc/self/clear_refs refused");
  return TimeLoadMetadata(job, iters, dir, row);
}

}  // namespace shardsafe::bench
