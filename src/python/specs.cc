#include "python/specs.h"

#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>

#include <algorithm>

namespace nb = nanobind;

namespace shardsafe::python {
namespace {

// A fast path's items (moved out, once), then `specs` (moved out of).
template <typename Item>
std::vector<Item> Items(std::vector<Spec>&& specs, Whole<Item>* whole) {
  std::vector<Item> items;
  if (whole != nullptr) {
    if (whole->handed_over) {
      throw nb::value_error("a fast path's plan goes to one engine call; plan again");
    }
    whole->handed_over = true;
    items = std::exchange(whole->items, {});
  }
  items.reserve(items.size() + specs.size());
  for (Spec& spec : specs) items.push_back(ItemOf<Item>(spec));
  return items;
}

// Whether the tensors `whole` names are the same (key, dtype, shape, by
// number) in `tensors`: planned against another open of the checkpoint.
bool SameTensors(const WholeTargets& whole, const PackedTensors& tensors) {
  const PackedTensors& planned = *whole.tensors;
  for (const WholeTensorTarget& t : whole.items) {
    const size_t n = t.tensor;
    if (n >= tensors.size() || planned.key(n) != tensors.key(n) ||
        planned.dtype(n) != tensors.dtype(n) ||
        !std::ranges::equal(planned.dims(n), tensors.dims(n))) {
      return false;
    }
  }
  return true;
}

}  // namespace

SaveState MakeState(std::vector<Spec>&& tensors, WholeShards* whole, nb::list blobs,
                    const std::string& values_json, const std::string& metadata_json) {
  SaveState state;
  state.tensors = Items(std::move(tensors), whole);
  for (nb::handle item : blobs) {
    auto [name, data, per_rank] = nb::cast<std::tuple<std::string, nb::bytes, bool>>(item);
    state.blobs.push_back({name, data.c_str(), data.size(), per_rank});
  }
  state.values = values_json;
  state.metadata = metadata_json;
  return state;
}

LoadRequest MakeRequest(std::vector<Spec>&& targets) {
  return LoadRequest{Items<TensorTarget>(std::move(targets), nullptr)};
}

std::vector<WholeTensorTarget> TakeWhole(WholeTargets* whole, const CheckpointSource& source) {
  if (whole == nullptr) return {};
  if (whole->handed_over) {
    throw nb::value_error("a fast path's plan goes to one engine call; plan again");
  }
  if (whole->tensors != source.packed && !SameTensors(*whole, *source.packed)) {
    throw nb::value_error("a fast path's plan goes to a load of the checkpoint it was planned "
                          "for");
  }
  whole->handed_over = true;
  return std::exchange(whole->items, {});
}

}  // namespace shardsafe::python
