// What a save plan made by all ranks together (engine/save/distributed_plan.h)
// costs each rank of a simulated job, against PlanSave on rank 0 (what a save
// runs today: planner_benchmark measures it).
//
//   distributed_plan_benchmark [--world N]... [--layout tp-pp-dp|fsdp|moe] [--json]
//
// Every rank of the job is simulated in this process, one after another
// through each of the six rounds, running the same RankPlanner methods a
// rank runs (PlanOverComm calls them around its collectives); the messages
// are routed between them as the collectives would route them, nothing
// waits and no network is modelled. Per rank:
//   time       the sum of its rounds' calls (rank 0's includes Coordinate);
//   coord      the bytes it sends plus receives (an all-to-all's parts,
//              the gather and scatter rooted at 0, the all-gather's
//              messages: its own once, every other's once);
//   memory     the peak resident size while the two ranks that do the most
//              plan, less before: rank 0's Coordinate (with the summaries it
//              holds) and the busiest home's PlanHome, run again alone
//              from the messages it received (with them).
// Plus the busiest writer's share of the ideal (simulated::IdealMaxRankBytes
// computed from every rank's part). Rows whose simulation would not fit in
// this machine's memory (every rank's state is held at once) are not run.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/save/distributed_plan.h"
#include "planner_jobs.h"
#include "proc_memory.h"

