// Steps 3 (after the data files) to 6 of every save (save_driver.h), and
// rank 0's side of them: its answer to the reports.
#include "engine/save/save_driver.h"

#include "engine/save/save_writer.h"
#include "layout/plan_part.h"

namespace shardsafe {
namespace {

std::vector<std::string> SplitLines(const std::string& text) {
  std::vector<std::string> lines;
  size_t start = 0;
  for (size_t nl; (nl = text.find('\n', start)) != std::string::npos; start = nl + 1) {
    lines.push_back(text.substr(start, nl - start));
  }
  return lines;
}

// Rank 0's side of steps 4-6: its answer to the reports. On failure what
// the save wrote is removed (ReportChannel::Abandon).
class Leader {
 public:
  Leader(const PreparedSave& save, int world, ReportChannel& channel, const CommitOptions& commit)
      : save_(save), world_(world), channel_(channel), commit_(commit),
        path_(JoinPath(save.root, save.tag)) {}

  // To every rank's report (or a rank's failure): the copies asked for
  // when the reports leave them out and the digests do not add up, else
  // the outcome of step 5.
  Result<std::string> ToReports(Result<std::vector<RankReport>> reports) {
    if (!reports.ok()) {
      channel_.Abandon(reports.status(), /*all_reported=*/false);
      return reports.status().WithContext("saving " + path_);
    }
    reports_ = std::move(*reports);
    if (channel_.SecondRound() && !DigestsAddUp(reports_)) {
      return std::string(1, kSendCopiesAnswer);
    }
    return Commit();
  }

  // To the second round (`added`: the copies added to the reports), then
  // steps 5-6.
  Result<std::string> ToCopies(const Status& added) { return added.ok() ? Commit() : Fail(added); }

  std::vector<RankReport>* reports() { return &reports_; }

 private:
  Result<std::string> Commit() {
    auto committed =
        save_.planned->Commit(*save_.fs, *save_.plan, std::move(reports_), save_.json, save_.root,
                              save_.tag, save_.dirs, world_, save_.chunk_table, commit_);
    if (!committed.ok()) return Fail(committed.status());
    return kCommittedAnswer + *committed;
  }

  Status Fail(const Status& s) {
    channel_.Abandon(s, /*all_reported=*/true);
    return (world_ > 1 ? s.WithContext("rank 0") : s).WithContext("committing " + path_);
  }

  const PreparedSave& save_;
  const int world_;
  ReportChannel& channel_;
  const CommitOptions& commit_;
  const std::string path_;
  std::vector<RankReport> reports_;  // decoded, kept for the second round
};

// Step 6's result on this rank: the warnings of a committed save, or the
// failure. Rank 0 succeeds once it committed, even if telling the others
// failed (then with a warning).
Result<std::vector<std::string>> Warnings(int rank, const Result<std::string>& answer,
                                          const Result<std::string>& outcome) {
  if (outcome.ok() && !outcome->empty() && (*outcome)[0] == kCommittedAnswer) {
    return SplitLines(outcome->substr(1));
  }
  if (outcome.ok()) return InternalError("unexpected answer from rank 0 to the save's reports");
  if (rank == 0 && answer.ok() && !answer->empty() && (*answer)[0] == kCommittedAnswer) {
    std::vector<std::string> warnings = SplitLines(answer->substr(1));
    warnings.push_back("committed, but telling the other ranks failed: " +
                       outcome.status().message());
    return warnings;
  }
  return outcome.status();
}

}  // namespace

Result<std::vector<std::string>> ReportAndCommit(const PreparedSave& save, int rank, int world,
                                                 ReportChannel& channel,
                                                 Result<std::vector<WrittenFile>> written,
                                                 Result<HeldChecksums> held,
                                                 const CommitOptions& commit) {
  FileSystem& fs = *save.fs;
  // Step 3, after the data files: the checksum file, the extras.
  if (written.ok() && save.chunk_table) {
    Status s = WriteChecksumFile(*save.plan, rank, *written, save.dirs, fs);
    if (!s.ok()) written = s;
  }
  if (written.ok()) {
    Status s = save.planned->WriteExtras(rank, save.dirs, fs);
    if (!s.ok()) written = s;
  }
  const Status mine = written.ok() ? held.status() : written.status();
  RankReport own;
  if (mine.ok()) own.files = std::move(*written);
  // Steps 4-6; the answer is rank 0's.
  auto reports = channel.Reports(mine, std::move(own), mine.ok() ? *held : HeldChecksums());
  Leader leader(save, world, channel, commit);
  Result<std::string> answer = std::string();
  if (rank == 0) answer = leader.ToReports(std::move(reports));
  auto outcome = channel.Outcome(answer);
  if (outcome.ok() && *outcome == std::string(1, kSendCopiesAnswer)) {
    Status added = channel.Copies(rank == 0 ? leader.reports() : nullptr);
    if (rank == 0) answer = leader.ToCopies(added);
    outcome = channel.Outcome(answer);
  }
  return Warnings(rank, answer, outcome);
}

SaveStats StatsOf(const SavePlan& plan, int rank) {
  SaveStats s;
  s.bytes_written = RankBytes(plan, rank);
  s.unique_bytes = plan.unique_bytes;
  s.max_rank_bytes = MaxRankBytes(plan);
  if (plan.part) {
    s.files = static_cast<int>(plan.part->whole_files);
    s.held_bytes = plan.part->held_bytes;
    return s;
  }
  s.files = static_cast<int>(plan.files.size());
  for (const PlannedChunk& c : plan.chunks) s.held_bytes += c.bytes * c.holders;
  return s;
}

}  // namespace shardsafe
