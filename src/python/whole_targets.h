// The common case of a save or a load, planned in C++: a plain CPU tensor
// saved whole as it lies in memory, or loaded whole, in place, from the
// checkpoint tensor of its own key, dtype and shape.
//
// python/shardsafe/_save.py and _load.py plan every other tensor (DTensor shards, device
// or strided tensors, lazy conj/neg views, renamed or grouped keys, dtype
// conversion, FP8 dequantisation). For the common case it spent ~2 us a
// tensor in the interpreter and the spec tuples it built cost ~0.4 us more
// to convert here; this asks each tensor the same questions through the C
// API and keeps the engine's items on this side (20,000 tensors: a load's
// planning and conversion ~50 -> ~25 ms, a save's ~55 -> ~35 ms; torch's
// getters, ~1.2-1.8 us a tensor, are most of what is left, and a load asks
// them while its checkpoint is opened).
#ifndef SHARDSAFE_PYTHON_WHOLE_TARGETS_H_
#define SHARDSAFE_PYTHON_WHOLE_TARGETS_H_

#include <nanobind/nanobind.h>

#include <memory>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "format/index_packed.h"
#include "shardsafe/checkpoint.h"
#include "shardsafe/source.h"

namespace shardsafe::python {

// Items planned by a fast path, handed to one engine call, which moves them
// out; a second call with the same object is an error (it would silently
// read or write none of those tensors). The tensors they point into must
// stay alive until that call returns.
template <typename Item>
struct Whole {
  std::vector<Item> items;
  bool handed_over = false;
};
using WholeShards = Whole<TensorShard>;  // a save's
// A load's: the engine's whole-tensor targets (16 bytes each, where a
// TensorTarget takes ~270), by their place in the opened source's packed
// tensors, which this keeps alive (for specs()).
struct WholeTargets {
  std::vector<WholeTensorTarget> items;
  std::shared_ptr<const PackedTensors> tensors;
  bool handed_over = false;
};

// What both fast paths need to know of a state's tensors, asked once: the
// load asks while its checkpoint is opened on another thread (the first
// touch of each tensor's objects, scattered among the tensors' data, is most
// of the cost: ~1 us a tensor), then plans once the index is there.
// (32 bytes a tensor, and its dimensions: what a load of many tensors
// holds of each while its checkpoint is opened.)
struct AskedTensor {
  std::string_view key;  // UTF-8 of a str that `AskedTensors::keys` holds
  void* data = nullptr;
  uint32_t dims_at = 0;  // into AskedTensors::dims
  uint8_t ndim = 0;
  DType dtype = DType::kF32;
  bool plain = false;    // asked plain; else the general path's
};
struct AskedTensors {
  nanobind::list keys;              // the state's keys, as given
  std::vector<AskedTensor> asked;   // emptied by a plan
  std::vector<uint64_t> dims;       // the plain ones' shapes
  size_t count = 0;                 // tensors asked
  bool planned = false;

  std::span<const uint64_t> DimsOf(const AskedTensor& t) const {
    return std::span<const uint64_t>(dims).subspan(t.dims_at, t.ndim);
  }
};

// Asks tensors[i] what both fast paths take: a tensor whose type is one of
// `plain_types` (torch.Tensor, torch.nn.Parameter), whose layout is
// `strided`, whose dtype `dtype_names` maps to a safetensors name, and which
// lies contiguous in CPU memory with neither the negative nor (C64) the
// conjugate bit, under a str key. Raises what a tensor attribute raises.
AskedTensors AskTensors(nanobind::list keys, nanobind::list tensors,
                        nanobind::tuple plain_types, nanobind::handle strided,
                        nanobind::dict dtype_names);

// A load's: a tensor asked plain whose key names a tensor of `src` (packed)
// with its dtype and shape becomes a whole-tensor target reading into it.
// Returns (the WholeTargets, the keys taken, the indexes of the tensors
// left to the general planner, in order), and frees what was asked.
// ValueError when `asked` was planned already.
nanobind::tuple PlanWhole(AskedTensors& asked, const CheckpointSource& src);
// A save's: every tensor asked plain becomes the whole-tensor shard of its
// key. Returns (the items, the indexes left, in order): a save has no use
// for the keys taken. ValueError when `asked` was planned already.
nanobind::tuple PlanSaveWhole(AskedTensors& asked);

// (key, dtype name, shape, offset, size, data address) of each item, as the
// Python planners write them (tests compare the two).
nanobind::list WholeSpecs(const WholeTargets& whole);
nanobind::list WholeSpecs(const WholeShards& whole);

// `key`'s UTF-8 (cached in the str object, valid while it lives), or
// nullopt when it is not a str or cannot be encoded.
std::optional<std::string_view> Utf8Of(nanobind::handle key);

// `shape` as a tuple of ints.
nanobind::tuple ShapeTuple(const Shape& shape);

}  // namespace shardsafe::python

#endif  // SHARDSAFE_PYTHON_WHOLE_TARGETS_H_
