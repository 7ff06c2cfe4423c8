// Simulated training layouts for planner tests and benchmarks (header-only).
//
// TransformerLayout: a decoder-only transformer under tensor (TP), pipeline
// (PP) and data (DP) parallelism, optionally with ZeRO-1 optimizer state
// (fp32 master weights, exp_avg and exp_avg_sq, each rank holding a flat
// 1/DP slice of its TP shard, uneven when the shard does not divide), and
// optionally FSDP (ZeRO-3): the weights flat-sharded over DP like the
// optimizer state, so that nothing is replicated over DP.
//
// MoeLayout: the same attention under TP x EP x DP x PP, with every MLP a
// mixture of experts split over expert parallelism (EP).
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
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
  bool fsdp = false;  // weights flat-sharded over DP too (no DP replicas)
  int world() const { return tp * pp * dp; }
  // TP is innermost, then DP, then PP.
  int Rank(int pp_i, int dp_i, int tp_i) const { return (pp_i * dp + dp_i) * tp + tp_i; }
};

// A mixture-of-experts transformer: attention, norms, embedding and head as
// in TransformerLayout (TP-split, replicated over DP x EP, as Megatron-LM
// holds them); each layer's MLP is a router [experts, h] (replicated over
// TP) and `experts` SwiGLU experts stored grouped, expert dimension first,
// as grouped-GEMM layers hold them: experts.fc1 [experts, 2 ffn, h] and
// experts.fc2 [experts, h, ffn], split over EP on that dimension (experts /
// EP per rank) and over TP inside each expert. With ZeRO-1, the optimizer
// state of a dense parameter is a flat 1/(DP x EP) of the rank's TP shard
// (its replicas), that of an expert parameter a flat 1/DP of the rank's
// (EP, TP) shard.
struct MoeLayout {
  int tp = 8;
  int pp = 4;
  int ep = 64;
  int dp = 8;
  int layers = 80;
  int experts = 256;
  uint64_t hidden = 8192;
  uint64_t expert_ffn = 512;
  uint64_t vocab = 32000;
  bool zero = true;
  int world() const { return tp * ep * dp * pp; }
  // TP is innermost, then EP, then DP, then PP.
  int Rank(int pp_i, int dp_i, int ep_i, int tp_i) const {
    return ((pp_i * dp + dp_i) * ep + ep_i) * tp + tp_i;
  }
};

// One parameter: its name, global shape, the dimension TP splits (-1:
// replicated over TP), and whether dimension 0 is the expert dimension
// (split over EP).
struct Param {
  std::string name;
  Shape shape;
  int split = -1;
  bool expert = false;
};

// The parameters of pipeline stage `stage` of `pp`: the embedding on the
// first, layer(prefix) for each of its layers ("layers.L."), the final norm
// and the head on the last.
template <typename Layer>
std::vector<Param> StageParamsOf(int layers, int pp, int stage, uint64_t vocab, uint64_t h,
                                 const Layer& layer) {
  std::vector<Param> out;
  if (stage == 0) out.push_back({"embed.weight", {vocab, h}, 0});
  const int per_stage = (layers + pp - 1) / pp;
  for (int l = stage * per_stage; l < std::min(layers, (stage + 1) * per_stage); ++l) {
    for (Param& p : layer("layers." + std::to_string(l) + ".")) out.push_back(std::move(p));
  }
  if (stage == pp - 1) {
    out.push_back({"final_norm.weight", {h}, -1});
    out.push_back({"lm_head.weight", {vocab, h}, 0});
  }
  return out;
}

// A layer's attention and norms, then `mlp`, its names prefixed by `p`.
inline std::vector<Param> LayerParams(const std::string& p, uint64_t h, std::vector<Param> mlp) {
  std::vector<Param> out{{p + "input_norm.weight", {h}, -1},
                         {p + "attn.qkv.weight", {3 * h, h}, 0},
                         {p + "attn.out.weight", {h, h}, 1},
                         {p + "post_norm.weight", {h}, -1}};
  for (Param& m : mlp) out.push_back({p + m.name, std::move(m.shape), m.split, m.expert});
  return out;
}

// The parameters of pipeline stage `stage`.
inline std::vector<Param> StageParams(const TransformerLayout& m, int stage) {
  const uint64_t h = m.hidden;
  return StageParamsOf(m.layers, m.pp, stage, m.vocab, h, [&](const std::string& p) {
    return LayerParams(p, h, {{"mlp.fc1.weight", {2 * m.ffn, h}, 0},
                              {"mlp.fc2.weight", {h, m.ffn}, 1}});
  });
}

