// Who planned a save, and what the later steps do differently because of it
// (the steps: save_driver.h). Chosen once per save, from the plan the ranks agreed
// on (PlanAndPrepare): rank 0 planned the whole job, or all ranks planned
// together (distributed_save.h). A synchronous save and an asynchronous one
// call the same methods; only how the messages travel differs
// (ReportChannel, report_channel.h: collectives, or marker files).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "engine/save/commit.h"
#include "engine/save/distributed_index.h"
#include "engine/save/plan_cache.h"
#include "engine/save/replica_check.h"
#include "engine/save/save_dirs.h"
#include "engine/save/save_messages.h"
#include "engine/save/user_json.h"
#include "layout/save_planner.h"

namespace shardsafe {

class PlannedBy {
 public:
  virtual ~PlannedBy() = default;

  // Step 2 (rank 0): whether the save writes a chunk table and checksum
  // files (from `min_chunks` chunks on, as WritesChunkTable says, or
  // always), and whether the ranks report compactly (SaveStart).
  virtual Result<bool> WritesTable(const SavePlan& plan, uint64_t min_chunks) const = 0;
  virtual bool CompactReports() const = 0;

  // Step 3 (each rank), after its data and checksum files: what else it
  // writes (a home's part of the chunk table, or nothing).
  virtual Status WriteExtras(int rank, const SaveDirs& dirs, FileSystem& fs) const = 0;

  // Step 4, second round (each rank): its copies' checksums, from
  // `own_copies` (numbered as in the whole plan) and the files it wrote.
  virtual std::string EncodeCopies(const SavePlan& plan, int rank, const RankReport& own_copies,
                                   const std::vector<WrittenFile>& files) const = 0;

  // Step 4 with markers (each rank): its `done` marker, from `report` (its
  // files as written, numbered in its part) and the checksums of the
  // replicas it holds (their digest added when `verify_replicas`).
  virtual std::string EncodeMarker(const SavePlan& plan, int rank, RankReport report,
                                   const HeldChecksums& held, bool verify_replicas) const = 0;

  // Step 5 (rank 0): every rank's report from the first round, or from
  // its marker, decoded in whole-plan numbers.
  virtual Result<std::vector<RankReport>> ReadReports(const SavePlan& plan,
                                                      const std::vector<std::string>& msgs) = 0;
  virtual Result<std::vector<RankReport>> ReadMarkers(const SavePlan& plan,
                                                      const std::vector<std::string>& markers) = 0;

  // Step 5 (rank 0): the second round's messages (EncodeCopies) added to
  // `reports`, or checked against each other.
  virtual Status AddCopies(const std::vector<std::string>& msgs,
                           std::vector<RankReport>* reports) = 0;

  // Step 5 (rank 0): the replicas checked, the index made and committed
  // (commit.h steps 4-7); `chunk_table` as SaveStart says. Returns the
  // post-commit warnings, one per line; on failure what the save wrote is
  // left for the caller to remove (AbandonSave).
  virtual Result<std::string> Commit(FileSystem& fs, const SavePlan& plan,
                                     std::vector<RankReport> reports, const UserJson& json,
                                     const std::string& root, const std::string& tag,
                                     const SaveDirs& dirs, int world, bool chunk_table,
                                     const CommitOptions& commit) = 0;
};

// Rank 0 planned: `layouts` are the plan's (CachedPlan::layouts), which
// rank 0 completes compact reports from and keeps from full ones.
std::unique_ptr<PlannedBy> PlannedOnRankZero(std::shared_ptr<FileLayouts> layouts);

// Rank 0's side of a save it planned, which PlannedOnRankZero calls (and
// the tests and benchmarks call one by one).

// Rank 0, step 5 (save_driver.h): every rank's encoded report (save_messages.h), decoded
// in whole-plan numbers; compact ones completed from `layouts`, which keeps
// the layouts when all are full and forgets them when a compact one does
// not match (so that the next save reports in full). `*layouts_match`
// (when set): every file's layout is the one `layouts` keeps (all compact,
// or kept now), so that its chunk table fits this save.
Result<std::vector<RankReport>> ReadReports(const std::vector<std::string>& msgs,
                                            const SavePlan& plan, FileLayouts* layouts,
                                            bool* layouts_match = nullptr);

// How rank 0 makes a save's index: with a chunk table and checksum files
// (version 3, SaveStart::chunk_table) or not, and the plan's layouts,
// whose chunk table is reused, or kept once made, when the reports' file
// layouts are theirs (ReadReports).
struct LeaderIndex {
  bool chunk_table = false;
  FileLayouts* layouts = nullptr;
  bool layouts_match = false;
};

// Rank 0: the index of a save and what its commit writes (IndexToCommit).
struct LeaderCommit {
  CheckpointIndex index;
  CommitIndex written;
};
// `written`: what each rank wrote (by rank, FilesByRank).
Result<LeaderCommit> MakeIndex(const SavePlan& plan,
                               const std::vector<std::vector<WrittenFile>>& written,
                               const UserJson& json, const std::string& tag,
                               const SaveDirs& dirs, int world_size, const LeaderIndex& how);

// Step 5 on rank 0 (commit.h steps 4-7): checks the copies the reports carry (CheckReplicas),
// makes the index (MakeIndex) and commits. Returns the post-commit
// warnings, one per line; on failure what the save wrote is left for the
// caller to remove (AbandonSave).
Result<std::string> CommitOnLeader(FileSystem& fs, const SavePlan& plan,
                                   std::vector<RankReport> reports, const UserJson& json,
                                   const std::string& root, const std::string& tag,
                                   const SaveDirs& dirs, int world_size,
                                   const CommitOptions& commit, const LeaderIndex& how);

// All ranks planned together: rank 0's index skeleton, this rank's part of
// the chunk table as a home (empty: none).
std::unique_ptr<PlannedBy> PlannedTogether(std::shared_ptr<const IndexSkeleton> skeleton,
                                           std::shared_ptr<const std::string> table_part);

}  // namespace shardsafe
