// Save: the collective protocol of commit.h, from the caller's state to a
// committed checkpoint. Every rank runs the same sequence of collectives
// whatever happens locally, so a failure anywhere reaches every rank.
//
// Every save runs these steps: Save and CheckpointManager (SaveToRoot) and
// AsyncSaver (async_save.cc), each planned on rank 0 or by all ranks
// together (distributed_save.h), onto POSIX or an object store (commit.h,
// object_store_commit.h). What differs is who plans (marked "planner":
// after step 1 every difference is a call of PlannedBy, planned_by.h,
// chosen once from the agreed plan) and how the reports reach rank 0 and
// the outcome the other ranks ("channel": collectives here, or an async
// save's marker files in async_save.cc).
//
//  0. Check (each rank, no collective): SaveOptions::local_failure, the
//     tag, the file system, the shards and blobs, the user JSON
//     (CheckLocalState). A failure rides in step 1's first collective.
//  1. Plan (collective, planner; GatherAndPlan): the quick check (one
//     AllReduceMax: every layout unchanged, the digests and the planner
//     agree) reuses the cached plan (plan_cache.h); otherwise rank 0
//     gathers every layout, plans and scatters each rank its part, or the
//     ranks plan together (PlanTogether: rounds 1-8, each home its part of
//     the chunk table, rank 0 an index skeleton). Touches no file.
//  2. Prepare (rank 0, commit.h step 1; PlanAndPrepare): PrepareSave
//     creates and locks ROOT/.tmp-TAG.NONCE (on an object store: picks the
//     data objects' suffix, writes `started`); one broadcast (SaveStart)
//     tells every rank where to write, whether reports are compact and
//     whether a chunk table is written.
//  3. Write (each rank; an async save copies into staging on the caller's
//     thread and writes from a background thread): its data files,
//     fdatasync'ed; its checksum file (chunk table saves); planner
//     together, a home's part of the chunk table; meanwhile the checksums
//     of the replicas it holds but does not write (replica_check.h).
//  4. Report (channel): collectives gather every rank's report (or
//     failure) on rank 0, and a second round brings the copies' checksums
//     when the replica digests do not add up; markers: each rank leaves
//     `done-RRRRR` (its report and copies) or `failed-RRRRR`, and rank 0
//     polls for them.
//  5. Commit (rank 0): the reports decoded (planner: ReadReports, or the
//     compact ones of a plan made together), the replicas checked, the
//     index made (planner: MakeIndex from the whole plan, or IndexOfSave
//     from the skeleton) and committed (CommitSave: commit.h steps 4-7).
//     A failure removes what the save wrote (AbandonSave).
//  6. Outcome (channel): collectives broadcast "committed" and the
//     warnings, or the failure; markers: rank 0 leaves `aborted` on
//     failure, the other ranks poll until the index appears, `aborted`
//     appears or the temporary directory vanishes.
//
// What a crash in each step leaves:
//  - 0-1: nothing; the other ranks fail in the collective (or their
//    Comm's timeout).
//  - 2-4: a .tmp-TAG.NONCE that readers ignore and the next save into the
//    root removes once nobody holds its lock (an object store: the
//    prefix and the data objects with the save's suffix, which no index
//    names, removed once older than ObjectLeftoverAge()); `latest` and
//    every committed checkpoint untouched. With markers, the waiting ranks
//    time out (SaveOptions::peer_timeout).
//  - 5: as commit.h says: before its rename (object store: the index's
//    conditional write) nothing is committed; after it the checkpoint is.
//  - 6: committed. Rank 0 reports success with a warning when the
//    broadcast fails; the other ranks return the broadcast's failure, or
//    (markers) find the index and succeed.
#include <algorithm>
#include <chrono>
#include <future>
#include <map>

#include "comm/agree.h"
#include "comm/wire.h"
#include "engine/catalog/checkpoint_dir.h"
#include "engine/save/commit.h"
#include "engine/save/distributed_save.h"
#include "engine/save/plan_cache.h"
#include "engine/save/plan_wire.h"
#include "engine/save/planned_by.h"
#include "engine/save/save_internal.h"
#include "engine/save/save_messages.h"
#include "engine/save/save_writer.h"
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
    Result<TmpDir> made = table.ok() ? PrepareSave(**fs, root, tag, options.overwrite)
                                     : Result<TmpDir>(table.status());
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
  return prepared;
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

namespace {

// Rank 0's answer to the step-4 reports, which it broadcasts: committed
// (then the warnings), or "send the copies' checksums" when the replica
// digests do not add up (replica_check.h).
constexpr char kCommitted = 'C';
constexpr char kSendCopies = 'R';

// Rank 0's side of steps 4-6 of a synchronous save: its answer
// to the reports, which it broadcasts. On failure what the save wrote is
// removed.
class LeaderAnswer {
 public:
  LeaderAnswer(FileSystem& fs, const SavePlan& plan, const PreparedSave& prepared,
               const std::string& root, const std::string& tag, Comm& comm,
               const CommitOptions& commit)
      : fs_(fs), plan_(plan), prepared_(prepared), root_(root), tag_(tag), comm_(comm),
        commit_(commit) {}

  // To every rank's report (or a rank's failure): the copies' checksums
  // asked for when the digests do not add up, else the outcome of steps 5-6.
  Result<std::string> ToReports(const Result<std::vector<std::string>>& msgs) {
    if (!msgs.ok()) {
      AbandonSave(fs_, prepared_.dirs);
      return msgs.status().WithContext("saving " + JoinPath(root_, tag_));
    }
    auto read = prepared_.planned->ReadReports(plan_, *msgs);
    if (!read.ok()) return Fail(read.status());
    reports_ = std::move(*read);
    if (!DigestsAddUp(reports_)) return std::string(1, kSendCopies);
    return Commit();
  }

