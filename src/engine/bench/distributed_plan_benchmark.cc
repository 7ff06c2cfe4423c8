// What a save plan made by all ranks together (engine/plan/distributed_plan.h)
// costs each rank of a simulated job, against PlanSave on rank 0 (what a save
// runs today: planner_benchmark measures it).
//
//   distributed_plan_benchmark [--world N]... [--layout tp-pp-dp|fsdp|moe] [--json] [--no-index]
//
// Every rank of the job is simulated in this process (plan_simulation.h),
// one after another through each of the six rounds, running the same
// RankPlanner methods a rank runs (PlanOverComm calls them around its
// collectives); the messages are routed as the collectives route them,
// nothing waits and no network is modelled. Per rank:
//   time       the sum of its calls (rank 0's includes Coordinate);
//   coord      the bytes it sends plus receives (PlanTraffic's count);
//   memory     the peak resident size, less before, of the two ranks that
//              hold the most: rank 0 in Coordinate (plus the summaries it
//              received and the decisions it sends) and the busiest home in
//              PlanHome, run again alone from copies of its messages (plus
//              them and what it sends).
// Plus the busiest writer's share of the ideal (simulated::IdealMaxRankBytes,
// from every rank's part). Then (unless --no-index) rounds 7 and 8 of the
// index made together (distributed_index.h) over every rank's part and
// home, routed the same way: rank 0's time (its own calls and Assemble),
// its bytes and the most any rank sends + receives, the largest home's
// part of the chunk table; and rank 0's commit of one save of the plan
// (IndexOfSave, SerializeIndexToCommit): time and the index's size. Every rank's state is held at once: FSDP at
// 16,384 ranks takes about 10 GB; 65,536 ranks do not fit this machine.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/bench/planner_jobs.h"
#include "engine/bench/proc_memory.h"
#include "engine/save/distributed_index.h"
#include "engine/testing/plan_simulation.h"
#include "format/index.h"