namespace shardsafe::bench {
namespace {

using Clock = std::chrono::steady_clock;

struct RankCost {
  double s = 0;
  uint64_t sent = 0, received = 0;
  uint64_t coord() const { return sent + received; }
};

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

// The non-empty messages to one rank, back to back, and each one's sender
// and end (millions of small messages held as strings of their own would
// not fit).
struct Mailbox {
  std::string bytes;
  std::vector<std::pair<int, uint64_t>> ends;
};

std::vector<std::string> Expand(Mailbox& box, int world, uint64_t* received) {
  std::vector<std::string> out(world);
  uint64_t at = 0;
  for (const auto& [from, end] : box.ends) {
    out[from] = box.bytes.substr(at, end - at);
    at = end;
  }
  *received += box.bytes.size();
  Mailbox().bytes.swap(box.bytes);
  std::vector<std::pair<int, uint64_t>>().swap(box.ends);
  return out;
}

void Post(const std::vector<std::string>& msgs, int from, std::vector<Mailbox>& boxes,
          uint64_t* sent) {
  for (size_t to = 0; to < msgs.size(); ++to) {
    if (msgs[to].empty()) continue;
    *sent += msgs[to].size();
    boxes[to].bytes += msgs[to];
    boxes[to].ends.emplace_back(from, boxes[to].bytes.size());
  }
}

template <typename F>
auto Timed(RankCost& cost, F&& f) {
  const auto t0 = Clock::now();
  auto out = f();
  cost.s += std::chrono::duration<double>(Clock::now() - t0).count();
  return out;
}

// The busiest home's round 2 again, alone, from copies of its messages.
uint64_t HomePeak(int home, int world, std::vector<std::string> in) {
  uint64_t held = 0;
  for (const std::string& m : in) held += m.size();
  RankHoldings none;
  ResetPeakRss();
  const uint64_t before = StatusBytes("VmRSS:");
  {
    RankPlanner planner(home, world, none, SavePlanOptions{});
    std::vector<std::string> out = planner.PlanHome(in);
    for (const std::string& m : out) held += m.size();
  }
  return StatusBytes("VmHWM:") - before + held;
}

DistRow Run(const SimulatedJob& job) {
  const int n = job.world;
  DistRow row{job.layout, n};
  const SavePlanOptions options;
  std::vector<RankHoldings> holdings(n);
  std::vector<std::unique_ptr<RankPlanner>> ranks;
  std::vector<RankCost> cost(n);
  std::vector<Mailbox> boxes(n);
  for (int r = 0; r < n; ++r) {
    holdings[r] = job.rank_shards(r);
    ranks.push_back(std::make_unique<RankPlanner>(r, n, holdings[r], options));
    Post(Timed(cost[r], [&] { return ranks[r]->ToHomes(); }), r, boxes, &cost[r].sent);
    std::vector<ShardInfo>().swap(holdings[r].shards);  // read in round 1 only
  }
  // The busiest home: the most bytes received in round 1.
  uint64_t most = 0;
  for (int h = 0; h < n; ++h) {
    if (boxes[h].bytes.size() > most) most = boxes[h].bytes.size(), row.busiest_home = h;
  }
  Mailbox copy = boxes[row.busiest_home];
  uint64_t ignored = 0;
  std::vector<std::string> busiest_in = Expand(copy, n, &ignored);
  std::vector<Mailbox> next(n);
  for (int h = 0; h < n; ++h) {
    std::vector<std::string> in = Expand(boxes[h], n, &cost[h].received);
    Post(Timed(cost[h], [&] { return ranks[h]->PlanHome(in); }), h, next, &cost[h].sent);
  }
  std::vector<std::string> summaries(n);
  for (int r = 0; r < n; ++r) {
    std::vector<std::string> in = Expand(next[r], n, &cost[r].received);
    summaries[r] = Timed(cost[r], [&] { return ranks[r]->Summary(in); });
    cost[r].sent += summaries[r].size();
    cost[0].received += summaries[r].size();
  }
  ResetPeakRss();
  const uint64_t before = StatusBytes("VmRSS:");
  std::vector<std::string> decisions =
      Timed(cost[0], [&] { return RankPlanner::Coordinate(summaries, options); });
  row.rank0_peak = StatusBytes("VmHWM:") - before;
  for (int r = 0; r < n; ++r) {
    row.rank0_peak += summaries[r].size() + decisions[r].size();
    cost[0].sent += decisions[r].size();
    cost[r].received += decisions[r].size();
  }
  std::vector<std::string>().swap(summaries);
  for (int r = 0; r < n; ++r) {
    Post(Timed(cost[r], [&] { return ranks[r]->Assign(decisions[r]); }), r, boxes, &cost[r].sent);
    std::string().swap(decisions[r]);
  }
  std::vector<std::string> packed(n);
  for (int r = 0; r < n; ++r) {
    std::vector<std::string> in = Expand(boxes[r], n, &cost[r].received);
    packed[r] = Timed(cost[r], [&] { return ranks[r]->PackPart(in); });
  }
  uint64_t all_packed = 0;
  for (const std::string& p : packed) all_packed += p.size();
  std::vector<uint64_t> mandatory(n, 0);
  uint64_t most_bytes = 0, unique = 0;
  for (int r = 0; r < n; ++r) {
    cost[r].sent += packed[r].size();
    cost[r].received += all_packed - packed[r].size();
    Result<SavePlan> part = Timed(cost[r], [&] { return ranks[r]->Finish(packed); });
    ranks[r].reset();
    if (!part.ok()) {
      row.note = "rank " + std::to_string(r) + ": " + part.status().ToString();
      return row;
    }
    for (const PlannedChunk& c : part->chunks) {
      if (c.holders == 1) mandatory[r] += c.bytes;
    }
    for (const PlannedBlob& b : part->blobs) mandatory[r] += b.bytes;
    row.chunks += part->chunks.size();
    most_bytes = part->part->max_rank_bytes;
    unique = part->unique_bytes;
  }
  uint64_t ideal = (unique + n - 1) / n;
  for (uint64_t m : mandatory) ideal = std::max(ideal, m);
  row.balance = static_cast<double>(most_bytes) / static_cast<double>(ideal);
  row.rank0_s = cost[0].s;
  row.rank0_coord = cost[0].coord();
  for (int r = 0; r < n; ++r) {
    if (cost[r].s > row.slowest_s) row.slowest_s = cost[r].s, row.slowest = r;
    if (cost[r].coord() > row.most_coord) row.most_coord = cost[r].coord(), row.most_coord_rank = r;
  }
  ranks.clear();
  boxes.assign(n, {});
  row.home_peak = HomePeak(row.busiest_home, n, std::move(busiest_in));
  return row;
}

void PrintRow(const DistRow& r) {
  if (!r.note.empty()) {
    std::printf("| %s | %d | - | - | - | - | - | - | - | %s |\n", r.layout.c_str(), r.world,
                r.note.c_str());
    return;
  }
  std::printf("| %s | %d | %.3f | %.3f (%d) | %.1f | %.1f (%d) | %.0f | %.0f (%d) | %.3f | %.1f M chunks |\n",
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
