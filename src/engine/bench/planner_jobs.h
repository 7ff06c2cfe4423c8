// The simulated jobs the planner benchmark measures: three layouts of a
// large model at any world size they divide, each rank's holdings computed
// on demand (testing/layout/simulated_layouts.h), so that no more than one rank's
// exist at a time.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

#include "layout/save_planner.h"
#include "shardsafe/status.h"

namespace shardsafe::bench {

inline constexpr std::string_view kLayouts[] = {"tp-pp-dp", "fsdp", "moe"};

struct SimulatedJob {
  std::string layout;  // one of kLayouts
  int world = 0;
  std::string model;   // e.g. "80-layer dense transformer (hidden 8192, ...)"
  std::string mesh;    // e.g. "TP 8 x PP 4 x DP 32, ZeRO-1"
  std::function<RankHoldings(int rank)> rank_shards;
  uint64_t params = 0;            // parameters of the model
  uint64_t checkpoint_bytes = 0;  // BF16 weights and F32 master, exp_avg, exp_avg_sq
};

// `layout` at `world` ranks:
//   tp-pp-dp  TP 8 x PP 4 x DP world/32, ZeRO-1; an 80-layer dense transformer
//   fsdp      TP 8 x DP world/8, weights and optimizer state flat-sharded over DP
//   moe       TP 8 x PP 4 x EP x DP: EP = min(64, world/32), DP = world/(32 EP);
//             80 layers of 256 experts
// InvalidArgument naming the layout for an unknown one or a world size
// the mesh does not divide.
Result<SimulatedJob> MakeJob(std::string_view layout, int world);

}  // namespace shardsafe::bench