inline std::vector<Param> StageParams(const MoeLayout& m, int stage) {
  const uint64_t h = m.hidden, e = m.experts, f = m.expert_ffn;
  return StageParamsOf(m.layers, m.pp, stage, m.vocab, h, [&](const std::string& p) {
    return LayerParams(p, h, {{"moe.router.weight", {e, h}, -1},
                              {"moe.experts.fc1.weight", {e, 2 * f, h}, 1, true},
                              {"moe.experts.fc2.weight", {e, h, f}, 2, true}});
  });
}

// Part `part` of `parts` of `box` along dimension `dim` (even split, the
// last part taking the remainder).
inline Box PartBox(Box box, int dim, int parts, int part) {
  const uint64_t n = box.size[dim], each = n / parts;
  box.offset[dim] += each * part;
  box.size[dim] = part == parts - 1 ? n - each * part : each;
  return box;
}

// The TP shard `part` of `tp` of a parameter.
inline Box TpBox(const Param& p, int tp, int part) {
  const Box whole = Box::Whole(p.shape);
  return p.split < 0 ? whole : PartBox(whole, p.split, tp, part);
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

// Adds BF16 weights of `p` covering `weights` and, when `optim` is set, its
// F32 optimizer states covering that slice.
inline void AddParamShards(RankHoldings& h, const Param& p, const Slice& weights,
                           const std::optional<Slice>& optim) {
  h.shards.push_back(ShardInfo{p.name, DType::kBF16, p.shape, weights});
  if (!optim) return;
  for (const char* state : kOptimStates) {
    h.shards.push_back(
        ShardInfo{std::string("optim.") + state + "." + p.name, DType::kF32, p.shape, *optim});
  }
}

// Every rank's blobs: a per-rank RNG state and a global sampler position.
inline void AddBlobs(RankHoldings& h) {
  h.blobs.push_back(BlobInfo{"rng", 5056, true});
  h.blobs.push_back(BlobInfo{"sampler", 40, false});
}

// The shards rank (pp_i, dp_i, tp_i) holds: BF16 weights of its TP shard
// (replicated over DP, or with FSDP a flat 1/DP of it) and, with ZeRO, F32
// optimizer state of a flat 1/DP of that shard. Plus the blobs.
inline RankHoldings RankShards(const TransformerLayout& m, int pp_i, int dp_i, int tp_i) {
  RankHoldings h;
  for (const Param& p : StageParams(m, pp_i)) {
    const Box box = TpBox(p, m.tp, tp_i);
    const Slice flat{box, FlatPart(box, dp_i, m.dp)};
    AddParamShards(h, p, m.fsdp ? flat : Slice{box, {}},
                   m.zero ? std::optional<Slice>(flat) : std::nullopt);
  }
  AddBlobs(h);
  return h;
}

inline RankHoldings RankShards(const TransformerLayout& m, int rank) {
  return RankShards(m, rank / (m.tp * m.dp), rank / m.tp % m.dp, rank % m.tp);
}

// The shards rank `rank` of `m` holds (MoeLayout's comment says which).
inline RankHoldings RankShards(const MoeLayout& m, int rank) {
  const int tp_i = rank % m.tp, ep_i = rank / m.tp % m.ep;
  const int dp_i = rank / (m.tp * m.ep) % m.dp, pp_i = rank / (m.tp * m.ep * m.dp);
  RankHoldings h;
  for (const Param& p : StageParams(m, pp_i)) {
    Box box = TpBox(p, m.tp, tp_i);
    if (p.expert) box = PartBox(box, 0, m.ep, ep_i);
    const FlatRange flat = p.expert ? FlatPart(box, dp_i, m.dp)
                                    : FlatPart(box, dp_i * m.ep + ep_i, m.dp * m.ep);
    AddParamShards(h, p, Slice{box, {}},
                   m.zero ? std::optional<Slice>(Slice{box, flat}) : std::nullopt);
  }
  AddBlobs(h);
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

// A 4-rank job (TP 2 x DP 2, ZeRO-1, two small layers) planned into files
// of 64 KiB with every replica split: small enough for unit tests, with
// every kind of chunk, copy and file a plan has.
inline Result<SavePlan> SmallPlan() {
  const TransformerLayout m{.tp = 2, .pp = 1, .dp = 2, .layers = 2, .hidden = 64, .ffn = 96,
                            .vocab = 100, .zero = true};
  return PlanSave(MakeHoldings(m), SavePlanOptions{.max_file_bytes = 1 << 16, .min_split_bytes = 1});
}

}  // namespace shardsafe::simulated