namespace shardsafe::bench {
namespace {

using Clock = std::chrono::steady_clock;

struct DistRow {
  std::string layout;
  int world = 0;
  double rank0_s = 0, slowest_s = 0;
  int slowest = 0;
  uint64_t rank0_coord = 0, most_coord = 0;
  int most_coord_rank = 0;
  uint64_t rank0_peak = 0, home_peak = 0;
  int busiest_home = 0;
  double balance = 0;
  uint64_t chunks = 0;
  // Rounds 7 and 8 (distributed_index.h) and the commit of one save.
  double index_rank0_s = 0;        // rank 0's ToHomes, Summary and Assemble
  uint64_t index_rank0_coord = 0;  // its round-7 messages and the summaries it gathers
  uint64_t index_most_coord = 0;   // the most any rank sends + receives in rounds 7-8
  uint64_t largest_part = 0;       // the largest home's part of the chunk table
  double commit_s = 0;             // IndexOfSave + SerializeIndexToCommit on rank 0
  uint64_t index_bytes = 0;        // the committed index
  std::string note;
};

// The busiest home's round 2 again, alone, from copies of its messages.
uint64_t HomePeak(int home, int world, const std::vector<std::string>& in) {
  uint64_t held = 0;
  for (const std::string& m : in) held += m.size();
  RankHoldings none;
  ResetPeakRss();
  const uint64_t before = StatusBytes("VmRSS:");
  {
    RankPlanner planner(home, world, none, SavePlanOptions{});
    for (const std::string& m : planner.PlanHome(in)) held += m.size();
  }
  return StatusBytes("VmHWM:") - before + held;
}

double Seconds(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// Rounds 7 and 8 over every rank's part and home (SimulateIndex), then
// rank 0's commit of one save of the plan.
void RunIndexRounds(const std::vector<SavePlan>& parts,
                    const std::vector<std::unique_ptr<KeyHome>>& homes, DistRow* row) {
  const IndexSimulation sim =
      SimulateIndex(parts, homes, -1, [&](int, const std::string& part) {
        row->largest_part = std::max<uint64_t>(row->largest_part, part.size());
      });
  row->index_rank0_s = sim.ranks[0].seconds;
  row->index_rank0_coord = sim.ranks[0].sent + sim.ranks[0].received;
  for (const SimulatedRankCost& c : sim.ranks) {
    row->index_most_coord = std::max(row->index_most_coord, c.sent + c.received);
  }
  const Result<IndexSkeleton>& skeleton = sim.skeleton;
  if (!skeleton.ok()) {
    row->note = "index: " + skeleton.status().ToString();
    return;
  }
  // One save's reports: every data file, its blobs' checksums (made up).
  std::vector<std::vector<WrittenFile>> written(1);
  for (uint32_t f = 0; f < skeleton->blob_slots.size(); ++f) {
    WrittenFile file{f, 0, {}, {}};
    file.blobs.resize(skeleton->blob_slots[f].size());
    written[0].push_back(std::move(file));
  }
  const auto commit = Clock::now();
  Result<CheckpointIndex> index = IndexOfSave(*skeleton, written, UserJson{}, "step-1", "");
  Result<CommitIndex> text = index.ok() ? SerializeIndexToCommit(*index, nullptr)
                                        : Result<CommitIndex>(index.status());
  row->commit_s = Seconds(commit);
  if (!text.ok()) {
    row->note = "commit: " + text.status().ToString();
    return;
  }
  row->index_bytes = text->text.size();
}

DistRow Run(const SimulatedJob& job, bool index) {
  const int n = job.world;
  DistRow row{job.layout, n};
  std::vector<uint64_t> mandatory(n, 0);
  uint64_t most_bytes = 0, unique = 0, before = 0;
  std::vector<SavePlan> parts(index ? n : 0);
  std::vector<std::unique_ptr<KeyHome>> homes(index ? n : 0);
  const PlanSimulation sim = SimulatePlan(
      n, job.rank_shards, SavePlanOptions{},
      [&](int r, Result<SavePlan> part) {
        if (!part.ok()) {
          if (row.note.empty()) row.note = "rank " + std::to_string(r) + ": " + part.status().ToString();
          return;
        }
        for (const PlannedChunk& c : part->chunks) mandatory[r] += c.holders == 1 ? c.bytes : 0;
        for (const PlannedBlob& b : part->blobs) mandatory[r] += b.bytes;
        row.chunks += part->chunks.size();
        most_bytes = part->part->max_rank_bytes;
        unique = part->unique_bytes;
        if (index) parts[r] = std::move(*part);
      },
      [&] {
        ResetPeakRss();
        before = StatusBytes("VmRSS:");
      },
      [&] { row.rank0_peak = StatusBytes("VmHWM:") - before; },
      [&](int r, std::unique_ptr<KeyHome> home) {
        if (index) homes[r] = std::move(home);
      });
  if (!row.note.empty()) return row;
  uint64_t ideal = (unique + n - 1) / n;
  for (uint64_t m : mandatory) ideal = std::max(ideal, m);
  row.balance = static_cast<double>(most_bytes) / static_cast<double>(ideal);
  row.rank0_s = sim.ranks[0].seconds;
  // Rank 0 holds every summary it received and every decision it sends.
  row.rank0_peak += sim.ranks[0].received + sim.ranks[0].sent;
  for (int r = 0; r < n; ++r) {
    const SimulatedRankCost& c = sim.ranks[r];
    if (r == 0) row.rank0_coord = c.sent + c.received;
    if (c.seconds > row.slowest_s) row.slowest_s = c.seconds, row.slowest = r;
    if (c.sent + c.received > row.most_coord) row.most_coord = c.sent + c.received, row.most_coord_rank = r;
  }
  row.busiest_home = sim.other;
  if (sim.other > 0) row.home_peak = HomePeak(sim.other, n, sim.other_inbox.all_to_all.front());
  if (index) RunIndexRounds(parts, homes, &row);
  return row;
}

void PrintRow(const DistRow& r) {
  if (!r.note.empty()) {
    std::printf("| %s | %d | - | - | - | - | - | - | - | %s |\n", r.layout.c_str(), r.world,
                r.note.c_str());
    return;
  }
  std::printf("| %s | %d | %.3f | %.3f (%d) | %.1f | %.1f (%d) | %.1f | %.1f (%d) | %.3f | %.1f M chunks |\n",
              r.layout.c_str(), r.world, r.rank0_s, r.slowest_s, r.slowest, r.rank0_coord / 1e6,
              r.most_coord / 1e6, r.most_coord_rank, r.rank0_peak / 1e6, r.home_peak / 1e6,
              r.busiest_home, r.balance, r.chunks / 1e6);
  if (r.index_bytes > 0) {
    std::printf("|  | rounds 7-8 | %.3f | | %.1f | %.1f | | largest part %.2f MB | commit %.3f s "
                "| index %.1f MB |\n",
                r.index_rank0_s, r.index_rank0_coord / 1e6, r.index_most_coord / 1e6,
                r.largest_part / 1e6, r.commit_s, r.index_bytes / 1e6);
  }
}

nlohmann::ordered_json Json(const DistRow& r) {
  return {{"layout", r.layout},         {"world", r.world},
          {"rank0_plan_s", r.rank0_s},  {"slowest_plan_s", r.slowest_s},
          {"slowest_rank", r.slowest},  {"rank0_coord_bytes", r.rank0_coord},
          {"most_coord_bytes", r.most_coord}, {"most_coord_rank", r.most_coord_rank},
          {"rank0_peak_bytes", r.rank0_peak}, {"busiest_home_peak_bytes", r.home_peak},
          {"busiest_home", r.busiest_home},   {"writer_balance", r.balance},
          {"chunks", r.chunks},
          {"index_rank0_s", r.index_rank0_s}, {"index_rank0_coord_bytes", r.index_rank0_coord},
          {"index_most_coord_bytes", r.index_most_coord}, {"largest_table_part_bytes", r.largest_part},
          {"commit_s", r.commit_s},     {"index_bytes", r.index_bytes},
          {"note", r.note}};
}

}  // namespace
}  // namespace shardsafe::bench

int main(int argc, char** argv) {
  using namespace shardsafe::bench;
  std::vector<int> worlds;
  std::vector<std::string> layouts;
  bool json = false, index = true;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--json") json = true;
    else if (flag == "--no-index") index = false;
    else if (flag == "--world" && i + 1 < argc) worlds.push_back(std::atoi(argv[++i]));
    else if (flag == "--layout" && i + 1 < argc) layouts.push_back(argv[++i]);
    else {
      std::fprintf(stderr,
                   "usage: distributed_plan_benchmark [--world N]... [--layout L]... [--json] "
                   "[--no-index]\n");
      return 2;
    }
  }
  if (worlds.empty()) worlds = {1024, 4096, 16384};
  if (layouts.empty()) layouts.assign(std::begin(kLayouts), std::end(kLayouts));
  nlohmann::ordered_json out = {{"rows", nlohmann::ordered_json::array()}};
  if (!json) {
    std::printf("| layout | ranks | rank 0 s | slowest rank s (rank) | rank 0 coord MB | most coord "
                "MB (rank) | rank 0 peak MB | busiest home peak MB (rank) | writer / ideal | |\n"
                "|---|---|---|---|---|---|---|---|---|---|\n");
  }
  for (const std::string& layout : layouts) {
    for (int world : worlds) {
      auto job = MakeJob(layout, world);
      if (!job.ok()) {
        std::fprintf(stderr, "%s\n", job.status().ToString().c_str());
        return 2;
      }
      const DistRow row = Run(*job, index);
      if (json) out["rows"].push_back(Json(row));
      else PrintRow(row);
      std::fflush(stdout);
    }
  }
  if (json) std::printf("%s\n", out.dump(2).c_str());
  return 0;
}
