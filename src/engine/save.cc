// Save: the collective protocol of commit.h, from the caller's state to a
// committed checkpoint. Every rank runs the same sequence of collectives
// whatever happens locally, so a failure anywhere reaches every rank.
#include <chrono>

#include "engine/agree.h"
#include "engine/checkpoint_dir.h"
#include "engine/commit.h"
#include "engine/save_internal.h"
#include "engine/save_messages.h"
#include "engine/save_writer.h"

namespace shardsafe {
namespace {

Status CheckLocalState(const SaveState& state, const SaveOptions& options) {
  for (const TensorShard& t : state.tensors) {
    if (t.data == nullptr && t.slice.NumElements() > 0) {
      return InvalidArgumentError("tensor \"" + t.key + "\": null data pointer");
    }
    if (t.on_device && options.device == nullptr) {
      return InvalidArgumentError("tensor \"" + t.key +
                                  "\" is on a device, but no SaveOptions::device copies it");
    }
  }
  for (const BlobRef& b : state.blobs) {
    if (b.data == nullptr && b.size > 0) {
      return InvalidArgumentError("blob \"" + b.name + "\": null data pointer");
    }
  }
  return Status();
}

}  // namespace

Result<SavePlan> GatherAndPlan(const SaveState& state, const std::string& tag, Comm& comm,
                               const SaveOptions& options, const Status& pending) {
  Status local = pending.ok() ? CheckLocalState(state, options) : pending;
  SS_ASSIGN_OR_RETURN(auto msgs, GatherOrFail(comm, local, EncodeHoldings(tag, state)));
  std::vector<RankHoldings> holdings(msgs.size());
  for (size_t r = 0; r < msgs.size(); ++r) {
    std::string their_tag;
    SS_ASSIGN_OR_RETURN(holdings[r], DecodeHoldings(msgs[r], &their_tag));
    if (their_tag != tag) {
      return InvalidArgumentError("ranks disagree on the checkpoint: rank 0 saves \"" + tag +
                                  "\", rank " + std::to_string(r) + " saves \"" + their_tag + "\"");
    }
  }
  return PlanSave(holdings, SavePlanOptions{options.max_file_bytes});
}

Result<PreparedSave> PlanAndPrepare(const SaveState& state, const std::string& root,
                                    const std::string& tag, Comm& comm,
                                    const SaveOptions& options, const Status& pending) {
  FileSystem& fs = options.fs ? *options.fs : *DefaultFileSystem();
  SS_RETURN_IF_ERROR(ValidateTag(tag));
  PreparedSave prepared;
  SS_ASSIGN_OR_RETURN(prepared.plan, GatherAndPlan(state, tag, comm, options, pending));
  // Step 1: rank 0 prepares the temporary directory; everyone learns it.
  Result<std::string> tmp = std::string();
  if (comm.rank() == 0) {
    Result<TmpDir> dir = PrepareSave(fs, root, tag, options.overwrite);
    tmp = dir.ok() ? Result<std::string>(dir->path) : Result<std::string>(dir.status());
    if (dir.ok()) prepared.lock = std::move(dir->lock);
  }
  SS_ASSIGN_OR_RETURN(prepared.tmp_dir, BroadcastOrFail(comm, 0, tmp));
  return prepared;
}

Result<std::string> CommitOnLeader(FileSystem& fs, const SavePlan& plan,
                                   const std::vector<std::string>& reports, const SaveState& state,
                                   const std::string& root, const std::string& tag,
                                   const std::string& tmp_dir, int world_size, bool overwrite,
                                   bool update_latest) {
  std::vector<std::vector<WrittenFile>> by_rank(reports.size());
  Status s;
  for (size_t r = 0; r < reports.size() && s.ok(); ++r) {
    auto decoded = DecodeWritten(reports[r]);
    s = decoded.status();
    if (decoded.ok()) by_rank[r] = std::move(*decoded);
  }
  auto index = s.ok() ? BuildIndex(plan, by_rank, state, tag, world_size) : Result<CheckpointIndex>(s);
  std::vector<std::string> warnings;
  s = index.ok() ? CommitSave(fs, tmp_dir, root, *index, overwrite, update_latest, &warnings)
                 : index.status();
  if (!s.ok()) {
    AbandonSave(fs, tmp_dir);
    return s;
  }
  std::string joined;
  for (const auto& w : warnings) joined += w + "\n";
  return joined;
}

std::vector<std::string> SplitLines(const std::string& text) {
  std::vector<std::string> lines;
  size_t start = 0;
  for (size_t nl; (nl = text.find('\n', start)) != std::string::npos; start = nl + 1) {
    lines.push_back(text.substr(start, nl - start));
  }
  return lines;
}

SaveStats StatsOf(const SavePlan& plan, int rank) {
  SaveStats s;
  s.bytes_written = plan.bytes_per_rank[rank];
  s.unique_bytes = plan.unique_bytes;
  s.files = static_cast<int>(plan.files.size());
  for (uint64_t b : plan.bytes_per_rank) s.max_rank_bytes = std::max(s.max_rank_bytes, b);
  for (const PlannedChunk& c : plan.chunks) s.held_bytes += c.bytes * c.holders;
  return s;
}

Result<SaveStats> SaveToRoot(const SaveState& state, const std::string& root,
                             const std::string& tag, Comm& comm, const SaveOptions& options,
                             bool update_latest) {
  const auto start = std::chrono::steady_clock::now();
  FileSystem& fs = options.fs ? *options.fs : *DefaultFileSystem();
  const bool leader = comm.rank() == 0;
  auto report = [&](std::string_view phase, uint64_t done, uint64_t total) {
    if (options.progress) options.progress({phase, done, total});
  };
  report("plan", 0, 0);
  SS_ASSIGN_OR_RETURN(PreparedSave prepared, PlanAndPrepare(state, root, tag, comm, options, {}));
  const SavePlan& plan = prepared.plan;
  const std::string& tmp_dir = prepared.tmp_dir;

  // Step 2: every rank writes its files.
  std::atomic<uint64_t> progress{0};
  auto written = WriteRankFiles(plan, comm.rank(), state, tmp_dir, fs, options, &progress);

  // Step 3: agree; on failure nothing is committed.
  auto reports = GatherOrFail(comm, written.status(),
                              written.ok() ? EncodeWritten(*written) : std::string());
  if (!reports.ok()) {
    if (leader) AbandonSave(fs, tmp_dir);
    return reports.status().WithContext("saving " + JoinPath(root, tag));
  }

  // Steps 4-6 on rank 0, then everyone learns the outcome and warnings.
  report("commit", plan.bytes_per_rank[comm.rank()], plan.bytes_per_rank[comm.rank()]);
  Result<std::string> committed = std::string();
  if (leader) committed = CommitOnLeader(fs, plan, *reports, state, root, tag, tmp_dir, comm.size(),
                                         options.overwrite, update_latest);
  auto outcome = BroadcastOrFail(comm, 0, committed);
  if (!outcome.ok()) return outcome.status().WithContext("committing " + JoinPath(root, tag));

  SaveStats stats = StatsOf(plan, comm.rank());
  stats.warnings = SplitLines(*outcome);
  stats.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return stats;
}

Result<SaveStats> Save(const SaveState& state, const std::string& path, Comm& comm,
                       const SaveOptions& options) {
  return SaveToRoot(state, ParentDir(path), BaseName(path), comm, options,
                    /*update_latest=*/false);
}

}  // namespace shardsafe
