// Save and SaveToRoot: the save driver (save_driver.h) with the data files
// written from the caller's memory and the reports sent over collectives.
#include <chrono>
#include <future>

#include "engine/catalog/checkpoint_dir.h"
#include "engine/save/save_driver.h"
#include "engine/save/save_writer.h"
#include "layout/plan_part.h"

namespace shardsafe {

Result<SaveStats> SaveToRoot(const SaveState& state, const std::string& root,
                             const std::string& tag, Comm& comm, const SaveOptions& options,
                             CommitOptions commit) {
  const auto start = std::chrono::steady_clock::now();
  auto report = [&](std::string_view phase, uint64_t done, uint64_t total) {
    if (options.progress) options.progress({phase, done, total});
  };
  report("plan", 0, 0);
  SS_ASSIGN_OR_RETURN(PreparedSave prepared, PlanAndPrepare(state, root, tag, comm, options));
  const SavePlan& plan = *prepared.plan;

  // Step 3: every rank writes its files, and checksums the replicas it
  // holds but does not write meanwhile.
  std::atomic<uint64_t> progress{0};
  auto copies = std::async(std::launch::async, [&] {
    return options.verify_replicas
               ? ChecksumCopies(plan, comm.rank(), state, options.device.get())
               : Result<HeldChecksums>(HeldChecksums());
  });
  auto written =
      WriteRankFiles(plan, comm.rank(), state, prepared.dirs, *prepared.fs, options, &progress);
  auto held = copies.get();
  report("commit", RankBytes(plan, comm.rank()), RankBytes(plan, comm.rank()));

  // Steps 4-6 over collectives.
  auto channel = CollectiveReports(comm, prepared, options.verify_replicas);
  SS_ASSIGN_OR_RETURN(std::vector<std::string> warnings,
                      ReportAndCommit(prepared, comm.rank(), comm.size(), *channel,
                                      std::move(written), std::move(held), commit));
  SaveStats stats = StatsOf(plan, comm.rank());
  stats.plan_reused = prepared.plan_reused;
  stats.warnings = std::move(warnings);
  stats.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return stats;
}

Result<SaveStats> Save(const SaveState& state, const std::string& path, Comm& comm,
                       const SaveOptions& options) {
  CommitOptions commit;
  commit.overwrite = options.overwrite;
  return SaveToRoot(state, ParentDir(path), BaseName(path), comm, options, commit);
}

}  // namespace shardsafe
