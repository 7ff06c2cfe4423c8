#include "engine/save/planned_by.h"

#include "engine/save/distributed_save.h"

namespace shardsafe {
namespace {

class OnRankZero final : public PlannedBy {
 public:
  explicit OnRankZero(std::shared_ptr<FileLayouts> layouts) : layouts_(std::move(layouts)) {}

  Result<bool> WritesTable(const SavePlan& plan, uint64_t min_chunks) const override {
    return WritesChunkTable(plan.chunks.size(), min_chunks);
  }
  bool CompactReports() const override { return layouts_ && layouts_->ready(); }
  Status WriteExtras(int, const SaveDirs&, FileSystem&) const override { return Status(); }

  std::string EncodeCopies(const SavePlan&, int, const RankReport& own_copies,
                           const std::vector<WrittenFile>&) const override {
    return EncodeReport(own_copies, ReportForm{.compact = true});
  }

  std::string EncodeMarker(const SavePlan& plan, int, RankReport report,
                           const HeldChecksums& held, bool) const override {
    report.copies = held.copies;
    NumberAsWhole(plan, &report);
    return EncodeReport(report);
  }

  Result<std::vector<RankReport>> ReadReports(const SavePlan& plan,
                                              const std::vector<std::string>& msgs) override {
    return shardsafe::ReadReports(msgs, plan, layouts_.get(), &layouts_match_);
  }
  Result<std::vector<RankReport>> ReadMarkers(const SavePlan& plan,
                                              const std::vector<std::string>& markers) override {
    return ReadReports(plan, markers);
  }

  Status AddCopies(const std::vector<std::string>& msgs,
                   std::vector<RankReport>* reports) override {
    for (size_t r = 0; r < msgs.size() && r < reports->size(); ++r) {
      ReportForm form;
      SS_ASSIGN_OR_RETURN(RankReport more, DecodeReport(msgs[r], &form));
      (*reports)[r].copies = std::move(more.copies);
      SS_RETURN_IF_ERROR(AddChunkChecksums(more.files, &(*reports)[r].files));
    }
    return Status();
  }

  Result<std::string> Commit(FileSystem& fs, const SavePlan& plan, std::vector<RankReport> reports,
                             const UserJson& json, const std::string& root,
                             const std::string& tag, const SaveDirs& dirs, int world,
                             bool chunk_table, const CommitOptions& commit) override {
    return CommitOnLeader(fs, plan, std::move(reports), json, root, tag, dirs, world, commit,
                          {chunk_table, layouts_.get(), layouts_match_});
  }

 private:
  std::shared_ptr<FileLayouts> layouts_;
  bool layouts_match_ = false;  // as ReadReports found
};

class Together final : public PlannedBy {
 public:
  Together(std::shared_ptr<const IndexSkeleton> skeleton,
           std::shared_ptr<const std::string> table_part)
      : skeleton_(std::move(skeleton)), table_part_(std::move(table_part)) {}

  Result<bool> WritesTable(const SavePlan&, uint64_t) const override { return true; }
  bool CompactReports() const override { return true; }

  Status WriteExtras(int rank, const SaveDirs& dirs, FileSystem& fs) const override {
    if (!table_part_ || table_part_->empty()) return Status();
    return WriteTablePart(*table_part_, rank, dirs, fs);
  }

  std::string EncodeCopies(const SavePlan& plan, int rank, const RankReport& own_copies,
                           const std::vector<WrittenFile>& files) const override {
    return EncodeReplicaRound(plan, rank, own_copies.copies, files);
  }

  std::string EncodeMarker(const SavePlan& plan, int rank, RankReport report,
                           const HeldChecksums& held, bool verify_replicas) const override {
    if (verify_replicas) report.replica_digest = ReplicaDigest(plan, rank, held, report.files);
    NumberAsWhole(plan, &report);
    return EncodeTogetherMarker(
        EncodeReport(report, {.compact = true, .chunk_checksums = false}),
        EncodeReplicaRound(plan, rank, held.copies, report.files));
  }

  Result<std::vector<RankReport>> ReadReports(const SavePlan&,
                                              const std::vector<std::string>& msgs) override {
    return DecodeCompactReports(msgs);
  }
  Result<std::vector<RankReport>> ReadMarkers(const SavePlan&,
                                              const std::vector<std::string>& markers) override {
    return ReadTogetherMarkers(markers);
  }

