// Steps 0-2 of every save (save_driver.h): the local checks, the plan the
// ranks agree on (reused, made on rank 0 or made together) and the
// temporary directory rank 0 creates for it.
#include <algorithm>

#include "comm/agree.h"
#include "engine/save/distributed_save.h"
#include "engine/save/plan_cache.h"
#include "engine/save/plan_wire.h"
#include "engine/save/save_driver.h"
#include "layout/plan_part.h"

namespace shardsafe {
namespace {

// A name with a NUL byte would be cut short wherever it becomes a C string.
Status CheckName(const char* kind, const std::string& name) {
  if (name.find('\0') == std::string::npos) return Status();
  std::string shown = name;
  std::replace(shown.begin(), shown.end(), '\0', '?');
  return InvalidArgumentError(std::string(kind) + " \"" + shown + "\": the name holds a NUL byte");
}

Status CheckShards(const SaveState& state, const SaveOptions& options) {
  for (const TensorShard& t : state.tensors) {
    SS_RETURN_IF_ERROR(CheckName("tensor", t.key));
    if (t.data == nullptr && t.slice.NumElements() > 0) {
      return InvalidArgumentError("tensor \"" + t.key + "\": null data pointer");
    }
    if (t.on_device && options.device == nullptr) {
      return InvalidArgumentError("tensor \"" + t.key +
                                  "\" is on a device, but no SaveOptions::device copies it");
    }
  }
  for (const BlobRef& b : state.blobs) {
    SS_RETURN_IF_ERROR(CheckName("blob", b.name));
    if (b.data == nullptr && b.size > 0) {
      return InvalidArgumentError("blob \"" + b.name + "\": null data pointer");
    }
  }
  return Status();
}

}  // namespace

Status CheckLocalState(const SaveState& state, const SaveOptions& options, UserJson* json) {
  SS_RETURN_IF_ERROR(options.local_failure);
  SS_RETURN_IF_ERROR(CheckShards(state, options));
  SS_ASSIGN_OR_RETURN(*json, ParseUserJson(state));
  return Status();
}

namespace {

// The first round of GatherAndPlan (plan_cache.h), one AllReduceMax:
// whether this rank's layout is the one its cached plan was made with, that
// plan's digest, a digest of what the ranks must agree on and whether the
// rank plans together, each but the first also complemented, so that the
// maximum of both tells whether all ranks sent the same.
std::vector<uint64_t> QuickCheck(const std::optional<CachedPlan>& cached,
                                 const Digest& agreement, bool together) {
  const Digest plan = cached ? cached->digest : Digest{};
  const uint64_t t = together ? 1 : 0;
  return {cached ? 0u : 1u, plan[0],  plan[1],  agreement[0],  agreement[1],  t,
          ~plan[0],         ~plan[1], ~agreement[0], ~agreement[1], ~t};
}
constexpr size_t kQuickWords = 5;  // after the first, each complemented after them

// Whether every rank sent the same word `i` of QuickCheck.
bool AllSent(const std::vector<uint64_t>& max, size_t i) {
  return max[i] == ~max[i + kQuickWords];
}

// True when every rank's layout is unchanged and the digests agree, from
// the maximum of every rank's QuickCheck.
bool AllUnchanged(const std::vector<uint64_t>& max) {
  if (max.size() != 1 + 2 * kQuickWords || max[0] != 0) return false;
  for (size_t i = 1; i <= kQuickWords; ++i) {
    if (!AllSent(max, i)) return false;
  }
  return true;
}

// The digest of a plan's input: every rank's layout, the world size and the
// planner's options.
Digest PlanDigest(const std::vector<std::string_view>& layouts, const SavePlanOptions& options) {
  std::vector<std::string_view> parts = layouts;
  const uint64_t header[] = {layouts.size(), options.max_file_bytes, options.min_split_bytes};
  parts.emplace_back(reinterpret_cast<const char*>(header), sizeof header);
  return DigestOf(parts);
}

// On rank 0: the whole plan of the gathered announcements, and the digest
// of their layouts (plan_cache.h). Each message is freed once decoded.
Result<SavePlan> PlanOnLeader(std::vector<std::string> msgs, const SavePlanOptions& options,
                              Digest* digest) {
  std::vector<std::string_view> layouts(msgs.size());
  for (size_t r = 0; r < msgs.size(); ++r) {
    SS_ASSIGN_OR_RETURN(layouts[r], LayoutOf(msgs[r]));
  }
  *digest = PlanDigest(layouts, options);
  layouts.clear();
  std::vector<Announcement> announced(msgs.size());
  for (size_t r = 0; r < msgs.size(); ++r) {
    SS_ASSIGN_OR_RETURN(announced[r], DecodeHoldings(msgs[r]));
    std::string().swap(msgs[r]);
  }
  SS_RETURN_IF_ERROR(CheckAgreement(announced));
  std::vector<RankHoldings> holdings(announced.size());
  for (size_t r = 0; r < announced.size(); ++r) holdings[r] = std::move(announced[r].holdings);
  announced.clear();
  return PlanSave(holdings, options);
}

// Each rank's part of `whole`, encoded; rank 0 keeps the whole plan.
std::vector<std::string> PartMessages(const SavePlan& whole, const Digest& digest) {
  std::vector<std::string> parts(whole.bytes_per_rank.size());
  const PlanPartInfo totals = PlanTotals(whole);
  for (size_t r = 1; r < parts.size(); ++r) {
    parts[r] = EncodePlanMessage(PartOfPlan(whole, static_cast<int>(r), totals), digest);
  }
  return parts;
}

}  // namespace

Result<AgreedPlan> GatherAndPlan(const SaveState& state, const std::string& destination,
                                 Comm& comm, const SaveOptions& options, const Status& local,
                                 const UserJson& json, bool together) {
  const SavePlanOptions plan_options{options.max_file_bytes};
  std::string layout = EncodeLayout(state);
  const std::string agreement = EncodeAgreement(destination, json.fingerprints);
  std::optional<CachedPlan> cached = LookUpPlan(comm);
  if (cached && (cached->layout != layout || cached->together != together ||
                 cached->options.max_file_bytes != plan_options.max_file_bytes ||
                 cached->options.min_split_bytes != plan_options.min_split_bytes)) {
    cached.reset();
  }
  SS_ASSIGN_OR_RETURN(
      auto checks,
      ReduceMaxOrFail(comm, local, QuickCheck(cached, DigestOf({agreement}), together)));
  if (!AllSent(checks, kQuickWords)) {
    return InvalidArgumentError(
        "ranks disagree on whether the save is planned by all ranks together (every rank "
        "must pass the same SaveOptions::distributed_plan_min_ranks and see the same "
        "SHARDSAFE_DISTRIBUTED_PLAN_MIN_RANKS)");
  }
  if (AllUnchanged(checks)) {
    return AgreedPlan{cached->plan,     true, cached->layouts, cached->together,
                      cached->skeleton, cached->table_part};
  }
  if (together) {
    SS_ASSIGN_OR_RETURN(TogetherPlan made,
                        PlanTogether(comm, layout, agreement, plan_options));
    StorePlan(comm, CachedPlan{std::move(layout), plan_options, made.id, true, made.part,
                               made.skeleton, made.table_part, nullptr});
    return AgreedPlan{made.part, false, nullptr, true, made.skeleton, made.table_part};
  }

  // Rank 0 gathers every rank's layout, plans and sends each rank its part
  // of the plan; a rank's cost is its own part, rank 0's the whole job's.
  // Whatever fails, every rank goes on into the scatter, which carries
  // rank 0's failure to all.
  auto msgs = GatherToRootOrFail(comm, 0, Status(), EncodeHoldings(layout, agreement));
  std::shared_ptr<const SavePlan> plan;
  Digest digest{};
  Result<std::vector<std::string>> parts = std::vector<std::string>();
  if (comm.rank() == 0) {
    Result<SavePlan> whole = msgs.ok() ? PlanOnLeader(std::move(*msgs), plan_options, &digest)
                                       : Result<SavePlan>(msgs.status());
    if (whole.ok()) plan = std::make_shared<const SavePlan>(std::move(*whole));
    parts = whole.ok() ? PartMessages(*plan, digest) : Result<std::vector<std::string>>(whole.status());
  }
  SS_ASSIGN_OR_RETURN(std::string mine, ScatterOrFail(comm, 0, std::move(parts)));
  if (comm.rank() != 0) {
    SS_ASSIGN_OR_RETURN(PlanMessage received, DecodePlanMessage(mine));
    plan = std::make_shared<const SavePlan>(std::move(received.plan));
    digest = received.digest;
  }
  auto layouts = std::make_shared<FileLayouts>();
  StorePlan(comm, CachedPlan{std::move(layout), plan_options, digest, false, plan, nullptr,
                             nullptr, layouts});
  return AgreedPlan{std::move(plan), false, std::move(layouts)};
}

namespace {

// Rank 0, before anything is created: the data files of a save planned
// here (the whole plan: its bytes per rank) must fit under `root`
// (CheckFreeSpace). A plan in parts (planned together) is not checked.
Status CheckPlanFits(FileSystem& fs, const std::string& root, const SavePlan& plan) {
  if (plan.bytes_per_rank.empty()) return Status();
  uint64_t needed = 0;
  for (uint64_t b : plan.bytes_per_rank) needed += b;
  return CheckFreeSpace(fs, root, needed);
}

}  // namespace

Result<PreparedSave> PlanAndPrepare(const SaveState& state, const std::string& root,
                                    const std::string& tag, Comm& comm,
                                    const SaveOptions& options) {
  Result<FileSystem*> fs = FileSystemFor(root, options.fs);
  PreparedSave prepared;
  Status local = fs.status();
  if (local.ok()) local = ValidateTag(tag);
  if (local.ok()) local = CheckLocalState(state, options, &prepared.json);
  Result<bool> together = PlansTogether(comm.size(), options.distributed_plan_min_ranks);
  if (local.ok()) local = together.status();
  SS_ASSIGN_OR_RETURN(AgreedPlan agreed,
                      GatherAndPlan(state, JoinPath(root, tag), comm, options, local,
                                    prepared.json, together.ok() && *together));
  prepared.plan = std::move(agreed.plan);
  prepared.plan_reused = agreed.reused;
  prepared.planned = agreed.together
                         ? PlannedTogether(std::move(agreed.skeleton), std::move(agreed.table_part))
                         : PlannedOnRankZero(std::move(agreed.layouts));
  // Step 2, once every rank has agreed (nothing is created before): rank 0
  // prepares the temporary directory; everyone learns where to write.
  Result<std::string> dirs = std::string();
  if (comm.rank() == 0) {
    Result<bool> table =
        prepared.planned->WritesTable(*prepared.plan, options.chunk_table_min_chunks);
    Status fits = table.ok() ? CheckPlanFits(**fs, root, *prepared.plan) : table.status();
    Result<TmpDir> made = fits.ok() ? PrepareSave(**fs, root, tag, options.overwrite)
                                    : Result<TmpDir>(fits);
    const bool compact = prepared.planned->CompactReports();
    dirs = made.ok() ? Result<std::string>(EncodeSaveStart({made->dirs, compact, *table}))
                     : Result<std::string>(made.status());
    if (made.ok()) prepared.lock = std::move(made->lock);
  }
  SS_ASSIGN_OR_RETURN(std::string sent, BroadcastOrFail(comm, 0, dirs));
  SS_ASSIGN_OR_RETURN(SaveStart start, DecodeSaveStart(sent));
  prepared.dirs = std::move(start.dirs);
  prepared.compact_reports = start.compact_reports;
  prepared.chunk_table = start.chunk_table;
  prepared.fs = *fs;  // found: GatherAndPlan failed every rank otherwise
  prepared.root = root;
  prepared.tag = tag;
  return prepared;
}

}  // namespace shardsafe
