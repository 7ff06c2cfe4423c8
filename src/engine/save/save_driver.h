// The save driver: the collective protocol of commit.h, from the caller's
// state to a committed checkpoint, written once for every save — Save and
// CheckpointManager (SaveToRoot, save.cc) and AsyncSaver (async_save.cc),
// planned on rank 0 or by all ranks together, onto POSIX or an object store
// (commit.h, object_store_commit.h). Every rank runs the same steps whatever
// happens locally, so a failure anywhere reaches every rank. Two interfaces,
// chosen at the start, hold what differs:
//  - who planned (PlannedBy, planned_by.h; chosen in step 1 from the agreed
//    plan): the reports' form, the extras a rank writes, how rank 0 makes
//    the index;
//  - how reports reach rank 0 and the outcome the other ranks
//    (ReportChannel, report_channel.h): collectives for a synchronous save,
//    marker files for an async one, whose writing runs on a background
//    thread that must not enter collectives.
// The callers differ only in step 3's data files: a synchronous save writes
// them from the caller's memory; an async save copies them into staging on
// the caller's thread and writes them from a background thread.
//
//  0. Check (each rank, no collective): SaveOptions::local_failure, the
//     tag, the file system, the shards and blobs, the user JSON
//     (CheckLocalState). A failure rides in step 1's first collective.
//  1. Plan (collective; GatherAndPlan): the quick check (one AllReduceMax:
//     every layout unchanged, the digests and the planner agree) reuses the
//     cached plan (plan_cache.h); otherwise rank 0 gathers every layout,
//     plans and scatters each rank its part, or the ranks plan together
//     (PlanTogether: rounds 1-8, each home its part of the chunk table, rank
//     0 an index skeleton). Touches no file.
//  2. Prepare (rank 0, commit.h step 1; PlanAndPrepare): PrepareSave
//     creates and locks ROOT/.tmp-TAG.NONCE (on an object store: picks the
//     data objects' suffix, writes `started`); one broadcast (SaveStart)
//     tells every rank where to write, whether reports are compact and
//     whether a chunk table is written.
//  3. Write (each rank; the caller): its data files, fdatasync'ed, and
//     meanwhile the checksums of the replicas it holds but does not write
//     (replica_check.h); then (ReportAndCommit) its checksum file (chunk
//     table saves) and its extras (PlannedBy::WriteExtras: a home's part of
//     the chunk table).
//  4. Report (ReportChannel::Reports): every rank's report (or failure)
//     reaches rank 0; when the reports leave the copies' checksums out and
//     the replica digests do not add up, a second round brings them.
//  5. Commit (rank 0): the reports decoded (PlannedBy), the replicas
//     checked, the index made and committed (PlannedBy::Commit: commit.h
//     steps 4-7). A failure removes what the save wrote
//     (ReportChannel::Abandon).
//  6. Outcome (ReportChannel::Outcome): every rank learns "committed" and
//     the warnings, or the failure.
//
// What a crash in each step leaves:
//  - 0-1: nothing; the other ranks fail in the collective (or their
//    Comm's timeout).
//  - 2-4: a .tmp-TAG.NONCE that readers ignore and the next save into the
//    root removes once nobody holds its lock (an object store: the
//    prefix and the data objects with the save's suffix, which no index
//    names, removed once older than ObjectLeftoverAge()); `latest` and
//    every committed checkpoint untouched. With markers, the waiting ranks
//    time out (SaveOptions::peer_timeout).
//  - 5: as commit.h says: before its rename (object store: the index's
//    conditional write) nothing is committed; after it the checkpoint is.
//  - 6: committed. Rank 0 reports success with a warning when telling the
//    others fails; the other ranks return that failure, or (markers) find
//    the index and succeed.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "engine/save/commit.h"
#include "engine/save/planned_by.h"
#include "engine/save/replica_check.h"
#include "engine/save/report_channel.h"
#include "engine/save/save_messages.h"
#include "engine/save/user_json.h"
#include "layout/save_planner.h"
#include "shardsafe/checkpoint.h"

