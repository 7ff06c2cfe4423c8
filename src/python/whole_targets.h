// The common case of a load, planned in C++: a plain tensor loaded whole, in
// place, from the checkpoint tensor of its own key, dtype and shape.
//
// python/shardsafe/_api.py plans every other tensor (DTensor shards, renamed
// or grouped keys, dtype conversion, FP8 dequantisation, device or strided
// targets). For the common case it spent ~2 us a tensor in the interpreter
// and the target tuples it built cost ~0.4 us more to convert here; this
// asks each tensor the same questions through the C API and keeps the
// engine targets on this side (20,000 tensors: planning and conversion
// ~50 -> ~25 ms).
#ifndef SHARDSAFE_PYTHON_WHOLE_TARGETS_H_
#define SHARDSAFE_PYTHON_WHOLE_TARGETS_H_

#include <nanobind/nanobind.h>

#include <vector>

#include "engine/source.h"
#include "shardsafe/checkpoint.h"

namespace shardsafe::python {

// Engine targets planned by PlanWhole, handed to one load (which moves them
// out: the object is empty afterwards).
struct WholeTargets {
  std::vector<TensorTarget> targets;
};

// For each (keys[i], tensors[i]): when the tensor's type is one of
// `plain_types` (torch.Tensor, torch.nn.Parameter), its layout is
// `strided`, it lies contiguous in CPU memory with neither the negative nor
// (for complex dtypes) the conjugate bit, and `src` holds a tensor under
// the same key with the dtype `dtype_names[tensor.dtype]` and the same
// shape, the tensor becomes a whole-tensor target reading into its own
// memory. Returns (WholeTargets, the keys it took, the indexes of the
// tensors it left to the caller's general planner, in order). Raises what
// a tensor attribute raises. The tensors must stay alive until the load.
nanobind::tuple PlanWhole(nanobind::list keys, nanobind::list tensors, const CheckpointSource& src,
                          nanobind::tuple plain_types, nanobind::handle strided,
                          nanobind::dict dtype_names);

// `shape` as a tuple of ints.
nanobind::tuple ShapeTuple(const Shape& shape);

// (key, dtype name, shape, offset, size, data address) of each target, as
// the Python planner writes them (tests compare the two).
nanobind::list WholeTargetSpecs(const WholeTargets& whole);

}  // namespace shardsafe::python

#endif  // SHARDSAFE_PYTHON_WHOLE_TARGETS_H_
