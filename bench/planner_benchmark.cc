// Planner benchmark: what planning a save and reading the metadata of a load
// cost the ranks of a large job, on the engine's own code, at 1,024 / 4,096 /
// 16,384 / 65,536 simulated ranks on three layouts (bench/planner_jobs.h):
// for rank 0, which plans the whole save and scatters every rank its part,
// and for the other rank that receives the largest part: planning time of a
// first and of a repeated save, planning's peak memory, the bytes the rank
// sends and receives to coordinate; then the index a loader reads and its
// parse time, and the busiest writer's share (bench/planner_row.h says
// exactly what each measures). Rows that would not fit in this machine's
// memory are reported with their estimated need instead of run. No I/O.
//
//   planner_benchmark [--world N]... [--layout tp-pp-dp|fsdp|moe] [--json] [--iters N] [--details]
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <iterator>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "planner_details.h"
#include "planner_jobs.h"
#include "planner_row.h"

namespace shardsafe::bench {
namespace {

constexpr int kWorlds[] = {1024, 4096, 16384, 65536};

struct Flags {
  std::vector<int> worlds{std::begin(kWorlds), std::end(kWorlds)};
  std::vector<std::string> layouts{std::begin(kLayouts), std::end(kLayouts)};
  bool json = false;
  bool details = false;
  int iters = 1;
};

constexpr char kUsage[] =
    "usage: planner_benchmark [--world N]... [--layout tp-pp-dp|fsdp|moe] [--json] [--iters N] "
    "[--details]\n";

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
    } else if (flag == "--world" && has_value) {  // repeated: several rows
      if (!worlds_given) flags->worlds.clear();
      worlds_given = true;
      flags->worlds.push_back(std::atoi(argv[++i]));
    } else if (flag == "--layout" && has_value) {
      flags->layouts = {argv[++i]};
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
  std::printf("| layout | ranks | plan s | repeat ms | repeat commit s | peak RSS GB | coord MB | repeat coord MB "
              "| other: plan ms | other: peak RSS MB | other: coord KB | other: repeat coord KB "
              "| load meta MB | load meta s | load meta peak MB | writer / ideal | note |\n"
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
}

void PrintRow(const Row& r) {
  const RankCost& l = r.leader;
  const RankCost& o = r.other;
  std::printf("| %s | %d | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n",
              r.layout.c_str(), r.world, Cell(l.plan_s, 1, 2).c_str(),
              Cell(l.repeat_plan_s, 1e3, 2).c_str(), Cell(r.repeat_commit_s, 1, 2).c_str(),
              Cell(l.peak_rss_bytes, 1e-9, 2).c_str(),
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
  std::printf(
      "\nOn the engine's own code (bench/planner_row.h has the exact calls), for rank 0 (the\n"
      "first columns: the whole job's planning, the most of any rank) and for the other rank\n"
      "whose part of the plan is the largest (\"other\", named below):\n"
      "  plan s          step 0 of a first save, GatherAndPlan: the quick check; rank 0 unpacks\n"
      "                  every rank's gathered layout, DecodeHoldings, CheckAgreement, PlanSave\n"
      "                  over all ranks, then builds, encodes and scatters every rank's part\n"
      "                  (PartOfPlan, EncodePlanMessage); another rank sends its layout and\n"
      "                  decodes its part (DecodePlanMessage); both cache what they have\n"
      "  repeat ms       GatherAndPlan of the next save, every layout unchanged: EncodeLayout,\n"
      "                  LookUpPlan and comparison, the quick check (a max-reduction of 80 B),\n"
      "                  after malloc_trim (what the first save freed consolidated); best of 5\n"
      "  repeat commit s rank 0's commit work in a repeated save before its writes: the compact\n"
      "                  reports read (ReadReports), their digests added, MakeIndex (the index\n"
      "                  text; a chunk table is the one the first save made, kept); best of 5\n"
      "  peak RSS        VmHWM during the first save's step 0, less VmRSS before: rank 0's\n"
      "                  received layouts, plan and parts; the other rank's part, decoded\n"
      "  coord MB        bytes the rank sends + receives in a first save: the quick check, the\n"
      "                  layouts' gather to rank 0, the parts' scatter from it, the\n"
      "                  directories' broadcast, the step-3 reports' gather to rank 0, the\n"
      "                  outcome's broadcast\n"
      "  repeat coord    the same for a repeated save (no layouts, no parts; compact reports:\n"
      "                  rank 0 kept the offsets; with a chunk table the chunks' checksums are\n"
      "                  in each writer's checksum file, so a count per file, the blobs'\n"
      "                  checksums and the replica digest)\n"
      "  load meta MB    what rank 0 reads to load its own shards again: the committed index\n"
      "                  (MakeIndex: a chunk table from 65,536 chunks on, in files under /tmp,\n"
      "                  with every rank's checksum file), the parts of the chunk table\n"
      "                  ReadChunksFor reads for its slices and the checksum files of their\n"
      "                  writers; load meta s: reading and parsing the index (ParseIndex) and\n"
      "                  ReadChunksFor; load meta peak MB: VmHWM during those, less VmRSS\n"
      "                  before\n"
      "  writer / ideal  busiest writer's bytes / max(unique bytes / ranks, its own-only bytes)\n"
      "Simulated: every rank but the measured one (its holdings computed, encoded as Save\n"
      "encodes them and handed to rank 0 by a Comm double; the other rank's part is the one\n"
      "rank 0's run scattered; no network, so no wait is timed); the reports' file offsets and\n"
      "checksums (no byte is written). Timings: best of %d, one thread, on %u hardware threads\n"
      "shared with other work.\n",
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
    if (r.other.plan_s) {
      std::printf(", %.1f M chunks planned; other: rank %d (part %.1f KB)\n", r.chunks / 1e6,
                  r.other_rank, r.other_part_bytes / 1e3);
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
  RowRunner runner(flags.iters);
  std::vector<Row> rows;
  bool failed = false;
  for (const SimulatedJob& job : jobs) {
    rows.push_back(runner.Run(job));
    failed |= rows.back().failed;
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