namespace shardsafe {

// A save once steps 0-2 are over on this rank: what the later steps need.
struct PreparedSave {
  std::shared_ptr<const SavePlan> plan;  // this rank's part, or on rank 0 the whole plan
  bool plan_reused = false;  // the cached plan of an unchanged layout
  std::shared_ptr<PlannedBy> planned;  // who planned it (step 1)
  bool compact_reports = false;        // step 2 (SaveStart)
  bool chunk_table = false;            // version 3: checksum files (SaveStart)
  UserJson json;  // this rank's values, metadata and layout (rank 0's are saved)
  FileSystem* fs = nullptr;  // where the root lies (FileSystemFor)
  std::string root, tag;
  SaveDirs dirs;
  std::shared_ptr<FileLock> lock;  // rank 0: held until committed or abandoned
};

// Step 0: this rank's checks before the first collective:
// SaveOptions::local_failure, its shards and blobs, and its user JSON
// (parsed into *json).
Status CheckLocalState(const SaveState& state, const SaveOptions& options, UserJson* json);

// The plan the ranks agreed on in step 1.
struct AgreedPlan {
  std::shared_ptr<const SavePlan> plan;
  bool reused = false;  // the cached plan of an unchanged layout (plan_cache.h)
  std::shared_ptr<FileLayouts> layouts = nullptr;  // planned on rank 0: its layouts (CachedPlan)
  bool together = false;                           // planned by all ranks together
  std::shared_ptr<const IndexSkeleton> skeleton = nullptr;
  std::shared_ptr<const std::string> table_part = nullptr;
};

// Step 1 (collective): agree that every rank's layout is unchanged and
// reuse the cached plan (plan_cache.h), or, with `together`, plan together
// (distributed_save.h), else gather every rank's holdings on rank 0, which
// plans and sends each rank its part (layout/plan_part.h; rank 0 keeps the
// whole plan); `local` (this rank's failure so far) fails it on every rank,
// as does a rank whose `together` differs. Every rank must save to the same
// `destination` (the checkpoint's path) and pass only global values equal
// to rank 0's. Touches no file. An async save's reservation runs it alone.
Result<AgreedPlan> GatherAndPlan(const SaveState& state, const std::string& destination,
                                 Comm& comm, const SaveOptions& options, const Status& local,
                                 const UserJson& json, bool together = false);

// Steps 0-2 (collective): the checks, GatherAndPlan (together as
// PlansTogether says), then rank 0 creates the temporary directory of
// ROOT/TAG and every rank learns where to write.
Result<PreparedSave> PlanAndPrepare(const SaveState& state, const std::string& root,
                                    const std::string& tag, Comm& comm,
                                    const SaveOptions& options);

// Steps 3 (after the data files) to 6 on every rank of a `world`-rank
// save, through `channel`: once this rank's data files are written
// (`written`: their reports, numbered in its part of the plan, or the
// failure) and the replicas it holds but does not write checksummed
// (`held`, or the failure), its checksum file and extras, its report, rank
// 0's commit (`commit`), and the outcome. Returns the post-commit warnings
// (rank 0's; over markers the other ranks learn none), or the failure.
Result<std::vector<std::string>> ReportAndCommit(const PreparedSave& save, int rank, int world,
                                                 ReportChannel& channel,
                                                 Result<std::vector<WrittenFile>> written,
                                                 Result<HeldChecksums> held,
                                                 const CommitOptions& commit);

// This rank's statistics of a save of `plan` (bytes, files).
SaveStats StatsOf(const SavePlan& plan, int rank);

// Saves `state` as ROOT/TAG, committed as `commit` says (Save, and a
// CheckpointManager's save).
Result<SaveStats> SaveToRoot(const SaveState& state, const std::string& root,
                             const std::string& tag, Comm& comm, const SaveOptions& options,
                             CommitOptions commit);

}  // namespace shardsafe
