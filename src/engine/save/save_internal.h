// Engine-internal entry points shared by Save, the manager and the CLI.
#pragma once

#include <memory>
#include <string>

#include "engine/save/commit.h"
#include "engine/save/distributed_index.h"
#include "engine/save/planned_by.h"
#include "engine/save/save_messages.h"
#include "engine/save/user_json.h"
#include "layout/save_planner.h"
#include "shardsafe/checkpoint.h"

namespace shardsafe {

struct PreparedSave {
  std::shared_ptr<const SavePlan> plan;  // this rank's part, or on rank 0 the whole plan
  bool plan_reused = false;  // the cached plan of an unchanged layout
  // Who planned it (rank 0, or all ranks together) and what the later
  // steps do differently for it.
  std::shared_ptr<PlannedBy> planned;
  bool compact_reports = false;          // step 3 (SaveStart)
  bool chunk_table = false;              // version 3: checksum files (SaveStart)
  UserJson json;  // this rank's values, metadata and layout (rank 0's are saved)
  FileSystem* fs = nullptr;  // where the root lies (FileSystemFor)
  SaveDirs dirs;
  std::shared_ptr<FileLock> lock;  // rank 0: held until committed or abandoned
};

// This rank's checks before the first collective: SaveOptions::local_failure,
// its shards and blobs, and its user JSON (parsed into *json).
Status CheckLocalState(const SaveState& state, const SaveOptions& options, UserJson* json);

struct AgreedPlan {
  std::shared_ptr<const SavePlan> plan;
  bool reused = false;  // the cached plan of an unchanged layout (plan_cache.h)
  std::shared_ptr<FileLayouts> layouts;
  bool together = false;  // as CachedPlan
  std::shared_ptr<const IndexSkeleton> skeleton;
  std::shared_ptr<const std::string> table_part;
};

// Step 1 (collective; save.cc numbers the steps): agree that every rank's layout is
// unchanged and reuse the cached plan (plan_cache.h), or, with `together`,
// plan together (distributed_save.h), else gather every rank's holdings on
// rank 0, which plans and sends each rank its part (layout/plan_part.h;
// rank 0 keeps the whole plan); `local` (this rank's failure so far) fails
// it on every rank, as does a rank whose `together` differs. Every rank
// must save to the same `destination` (the checkpoint's path) and pass
// only global values equal to rank 0's. Touches no file.
Result<AgreedPlan> GatherAndPlan(const SaveState& state, const std::string& destination,
                                 Comm& comm, const SaveOptions& options, const Status& local,
                                 const UserJson& json, bool together = false);

// Steps 1-2, shared by Save and AsyncSave (collective):
// GatherAndPlan (together as PlansTogether says), then rank 0 creates the
// temporary directory.
Result<PreparedSave> PlanAndPrepare(const SaveState& state, const std::string& root,
                                    const std::string& tag, Comm& comm,
                                    const SaveOptions& options);

std::vector<std::string> SplitLines(const std::string& text);
SaveStats StatsOf(const SavePlan& plan, int rank);

// Saves `state` as ROOT/TAG, committed as `commit` says.
Result<SaveStats> SaveToRoot(const SaveState& state, const std::string& root,
                             const std::string& tag, Comm& comm, const SaveOptions& options,
                             CommitOptions commit);

}  // namespace shardsafe
