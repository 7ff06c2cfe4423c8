// Planner benchmark: plans the save of a simulated 1,024-rank training job
// (TP=8, PP=4, DP=32, ZeRO-1 optimizer state, an 80-layer transformer:
// ~1,900 tensors) and the load of it into another layout (TP=4, DP=64),
// printing timings, writer balance and read amplification, and the size, write
// and parse time and parse peak memory of the index it commits; then the load
// plan of a column split of many small tensors (saved Shard(0), loaded
// Shard(1): a run per row). No I/O.
//
//   planner_benchmark [--dp N] [--tp-load N] [--dp-load N] [--iters N] [--zero 0|1]
#include <malloc.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "format/index.h"
#include "layout/load_planner.h"
#include "layout/save_planner.h"
#include "layout/simulated_layouts.h"

namespace shardsafe {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point since) {
  return std::chrono::duration<double>(Clock::now() - since).count();
}

// The saved tensors as a checkpoint index would describe them: each file's
// chunks and blobs laid out back to back, in plan order.
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

void PrintSave(const simulated::TransformerLayout& m, size_t shards, const SavePlan& plan,
               double seconds) {
  uint64_t max_rank = 0, max_file = 0, max_chunk = 0;
  for (uint64_t b : plan.bytes_per_rank) max_rank = std::max(max_rank, b);
  for (const PlannedFile& f : plan.files) max_file = std::max(max_file, f.payload_bytes);
  for (const PlannedChunk& c : plan.chunks) max_chunk = std::max(max_chunk, c.bytes);
  const uint64_t ideal = simulated::IdealMaxRankBytes(plan);
  std::printf("save: world %d (tp %d, pp %d, dp %d, zero %d), %zu tensors, %zu shards held\n",
              m.world(), m.tp, m.pp, m.dp, m.zero, plan.tensors.size(), shards);
  std::printf("  PlanSave            %.3f s\n", seconds);
  std::printf("  chunks              %zu (largest %.1f MiB), files %zu (largest %.1f MiB)\n",
              plan.chunks.size(), max_chunk / 1048576.0, plan.files.size(), max_file / 1048576.0);
  std::printf("  unique bytes        %.2f GiB\n", plan.unique_bytes / 1073741824.0);
  std::printf("  max rank / ideal    %.1f / %.1f MiB = %.3f\n", max_rank / 1048576.0,
              ideal / 1048576.0, static_cast<double>(max_rank) / ideal);
}

// The index a save with this plan would commit (offsets and checksums
// synthesized), to measure its size and how long it takes to write and read.
CheckpointIndex IndexOf(const SavePlan& plan) {
  CheckpointIndex index;
  index.tag = "step-00000001";
  index.world_size = static_cast<int>(plan.bytes_per_rank.size());
  for (size_t f = 0; f < plan.files.size(); ++f) {
    index.files.push_back({"data-" + std::to_string(plan.files[f].rank) + ".safetensors",
                           plan.files[f].payload_bytes + 4096, plan.files[f].rank});
  }
  std::vector<uint32_t> file_of(plan.chunks.size());
  std::vector<uint64_t> offset(plan.files.size(), 4096);
  for (size_t f = 0; f < plan.files.size(); ++f) {
    for (uint32_t c : plan.files[f].chunks) file_of[c] = static_cast<uint32_t>(f);
  }
  for (const PlannedTensor& t : plan.tensors) {
    IndexTensor& it = index.tensors[t.key];
    it.dtype = t.dtype;
    it.shape = t.shape;
    for (uint32_t c : t.chunks) {
      const PlannedChunk& chunk = plan.chunks[c];
      it.chunks.push_back({chunk.slice, file_of[c], offset[file_of[c]], chunk.bytes,
                           static_cast<uint32_t>(c * 2654435761u)});
      offset[file_of[c]] += chunk.bytes;
    }
  }
  return index;
}

// A size in bytes from /proc/self/status ("VmRSS:", "VmHWM:"); 0 where unreadable.
uint64_t ProcStatusBytes(const std::string& field) {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind(field, 0) == 0) {
      return std::strtoull(line.c_str() + field.size(), nullptr, 10) << 10;
    }
  }
  return 0;
}

// Returns freed heap to the system and resets the peak resident size
// (VmHWM) to the current one, so that the peak read afterwards is that of
// what runs in between. False where the kernel refuses (clear_refs).
bool ResetPeakRss() {
  malloc_trim(0);
  std::ofstream clear("/proc/self/clear_refs");
  clear << "5";
  clear.flush();
  return clear.good() && ProcStatusBytes("VmHWM:") > 0;
}