  Status AddCopies(const std::vector<std::string>& msgs, std::vector<RankReport>*) override {
    return CheckReplicaRounds(msgs);
  }

  Result<std::string> Commit(FileSystem& fs, const SavePlan&, std::vector<RankReport> reports,
                             const UserJson& json, const std::string& root,
                             const std::string& tag, const SaveDirs& dirs, int, bool,
                             const CommitOptions& commit) override {
    if (!skeleton_) return InternalError("a save planned together without an index skeleton");
    return CommitTogether(fs, *skeleton_, std::move(reports), json, root, tag, dirs, commit);
  }

 private:
  std::shared_ptr<const IndexSkeleton> skeleton_;
  std::shared_ptr<const std::string> table_part_;
};

}  // namespace

Result<std::vector<RankReport>> ReadReports(const std::vector<std::string>& msgs,
                                            const SavePlan& plan, FileLayouts* layouts,
                                            bool* layouts_match) {
  std::vector<RankReport> reports(msgs.size());
  bool all_full = true, all_compact = true;
  for (size_t r = 0; r < msgs.size(); ++r) {
    ReportForm form;
    SS_ASSIGN_OR_RETURN(reports[r], DecodeReport(msgs[r], &form));
    all_full = all_full && !form.compact;
    all_compact = all_compact && form.compact;
    if (!form.compact) continue;
    Status s = layouts ? layouts->Fill(&reports[r].files)
                       : InternalError("compact save report without layouts");
    if (!s.ok()) {
      if (layouts) layouts->Forget();  // the next save reports in full
      return s;
    }
  }
  const bool kept = all_full && layouts && layouts->Keep(plan, reports);
  if (layouts_match) *layouts_match = layouts && (kept || (all_compact && layouts->ready()));
  return reports;
}

Result<LeaderCommit> MakeIndex(const SavePlan& plan,
                               const std::vector<std::vector<WrittenFile>>& written,
                               const UserJson& json, const std::string& tag,
                               const SaveDirs& dirs, int world_size, const LeaderIndex& how) {
  FileLayouts* layouts = how.layouts_match ? how.layouts : nullptr;
  std::shared_ptr<const EncodedChunkTable> table =
      how.chunk_table && layouts ? layouts->table() : nullptr;
  LeaderCommit out;
  SS_ASSIGN_OR_RETURN(out.index, BuildIndex(plan, written, json, tag, world_size,
                                            dirs.file_suffix, {how.chunk_table, !table}));
  SS_ASSIGN_OR_RETURN(out.written,
                      IndexToCommit(&out.index, how.chunk_table, dirs.file_suffix, table));
  if (how.chunk_table && layouts && !table) layouts->KeepTable(out.written.table);
  return out;
}

Result<std::string> CommitOnLeader(FileSystem& fs, const SavePlan& plan,
                                   std::vector<RankReport> reports, const UserJson& json,
                                   const std::string& root, const std::string& tag,
                                   const SaveDirs& dirs, int world_size,
                                   const CommitOptions& commit, const LeaderIndex& how) {
  std::vector<std::vector<CopyChecksum>> copies(reports.size());
  for (size_t r = 0; r < reports.size(); ++r) copies[r] = std::move(reports[r].copies);
  const std::vector<std::vector<WrittenFile>> written = FilesByRank(std::move(reports));
  SS_RETURN_IF_ERROR(CheckReplicas(plan, written, copies));
  SS_ASSIGN_OR_RETURN(LeaderCommit made,
                      MakeIndex(plan, written, json, tag, dirs, world_size, how));
  std::vector<std::string> warnings;
  SS_RETURN_IF_ERROR(CommitSave(fs, dirs, root, made.index, made.written, commit, &warnings));
  std::string joined;
  for (const auto& w : warnings) joined += w + "\n";
  return joined;
}

std::unique_ptr<PlannedBy> PlannedOnRankZero(std::shared_ptr<FileLayouts> layouts) {
  return std::make_unique<OnRankZero>(std::move(layouts));
}

std::unique_ptr<PlannedBy> PlannedTogether(std::shared_ptr<const IndexSkeleton> skeleton,
                                           std::shared_ptr<const std::string> table_part) {
  return std::make_unique<Together>(std::move(skeleton), std::move(table_part));
}

}  // namespace shardsafe
