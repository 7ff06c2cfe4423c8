// Repeated saves of an unchanged layout skip planning.
//
// Planning a save gathers every rank's layout (keys, dtypes, shapes,
// slices, blob sizes) on rank 0, which runs the planner over all of it (at
// 16,384 ranks seconds of CPU and gigabytes) and sends each rank its part.
// A training job saves the same layout at every step, so each rank keeps
// the plan of its last save (rank 0 the whole plan, another rank its
// part), with its own layout as it announced it and rank 0's digest of all
// ranks' layouts (and of the planner's options), and a save first runs one
// small agreement:
//
//   a max-reduction over all ranks (Comm::AllReduceMax) of (its layout is
//   not byte-for-byte its cached one, or the planner's options changed?;
//   the cached digest; a digest of its destination and values; both
//   digests complemented)                         -- 72 bytes, any world size
//
// The cached plan is reused when every rank's layout is unchanged and every
// rank sends the same digests (the maximum of each digest word equals the
// complement of the maximum of its complement only when all ranks agree).
// That is exact: each rank compares its own layout in full, so no change
// goes unseen, and equal digests on every rank mean their cached plans (or
// parts) came from the same planning of the same layouts (128-bit digests: two CRC-64s with different polynomials; CRCs
// are no defence against crafted input, but ranks of one job are not
// adversaries, and a collision needs two ranks whose caches come from
// // different saves, never a layout change slipping through). Otherwise the
// full exchange and planning run, and every rank caches the new plan. Destinations and values are compared by
// digest in the agreement; a difference falls back to the full exchange,
// which names the ranks and keys that differ.
//
// A cache entry is per (world size, rank), so rank threads in one process
// keep separate entries (groups of one size share them: a stale entry only
// costs a re-plan, the digests make sure of that); a few dozen entries are
// kept, the least recently used dropped. The cached plan (on rank 0 every
// rank's chunks) stays in memory between saves. Thread-safe.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "layout/save_planner.h"
#include "shardsafe/comm.h"

namespace shardsafe {

using Digest = std::array<uint64_t, 2>;

// A 128-bit digest of `parts`, in order (each part's length counts too).
Digest DigestOf(const std::vector<std::string_view>& parts);

class FileLayouts;  // save_messages.h
struct IndexSkeleton;  // distributed_index.h

struct CachedPlan {
  std::string layout;       // this rank's, as EncodeLayout gave it
  SavePlanOptions options;  // the planner's
  // Planned on rank 0: a digest of every rank's layout, the world size and
  // the options. Planned together (distributed_save.h): the planning's id.
  Digest digest{};
  bool together = false;
  std::shared_ptr<const SavePlan> plan;
  // Planned together: rank 0's skeleton of the index, a home's part of the
  // chunk table.
  std::shared_ptr<const IndexSkeleton> skeleton;
  std::shared_ptr<const std::string> table_part;
  // Rank 0: where the plan's files put their entries, once a save of it
  // reported them in full (then later ones report compactly).
  std::shared_ptr<FileLayouts> layouts;
};

// The plan `comm`'s rank cached at its last save, if any.
std::optional<CachedPlan> LookUpPlan(const Comm& comm);

// Caches `entry` for `comm`'s rank, replacing what it had.
void StorePlan(const Comm& comm, CachedPlan entry);

}  // namespace shardsafe
