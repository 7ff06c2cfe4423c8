// Simulated training layouts for planner tests and benchmarks (header-only):
// a decoder-only transformer under tensor (TP), pipeline (PP) and data (DP)
// parallelism, optionally with ZeRO-1 optimizer state (fp32 master weights,
// exp_avg and exp_avg_sq, each rank holding a flat 1/DP slice of its TP
// shard, uneven when the shard does not divide).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "layout/save_planner.h"

namespace shardsafe::simulated {

struct TransformerLayout {
  int tp = 8;
  int pp = 4;
  int dp = 32;
  int layers = 80;
  uint64_t hidden = 8192;
  uint64_t ffn = 28672;
  uint64_t vocab = 32000;
  bool zero = true;
  int world() const { return tp * pp * dp; }
  // TP is innermost, then DP, then PP.
  int Rank(int pp_i, int dp_i, int tp_i) const { return (pp_i * dp + dp_i) * tp + tp_i; }
};

// One parameter: its name, global shape, and the dimension TP splits (-1:
// replicated over TP).
struct Param {
  std::string name;
  Shape shape;
  int split = -1;
};

// The parameters of pipeline stage `stage`.
inline std::vector<Param> StageParams(const TransformerLayout& m, int stage) {
  const uint64_t h = m.hidden;
  std::vector<Param> out;
  if (stage == 0) out.push_back({"embed.weight", {m.vocab, h}, 0});
  const int per_stage = (m.layers + m.pp - 1) / m.pp;
  for (int l = stage * per_stage; l < std::min(m.layers, (stage + 1) * per_stage); ++l) {
    const std::string p = "layers." + std::to_string(l) + ".";
    out.push_back({p + "input_norm.weight", {h}, -1});
    out.push_back({p + "attn.qkv.weight", {3 * h, h}, 0});
    out.push_back({p + "attn.out.weight", {h, h}, 1});
    out.push_back({p + "post_norm.weight", {h}, -1});
    out.push_back({p + "mlp.fc1.weight", {2 * m.ffn, h}, 0});
    out.push_back({p + "mlp.fc2.weight", {h, m.ffn}, 1});
  }
  if (stage == m.pp - 1) {
    out.push_back({"final_norm.weight", {h}, -1});
    out.push_back({"lm_head.weight", {m.vocab, h}, 0});
  }
  return out;
}

// The TP shard `part` of `tp` of a parameter (even split, the last part
// taking the remainder).
inline Box TpBox(const Param& p, int tp, int part) {
  Box box = Box::Whole(p.shape);
  if (p.split < 0) return box;
  const uint64_t n = p.shape[p.split], each = n / tp;
  box.offset[p.split] = each * part;
  box.size[p.split] = part == tp - 1 ? n - each * part : each;
  return box;
}

// Flat slice `part` of `parts` of a box: [n*part/parts, n*(part+1)/parts).
inline FlatRange FlatPart(const Box& box, int part, int parts) {
  uint64_t n = 1;
  for (uint64_t s : box.size) n *= s;
  const auto cut = [&](int i) {
    return static_cast<uint64_t>(static_cast<unsigned __int128>(n) * i / parts);
  };
  return FlatRange{cut(part), cut(part + 1)};
}

inline const char* const kOptimStates[] = {"master", "exp_avg", "exp_avg_sq"};

// The shards rank (pp_i, dp_i, tp_i) holds: BF16 weights of its TP shard
// (replicated over DP) and, with ZeRO, F32 optimizer state of a flat 1/DP of
// that shard. Plus a per-rank RNG blob and a global sampler blob.
inline RankHoldings RankShards(const TransformerLayout& m, int pp_i, int dp_i, int tp_i) {
  RankHoldings h;
  for (const Param& p : StageParams(m, pp_i)) {
    const Box box = TpBox(p, m.tp, tp_i);
    h.shards.push_back(ShardInfo{p.name, DType::kBF16, p.shape, Slice{box, {}}});
    if (!m.zero) continue;
    const FlatRange flat = FlatPart(box, dp_i, m.dp);
    for (const char* state : kOptimStates) {
      h.shards.push_back(ShardInfo{std::string("optim.") + state + "." + p.name, DType::kF32,
                                   p.shape, Slice{box, flat}});
    }
  }
  h.blobs.push_back(BlobInfo{"rng", 5056, true});
  h.blobs.push_back(BlobInfo{"sampler", 40, false});
  return h;
}

inline std::vector<RankHoldings> MakeHoldings(const TransformerLayout& m) {
  std::vector<RankHoldings> out(m.world());
  for (int pp_i = 0; pp_i < m.pp; ++pp_i) {
    for (int dp_i = 0; dp_i < m.dp; ++dp_i) {
      for (int tp_i = 0; tp_i < m.tp; ++tp_i) {
        out[m.Rank(pp_i, dp_i, tp_i)] = RankShards(m, pp_i, dp_i, tp_i);
      }
    }
  }
  return out;
}

// The per-rank lower bound on the most bytes any rank must write: the
// average, and the bytes of chunks only one rank holds.
inline uint64_t IdealMaxRankBytes(const SavePlan& plan) {
  std::vector<uint64_t> mandatory(plan.bytes_per_rank.size(), 0);
  for (const PlannedChunk& c : plan.chunks) {
    if (c.holders == 1) mandatory[c.writer] += c.bytes;
  }
  for (const PlannedBlob& b : plan.blobs) mandatory[b.rank] += b.bytes;
  uint64_t ideal = (plan.unique_bytes + mandatory.size() - 1) / mandatory.size();
  for (uint64_t m : mandatory) ideal = std::max(ideal, m);
  return ideal;
}

}  // namespace shardsafe::simulated
