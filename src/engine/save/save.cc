// Save: the collective protocol of commit.h, from the caller's state to a
// committed checkpoint. Every rank runs the same sequence of collectives
// whatever happens locally, so a failure anywhere reaches every rank.
#include <algorithm>
#include <chrono>
#include <future>
#include <map>

#include "comm/agree.h"
#include "comm/wire.h"
#include "engine/catalog/checkpoint_dir.h"
#include "engine/save/commit.h"
#include "engine/save/plan_cache.h"
#include "engine/save/plan_wire.h"
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

// Every rank saves to the same place, and every global value a rank passes
// is rank 0's (values are saved once, from rank 0: a value that differs, or
// that rank 0 lacks, would be lost).
Status CheckAgreement(const std::vector<Announcement>& announced) {
  const Announcement& first = announced[0];
  std::map<std::string_view, uint64_t> values(first.values.begin(), first.values.end());
  for (size_t r = 1; r < announced.size(); ++r) {
    const std::string rank = std::to_string(r);
    if (announced[r].destination != first.destination) {
      return InvalidArgumentError("ranks disagree on the checkpoint: rank 0 saves to \"" +
                                  first.destination + "\", rank " + rank + " to \"" +
                                  announced[r].destination + "\"");
    }
    for (const auto& [key, fingerprint] : announced[r].values) {
      auto it = values.find(key);
      if (it == values.end()) {
        return InvalidArgumentError("value \"" + key + "\" is passed by rank " + rank +
                                    " but not by rank 0 (global values are saved once, from "
                                    "rank 0; save values that differ by rank per rank)");
      }
      if (it->second != fingerprint) {
        return InvalidArgumentError("value \"" + key + "\" differs between ranks 0 and " + rank +
                                    " (global values are saved once, from rank 0; save values "
                                    "that differ by rank per rank)");
      }
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
// plan's digest and a digest of what the ranks must agree on, each digest
// also complemented, so that the maximum of both tells whether all ranks
// sent the same.
std::vector<uint64_t> QuickCheck(const std::optional<CachedPlan>& cached,
                                 const Digest& agreement) {
  const Digest plan = cached ? cached->digest : Digest{};
  return {cached ? 0u : 1u, plan[0],  plan[1],  agreement[0],  agreement[1],
          ~plan[0],         ~plan[1], ~agreement[0], ~agreement[1]};
}

// True when every rank's layout is unchanged and the digests agree, from
// the maximum of every rank's QuickCheck.
bool AllUnchanged(const std::vector<uint64_t>& max) {
  if (max.size() != 9 || max[0] != 0) return false;
  for (size_t i = 1; i < 5; ++i) {
    if (max[i] != ~max[i + 4]) return false;
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
// of their layouts (plan_cache.h).
Result<SavePlan> PlanOnLeader(const std::vector<std::string>& msgs,
                              const SavePlanOptions& options, Digest* digest) {
  std::vector<Announcement> announced(msgs.size());
  std::vector<std::string_view> layouts(msgs.size());
  for (size_t r = 0; r < msgs.size(); ++r) {
    SS_ASSIGN_OR_RETURN(announced[r], DecodeHoldings(msgs[r]));
    SS_ASSIGN_OR_RETURN(layouts[r], LayoutOf(msgs[r]));
  }
  SS_RETURN_IF_ERROR(CheckAgreement(announced));
  std::vector<RankHoldings> holdings(announced.size());
  for (size_t r = 0; r < announced.size(); ++r) holdings[r] = std::move(announced[r].holdings);
  *digest = PlanDigest(layouts, options);
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
                                 const UserJson& json) {
  const SavePlanOptions plan_options{options.max_file_bytes};
  std::string layout = EncodeLayout(state);
  const std::string agreement = EncodeAgreement(destination, json.fingerprints);
  std::optional<CachedPlan> cached = LookUpPlan(comm);
  if (cached && (cached->layout != layout ||
                 cached->options.max_file_bytes != plan_options.max_file_bytes ||
                 cached->options.min_split_bytes != plan_options.min_split_bytes)) {
    cached.reset();
  }
  SS_ASSIGN_OR_RETURN(auto checks,
                      ReduceMaxOrFail(comm, local, QuickCheck(cached, DigestOf({agreement}))));
  if (AllUnchanged(checks)) return AgreedPlan{cached->plan, true, cached->layouts};

  // Rank 0 gathers every rank's layout, plans and sends each rank its part
  // of the plan; a rank's cost is its own part, rank 0's the whole job's.
  // Whatever fails, every rank goes on into the scatter, which carries
  // rank 0's failure to all.
  auto msgs = GatherToRootOrFail(comm, 0, Status(), EncodeHoldings(layout, agreement));
  std::shared_ptr<const SavePlan> plan;
  Digest digest{};
  Result<std::vector<std::string>> parts = std::vector<std::string>();
  if (comm.rank() == 0) {
    Result<SavePlan> whole =
        msgs.ok() ? PlanOnLeader(*msgs, plan_options, &digest) : Result<SavePlan>(msgs.status());
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
  StorePlan(comm, CachedPlan{std::move(layout), plan_options, digest, plan, layouts});
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
  SS_ASSIGN_OR_RETURN(AgreedPlan agreed, GatherAndPlan(state, JoinPath(root, tag), comm, options,
                                                       local, prepared.json));
  prepared.plan = std::move(agreed.plan);
  prepared.plan_reused = agreed.reused;
  prepared.layouts = std::move(agreed.layouts);
  // Step 1, once every rank has agreed (nothing is created before): rank 0
  // prepares the temporary directory; everyone learns where to write.
  Result<std::string> dirs = std::string();
  if (comm.rank() == 0) {
    Result<TmpDir> made = PrepareSave(**fs, root, tag, options.overwrite);
    dirs = made.ok() ? Result<std::string>(EncodeSaveStart({made->dirs, prepared.layouts &&
                                                                         prepared.layouts->ready()}))
                     : Result<std::string>(made.status());
    if (made.ok()) prepared.lock = std::move(made->lock);
  }
  SS_ASSIGN_OR_RETURN(std::string sent, BroadcastOrFail(comm, 0, dirs));
  SS_ASSIGN_OR_RETURN(SaveStart start, DecodeSaveStart(sent));
  prepared.dirs = std::move(start.dirs);
  prepared.compact_reports = start.compact_reports;
  prepared.fs = *fs;  // found: GatherAndPlan failed every rank otherwise
  return prepared;
}

namespace {

// Rank `rank`'s step-3 report; a compact one completed from `layouts` and
// the plan (a mismatch makes `layouts` forget, so the next save reports
// in full).
Result<RankReport> ReadReport(std::string_view msg, const SavePlan& plan, int rank,
                              FileLayouts* layouts, bool* compact) {
  SS_ASSIGN_OR_RETURN(RankReport report, DecodeReport(msg, compact));
  if (!*compact) return report;
  Status s = layouts ? layouts->Fill(&report.files)
                     : InternalError("compact save report without layouts");
  if (s.ok()) s = NumberCopies(plan, rank, &report.copies);
  if (!s.ok()) {
    if (layouts) layouts->Forget();
    return s;
  }
  return report;
}

}  // namespace

Result<std::string> CommitOnLeader(FileSystem& fs, const SavePlan& plan,
                                   const std::vector<std::string>& reports, const UserJson& json,
                                   const std::string& root, const std::string& tag,
                                   const SaveDirs& dirs, int world_size,
                                   const CommitOptions& commit, FileLayouts* layouts) {
  std::vector<std::vector<WrittenFile>> by_rank(reports.size());
  std::vector<std::vector<CopyChecksum>> copies(reports.size());
  Status s;
  bool all_full = true;
  for (size_t r = 0; r < reports.size() && s.ok(); ++r) {
    bool compact = false;
    auto report = ReadReport(reports[r], plan, static_cast<int>(r), layouts, &compact);
    s = report.status();
    if (!report.ok()) break;
    by_rank[r] = std::move(report->files);
    copies[r] = std::move(report->copies);
    all_full = all_full && !compact;
  }
  if (s.ok() && all_full && layouts) layouts->Keep(plan, by_rank);
  if (s.ok()) s = CheckReplicas(plan, by_rank, copies);
  auto index =
      s.ok() ? BuildIndex(plan, by_rank, json, tag, world_size, dirs.file_suffix)
             : Result<CheckpointIndex>(s);
  std::vector<std::string> warnings;
  s = index.ok() ? CommitSave(fs, dirs, root, *index, commit, &warnings)
                 : index.status();
  if (!s.ok()) return s;
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

Result<SaveStats> SaveToRoot(const SaveState& state, const std::string& root,
                             const std::string& tag, Comm& comm, const SaveOptions& options,
                             CommitOptions commit) {
  commit.chunk_table_min_chunks = options.chunk_table_min_chunks;
  const auto start = std::chrono::steady_clock::now();
  const bool leader = comm.rank() == 0;
  auto report = [&](std::string_view phase, uint64_t done, uint64_t total) {
    if (options.progress) options.progress({phase, done, total});
  };
  report("plan", 0, 0);
  SS_ASSIGN_OR_RETURN(PreparedSave prepared, PlanAndPrepare(state, root, tag, comm, options));
  FileSystem& fs = *prepared.fs;
  const SavePlan& plan = *prepared.plan;
  const SaveDirs& dirs = prepared.dirs;

  // Step 2: every rank writes its files, and checksums the replicas it
  // holds but does not write meanwhile.
  std::atomic<uint64_t> progress{0};
  auto copies = std::async(std::launch::async, [&] {
    return options.verify_replicas
               ? ChecksumCopies(plan, comm.rank(), state, options.device.get())
               : Result<std::vector<CopyChecksum>>(std::vector<CopyChecksum>());
  });
  auto written = WriteRankFiles(plan, comm.rank(), state, dirs, fs, options, &progress);
  auto checksums = copies.get();
  Status mine = written.ok() ? checksums.status() : written.status();

  // Step 3: rank 0 learns what every rank wrote, or a failure; then steps
  // 4-6 on rank 0, and everyone learns the outcome and warnings. On
  // failure nothing is committed.
  const std::string path = JoinPath(root, tag);
  RankReport own;
  if (mine.ok()) {
    own = {std::move(*written), std::move(*checksums)};
    NumberAsWhole(plan, &own);
  }
  auto reports = GatherToRootOrFail(
      comm, 0, mine, mine.ok() ? EncodeReport(own, prepared.compact_reports) : std::string());
  report("commit", RankBytes(plan, comm.rank()), RankBytes(plan, comm.rank()));
  Result<std::string> committed = std::string();
  if (leader) {
    committed = !reports.ok() ? reports.status().WithContext("saving " + path)
                              : CommitOnLeader(fs, plan, *reports, prepared.json, root, tag,
                                               dirs, comm.size(), commit, prepared.layouts.get());
    if (reports.ok() && !committed.ok()) {
      committed = WithRank(comm, 0, committed.status()).WithContext("committing " + path);
    }
    if (!committed.ok()) AbandonSave(fs, dirs);
  }
  auto outcome = BroadcastOrFail(comm, 0, committed, /*name_root=*/false);
  SaveStats stats = StatsOf(plan, comm.rank());
  stats.plan_reused = prepared.plan_reused;
  if (outcome.ok()) {
    stats.warnings = SplitLines(*outcome);
  } else if (leader && committed.ok()) {
    // Committed: the save succeeded, whatever happens after the commit.
    stats.warnings = SplitLines(*committed);
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
