#include "engine/bench/planner_details.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "layout/load_planner.h"
#include "layout/save_planner.h"
#include "testing/layout/simulated_layouts.h"

namespace shardsafe::bench {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point since) {
  return std::chrono::duration<double>(Clock::now() - since).count();
}

// The saved tensors as a checkpoint index would describe them: each file's
// chunks laid out back to back, in plan order.
std::vector<SavedTensor> SavedFromPlan(const SavePlan& plan) {
  std::vector<SavedTensor> out(plan.tensors.size());
  std::vector<SavedChunk> chunks(plan.chunks.size());
  for (uint32_t f = 0; f < plan.files.size(); ++f) {
    uint64_t at = 4096;  // room for a header
    for (uint32_t c : plan.files[f].chunks) {
      chunks[c] = SavedChunk{plan.chunks[c].slice, f, at};
      at += plan.chunks[c].bytes;
    }
  }
  for (uint32_t t = 0; t < plan.tensors.size(); ++t) {
    out[t].dtype = plan.tensors[t].dtype;
    out[t].shape = plan.tensors[t].shape;
    for (uint32_t c : plan.tensors[t].chunks) out[t].chunks.push_back(chunks[c]);
  }
  return out;
}

// What rank (pp_i, dp_i, tp_i) of layout `m` asks the checkpoint for.
std::vector<Want> WantsOf(const simulated::TransformerLayout& m, int pp_i, int dp_i, int tp_i,
                          const SavePlan& plan) {
  std::vector<Want> wants;
  for (const ShardInfo& s : simulated::RankShards(m, pp_i, dp_i, tp_i).shards) {
    auto it = std::lower_bound(
        plan.tensors.begin(), plan.tensors.end(), s.key,
        [](const PlannedTensor& t, const std::string& k) { return t.key < k; });
    wants.push_back(Want{static_cast<uint32_t>(it - plan.tensors.begin()), s.slice});
  }
  return wants;
}

// The plan of `wants`, made `iters` times; *best: the fastest, in seconds.
// A failure is printed.
Result<LoadPlan> TimedPlanLoad(const std::vector<SavedTensor>& saved,
                               const std::vector<Want>& wants, int iters, double* best) {
  *best = 1e9;
  Result<LoadPlan> lp = InvalidArgumentError("not run");
  for (int i = 0; i < iters; ++i) {
    const auto start = Clock::now();
    lp = PlanLoad(saved, wants, LoadPlanOptions{});
    *best = std::min(*best, Seconds(start));
  }
  if (!lp.ok()) std::fprintf(stderr, "PlanLoad: %s\n", lp.status().ToString().c_str());
  return lp;
}

bool PrintSampleLoads(const SavePlan& plan, int iters) {
  simulated::TransformerLayout load_layout;
  load_layout.tp = 4;
  load_layout.dp = 64;
  const std::vector<SavedTensor> saved = SavedFromPlan(plan);
  std::printf("load of the 1,024-rank tp-pp-dp save into TP %d x PP %d x DP %d:\n", load_layout.tp,
              load_layout.pp, load_layout.dp);
  const int samples[][3] = {{0, 0, 0}, {1, 17, 2}, {3, load_layout.dp - 1, load_layout.tp - 1}};
  for (const auto& s : samples) {
    const std::vector<Want> wants = WantsOf(load_layout, s[0], s[1], s[2], plan);
    double best = 0;
    const Result<LoadPlan> lp = TimedPlanLoad(saved, wants, iters, &best);
    if (!lp.ok()) return false;
    size_t reads = 0;
    for (const ReadGroup& g : lp->groups) reads += g.reads.size();
    std::printf("  rank (pp %d, dp %d, tp %d): %zu wants, PlanLoad %.4f s, %zu groups, %zu reads, "
                "read/needed %.2f/%.2f GiB = %.4f\n",
                s[0], s[1], s[2], wants.size(), best, lp->groups.size(), reads,
                lp->bytes_read / 1073741824.0, lp->bytes_needed / 1073741824.0,
                static_cast<double>(lp->bytes_read) / static_cast<double>(lp->bytes_needed));
  }
  return true;
}

// 20,000 tensors of [416, 64] f32 saved in row halves by 2 ranks (a file
// each), planned for the rank that loads the left half of the columns:
// 8.3 million rows of 128 bytes.
bool PrintColumnSplit(int iters) {
  constexpr uint32_t kTensors = 20000;
  constexpr uint64_t kRows = 416, kCols = 64, kHalf = kRows / 2 * kCols * 4;
  std::vector<SavedTensor> saved(kTensors);
  std::vector<Want> wants;
  for (uint32_t t = 0; t < kTensors; ++t) {
    saved[t].shape = {kRows, kCols};
    for (uint32_t f = 0; f < 2; ++f) {
      saved[t].chunks.push_back(
          SavedChunk{Slice{Box{{f * kRows / 2, 0}, {kRows / 2, kCols}}, {}}, f, 4096 + t * kHalf});
    }
    wants.push_back(Want{t, Slice{Box{{0, 0}, {kRows, kCols / 2}}, {}}});
  }
  double best = 0;
  const Result<LoadPlan> lp = TimedPlanLoad(saved, wants, iters, &best);
  if (!lp.ok()) return false;
  size_t segments = 0;
  for (const ReadGroup& g : lp->groups) {
    for (const ReadOp& r : g.reads) segments += r.segments.size();
  }
  std::printf("column split: %u tensors [%llu, %llu] f32, Shard(0) over 2 -> Shard(1): PlanLoad "
              "%.4f s, %zu groups, %zu segments, read/needed %.2f/%.2f GiB\n",
              kTensors, static_cast<unsigned long long>(kRows),
              static_cast<unsigned long long>(kCols), best, lp->groups.size(), segments,
              lp->bytes_read / 1073741824.0, lp->bytes_needed / 1073741824.0);
  return true;
}

}  // namespace

bool PrintPlannerDetails(int iters) {
  const Result<SavePlan> plan =
      PlanSave(simulated::MakeHoldings(simulated::TransformerLayout{}), SavePlanOptions{});
  if (!plan.ok()) {
    std::fprintf(stderr, "PlanSave: %s\n", plan.status().ToString().c_str());
    return false;
  }
  return PrintSampleLoads(*plan, iters) && PrintColumnSplit(iters);
}

}  // namespace shardsafe::bench
