// ReportChannel over marker files (report_channel.h): an async save's,
// whose background thread enters no collective.
#include <algorithm>
#include <cstdio>
#include <thread>

#include "comm/wire.h"
#include "engine/catalog/checkpoint_dir.h"
#include "engine/save/report_channel.h"
#include "engine/save/save_driver.h"

namespace shardsafe {
namespace {

constexpr std::string_view kAbortedMarker = "aborted";

std::string RankMarker(std::string_view prefix, int rank) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.*s%05d", static_cast<int>(prefix.size()), prefix.data(), rank);
  return buf;
}

// A failure's marker (`aborted`, `failed-RRRRR`): the status itself, so the
// ranks that read it report the same code and detail as the rank that wrote
// it (wire encoding; every rank of a save runs the same build).
Status WriteStatusMarker(FileSystem& fs, const std::string& path, const Status& why) {
  wire::Writer w;
  w.Status(why);
  return WriteFileAtomically(fs, path, w.Take());
}

// The status in a failure marker, its message prefixed by `who`.
Status StatusFromMarker(const std::string& text, const std::string& who) {
  Status why;
  wire::Reader r(text);
  if (!r.Status(&why).ok() || !r.done() || why.ok()) {
    return UnavailableError(who + ": unreadable failure marker");
  }
  return why.WithContext(who);
}

class MarkerChannel final : public ReportChannel {
 public:
  MarkerChannel(const PreparedSave& save, int rank, int world, bool verify_replicas,
                std::chrono::seconds peer_timeout)
      : save_(save), fs_(*save.fs), rank_(rank), world_(world),
        verify_replicas_(verify_replicas), peer_timeout_(peer_timeout) {}

  // Leaves this rank's marker (rank 0, failed: `aborted` at once, there is
  // nothing to wait for); rank 0 then waits for every rank's.
  Result<std::vector<RankReport>> Reports(const Status& mine, RankReport own,
                                          const HeldChecksums& held) override {
    own_ = mine;
    if (own_.ok()) {
      own_ = WriteFileAtomically(
          fs_, Tmp(RankMarker("done-", rank_)),
          save_.planned->EncodeMarker(*save_.plan, rank_, std::move(own), held,
                                      verify_replicas_));
    }
    if (!own_.ok()) {
      if (rank_ != 0) WriteStatusMarker(fs_, Tmp(RankMarker("failed-", rank_)), own_).IgnoreError();
      return own_;
    }
    if (rank_ != 0) return std::vector<RankReport>();
    SS_ASSIGN_OR_RETURN(std::vector<std::string> markers, GatherMarkers());
    for (int r = 0; r < world_; ++r) {
      SS_RETURN_IF_ERROR(fs_.RemoveFile(Tmp(RankMarker("done-", r))));
    }
    return save_.planned->ReadMarkers(*save_.plan, markers);
  }

  bool SecondRound() const override { return false; }  // a marker holds the copies
  Status Copies(std::vector<RankReport>*) override {
    return InternalError("a save through marker files has no second round");
  }

  // Before every rank reported, the others may still be writing: `aborted`
  // tells them, and the next save removes the rest. After, the data files
  // go now and `aborted` stays (with the directory) for them to read.
  void Abandon(const Status& why, bool all_reported) override {
    if (!WriteStatusMarker(fs_, Tmp(kAbortedMarker), why).ok()) {
      if (all_reported) AbandonSave(fs_, save_.dirs);  // they will see it vanish
      return;
    }
    if (!all_reported) return;
    const SaveDirs& dirs = save_.dirs;
    if (!dirs.file_suffix.empty()) AbandonSave(fs_, SaveDirs{"", dirs.data, dirs.file_suffix});
    auto entries = fs_.ListDir(dirs.tmp);
    if (!entries.ok()) return;
    for (const DirEntry& e : *entries) {
      if (e.name != kAbortedMarker) fs_.RemoveAll(JoinPath(dirs.tmp, e.name)).IgnoreError();
    }
  }

