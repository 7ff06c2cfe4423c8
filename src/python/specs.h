// The Python package's tensor specs turned into the engine's tensors: what
// a save's state and a load's request are built from.
//
// A spec is (key, dtype, global shape, box offset, box size, data address),
// or the same with a flat range (begin, end) of the box last
// (shardsafe.Sharded's flat parts). Data is passed by pointer: nothing is
// copied.
#ifndef SHARDSAFE_PYTHON_SPECS_H_
#define SHARDSAFE_PYTHON_SPECS_H_

#include <nanobind/nanobind.h>

#include <cstdint>
#include <string>
#include <tuple>
#include <utility>
#include <variant>
#include <vector>

#include "python/status_error.h"
#include "python/whole_targets.h"
#include "shardsafe/checkpoint.h"
#include "shardsafe/source.h"

namespace shardsafe::python {

using BoxSpec = std::tuple<std::string, std::string, Shape, Shape, Shape, uintptr_t>;
using FlatSpec = std::tuple<std::string, std::string, Shape, Shape, Shape, uintptr_t,
                            std::pair<uint64_t, uint64_t>>;
using Spec = std::variant<BoxSpec, FlatSpec>;

// The engine's tensor (TensorShard for a save, TensorTarget for a load) of
// one spec (moved out of).
template <typename Item>
Item ItemOf(Spec& spec) {
  if (auto* box = std::get_if<BoxSpec>(&spec)) {
    auto& [key, dtype, shape, offset, size, ptr] = *box;
    return {std::move(key), Unwrap(ParseDType(dtype)), std::move(shape),
            Slice{Box{std::move(offset), std::move(size)}, {}}, reinterpret_cast<void*>(ptr)};
  }
  auto& [key, dtype, shape, offset, size, ptr, flat] = std::get<FlatSpec>(spec);
  Slice slice{Box{std::move(offset), std::move(size)}, FlatRange{flat.first, flat.second}};
  return {std::move(key), Unwrap(ParseDType(dtype)), std::move(shape), std::move(slice),
          reinterpret_cast<void*>(ptr)};
}

// The state of one save: the items a fast path planned (`whole`, moved out
// once; may be null), then `tensors`. `blobs` holds (name, bytes, per_rank)
// tuples; the caller keeps that list alive for the call, so the bytes stay
// valid. The JSON texts are checked by the save.
SaveState MakeState(std::vector<Spec>&& tensors, WholeShards* whole, nanobind::list blobs,
                    const std::string& values_json, const std::string& metadata_json);

// A load's request of `targets` (moved out of).
LoadRequest MakeRequest(std::vector<Spec>&& targets);

// The targets a load's fast path planned against `source` (or another open
// of its checkpoint; moved out, once); none for a null `whole`.
std::vector<WholeTensorTarget> TakeWhole(WholeTargets* whole, const CheckpointSource& source);

}  // namespace shardsafe::python

#endif  // SHARDSAFE_PYTHON_SPECS_H_
