// Planner benchmark: what planning a save and reading the metadata of a load
// cost the ranks of a large job, on the engine's own code, at 1,024 / 4,096 /
// 16,384 / 65,536 simulated ranks on three layouts (engine/bench/planner_jobs.h),
// on the path a save of the job runs: from 1,024 ranks planned
// by all ranks together, under it on rank 0. For rank 0 and for another
// rank (the busiest home, or the rank that receives the largest part):
// planning time of a first and of a repeated save, planning's peak memory,
// the bytes the rank sends and receives to coordinate; then the metadata a
// loader reads and its parse time, and the busiest writer's share
// (engine/bench/planner_row.h says exactly what each measures and what is
// simulated). Rows that would not fit in this machine's memory are reported
// with their estimated need instead of run. Writes only the metadata a
// loader reads (under /tmp).
//
//   planner_benchmark [--world N]... [--layout tp-pp-dp|fsdp|moe] [--json] [--iters N]
//                     [--planning as-saved|together|rank0] [--require-all] [--details]
//                     [--check-simulation]
//
// --planning: as a save of the job plans (the default), or one way at any
// size (SaveOptions::distributed_plan_min_ranks makes a save do either).
// --require-all: exit 1 when a row is not run or stops for memory, as for
// a row that fails. --check-simulation: before each row planned together,
// the lean simulation of every rank that the row runs (SimulateSave) is
// compared with the full one (CheckSimulateSave, plan_simulation.h); a
// difference fails the row. It holds both at once: for small worlds.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <iterator>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/bench/planner_details.h"
#include "engine/bench/planner_jobs.h"
#include "engine/bench/planner_row.h"