  // Rank 0's answer is its own; another rank waits for the committed index
  // (then "committed", without the warnings) or a sign of failure.
  Result<std::string> Outcome(const Result<std::string>& answer) override {
    if (rank_ == 0) return answer;
    const std::string path = JoinPath(save_.root, save_.tag);
    if (!own_.ok()) return own_.WithContext("saving " + path);
    Status committed = AwaitCommit();
    if (!committed.ok()) return committed.WithContext("saving " + path);
    return std::string(1, kCommittedAnswer);
  }

 private:
  std::string Tmp(std::string_view name) const { return JoinPath(save_.dirs.tmp, name); }

  // Polls until `ready` returns a value (an optional Status or Result), with
  // a growing pause; Unavailable once the peer timeout has passed.
  template <typename Fn>
  auto PollUntil(std::string_view waiting_for, Fn ready) ->
      typename decltype(ready())::value_type {
    auto pause = std::chrono::milliseconds(1);
    const auto deadline = std::chrono::steady_clock::now() + peer_timeout_;
    for (;;) {
      auto r = ready();
      if (r.has_value()) return *std::move(r);
      if (std::chrono::steady_clock::now() > deadline) {
        return UnavailableError("timed out waiting for " + std::string(waiting_for));
      }
      std::this_thread::sleep_for(pause);
      pause = std::min(pause * 2, std::chrono::milliseconds(50));
    }
  }

  // Rank 0: every rank's `done` marker, or the first failure.
  Result<std::vector<std::string>> GatherMarkers() {
    std::vector<std::string> reports(world_);
    std::vector<bool> seen(world_, false);
    using R = std::optional<Result<std::vector<std::string>>>;
    return PollUntil("the other ranks' completion markers", [&]() -> R {
      if (!fs_.Stat(save_.dirs.tmp).ok()) {
        return R(UnavailableError("temporary directory " + save_.dirs.tmp + " vanished"));
      }
      for (int r = 0; r < world_; ++r) {
        if (seen[r]) continue;
        auto failed = ReadFileToString(fs_, Tmp(RankMarker("failed-", r)), 1 << 20);
        if (failed.ok()) return R(StatusFromMarker(*failed, "rank " + std::to_string(r)));
        auto done = ReadFileToString(fs_, Tmp(RankMarker("done-", r)), uint64_t{1} << 30);
        if (!done.ok()) return std::nullopt;
        reports[r] = std::move(*done);
        seen[r] = true;
      }
      return R(reports);
    });
  }

  // Another rank: the committed index, `aborted`, or the temporary
  // directory gone without an index.
  Status AwaitCommit() {
    const std::string index = JoinPath(JoinPath(save_.root, save_.tag), "shardsafe.json");
    using R = std::optional<Status>;
    return PollUntil("rank 0 to commit", [&]() -> R {
      if (fs_.Stat(index).ok()) return R(Status());
      auto aborted = ReadFileToString(fs_, Tmp(kAbortedMarker), 1 << 20);
      if (aborted.ok()) return R(StatusFromMarker(*aborted, "save aborted by rank 0"));
      if (!fs_.Stat(save_.dirs.tmp).ok() && !fs_.Stat(index).ok()) {
        return R(UnavailableError("save abandoned by rank 0 (its commit failed)"));
      }
      return std::nullopt;
    });
  }

  const PreparedSave& save_;
  FileSystem& fs_;
  const int rank_, world_;
  const bool verify_replicas_;
  const std::chrono::seconds peer_timeout_;
  Status own_;  // this rank's failure in step 4, if any
};

}  // namespace

std::unique_ptr<ReportChannel> MarkerReports(const PreparedSave& save, int rank, int world,
                                             bool verify_replicas,
                                             std::chrono::seconds peer_timeout) {
  return std::make_unique<MarkerChannel>(save, rank, world, verify_replicas, peer_timeout);
}

}  // namespace shardsafe
