// The state of a simulated training job for `shardsafe demo`: a transformer
// (embeddings, attention and SwiGLU MLP weights, norms, LM head) with AdamW
// moments, laid out tensor-parallel x data-parallel with ZeRO-1 sharded
// optimizer state. Tensor contents are a pure function of (key, global
// element index), so any rank in any layout can check what it loaded.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "shardsafe/types.h"

namespace shardsafe::cli {

struct DemoModel {
  int layers = 12;
  uint64_t hidden = 1024;
  uint64_t ffn = 2816;
  uint64_t vocab = 8192;
};

// One saved tensor: weights are BF16 (replicated over DP), optimizer
// moments F32 (ZeRO-sharded over DP). split_dim is the TP split dimension,
// or -1 for tensors replicated over TP.
struct DemoTensor {
  std::string key;
  DType dtype;
  Shape shape;
  int split_dim;
  bool zero_sharded;  // optimizer state: flat-sharded over DP
};

std::vector<DemoTensor> DemoTensors(const DemoModel& model);

// The slice rank (tp, dp) of a TP x DP layout holds. TP splits are as even
// as possible (uneven when the dimension does not divide).
Slice DemoSlice(const DemoTensor& t, int tp_rank, int tp, int dp_rank, int dp);

// Fills `dst` with the contents of `slice` / checks them; returns the number
// of mismatching elements.
void FillSlice(const DemoTensor& t, const Slice& slice, void* dst);
uint64_t CheckSlice(const DemoTensor& t, const Slice& slice, const void* src);

// Per-rank RNG state bytes.
std::string DemoRngState(int rank);

}  // namespace shardsafe::cli