namespace shardsafe::bench {
namespace {

constexpr int kWorlds[] = {1024, 4096, 16384, 65536};

struct Flags {
  std::vector<int> worlds{std::begin(kWorlds), std::end(kWorlds)};
  std::vector<std::string> layouts{std::begin(kLayouts), std::end(kLayouts)};
  bool json = false;
  bool details = false;
  bool require_all = false;  // a row not run (memory) fails the run too
  bool check_simulation = false;
  int iters = 1;
  RowRunner::Planning planning = RowRunner::Planning::kAsSaveDoes;
};

constexpr char kUsage[] =
    "usage: planner_benchmark [--world N]... [--layout tp-pp-dp|fsdp|moe] [--json] [--iters N] "
    "[--planning as-saved|together|rank0] [--require-all] [--details] [--check-simulation]\n";

// False (usage printed) for an unknown flag or a missing value.
bool ParseFlags(int argc, char** argv, Flags* flags) {
  bool worlds_given = false;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    const bool has_value = i + 1 < argc;
    if (flag == "--json") {
      flags->json = true;
    } else if (flag == "--details") {
      flags->details = true;
    } else if (flag == "--require-all") {
      flags->require_all = true;
    } else if (flag == "--check-simulation") {
      flags->check_simulation = true;
    } else if (flag == "--world" && has_value) {  // repeated: several rows
      if (!worlds_given) flags->worlds.clear();
      worlds_given = true;
      flags->worlds.push_back(std::atoi(argv[++i]));
    } else if (flag == "--layout" && has_value) {
      flags->layouts = {argv[++i]};
    } else if (flag == "--planning" && has_value) {
      const std::string how = argv[++i];
      if (how == "together") {
        flags->planning = RowRunner::Planning::kTogether;
      } else if (how == "rank0") {
        flags->planning = RowRunner::Planning::kOnRankZero;
      } else if (how != "as-saved") {
        std::fputs(kUsage, stderr);
        return false;
      }
    } else if (flag == "--iters" && has_value) {
      flags->iters = std::max(1, std::atoi(argv[++i]));
    } else {
      std::fputs(kUsage, stderr);
      return false;
    }
  }
  if (flags->json && flags->details) {
    std::fputs("planner_benchmark: --details prints text, not JSON\n", stderr);
    return false;
  }
  return true;
}

// "%.*f" of `v`, or "-" for none.
template <typename T>
std::string Cell(const std::optional<T>& v, double scale, int decimals) {
  if (!v) return "-";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.*f", decimals, static_cast<double>(*v) * scale);
  return buf;
}

void PrintHeader() {
  std::printf("| layout | ranks | plan s | repeat ms | repeat commit s | peak RSS MB | coord MB | repeat coord MB "
              "| other: plan ms | other: peak RSS MB | other: coord KB | other: repeat coord KB "
              "| load meta MB | load meta s | load meta peak MB | writer / ideal | note |\n"
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
}

void PrintRow(const Row& r) {
  const RankCost& l = r.leader;
  const RankCost& o = r.other;
  std::printf("| %s | %d | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n",
              r.layout.c_str(), r.world, Cell(l.plan_s, 1, 3).c_str(),
              Cell(l.repeat_plan_s, 1e3, 2).c_str(), Cell(r.repeat_commit_s, 1, 3).c_str(),
              Cell(l.peak_rss_bytes, 1e-6, 1).c_str(),
              Cell(l.coord_bytes, 1e-6, 1).c_str(), Cell(l.repeat_coord_bytes, 1e-6, 2).c_str(),
              Cell(o.plan_s, 1e3, 2).c_str(), Cell(o.peak_rss_bytes, 1e-6, 1).c_str(),
              Cell(o.coord_bytes, 1e-3, 1).c_str(), Cell(o.repeat_coord_bytes, 1e-3, 1).c_str(),
              Cell(r.load_meta_bytes, 1e-6, 1).c_str(), Cell(r.load_meta_s, 1, 2).c_str(),
              Cell(r.load_meta_peak_bytes, 1e-6, 1).c_str(), Cell(r.writer_balance, 1, 3).c_str(),
              r.note.c_str());
  std::fflush(stdout);
}

void PrintLegend(const std::vector<SimulatedJob>& jobs, const std::vector<Row>& rows,
                 int iters) {
  bool together = false, on_leader = false;
  for (const Row& r : rows) (r.together ? together : on_leader) = true;
  std::printf(
      "\nOn the engine's own code (src/engine/bench/planner_row.h has the exact calls), on the\n"
      "path a save of the job runs, for rank 0 (the first columns) and for another rank\n"
      "(\"other\", named below):\n"
      "  plan s          step 0 of a first save, GatherAndPlan: the quick check, then\n");
  if (together) {
    std::printf(
        "                  planned together (1,024+ ranks): PlanTogether on each rank: the\n"
        "                  agreement gathered to rank 0 and the planning's id broadcast,\n"
        "                  rounds 1-6 (PlanOverComm: its own shards, its keys as a home; rank\n"
        "                  0 also Coordinate) and 7-8 (IndexOverComm: its part of the chunk\n"
        "                  table as a home; rank 0 the index skeleton); the other rank is the\n"
        "                  busiest home\n");
  }
  if (on_leader) {
    std::printf(
        "                  planned on rank 0: rank 0 unpacks every rank's gathered layout,\n"
        "                  DecodeHoldings, CheckAgreement, PlanSave over all ranks, then\n"
        "                  builds, encodes and scatters every rank's part (PartOfPlan,\n"
        "                  EncodePlanMessage); another rank sends its layout and decodes its\n"
        "                  part; the other rank is the one sent the largest part\n");
  }
  std::printf(
      "                  both cache what they have\n"
      "  repeat ms       GatherAndPlan of the next save, every layout unchanged: EncodeLayout,\n"
      "                  LookUpPlan and comparison, the quick check (a max-reduction of 88 B),\n"
      "                  after malloc_trim (what the first save freed consolidated); best of 5\n"
      "  repeat commit s rank 0's commit work in a repeated save before its writes: the compact\n"
      "                  reports read, their digests added, the index text made (planned\n"
      "                  together: IndexOfSave of the skeleton; on rank 0: MakeIndex, a chunk\n"
      "                  table the one the first save made, kept); best of 5\n"
      "  peak RSS        VmHWM during the first save's step 0, less VmRSS before: what the\n"
      "                  rank received, its planning state and what it keeps\n"
      "  coord MB        bytes the rank sends + receives in a first save: step 0's collectives,\n"
      "                  the directories' broadcast, the step-3 reports' gather to rank 0 (at\n"
      "                  once compact when planned together), the outcome's broadcast\n"
      "  repeat coord    the same for a repeated save (the quick check; compact reports: a\n"
      "                  count per file, the blobs' checksums and the replica digest)\n"
      "  load meta MB    what rank 0 reads to load its own shards again: the committed index,\n"
      "                  the parts of the chunk table ReadChunksFor reads for its slices and\n"
      "                  the checksum files of their writers (written under /tmp as the save\n"
      "                  writes them); load meta s: reading and parsing the index\n"
      "                  (ParseIndex) and ReadChunksFor; load meta peak MB: VmHWM during\n"
      "                  those, less VmRSS before\n"
      "  writer / ideal  busiest writer's bytes / max(unique bytes / ranks, its own-only bytes)\n"
      "  row peak        below: VmHWM of the row less VmRSS before (planned together: of the\n"
      "                  simulation of every rank; on rank 0: rank 0's save and load), what\n"
      "                  the next row's memory estimate scales\n"
      "Simulated: every rank but the measured one (planned together: every rank's rounds run\n"
      "in this process, plan_simulation.h, and what the measured rank receives handed to it by\n"
      "a Comm double; on rank 0: its holdings computed and encoded as Save encodes them); no\n"
      "network, so no wait is timed; the reports' checksums (no data is written). Timings: best\n"
      "of %d, one thread, on %u hardware threads shared with other work.\n",
      iters, std::thread::hardware_concurrency());
  std::string last;
  for (size_t i = 0; i < jobs.size(); ++i) {
    const SimulatedJob& job = jobs[i];
    if (job.layout != last) {
      std::printf("%s: %s,\n  %.0f B parameters, checkpoint %.2f TB (BF16 weights; F32 master, "
                  "exp_avg, exp_avg_sq)\n",
                  job.layout.c_str(), job.model.c_str(), job.params / 1e9,
                  job.checkpoint_bytes / 1e12);
      last = job.layout;
    }
    const Row& r = rows[i];
    std::printf("  %6d ranks: %s; %.1f M shards held", job.world, job.mesh.c_str(),
                r.shards / 1e6);
    if (r.row_peak > 0) std::printf(" (row peak %.1f GB)", r.row_peak / 1e9);
    if (r.other.plan_s) {
      std::printf(", %.1f M chunks planned", r.chunks / 1e6);
      if (r.together) {
        std::printf(" together, %llu table parts (largest %.2f MB)",
                    static_cast<unsigned long long>(r.table_parts), r.largest_table_part / 1e6);
      }
      std::printf("; other: rank %d (%s %.1f KB)\n", r.other_rank,
                  r.together ? "shards received as a home" : "part", r.other_part_bytes / 1e3);
    } else if (r.leader.plan_s) {
      std::printf(", %.1f M chunks planned\n", r.chunks / 1e6);
    } else {
      std::printf(" (estimated from 64 ranks)\n");
    }
  }
}

template <typename T>
nlohmann::ordered_json OrNull(const std::optional<T>& v) {
  return v ? nlohmann::ordered_json(*v) : nlohmann::ordered_json(nullptr);
}

void PrintJson(const std::vector<Row>& rows) {
  nlohmann::ordered_json out = {{"rows", nlohmann::ordered_json::array()}};
  for (const Row& r : rows) {
    const RankCost& l = r.leader;
    const RankCost& o = r.other;
    nlohmann::ordered_json row = {{"layout", r.layout},
                                  {"world", r.world},
                                  {"planned_together", r.together},
                                  {"plan_s", OrNull(l.plan_s)},
                                  {"repeat_plan_s", OrNull(l.repeat_plan_s)},
                                  {"repeat_commit_s", OrNull(r.repeat_commit_s)},
                                  {"peak_rss_bytes", OrNull(l.peak_rss_bytes)},
                                  {"coord_bytes", OrNull(l.coord_bytes)},
                                  {"repeat_coord_bytes", OrNull(l.repeat_coord_bytes)},
                                  {"load_meta_bytes", OrNull(r.load_meta_bytes)},
                                  {"load_meta_s", OrNull(r.load_meta_s)},
                                  {"load_meta_peak_bytes", OrNull(r.load_meta_peak_bytes)},
                                  {"writer_balance", OrNull(r.writer_balance)},
                                  {"row_peak_bytes", r.row_peak},
                                  {"table_parts", r.table_parts},
                                  {"largest_table_part_bytes", r.largest_table_part},
                                  {"other_rank", o.plan_s ? nlohmann::ordered_json(r.other_rank)
                                                          : nlohmann::ordered_json(nullptr)},
                                  {"other_plan_s", OrNull(o.plan_s)},
                                  {"other_peak_rss_bytes", OrNull(o.peak_rss_bytes)},
                                  {"other_coord_bytes", OrNull(o.coord_bytes)},
                                  {"other_repeat_coord_bytes", OrNull(o.repeat_coord_bytes)}};
    if (!r.note.empty()) row["note"] = r.note;
    out["rows"].push_back(std::move(row));
  }
  std::printf("%s\n", out.dump(2).c_str());
}

int Run(int argc, char** argv) {
  Flags flags;
  if (!ParseFlags(argc, argv, &flags)) return 2;
  std::vector<SimulatedJob> jobs;
  for (const std::string& layout : flags.layouts) {
    for (int world : flags.worlds) {
      Result<SimulatedJob> job = MakeJob(layout, world);
      if (!job.ok()) {
        std::fprintf(stderr, "planner_benchmark: %s\n", job.status().ToString().c_str());
        return 2;
      }
      jobs.push_back(std::move(*job));
    }
  }
  if (!flags.json) PrintHeader();
  RowRunner runner(flags.iters, flags.planning, flags.check_simulation);
  std::vector<Row> rows;
  bool failed = false;
  for (const SimulatedJob& job : jobs) {
    rows.push_back(runner.Run(job));
    const Row& row = rows.back();
    failed |= row.failed || (flags.require_all && !row.leader.plan_s);
    if (!flags.json) PrintRow(rows.back());
  }
  if (flags.json) {
    PrintJson(rows);
  } else {
    PrintLegend(jobs, rows, flags.iters);
  }
  if (flags.details && !PrintPlannerDetails(flags.iters)) return 1;
  return failed ? 1 : 0;
}

}  // namespace
}  // namespace shardsafe::bench

int main(int argc, char** argv) { return shardsafe::bench::Run(argc, argv); }
