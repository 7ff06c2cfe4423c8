#include "engine/save/distributed_save.h"

#include <cstring>
#include <random>

#include "base/env.h"
#include "comm/agree.h"
#include "comm/wire.h"
#include "engine/plan/distributed_plan.h"
#include "engine/save/commit.h"
#include "engine/save/replica_check.h"
#include "format/index.h"

namespace shardsafe {
namespace {

// Rank 0: checks what the ranks must agree on (each `msgs` an announcement
// without a layout) and names this planning: 16 random bytes.
Result<std::string> AgreeAndName(const Result<std::vector<std::string>>& msgs) {
  if (!msgs.ok()) return msgs.status();
  std::vector<Announcement> announced(msgs->size());
  for (size_t r = 0; r < msgs->size(); ++r) {
    SS_ASSIGN_OR_RETURN(announced[r], DecodeHoldings((*msgs)[r]));
  }
  SS_RETURN_IF_ERROR(CheckAgreement(announced));
  std::random_device random;
  Digest id;
  for (uint64_t& word : id) word = uint64_t{random()} << 32 | random();
  return std::string(reinterpret_cast<const char*>(id.data()), sizeof id);
}

}  // namespace

Result<bool> PlansTogether(int world, uint64_t min_ranks) {
  if (min_ranks == 0) {
    SS_ASSIGN_OR_RETURN(const int64_t env,
                        EnvInteger("SHARDSAFE_DISTRIBUTED_PLAN_MIN_RANKS",
                                   kDefaultDistributedPlanMinRanks, 1, INT64_MAX));
    min_ranks = static_cast<uint64_t>(env);
  }
  return static_cast<uint64_t>(world) >= min_ranks;
}

Result<TogetherPlan> PlanTogether(Comm& comm, const std::string& layout,
                                  const std::string& agreement, const SavePlanOptions& options) {
  // This rank's holdings, from its own encoding of them: a failure here is
  // carried to every rank with the others.
  RankHoldings holdings;
  const Status decoded = DecodeLayout(layout, &holdings);
  auto msgs = GatherToRootOrFail(comm, 0, decoded, EncodeHoldings(EncodeLayout({}), agreement));
  Result<std::string> named = std::string();
  if (comm.rank() == 0) named = AgreeAndName(msgs);
  SS_ASSIGN_OR_RETURN(std::string id, BroadcastOrFail(comm, 0, named));
  TogetherPlan out;
  if (id.size() != sizeof out.id) return InternalError("a bad id of a distributed save plan");
  std::memcpy(out.id.data(), id.data(), sizeof out.id);
  std::unique_ptr<KeyHome> home;
  SS_ASSIGN_OR_RETURN(SavePlan part, PlanOverComm(comm, holdings, options, nullptr, &home));
  out.part = std::make_shared<const SavePlan>(std::move(part));
  std::string table_part;
  SS_ASSIGN_OR_RETURN(IndexSkeleton skeleton,
                      IndexOverComm(comm, *out.part, home.get(), &table_part));
  if (comm.rank() == 0) out.skeleton = std::make_shared<const IndexSkeleton>(std::move(skeleton));
  out.table_part = std::make_shared<const std::string>(std::move(table_part));
  return out;
}

Status WriteTablePart(const std::string& bytes, int rank, const SaveDirs& dirs, FileSystem& fs) {
  const std::string path = JoinPath(dirs.data, ChunkTableFileName(rank, dirs.file_suffix));
  return WriteSaveFile(fs, path, bytes).WithContext("writing " + path);
}

Result<std::vector<RankReport>> DecodeCompactReports(const std::vector<std::string>& msgs) {
  std::vector<RankReport> reports(msgs.size());
  for (size_t r = 0; r < msgs.size(); ++r) {
    ReportForm form;
    SS_ASSIGN_OR_RETURN(reports[r], DecodeReport(msgs[r], &form));
    if (!form.compact) return InternalError("a full save report in a save planned together");
  }
  return reports;
}

std::string EncodeTogetherMarker(const std::string& report, const std::string& replica_round) {
  wire::Writer w;
  w.Str(report);
  w.Str(replica_round);
  return w.Take();
}

Result<std::vector<RankReport>> ReadTogetherMarkers(const std::vector<std::string>& markers) {
  std::vector<std::string> reports(markers.size()), rounds(markers.size());
  for (size_t r = 0; r < markers.size(); ++r) {
    wire::Reader in(markers[r]);
    Result<std::string> report = in.Str();
    Result<std::string> round = report.ok() ? in.Str() : report;
    if (!round.ok() || !in.done()) {
      return InternalError("rank " + std::to_string(r) +
                           "'s completion marker is cut short or has bytes after its end");
    }
    reports[r] = std::move(*report);
    rounds[r] = std::move(*round);
  }
  SS_ASSIGN_OR_RETURN(std::vector<RankReport> decoded, DecodeCompactReports(reports));
  if (!DigestsAddUp(decoded)) SS_RETURN_IF_ERROR(CheckReplicaRounds(rounds));
  return decoded;
}

Result<std::string> CommitTogether(FileSystem& fs, const IndexSkeleton& skeleton,
                                   std::vector<RankReport> reports, const UserJson& json,
                                   const std::string& root, const std::string& tag,
                                   const SaveDirs& dirs, const CommitOptions& commit) {
  SS_ASSIGN_OR_RETURN(CheckpointIndex index,
                      IndexOfSave(skeleton, FilesByRank(std::move(reports)), json, tag,
                                  dirs.file_suffix));
  SS_ASSIGN_OR_RETURN(CommitIndex written, SerializeIndexToCommit(index, nullptr));
  std::vector<std::string> warnings;
  SS_RETURN_IF_ERROR(CommitSave(fs, dirs, root, index, written, commit, &warnings));
  std::string joined;
  for (const auto& w : warnings) joined += w + "\n";
  return joined;
}

}  // namespace shardsafe