  // To the second round: each rank's copies added to its report (and, in
  // a version-3 save, its chunks' checksums), then steps 5-6.
  Result<std::string> ToCopies(const Result<std::vector<std::string>>& msgs) {
    if (!msgs.ok()) return Fail(msgs.status());
    Status s = prepared_.planned->AddCopies(*msgs, &reports_);
    return s.ok() ? Commit() : Fail(s);
  }

 private:
  Result<std::string> Commit() {
    auto committed = prepared_.planned->Commit(fs_, plan_, std::move(reports_), prepared_.json,
                                               root_, tag_, prepared_.dirs, comm_.size(),
                                               prepared_.chunk_table, commit_);
    if (!committed.ok()) return Fail(committed.status());
    return kCommitted + *committed;
  }

  Status Fail(const Status& s) {
    AbandonSave(fs_, prepared_.dirs);
    return WithRank(comm_, 0, s).WithContext("committing " + JoinPath(root_, tag_));
  }

  FileSystem& fs_;
  const SavePlan& plan_;
  const PreparedSave& prepared_;
  const std::string& root_;
  const std::string& tag_;
  Comm& comm_;
  const CommitOptions& commit_;
  std::vector<RankReport> reports_;  // decoded, kept for the second round
};

}  // namespace

Result<SaveStats> SaveToRoot(const SaveState& state, const std::string& root,
                             const std::string& tag, Comm& comm, const SaveOptions& options,
                             CommitOptions commit) {
  const auto start = std::chrono::steady_clock::now();
  const bool leader = comm.rank() == 0;
  auto report = [&](std::string_view phase, uint64_t done, uint64_t total) {
    if (options.progress) options.progress({phase, done, total});
  };
  report("plan", 0, 0);
  SS_ASSIGN_OR_RETURN(PreparedSave prepared, PlanAndPrepare(state, root, tag, comm, options));
  FileSystem& fs = *prepared.fs;
  const SavePlan& plan = *prepared.plan;

  // Step 3: every rank writes its files, and checksums the replicas it
  // holds but does not write meanwhile.
  std::atomic<uint64_t> progress{0};
  auto copies = std::async(std::launch::async, [&] {
    return options.verify_replicas
               ? ChecksumCopies(plan, comm.rank(), state, options.device.get())
               : Result<HeldChecksums>(HeldChecksums());
  });
  auto written = WriteRankFiles(plan, comm.rank(), state, prepared.dirs, fs, options, &progress);
  if (written.ok() && prepared.chunk_table) {
    Status s = WriteChecksumFile(plan, comm.rank(), *written, prepared.dirs, fs);
    if (!s.ok()) written = s;
  }
  if (written.ok()) {
    Status s = prepared.planned->WriteExtras(comm.rank(), prepared.dirs, fs);
    if (!s.ok()) written = s;
  }
  auto checksums = copies.get();
  Status mine = written.ok() ? checksums.status() : written.status();

  // Step 4: rank 0 learns what every rank wrote and its replica digest, or
  // a failure; when the digests do not add up, a second round brings it
  // the copies' checksums (and in a version-3 save the chunks' checksums,
  // which the first left out). Then step 5 on rank 0, and everyone
  // learns the outcome and warnings. On failure nothing is committed.
  RankReport own, own_copies;
  if (mine.ok()) {
    own.files = std::move(*written);
    if (options.verify_replicas) {
      own.replica_digest = ReplicaDigest(plan, comm.rank(), *checksums, own.files);
    }
    own_copies.copies = std::move(checksums->copies);
    NumberAsWhole(plan, &own);
    NumberAsWhole(plan, &own_copies);
  }
  const ReportForm form{prepared.compact_reports, !prepared.chunk_table};
  auto msgs = GatherToRootOrFail(comm, 0, mine, mine.ok() ? EncodeReport(own, form) : std::string());
  report("commit", RankBytes(plan, comm.rank()), RankBytes(plan, comm.rank()));
  LeaderAnswer leader_answer(fs, plan, prepared, root, tag, comm, commit);
  Result<std::string> answer = std::string();
  if (leader) answer = leader_answer.ToReports(msgs);
  auto outcome = BroadcastOrFail(comm, 0, answer, /*name_root=*/false);
  if (outcome.ok() && *outcome == std::string(1, kSendCopies)) {
    if (prepared.chunk_table) own_copies.files = own.files;  // with their chunks' checksums
    auto more = GatherToRootOrFail(
        comm, 0, Status(),
        prepared.planned->EncodeCopies(plan, comm.rank(), own_copies, own.files));
    if (leader) answer = leader_answer.ToCopies(more);
    outcome = BroadcastOrFail(comm, 0, answer, /*name_root=*/false);
  }
  SaveStats stats = StatsOf(plan, comm.rank());
  stats.plan_reused = prepared.plan_reused;
  if (outcome.ok() && !outcome->empty() && (*outcome)[0] == kCommitted) {
    stats.warnings = SplitLines(outcome->substr(1));
  } else if (outcome.ok()) {
    return InternalError("unexpected answer from rank 0 to the save's reports");
  } else if (leader && answer.ok() && (*answer)[0] == kCommitted) {
    // Committed: the save succeeded, whatever happens after the commit.
    stats.warnings = SplitLines(answer->substr(1));
    stats.warnings.push_back("committed, but telling the other ranks failed: " +
                             outcome.status().message());
  } else {
    return outcome.status();
  }
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
