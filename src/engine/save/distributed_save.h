// A save planned by all ranks together (docs/design.md, "Planning by all
// ranks"): no rank handles the whole job, rank 0 included.
//
// From SaveOptions::distributed_plan_min_ranks ranks on, a save whose
// layout changed does not gather every rank's layout on rank 0:
//  - rank 0 gathers only what ranks must agree on (the destination and the
//    values' fingerprints, CheckAgreement) and broadcasts an id of this
//    planning (random), which every rank caches with its part, so that the
//    quick check of later saves (plan_cache.h) finds out whether all ranks'
//    caches come from the same planning;
//  - the ranks plan together (distributed_plan.h: each rank ends with its
//    part of the plan) and make the index together (distributed_index.h:
//    each home its part of the chunk table, rank 0 an IndexSkeleton);
//  - each save of the plan then writes, besides every rank's data and
//    checksum files, each home's part of the table (the same bytes at
//    every save), its ranks report compactly (a count per file, the blobs'
//    checksums, the replica digest: the files' layouts follow from the
//    plan), and rank 0 commits the skeleton with the save's names, values
//    and blob checksums (IndexOfSave). When the replica digests do not add
//    up, the second round's messages carry what rank 0 compares
//    (EncodeReplicaRound). An asynchronous save, whose reports are marker
//    files, has no second round: each marker holds the rank's compact
//    report and its replica round (EncodeTogetherMarker); rank 0 reads
//    every marker whole and compares the copies only when the digests do
//    not add up (ReadTogetherMarkers).
// Such a save always writes a chunk table (format version 4), whatever its
// chunk count.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "engine/save/distributed_index.h"
#include "engine/save/plan_cache.h"
#include "engine/save/save_messages.h"
#include "shardsafe/checkpoint.h"
#include "shardsafe/comm.h"

namespace shardsafe {

// Ranks from which a save plans together unless told otherwise
// (SaveOptions::distributed_plan_min_ranks).
inline constexpr uint64_t kDefaultDistributedPlanMinRanks = 1024;

// Whether a save of `world` ranks plans together: from `min_ranks` ranks
// on (0: SHARDSAFE_DISTRIBUTED_PLAN_MIN_RANKS, else the default).
// InvalidArgument for a bad variable.
Result<bool> PlansTogether(int world, uint64_t min_ranks);

// A plan made together, as each rank keeps it.
struct TogetherPlan {
  std::shared_ptr<const SavePlan> part;            // this rank's
  std::shared_ptr<const IndexSkeleton> skeleton;   // rank 0's
  std::shared_ptr<const std::string> table_part;   // as a home (empty: none)
  Digest id{};  // of this planning, the same on every rank
};

// Steps 0-2 of a save whose layout changed, planned together (collective;
// after the quick check, which carried every rank's earlier failure):
// `layout` and `agreement` as EncodeLayout and EncodeAgreement give them.
// Every rank returns its plan or the same error.
Result<TogetherPlan> PlanTogether(Comm& comm, const std::string& layout,
                                  const std::string& agreement, const SavePlanOptions& options);

// Step 2 on a home: writes its part of the table into dirs.data, synced.
Status WriteTablePart(const std::string& bytes, int rank, const SaveDirs& dirs, FileSystem& fs);

// Rank 0, step 3: every rank's compact report (EncodeReport), decoded.
Result<std::vector<RankReport>> DecodeCompactReports(const std::vector<std::string>& msgs);

// An asynchronous save: a rank's `done` marker, from its compact report
// (EncodeReport) and its replica round (EncodeReplicaRound): Str report,
// Str replica round.
std::string EncodeTogetherMarker(const std::string& report, const std::string& replica_round);

// Rank 0 of an asynchronous save: every rank's marker (by rank), its
// report decoded (DecodeCompactReports); when the replica digests do not
// add up, the copies compared (CheckReplicaRounds), whose error names the
// tensor. InternalError naming the rank for a marker cut short or longer
// than its two strings.
Result<std::vector<RankReport>> ReadTogetherMarkers(const std::vector<std::string>& markers);

// Steps 4-6 on rank 0 (as CommitOnLeader, whose replica check is
// CheckReplicaRounds here, run before): the index of `skeleton` for this
// save, committed. Returns the post-commit warnings, one per line.
Result<std::string> CommitTogether(FileSystem& fs, const IndexSkeleton& skeleton,
                                   std::vector<RankReport> reports, const UserJson& json,
                                   const std::string& root, const std::string& tag,
                                   const SaveDirs& dirs, const CommitOptions& commit);

}  // namespace shardsafe
