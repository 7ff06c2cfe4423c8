// Engine-internal loading from an already opened source (used by Load and
// LoadOpenedSource, and by tools that read many slices of one checkpoint).
#pragma once

#include <optional>

#include "engine/load/source.h"
#include "format/index_packed.h"
#include "layout/load_planner.h"
#include "shardsafe/checkpoint.h"

namespace shardsafe {

// Appends tensor t of `tensors` to `saved` as the planner takes it (its
// chunks), and their checksums to `crcs`.
void AddSavedChunks(const PackedTensors& tensors, size_t t, SavedTensor* saved,
                    std::vector<std::optional<uint32_t>>* crcs);

// Loads `request` from `src` on this process alone (no collectives), plus,
// when `blobs_of_rank` is set, the global blobs and that rank's per-rank
// blobs.
Status LoadFromSource(const LoadRequest& request, const CheckpointSource& src,
                      std::optional<int> blobs_of_rank, FileSystem& fs,
                      const LoadOptions& options, LoadResult* result);

}  // namespace shardsafe
