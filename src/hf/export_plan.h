// The plan of a Hugging Face export (docs/format.md §7): which output
// tensors come from which box of which source tensor, in which file, under
// which name; and the index file's text. Pure: no I/O.
//
// Order. Output tensors are sorted in natural key order (NaturalLess) and
// packed into shards by the greedy rule of huggingface_hub's
// split_torch_state_dict_into_shards: a tensor larger than the cap gets a
// shard of its own, appended at once; otherwise, if it would take the
// current shard over the cap, the current shard is closed first. Within a
// file, bytes follow the canonical safetensors order (BuildSafetensorsHeader).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "format/index_packed.h"
#include "shardsafe/index.h"
#include "shardsafe/hf.h"

namespace shardsafe {

// One output tensor: the whole of a source tensor, or a part of one (a
// grouped expert tensor split). 24 bytes, and its name where it is not its
// source's key: what a plan of many tensors holds of each.
struct ExportEntry {
  static constexpr uint32_t kWhole = UINT32_MAX;
  static constexpr uint32_t kKey = UINT32_MAX;
  uint32_t tensor = 0;      // the source tensor, in the source's PackedTensors
  uint32_t part = kWhole;   // into ExportPlan::parts, or the whole tensor
  uint32_t name = kKey;     // its output name: into ExportPlan::names, or the source's key
  DType src_dtype = DType::kF32;
  DType dtype = DType::kF32;  // output dtype
  uint64_t bytes = 0;         // output bytes
};

// A part of a source tensor that is an output tensor of its own.
struct ExportPart {
  Box box;      // of the source tensor (its row-major bytes are the output's)
  Shape shape;  // output shape (same element count as box)
};

struct ExportShard {
  std::string file;               // "model-00001-of-00002.safetensors"
  std::vector<uint32_t> entries;  // into ExportPlan::entries
  uint64_t bytes = 0;             // tensor bytes
};

struct ExportPlan {
  std::vector<ExportEntry> entries;  // natural order of names
  std::vector<ExportPart> parts;
  std::vector<std::string> names;    // output names other than their sources' keys
  std::vector<ExportShard> shards;
  uint64_t total_bytes = 0;
  uint64_t total_parameters = 0;
  std::string index_file;  // "" for a single shard, else NAME.safetensors.index.json

  // Of entry `e`, whose source tensors are `tensors`: its output name, its
  // source tensor's key, the box of it that it is, its output shape.
  std::string_view Name(const ExportEntry& e, const PackedTensors& tensors) const;
  std::string_view Key(const ExportEntry& e, const PackedTensors& tensors) const;
  Box BoxOf(const ExportEntry& e, const PackedTensors& tensors) const;
  Shape ShapeOf(const ExportEntry& e, const PackedTensors& tensors) const;
  std::span<const uint64_t> Dims(const ExportEntry& e, const PackedTensors& tensors) const;
};

// True if `a` sorts before `b` comparing dot-separated parts, parts made of
// digits as numbers ("layers.2" < "layers.10"), others byte-wise.
bool NaturalLess(std::string_view a, std::string_view b);

// Shard membership (indices into `sizes`, in order) under the greedy rule.
std::vector<std::vector<uint32_t>> AssignShards(const std::vector<uint64_t>& sizes,
                                                uint64_t max_shard_bytes);

// The export of `tensors` (a source's) under `options`. InvalidArgument
// for bad patterns or rules, a rule that does not fit a tensor, two
// outputs under one name (naming both sources), an empty name, or nothing
// selected.
Result<ExportPlan> PlanExport(const PackedTensors& tensors, const ExportHfOptions& options);

// The text of the plan's index file (a sharded export): as
// huggingface_hub writes it, json.dumps(indent=2, sort_keys=True) + "\n".
std::string IndexJson(const ExportPlan& plan, const PackedTensors& tensors);

}  // namespace shardsafe
