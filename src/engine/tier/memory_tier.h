// The memory tier of a CheckpointManager (docs/design.md, "Memory tier"):
// where its folder is, that every rank shares it, and in which order a
// load tries the tiers' copies of a step.
//
// A tier is a root like any other (docs/format.md §1): the memory tier's
// checkpoints are committed there with the commit protocol of every save,
// and a copy persisted to the manager's root is an ordinary checkpoint of
// that root. A step is the same checkpoint in every tier that holds it
// (the root's copy is the memory copy's bytes), so the order of copies is
// by step, then by tier.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "shardsafe/checkpoint.h"
#include "shardsafe/comm.h"
#include "shardsafe/status.h"

namespace shardsafe {

inline constexpr char kMemoryTier[] = "memory";
inline constexpr char kRootTier[] = "root";

// /dev/shm/shardsafe-<16 hex digits of the FNV-1a hash of `root`>: the
// same folder for the same root after a restart.
std::string DefaultMemoryDir(const std::string& root);

// Collective: OK when every rank names the same folder on the same host;
// else FailedPrecondition naming two ranks that differ (the memory tier
// spans one node until peer replicas exist). One AllGather.
Status CheckSharedFolder(Comm& comm, const std::string& dir);

// The step of the latest checkpoint of `root` (CheckpointInfo::is_latest
// of ListCheckpoints), nullopt for an empty or missing root or a latest
// without a step; DataLoss when which is the latest cannot be told.
Result<std::optional<int64_t>> LatestStepOf(FileSystem* fs, const std::string& root);

// A tier's committed checkpoints, and its latest step, as LoadOrder needs.
struct TierListing {
  std::string tier;
  std::vector<CheckpointInfo> checkpoints;  // ListCheckpoints
  std::optional<int64_t> latest;            // LatestStepOf
};

// The memory tier (at `memory_dir`) and the root, fastest first, as
// listed now (a tier not created yet is empty).
Result<std::vector<TierListing>> ListTiers(FileSystem* fs, const std::string& memory_dir,
                                           const std::string& root);

// Whether a load's failure says the copy it read is broken (a chunk
// corrupt, a file truncated or missing: DataLoss), so that another tier's
// copy of the step, or an older step, is worth trying; not for errors of
// the request (missing keys, shapes) or of the job.
bool CopyIsBroken(const Status& load_failure);

// The copies a load tries (CheckpointManager::LoadOrder), from the tiers'
// listings, fastest tier first: of `step` when set (NotFound naming the
// tiers when none holds it), else of the newest latest step and every
// older step, newest first (NotFound when no tier has a latest step).
Result<std::vector<TierCopy>> OrderCopies(const std::vector<TierListing>& tiers,
                                          std::optional<int64_t> step);

// The tiers' listings merged by tag, oldest step first (checkpoints
// without a step after, by tag), each with the tiers that hold it, the
// first tier's CheckpointInfo kept.
std::vector<CheckpointInfo> MergeListings(const std::vector<TierListing>& tiers);

// Copies as one message, and back (LoadOrder's broadcast).
std::string EncodeCopies(const std::vector<TierCopy>& copies);
Result<std::vector<TierCopy>> DecodeCopies(std::string_view message);

}  // namespace shardsafe
