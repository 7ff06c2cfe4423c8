// The planner benchmark's --details: load planning on the 1,024-rank
// tp-pp-dp job (TP 8 x PP 4 x DP 32, ZeRO-1), its save plan made by
// PlanSave directly; PlanLoad for three sample ranks of another layout
// (TP 4 x PP 4 x DP 64), with bytes read against bytes needed; and the load
// plan of a column split of many small tensors (saved Shard(0), loaded
// Shard(1): a run per row). No I/O.
#pragma once

namespace shardsafe::bench {

// Prints the details, timings the best of `iters`. False (printed) where
// planning fails.
bool PrintPlannerDetails(int iters);

}  // namespace shardsafe::bench
