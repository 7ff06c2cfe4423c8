// Engine-internal loading from an already opened source (used by Load and
// LoadOpenedSource, and by tools that read many slices of one checkpoint).
#pragma once

#include <optional>

#include "engine/load/source.h"
#include "shardsafe/checkpoint.h"

namespace shardsafe {

// Loads `request` from `src` on this process alone (no collectives), plus,
// when `blobs_of_rank` is set, the global blobs and that rank's per-rank
// blobs.
Status LoadFromSource(const LoadRequest& request, const CheckpointSource& src,
                      std::optional<int> blobs_of_rank, FileSystem& fs,
                      const LoadOptions& options, LoadResult* result);

}  // namespace shardsafe
