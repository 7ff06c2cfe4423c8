// How the reports of a save reach the rank that commits it, and the outcome
// every other rank: steps 4 and 6 of the save driver (save_driver.h). Chosen
// once per save: a synchronous save uses collectives (CollectiveReports), an
// async save, whose writing runs on a background thread that must not enter
// collectives, marker files in the temporary directory (MarkerReports). The
// driver calls the same methods in the same order on every rank; only rank 0
// receives reports and answers.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "engine/save/replica_check.h"
#include "engine/save/save_messages.h"
#include "shardsafe/comm.h"

namespace shardsafe {

struct PreparedSave;

// The first byte of rank 0's answer (ReportChannel::Outcome): committed
// (then the warnings, one per line), or "send the copies' checksums" when
// the replica digests do not add up (replica_check.h).
inline constexpr char kCommittedAnswer = 'C';
inline constexpr char kSendCopiesAnswer = 'R';

class ReportChannel {
 public:
  virtual ~ReportChannel() = default;

  // Step 4 (every rank): this rank's report (its files as written, numbered
  // in its part of the plan, and the checksums of the replicas it holds but
  // does not write), or its failure `mine`, sent to rank 0. Rank 0 returns
  // every rank's report in whole-plan numbers, or the first failure (its
  // own first); another rank returns nothing, or its own failure.
  virtual Result<std::vector<RankReport>> Reports(const Status& mine, RankReport own,
                                                  const HeldChecksums& held) = 0;

  // Whether the reports leave out the copies' checksums, which rank 0 asks
  // for in a second round (Copies) when the replica digests do not add up.
  virtual bool SecondRound() const = 0;
  // Step 4, second round (every rank, after Outcome said so): this rank's
  // copies' checksums (of the `held` it reported); rank 0 adds every rank's
  // to `reports` (null on the other ranks).
  virtual Status Copies(std::vector<RankReport>* reports) = 0;

  // Step 5's failure on rank 0 (nothing committed): removes what the save
  // wrote, or as much as the other ranks no longer need to learn why
  // (`all_reported`: every rank's report had arrived).
  virtual void Abandon(const Status& why, bool all_reported) = 0;

  // Step 6 (every rank): rank 0's `answer` (the driver's: committed and the
  // warnings, asking for copies, or the failure), as every rank learns it.
  // Over markers another rank learns only "committed" (no warnings) or the
  // failure.
  virtual Result<std::string> Outcome(const Result<std::string>& answer) = 0;
};

// Collectives over `comm`: a gather of the reports on rank 0 (compact as
// the save's start said; the copies' checksums in a second round), a
// broadcast of the answer.
std::unique_ptr<ReportChannel> CollectiveReports(Comm& comm, const PreparedSave& save,
                                                 bool verify_replicas);

// Marker files in the temporary directory: each rank leaves `done-RRRRR`
// (its whole report, copies included) or `failed-RRRRR` (its status); rank
// 0 polls for every rank's, and on failure leaves `aborted`; the other
// ranks poll until the committed index appears, `aborted` appears or the
// temporary directory vanishes. A wait longer than `peer_timeout` fails as
// Unavailable naming what it waited for.
std::unique_ptr<ReportChannel> MarkerReports(const PreparedSave& save, int rank, int world,
                                             bool verify_replicas,
                                             std::chrono::seconds peer_timeout);

}  // namespace shardsafe
