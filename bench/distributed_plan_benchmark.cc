// What a save plan made by all ranks together (engine/save/distributed_plan.h)
// costs each rank of a simulated job, against PlanSave on rank 0 (what a save
// runs today: planner_benchmark measures it).
//
//   distributed_plan_benchmark [--world N]... [--layout tp-pp-dp|fsdp|moe] [--json]
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
// from every rank's part). Every rank's state is held at once: FSDP at
// 16,384 ranks takes about 10 GB; 65,536 ranks do not fit this machine.
#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/save/plan_simulation.h"
#include "planner_jobs.h"
#include "proc_memory.h"

namespace shardsafe::bench {
namespace {

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

DistRow Run(const SimulatedJob& job) {
  const int n = job.world;
  DistRow row{job.layout, n};
  std::vector<uint64_t> mandatory(n, 0);
  uint64_t most_bytes = 0, unique = 0, before = 0;
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
      },
      [&] {
        ResetPeakRss();
        before = StatusBytes("VmRSS:");
      },
      [&] { row.rank0_peak = StatusBytes("VmHWM:") - before; });
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
  row.busiest_home = sim.busiest_home;
  row.home_peak = HomePeak(sim.busiest_home, n, sim.busiest_home_received);
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
}

nlohmann::ordered_json Json(const DistRow& r) {
  return {{"layout", r.layout},         {"world", r.world},
          {"rank0_plan_s", r.rank0_s},  {"slowest_plan_s", r.slowest_s},
          {"slowest_rank", r.slowest},  {"rank0_coord_bytes", r.rank0_coord},
          {"most_coord_bytes", r.most_coord}, {"most_coord_rank", r.most_coord_rank},
          {"rank0_peak_bytes", r.rank0_peak}, {"busiest_home_peak_bytes", r.home_peak},
          {"busiest_home", r.busiest_home},   {"writer_balance", r.balance},
          {"chunks", r.chunks},         {"note", r.note}};
}

}  // namespace
}  // namespace shardsafe::bench

int main(int argc, char** argv) {
  using namespace shardsafe::bench;
  std::vector<int> worlds;
  std::vector<std::string> layouts;
  bool json = false;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--json") json = true;
    else if (flag == "--world" && i + 1 < argc) worlds.push_back(std::atoi(argv[++i]));
    else if (flag == "--layout" && i + 1 < argc) layouts.push_back(argv[++i]);
    else {
      std::fprintf(stderr,
                   "usage: distributed_plan_benchmark [--world N]... [--layout L]... [--json]\n");
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
      const DistRow row = Run(*job);
      if (json) out["rows"].push_back(Json(row));
      else PrintRow(row);
      std::fflush(stdout);
    }
  }
  if (json) std::printf("%s\n", out.dump(2).c_str());
  return 0;
}