void PrintIndex(const SavePlan& plan) {
  const CheckpointIndex index = IndexOf(plan);
  auto start = Clock::now();
  const std::string text = SerializeIndex(index);
  const double write_s = Seconds(start);
  const bool peak_known = ResetPeakRss();
  const uint64_t rss_before = ProcStatusBytes("VmRSS:");
  start = Clock::now();
  auto parsed = ParseIndex(text, "simulated");
  const double read_s = Seconds(start);
  const uint64_t peak = ProcStatusBytes("VmHWM:");
  std::printf("  index               %.1f MB (%.0f bytes per chunk), write %.3f s, parse %.3f s%s\n",
              text.size() / 1e6, static_cast<double>(text.size()) / plan.chunks.size(), write_s,
              read_s, parsed.ok() ? "" : " FAILED");
  // The text is the caller's; the growth is what parsing adds to it.
  if (peak_known && peak >= rss_before) {
    std::printf("  index parse memory  peak +%.1f MB = %.2f x the text (%.2f x with the text)\n",
                (peak - rss_before) / 1e6, static_cast<double>(peak - rss_before) / text.size(),
                static_cast<double>(peak - rss_before + text.size()) / text.size());
  } else {
    std::printf("  index parse memory  peak unknown (/proc/self/clear_refs refused)\n");
  }
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

// 20,000 tensors of [416, 64] f32 saved in row halves by 2 ranks (a file
// each), planned for the rank that loads the left half of the columns:
// 8.3 million rows of 128 bytes.
bool PlanColumnSplit(int iters) {
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

int Run(int argc, char** argv) {
  simulated::TransformerLayout save_layout;  // tp 8, pp 4, dp 32, ZeRO-1
  simulated::TransformerLayout load_layout = save_layout;
  load_layout.tp = 4;
  load_layout.dp = 64;
  int iters = 3;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--dp")) save_layout.dp = std::atoi(argv[i + 1]);
    if (!std::strcmp(argv[i], "--tp-load")) load_layout.tp = std::atoi(argv[i + 1]);
    if (!std::strcmp(argv[i], "--dp-load")) load_layout.dp = std::atoi(argv[i + 1]);
    if (!std::strcmp(argv[i], "--iters")) iters = std::max(1, std::atoi(argv[i + 1]));
    if (!std::strcmp(argv[i], "--zero")) save_layout.zero = load_layout.zero = std::atoi(argv[i + 1]);
  }
  const std::vector<RankHoldings> holdings = simulated::MakeHoldings(save_layout);
  size_t shards = 0;
  for (const RankHoldings& h : holdings) shards += h.shards.size();

  double best = 1e9;
  Result<SavePlan> plan = InvalidArgumentError("not run");
  for (int i = 0; i < iters; ++i) {
    const auto start = Clock::now();
    plan = PlanSave(holdings, SavePlanOptions{});
    best = std::min(best, Seconds(start));
    if (!plan.ok()) {
      std::fprintf(stderr, "PlanSave: %s\n", plan.status().ToString().c_str());
      return 1;
    }
  }
  PrintSave(save_layout, shards, *plan, best);
  PrintIndex(*plan);

  const std::vector<SavedTensor> saved = SavedFromPlan(*plan);
  std::printf("load: into tp %d, pp %d, dp %d\n", load_layout.tp, load_layout.pp, load_layout.dp);
  const int samples[][3] = {{0, 0, 0}, {1, 17, 2}, {3, load_layout.dp - 1, load_layout.tp - 1}};
  for (const auto& s : samples) {
    const std::vector<Want> wants = WantsOf(load_layout, s[0], s[1], s[2], *plan);
    double load_best = 0;
    const Result<LoadPlan> lp = TimedPlanLoad(saved, wants, iters, &load_best);
    if (!lp.ok()) return 1;
    size_t reads = 0;
    for (const ReadGroup& g : lp->groups) reads += g.reads.size();
    std::printf("  rank (pp %d, dp %d, tp %d): %zu wants, PlanLoad %.4f s, %zu groups, %zu reads, "
                "read/needed %.2f/%.2f GiB = %.4f\n",
                s[0], s[1], s[2], wants.size(), load_best, lp->groups.size(), reads,
                lp->bytes_read / 1073741824.0, lp->bytes_needed / 1073741824.0,
                static_cast<double>(lp->bytes_read) / static_cast<double>(lp->bytes_needed));
  }
  return PlanColumnSplit(iters) ? 0 : 1;
}

}  // namespace
}  // namespace shardsafe

int main(int argc, char** argv) { return shardsafe::Run(argc, argv); }
