#include "cli/demo_model.h"

#include <functional>

namespace shardsafe::cli {
namespace {

uint64_t Mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// A small finite float from a hash: sign, exponent near 2^-6, random mantissa.
uint32_t F32Bits(uint64_t h) { return (h & 0x807FFFFFu) | 0x3C800000u; }

// Calls fn(i, g) for the i-th selected element with global row-major index g.
template <typename Fn>
void ForEachElement(const Shape& shape, const Slice& slice, Fn fn) {
  const Box& box = slice.box;
  const size_t rank = shape.size();
  uint64_t volume = 1;
  for (uint64_t d : box.size) volume *= d;
  const uint64_t begin = slice.flat ? slice.flat->begin : 0;
  const uint64_t end = slice.flat ? slice.flat->end : volume;
  if (begin >= end) return;
  if (rank == 0) return fn(0, 0);
  std::vector<uint64_t> idx(rank), stride(rank, 1);
  for (size_t d = rank; d-- > 1;) stride[d - 1] = stride[d] * shape[d];
  uint64_t rest = begin;
  for (size_t d = rank; d-- > 0;) {
    idx[d] = rest % box.size[d];
    rest /= box.size[d];
  }
  uint64_t g = 0;
  for (size_t d = 0; d < rank; ++d) g += (idx[d] + box.offset[d]) * stride[d];
  for (uint64_t i = 0; i < end - begin; ++i) {
    fn(i, g);
    // Advance the odometer, last dimension fastest, keeping g in step.
    size_t d = rank - 1;
    ++idx[d];
    g += stride[d];
    while (idx[d] == box.size[d] && d > 0) {
      g -= stride[d] * box.size[d];
      idx[d] = 0;
      --d;
      ++idx[d];
      g += stride[d];
    }
  }
}

uint64_t KeySeed(const std::string& key) { return std::hash<std::string>{}(key); }

}  // namespace

std::vector<DemoTensor> DemoTensors(const DemoModel& m) {
  std::vector<DemoTensor> weights;
  const uint64_t h = m.hidden, f = m.ffn;
  weights.push_back({"model.embed_tokens.weight", DType::kBF16, {m.vocab, h}, 0, false});
  for (int l = 0; l < m.layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    weights.push_back({p + "input_layernorm.weight", DType::kBF16, {h}, -1, false});
    for (const char* name : {"q_proj", "k_proj", "v_proj"}) {
      weights.push_back({p + "self_attn." + name + ".weight", DType::kBF16, {h, h}, 0, false});
    }
    weights.push_back({p + "self_attn.o_proj.weight", DType::kBF16, {h, h}, 1, false});
    weights.push_back({p + "post_attention_layernorm.weight", DType::kBF16, {h}, -1, false});
    weights.push_back({p + "mlp.gate_proj.weight", DType::kBF16, {f, h}, 0, false});
    weights.push_back({p + "mlp.up_proj.weight", DType::kBF16, {f, h}, 0, false});
    weights.push_back({p + "mlp.down_proj.weight", DType::kBF16, {h, f}, 1, false});
  }
  weights.push_back({"model.norm.weight", DType::kBF16, {h}, -1, false});
  weights.push_back({"lm_head.weight", DType::kBF16, {m.vocab, h}, 0, false});
  std::vector<DemoTensor> all = weights;
  for (const char* moment : {"exp_avg", "exp_avg_sq"}) {
    for (const DemoTensor& w : weights) {
      all.push_back({std::string("optim.") + moment + "." + w.key, DType::kF32, w.shape,
                     w.split_dim, true});
    }
  }
  return all;
}

Slice DemoSlice(const DemoTensor& t, int tp_rank, int tp, int dp_rank, int dp) {
  Slice s{Box::Whole(t.shape), std::nullopt};
  if (t.split_dim >= 0) {
    const uint64_t n = t.shape[t.split_dim];
    const uint64_t lo = n * tp_rank / tp, hi = n * (tp_rank + 1) / tp;
    s.box.offset[t.split_dim] = lo;
    s.box.size[t.split_dim] = hi - lo;
  }
  if (t.zero_sharded) {
    const uint64_t n = s.NumElements();
    s.flat = FlatRange{n * dp_rank / dp, n * (dp_rank + 1) / dp};
  }
  return s;
}

void FillSlice(const DemoTensor& t, const Slice& slice, void* dst) {
  const uint64_t seed = KeySeed(t.key);
  if (t.dtype == DType::kBF16) {
    auto* out = static_cast<uint16_t*>(dst);
    ForEachElement(t.shape, slice, [&](uint64_t i, uint64_t g) { out[i] = F32Bits(Mix(seed + g)) >> 16; });
  } else {
    auto* out = static_cast<uint32_t*>(dst);
    ForEachElement(t.shape, slice, [&](uint64_t i, uint64_t g) { out[i] = F32Bits(Mix(seed + g)); });
  }
}

uint64_t CheckSlice(const DemoTensor& t, const Slice& slice, const void* src) {
  const uint64_t seed = KeySeed(t.key);
  uint64_t bad = 0;
  if (t.dtype == DType::kBF16) {
    auto* in = static_cast<const uint16_t*>(src);
    ForEachElement(t.shape, slice, [&](uint64_t i, uint64_t g) {
      bad += in[i] != static_cast<uint16_t>(F32Bits(Mix(seed + g)) >> 16);
    });
  } else {
    auto* in = static_cast<const uint32_t*>(src);
    ForEachElement(t.shape, slice, [&](uint64_t i, uint64_t g) { bad += in[i] != F32Bits(Mix(seed + g)); });
  }
  return bad;
}

std::string DemoRngState(int rank) {
  std::string s(5056, '\0');  // the size of a torch CPU generator state
  for (size_t i = 0; i < s.size(); ++i) s[i] = static_cast<char>(Mix(rank * 100003ull + i));
  return s;
}

}  // namespace shardsafe::cli
