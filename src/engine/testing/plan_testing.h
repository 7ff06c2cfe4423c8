// Random save layouts for the tests of the distributed plan and index.
#pragma once

#include <algorithm>
#include <numeric>
#include <string>
#include <vector>

#include "layout/save_planner.h"
#include "testing/layout/layout_testing.h"

namespace shardsafe::testing {

inline ShardInfo Shard(std::string key, const Shape& shape, Slice slice, DType dtype = DType::kF32) {
  return ShardInfo{std::move(key), dtype, shape, std::move(slice)};
}

// Random tensors tiled at random, each slice held by a random set of ranks;
// random per-rank and global blobs.
inline std::vector<RankHoldings> RandomHoldings(Rng& rng) {
  const int world = static_cast<int>(Uniform(rng, 1, 9));
  std::vector<RankHoldings> h(world);
  const int tensors = static_cast<int>(Uniform(rng, 1, 12));
  for (int t = 0; t < tensors; ++t) {
    const DType dtype = RandomDType(rng);
    const Shape shape = RandomShape(rng, dtype);
    for (const Slice& s : RandomTiling(rng, shape, dtype)) {
      std::vector<int> ranks(world);
      std::iota(ranks.begin(), ranks.end(), 0);
      std::shuffle(ranks.begin(), ranks.end(), rng);
      ranks.resize(Uniform(rng, 1, world));
      for (int r : ranks) h[r].shards.push_back(Shard("t" + std::to_string(t), shape, s, dtype));
    }
  }
  for (RankHoldings& rank : h) {
    std::shuffle(rank.shards.begin(), rank.shards.end(), rng);
    if (Chance(rng, 0.5)) rank.blobs.push_back({"rng", Uniform(rng, 0, 50), true});
    if (Chance(rng, 0.5)) rank.blobs.push_back({"config", 17, false});
  }
  return h;
}

}  // namespace shardsafe::testing
