// Planning a 4,096-rank save (TP 8 x PP 4 x DP 128, ZeRO-1, an 80-layer
// ~1 TB transformer) with the functions rank 0 runs: the busiest writer
// stays within 1.1x its ideal share, and what rank 0 sends each other rank
// (its part of the plan, plan_wire.h) follows that rank's own work, not the
// job's size: each rank holds the same tensors at 1,024 and 4,096 ranks,
// and its part grows only by the pieces of the replicas it holds (more,
// smaller pieces as the ideal share shrinks: a few tens of bytes each),
// where every rank's layout and chunks would be 4x as many; every rank's
// report stays small, and a repeated save's (compact) under half of it.
// Counts bytes, never times.
#include <gtest/gtest.h>

#include <algorithm>

#include "engine/save/plan_wire.h"
#include "engine/save/save_messages.h"
#include "layout/plan_part.h"
#include "testing/layout/simulated_layouts.h"

namespace shardsafe {
namespace {

struct Measured {
  double balance = 0;
  uint64_t largest_part = 0;
  uint64_t largest_report = 0;
  uint64_t largest_compact_report = 0;  // a repeated save's
  uint64_t compact_overhead = 0;        // the most a compact report adds to 4 bytes an entry
  uint64_t largest_v3_report = 0;       // a repeated save's, its chunks' checksums in files
};

// A report as the rank would send it when the replicas agree (no copies),
// its checksums made up, its entries back to back after 4 KiB.
std::string ReportOf(const SavePlan& part, ReportForm form) {
  RankReport report;
  for (uint32_t f = 0; f < part.files.size(); ++f) {
    WrittenFile w{f, 4096 + part.files[f].payload_bytes, {}, {}};
    uint64_t at = 4096;
    for (uint32_t c : part.files[f].chunks) {
      w.chunks.push_back({at, 0x9e3779b9u * c});
      at += part.chunks[c].bytes;
    }
    for (uint32_t b : part.files[f].blobs) {
      w.blobs.push_back({at, 7});
      at += part.blobs[b].bytes;
    }
    report.files.push_back(std::move(w));
  }
  report.replica_digest = 0x0123456789abcdefu;
  NumberAsWhole(part, &report);
  return EncodeReport(report, form);
}

Measured Plan(int dp) {
  simulated::TransformerLayout m;  // tp 8, pp 4, ZeRO-1
  m.dp = dp;
  auto plan = PlanSave(simulated::MakeHoldings(m), SavePlanOptions{});
  EXPECT_TRUE(plan.ok()) << plan.status().ToString();
  Measured out;
  if (!plan.ok()) return out;
  out.balance = static_cast<double>(MaxRankBytes(*plan)) / simulated::IdealMaxRankBytes(*plan);
  const PlanPartInfo totals = PlanTotals(*plan);
  for (int r = 1; r < m.world(); ++r) {
    const SavePlan part = PartOfPlan(*plan, r, totals);
    const uint64_t sent = EncodePlanMessage(part, Digest{}).size();
    out.largest_part = std::max(out.largest_part, sent);
    out.largest_report = std::max<uint64_t>(out.largest_report, ReportOf(part, {}).size());
    const uint64_t compact = ReportOf(part, {.compact = true}).size();
    out.largest_v3_report =
        std::max<uint64_t>(out.largest_v3_report,
                           ReportOf(part, {.compact = true, .chunk_checksums = false}).size());
    out.largest_compact_report = std::max(out.largest_compact_report, compact);
    uint64_t entries = 0;
    for (const PlannedFile& f : part.files) entries += f.chunks.size() + f.blobs.size();
    out.compact_overhead = std::max(out.compact_overhead, compact - std::min(compact, 4 * entries));
  }
  return out;
}

TEST(PlanScaleTest, At4096RanksWritersBalanceAndARankReceivesItsOwnPartOnly) {
  const Measured at1024 = Plan(32), at4096 = Plan(128);
  EXPECT_LE(at1024.balance, 1.1);
  EXPECT_LE(at4096.balance, 1.1);
  EXPECT_GT(at4096.largest_part, 0u);
  EXPECT_LE(at4096.largest_part, at1024.largest_part * 5 / 4)
      << "a part grows with the job, not the rank's own work";
  EXPECT_LE(at4096.largest_part, 256u << 10);
  EXPECT_LE(at4096.largest_report, 16u << 10) << "a rank's report of what it wrote";
  EXPECT_LE(at4096.largest_compact_report * 3, at4096.largest_report * 2)
      << "a repeated save's report: 4 bytes an entry, not 8-9 with its offset";
  EXPECT_LE(at4096.compact_overhead, 64u) << "a compact report: the checksums, a digest, counts";
  EXPECT_LE(at4096.largest_v3_report, 64u)
      << "a repeated version-3 save: counts, the blobs' checksums and a digest";
}

}  // namespace
}  // namespace shardsafe
