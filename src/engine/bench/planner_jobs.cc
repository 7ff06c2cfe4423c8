#include "engine/bench/planner_jobs.h"

#include <algorithm>

#include "testing/layout/simulated_layouts.h"

namespace shardsafe::bench {
namespace {

// Parameters of a model whose stage s holds StageParams(m, s).
template <typename Layout>
uint64_t ParamsOf(const Layout& m) {
  uint64_t n = 0;
  for (int stage = 0; stage < m.pp; ++stage) {
    for (const simulated::Param& p : simulated::StageParams(m, stage)) {
      n += Slice{Box::Whole(p.shape), {}}.NumElements();
    }
  }
  return n;
}

std::string ModelOf(const simulated::TransformerLayout& m) {
  return std::to_string(m.layers) + "-layer dense transformer (hidden " +
         std::to_string(m.hidden) + ", ffn " + std::to_string(m.ffn) + ", vocab " +
         std::to_string(m.vocab) + ")";
}

std::string ModelOf(const simulated::MoeLayout& m) {
  return std::to_string(m.layers) + "-layer MoE transformer (hidden " + std::to_string(m.hidden) +
         ", " + std::to_string(m.experts) + " experts of ffn " + std::to_string(m.expert_ffn) +
         ", vocab " + std::to_string(m.vocab) + ")";
}

template <typename Layout>
SimulatedJob JobOf(std::string_view layout, const Layout& m, std::string mesh) {
  const uint64_t params = ParamsOf(m);
  return SimulatedJob{std::string(layout), m.world(), ModelOf(m), std::move(mesh),
                      [m](int rank) { return simulated::RankShards(m, rank); }, params,
                      params * (m.zero ? 2 + 3 * 4 : 2)};
}

Status Indivisible(std::string_view layout, int world, std::string_view by) {
  return InvalidArgumentError("layout " + std::string(layout) + ": " + std::to_string(world) +
                              " ranks is not " + std::string(by));
}

}  // namespace

Result<SimulatedJob> MakeJob(std::string_view layout, int world) {
  if (layout == "tp-pp-dp") {
    if (world <= 0 || world % 32) return Indivisible(layout, world, "a multiple of TP 8 x PP 4");
    const simulated::TransformerLayout m{8, 4, world / 32};
    return JobOf(layout, m, "TP 8 x PP 4 x DP " + std::to_string(m.dp) + ", ZeRO-1");
  }
  if (layout == "fsdp") {
    if (world <= 0 || world % 8) return Indivisible(layout, world, "a multiple of TP 8");
    simulated::TransformerLayout m{8, 1, world / 8};
    m.fsdp = true;
    return JobOf(layout, m, "TP 8 x DP " + std::to_string(m.dp) + ", FSDP (flat)");
  }
  if (layout == "moe") {
    const int ep = std::min(64, world / 32);
    if (world <= 0 || world % 32 || (world / 32) % ep) {
      return Indivisible(layout, world, "TP 8 x PP 4 x EP (up to 64) x DP");
    }
    simulated::MoeLayout m;
    m.ep = ep;
    m.dp = world / 32 / ep;
    return JobOf(layout, m,
                 "TP 8 x PP 4 x EP " + std::to_string(ep) + " x DP " + std::to_string(m.dp) +
                     " (" + std::to_string(m.experts / ep) + " experts per EP rank), ZeRO-1");
  }
  return InvalidArgumentError("unknown layout \"" + std::string(layout) +
                              "\" (tp-pp-dp, fsdp or moe)");
}

}  // namespace shardsafe::bench
