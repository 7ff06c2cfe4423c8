// ReportChannel over collectives (report_channel.h): a synchronous save's.
#include "comm/agree.h"
#include "engine/save/report_channel.h"
#include "engine/save/save_driver.h"

namespace shardsafe {
namespace {

class CollectiveChannel final : public ReportChannel {
 public:
  CollectiveChannel(Comm& comm, const PreparedSave& save, bool verify_replicas)
      : comm_(comm), save_(save), verify_replicas_(verify_replicas) {}

  // The first round carries the files and the replica digest; the copies'
  // checksums are kept for a second round.
  Result<std::vector<RankReport>> Reports(const Status& mine, RankReport own,
                                          const HeldChecksums& held) override {
    const SavePlan& plan = *save_.plan;
    std::string msg;
    if (mine.ok()) {
      if (verify_replicas_) {
        own.replica_digest = ReplicaDigest(plan, comm_.rank(), held, own.files);
      }
      own_copies_.copies = held.copies;
      NumberAsWhole(plan, &own);
      NumberAsWhole(plan, &own_copies_);
      msg = EncodeReport(own, ReportForm{save_.compact_reports, !save_.chunk_table});
      own_files_ = std::move(own.files);
    }
    SS_ASSIGN_OR_RETURN(std::vector<std::string> msgs,
                        GatherToRootOrFail(comm_, 0, mine, std::move(msg)));
    if (comm_.rank() != 0) return std::vector<RankReport>();
    return save_.planned->ReadReports(plan, msgs);
  }

  bool SecondRound() const override { return true; }

  // In a version-3 save with the chunks' checksums, which the first round
  // left out.
  Status Copies(std::vector<RankReport>* reports) override {
    if (save_.chunk_table) own_copies_.files = own_files_;
    SS_ASSIGN_OR_RETURN(
        std::vector<std::string> msgs,
        GatherToRootOrFail(comm_, 0, Status(),
                           save_.planned->EncodeCopies(*save_.plan, comm_.rank(), own_copies_,
                                                       own_files_)));
    if (comm_.rank() != 0) return Status();
    return save_.planned->AddCopies(msgs, reports);
  }

  void Abandon(const Status&, bool) override { AbandonSave(*save_.fs, save_.dirs); }

  Result<std::string> Outcome(const Result<std::string>& answer) override {
    return BroadcastOrFail(comm_, 0, answer, /*name_root=*/false);
  }

 private:
  Comm& comm_;
  const PreparedSave& save_;
  const bool verify_replicas_;
  RankReport own_copies_;               // the copies' checksums, whole-plan numbers
  std::vector<WrittenFile> own_files_;  // as reported, whole-plan numbers
};

}  // namespace

std::unique_ptr<ReportChannel> CollectiveReports(Comm& comm, const PreparedSave& save,
                                                 bool verify_replicas) {
  return std::make_unique<CollectiveChannel>(comm, save, verify_replicas);
}

}  // namespace shardsafe
