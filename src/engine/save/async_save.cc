// AsyncSaver: the save protocol of commit.h with steps 2-6 moved to a
// background thread and the step-3 collective replaced by files.
//
// Foreground (collective, on the caller's thread):
//   a. wait for this saver's previous save (a failure of it is its handle's
//      to report);
//   b. plan and create the temporary directory (PlanAndPrepare);
//   c. copy this rank's file images (header + chunks + blobs) into the
//      staging arena, computing each entry's CRC-32C during the copy;
//      shards on a device are copied by SaveOptions::device meanwhile (its
//      DMA into the arena, which it may have page-locked).
// Background (no collectives; started before c, so the first writes overlap
// the rest of the copy):
//   d. write the images from staging (O_DIRECT, in place, several requests
//      in flight) as far as c has staged them, fdatasync each file; at the
//      same time, once c is over, checksum what the device copied (so the
//      caller does not wait for that);
//   e. leave a marker in the temporary directory: `done-RRRRR` holding this
//      rank's report (offsets and checksums; planned together, its compact
//      report and replica round, and each home writes its part of the
//      chunk table before), or `failed-RRRRR` with the error; markers
//      appear atomically (temporary file + rename);
//   f. rank 0 waits for all markers. All done: it removes them, commits
//      (index, rename, `latest`) and applies retention. Any failed (or a
//      timeout): it writes `aborted` and commits nothing;
//   g. ranks other than 0 wait until the committed index appears (success),
//      or `aborted` appears or the temporary directory vanishes (failure).
//
// Crash analysis: before f commits, everything lives in .tmp-TAG.NONCE,
// which readers ignore and the next save removes; f's commit is the same
// rename as a synchronous save's, with the same guarantees after it.
#include "shardsafe/async_save.h"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "base/crc32c.h"
#include "base/thread_pool.h"
#include "comm/wire.h"
#include "engine/catalog/checkpoint_dir.h"
#include "engine/save/distributed_save.h"
#include "engine/save/planned_by.h"
#include "engine/save/replica_check.h"
#include "engine/save/save_internal.h"
#include "engine/save/save_messages.h"
#include "engine/save/save_writer.h"
#include "engine/save/staging.h"

namespace shardsafe {
namespace {

constexpr std::string_view kAbortedMarker = "aborted";

// The writer follows the staging copy in steps of this many bytes of a file
// (a multiple of the 4 KiB O_DIRECT alignment).
constexpr uint64_t kWriteStep = uint64_t{32} << 20;

// The background thread (and the I/O threads it starts, which inherit its
// nice value) yields the CPU to training: it mostly waits on the disk, and
// the compute loop must not slow down. Best effort: failure changes nothing.
void LowerThreadPriority() {
  constexpr int kBackgroundNice = 10;
  errno = 0;
  const int current = getpriority(PRIO_PROCESS, static_cast<id_t>(gettid()));
  if (errno == 0 && current < kBackgroundNice) {
    setpriority(PRIO_PROCESS, static_cast<id_t>(gettid()), kBackgroundNice);
  }
}

std::string RankMarker(std::string_view prefix, int rank) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.*s%05d", static_cast<int>(prefix.size()), prefix.data(), rank);
  return buf;
}

class Handle final : public AsyncSaveHandle {
 public:
  bool Done() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return done_;
  }
  Result<SaveStats> Wait() override {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [this] { return done_; });
    if (!status_.ok()) return status_;
    return stats_;
  }
  double blocked_seconds() const override { return blocked_; }
  // Set by the foreground before the caller sees the handle.
  void set_blocked_seconds(double seconds) { blocked_ = seconds; }
  void Finish(Status status, SaveStats stats) {
    std::lock_guard<std::mutex> lock(mu_);
    status_ = std::move(status);
    stats_ = std::move(stats);
    done_ = true;
    cv_.notify_all();
  }

 private:
  double blocked_ = 0;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  Status status_;
  SaveStats stats_;
};

// Everything the background thread needs; owned by it. The staged images
// (staging.h) are filled by the foreground copy while the background
// writes them.
struct Job : StagedImages {
  std::shared_ptr<const SavePlan> plan;
  bool plan_reused = false;
  bool chunk_table = false;  // version 3: a checksum file (SaveStart)
  std::shared_ptr<PlannedBy> planned;  // who planned it (planned_by.h)
  std::string root, tag;
  SaveDirs dirs;
  FileSystem* fs = nullptr;            // where root lies (FileSystemFor)
  std::shared_ptr<FileLock> tmp_lock;  // rank 0: keeps other saves' cleanup away
  int rank = 0, world = 1;
  UserJson json;  // for rank 0's index
  // Checksums of the replicas this rank holds but does not write, and
  // their digest, computed by the foreground before it finishes `progress`
  // (replica_check.h).
  HeldChecksums held;
  SaveOptions options;
  CommitOptions commit;
  std::chrono::steady_clock::time_point start;
};

// Step d for file `index`, as far as the copy has staged it at each step.
Status WriteStaged(const Job& job, size_t index) {
  FileSystem& fs = *job.fs;
  const StagedFile& f = job.files[index];
  const PlannedFile& planned = job.plan->files[f.plan_file];
  const std::string path = JoinPath(
      job.dirs.data, DataFileName(planned.rank, planned.number, job.dirs.file_suffix));
  SS_ASSIGN_OR_RETURN(auto out, fs.NewWritableFile(path, DataFileOptions(job.options, f.size)));
  for (uint64_t done = 0; done < f.size;) {
    const uint64_t next = std::min(f.size, done + kWriteStep);
    SS_RETURN_IF_ERROR(job.progress->WaitFor(index, next));
    SS_RETURN_IF_ERROR(out->AppendStable(job.arena + f.offset + done, next - done));
    done = next;
  }
  SS_RETURN_IF_ERROR(out->Sync());
  return out->Close();
}

// Step d for every file and the device pieces' checksums, then the copy's
// outcome; once OK, the files' reports are filled in.
Status WriteAllStaged(Job& job) {
  if (!job.files.empty()) {
    ThreadPool pool(std::min<size_t>(std::max(job.options.io_threads, 1), job.files.size()));
    TaskGroup group(&pool);
    for (size_t i = 0; i < job.files.size(); ++i) {
      group.Add([&job, i] { return WriteStaged(job, i); });
    }
    Status checksummed = ChecksumDevicePieces(job);
    SS_RETURN_IF_ERROR(group.Wait());
    SS_RETURN_IF_ERROR(checksummed);
  }
  SS_RETURN_IF_ERROR(job.progress->WaitFinished());
  FillReports(*job.plan, job);
  return Status();
}

// Polls until `ready` returns a value (an optional Status or Result), with
// a growing pause; Unavailable once the peer timeout has passed.
template <typename Fn>
auto PollUntil(const Job& job, std::string_view waiting_for, Fn ready) ->
    typename decltype(ready())::value_type {
  auto pause = std::chrono::milliseconds(1);
  const auto deadline = std::chrono::steady_clock::now() + job.options.peer_timeout;
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

// A commit that failed once every rank was done: the other ranks learn why
// from the `aborted` marker, which stays (with the directory, until the next
// save removes it as a leftover) while the data files go now.
void AbortKeepingTheReason(FileSystem& fs, const SaveDirs& dirs, const Status& why) {
  if (!WriteStatusMarker(fs, JoinPath(dirs.tmp, kAbortedMarker), why).ok()) {
    AbandonSave(fs, dirs);  // they will see it vanish
    return;
  }
  if (!dirs.file_suffix.empty()) AbandonSave(fs, SaveDirs{"", dirs.data, dirs.file_suffix});
  auto entries = fs.ListDir(dirs.tmp);
  if (!entries.ok()) return;
  for (const DirEntry& e : *entries) {
    if (e.name != kAbortedMarker) fs.RemoveAll(JoinPath(dirs.tmp, e.name)).IgnoreError();
  }
}

// Step f, waiting part: every rank's report, or the first failure.
Result<std::vector<std::string>> GatherMarkers(const Job& job) {
  FileSystem& fs = *job.fs;
  std::vector<std::string> reports(job.world);
  std::vector<bool> seen(job.world, false);
  using R = std::optional<Result<std::vector<std::string>>>;
  return PollUntil(job, "the other ranks' completion markers", [&]() -> R {
    if (!fs.Stat(job.dirs.tmp).ok()) {
      return R(UnavailableError("temporary directory " + job.dirs.tmp + " vanished"));
    }
    for (int r = 0; r < job.world; ++r) {
      if (seen[r]) continue;
      auto failed = ReadFileToString(fs, JoinPath(job.dirs.tmp, RankMarker("failed-", r)), 1 << 20);
      if (failed.ok()) return R(StatusFromMarker(*failed, "rank " + std::to_string(r)));
      auto done = ReadFileToString(fs, JoinPath(job.dirs.tmp, RankMarker("done-", r)), uint64_t{1} << 30);
      if (!done.ok()) return std::nullopt;
      reports[r] = std::move(*done);
      seen[r] = true;
    }
    return R(reports);
  });
}

// Steps f (rank 0): commit when every rank is done, else leave `aborted`.
Result<std::vector<std::string>> CommitWhenAllDone(const Job& job) {
  FileSystem& fs = *job.fs;
  auto reports = GatherMarkers(job);
  if (!reports.ok()) {
    WriteStatusMarker(fs, JoinPath(job.dirs.tmp, kAbortedMarker), reports.status()).IgnoreError();
    return reports.status();
  }
  for (int r = 0; r < job.world; ++r) {
    SS_RETURN_IF_ERROR(fs.RemoveFile(JoinPath(job.dirs.tmp, RankMarker("done-", r))));
  }
  auto read = job.planned->ReadMarkers(*job.plan, *reports);
  Result<std::string> committed =
      read.ok() ? job.planned->Commit(fs, *job.plan, std::move(*read), job.json, job.root,
                                      job.tag, job.dirs, job.world, job.chunk_table, job.commit)
                : Result<std::string>(read.status());
  if (!committed.ok()) {
    AbortKeepingTheReason(fs, job.dirs, committed.status());
    return committed.status();
  }
  return SplitLines(*committed);
}

// Step g (ranks other than 0).
Status AwaitCommit(const Job& job) {
  FileSystem& fs = *job.fs;
  const std::string index = JoinPath(JoinPath(job.root, job.tag), "shardsafe.json");
  using R = std::optional<Status>;
  return PollUntil(job, "rank 0 to commit", [&]() -> R {
    if (fs.Stat(index).ok()) return R(Status());
    auto aborted = ReadFileToString(fs, JoinPath(job.dirs.tmp, kAbortedMarker), 1 << 20);
    if (aborted.ok()) return R(StatusFromMarker(*aborted, "save aborted by rank 0"));
    if (!fs.Stat(job.dirs.tmp).ok() && !fs.Stat(index).ok()) {
      return R(UnavailableError("save abandoned by rank 0 (its commit failed)"));
    }
    return std::nullopt;
  });
}

// Step e: the `done` marker of `report` (this rank's files, as written)
// and the job's copies' checksums (PlannedBy::EncodeMarker). Only once the
// foreground is over (job.held is its last write).
std::string Marker(const Job& job, RankReport report) {
  return job.planned->EncodeMarker(*job.plan, job.rank, std::move(report), job.held,
                                   job.options.verify_replicas);
}

// The whole background part for one rank, started while the foreground
// copy runs. A failure of that copy still goes through the markers, so that
// rank 0 aborts and nobody waits for this rank.
Status RunBackground(Job& job, std::vector<std::string>* warnings) {
  FileSystem& fs = *job.fs;
  Status written = WriteAllStaged(job);
  // The files' reports are filled in once the foreground is over
  // (WriteAllStaged waited for it when OK).
  RankReport report;
  if (written.ok()) {
    for (const StagedFile& f : job.files) report.files.push_back(f.report);
  }
  if (written.ok() && job.chunk_table) {
    written = WriteChecksumFile(*job.plan, job.rank, report.files, job.dirs, fs);
  }
  if (written.ok()) written = job.planned->WriteExtras(job.rank, job.dirs, fs);
  if (written.ok()) {
    written = WriteFileAtomically(fs, JoinPath(job.dirs.tmp, RankMarker("done-", job.rank)),
                                  Marker(job, std::move(report)));
  }
  if (!written.ok()) {
    if (job.rank == 0) {  // nothing to wait for: tell the others and stop
      WriteStatusMarker(fs, JoinPath(job.dirs.tmp, kAbortedMarker), written).IgnoreError();
      return written;
    }
    WriteStatusMarker(fs, JoinPath(job.dirs.tmp, RankMarker("failed-", job.rank)), written)
        .IgnoreError();
    return written;
  }
  if (job.rank != 0) return AwaitCommit(job);
  SS_ASSIGN_OR_RETURN(*warnings, CommitWhenAllDone(job));
  return written;
}

}  // namespace

class AsyncSaver::Impl {
 public:
  Impl() = default;
  ~Impl() { WaitForPending().IgnoreError(); }

  Result<std::shared_ptr<AsyncSaveHandle>> Save(const SaveState& state, const std::string& root,
                                                const std::string& tag, Comm& comm,
                                                const SaveOptions& options, bool update_latest,
                                                int keep_last, std::optional<int64_t> step);

  Status Reserve(const SaveState& state, Comm& comm, const SaveOptions& options);

  Status WaitForPending() {
    if (worker_.joinable()) worker_.join();
    if (!pending_) return Status();
    auto result = pending_->Wait();
    pending_.reset();
    return result.status();
  }

  size_t staging_bytes() const { return staging_.capacity(); }

 private:
  // Step a: waits for the save in flight. Its failure is its handle's to
  // report: this call goes ahead (and its prepare step removes what the
  // failed save left).
  void WaitForPrevious() { WaitForPending().IgnoreError(); }
  StagingArena staging_;
  std::thread worker_;
  std::shared_ptr<Handle> pending_;
};

Result<std::shared_ptr<AsyncSaveHandle>> AsyncSaver::Impl::Save(
    const SaveState& state, const std::string& root, const std::string& tag, Comm& comm,
    const SaveOptions& options, bool update_latest, int keep_last,
    std::optional<int64_t> step) {
  const auto start = std::chrono::steady_clock::now();
  if (options.overwrite) return InvalidArgumentError("async save cannot overwrite a checkpoint");
  // a. The previous save's failure fails this call on every rank. b.
  WaitForPrevious();
  SS_ASSIGN_OR_RETURN(PreparedSave prepared, PlanAndPrepare(state, root, tag, comm, options));
  // The job is shared: the foreground stages and checksums (c) while the
  // background writes (d), whichever ends first.
  auto job = std::make_shared<Job>();
  job->rank = comm.rank();
  job->world = comm.size();
  job->json = std::move(prepared.json);
  job->progress = std::make_shared<StagingProgress>();
  // c, first half; a failure is reported through the background (markers).
  std::vector<DeviceMemory::Copy> device_copies;
  Status laid_out;
  try {
    laid_out = staging_.LayOut(*prepared.plan, job->rank, state, options, job.get(),
                               &device_copies);
  } catch (const std::bad_alloc&) {
    laid_out = ResourceExhaustedError("no memory for the staging copy of this rank's data");
  }
  if (!laid_out.ok()) {
    job->files.clear();  // nothing to write
    job->progress->Finish(laid_out);
  }
  job->plan = std::move(prepared.plan);
  job->plan_reused = prepared.plan_reused;
  job->chunk_table = prepared.chunk_table;
  job->planned = std::move(prepared.planned);
  job->root = root;
  job->tag = tag;
  job->dirs = std::move(prepared.dirs);
  job->fs = prepared.fs;
  job->tmp_lock = std::move(prepared.lock);
  job->options = options;
  job->options.device.reset();  // the background copies nothing from the device
  job->commit = CommitOptions{.update_latest = update_latest, .step = step, .keep_last = keep_last};
  job->start = start;
  auto handle = std::make_shared<Handle>();
  pending_ = handle;
  worker_ = std::thread([job, handle] {
    LowerThreadPriority();
    std::vector<std::string> warnings;
    Status s = RunBackground(*job, &warnings);
    // The foreground may still be copying after a write failed: the job
    // (its pieces) and the arena stay in use until the copy is over.
    job->progress->WaitFinished().IgnoreError();
    SaveStats stats = StatsOf(*job->plan, job->rank);
    stats.plan_reused = job->plan_reused;
    stats.warnings = std::move(warnings);
    stats.seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - job->start).count();
    handle->Finish(s.WithContext("saving " + JoinPath(job->root, job->tag)), std::move(stats));
  });
  // c, second half, while the background writes what is staged.
  if (laid_out.ok()) {
    Status copied;
    try {
      copied = staging_.Copy(job.get(), options.device.get(), device_copies);
    } catch (const std::bad_alloc&) {
      copied = ResourceExhaustedError("no memory for the staging copy's task list");
    }
    // The caller may change its tensors once this call returns: the
    // replicas it does not write are checksummed now.
    if (copied.ok() && options.verify_replicas) {
      auto held = ChecksumCopies(*job->plan, job->rank, state, options.device.get());
      if (held.ok()) job->held = std::move(*held);
      else copied = held.status();
    }
    job->progress->Finish(std::move(copied));
  }
  handle->set_blocked_seconds(
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  return std::shared_ptr<AsyncSaveHandle>(handle);
}

Status AsyncSaver::Impl::Reserve(const SaveState& state, Comm& comm,
                                 const SaveOptions& options) {
  // A tag no save uses: a rank calling Save meanwhile fails the planning.
  WaitForPrevious();
  UserJson json;
  Status local = CheckLocalState(state, options, &json);
  const Result<bool> together = PlansTogether(comm.size(), options.distributed_plan_min_ranks);
  if (local.ok()) local = together.status();
  SS_ASSIGN_OR_RETURN(AgreedPlan agreed,
                      GatherAndPlan(state, "(staging reservation)", comm, options, local, json,
                                    together.ok() && *together));
  const SavePlan& plan = *agreed.plan;
  std::vector<StagedFile> files;
  std::vector<FileImage> images;
  SS_ASSIGN_OR_RETURN(uint64_t total, DescribeStaged(plan, comm.rank(), state,
                                                     options.device.get(), &files, &images));
  try {
    staging_.Grow(total, state, options);
  } catch (const std::bad_alloc&) {
    return ResourceExhaustedError("no memory for " + std::to_string(total) +
                                  " bytes of async save staging");
  }
  return Status();
}

AsyncSaver::AsyncSaver() : impl_(std::make_unique<Impl>()) {}
AsyncSaver::~AsyncSaver() = default;

Result<std::shared_ptr<AsyncSaveHandle>> AsyncSaver::Save(const SaveState& state,
                                                          const std::string& root,
                                                          const std::string& tag, Comm& comm,
                                                          const SaveOptions& options,
                                                          bool update_latest, int keep_last,
                                                          std::optional<int64_t> step) {
  return impl_->Save(state, root, tag, comm, options, update_latest, keep_last, step);
}

Status AsyncSaver::Reserve(const SaveState& state, Comm& comm, const SaveOptions& options) {
  return impl_->Reserve(state, comm, options);
}

Status AsyncSaver::WaitForPending() { return impl_->WaitForPending(); }

size_t AsyncSaver::staging_bytes() const { return impl_->staging_bytes(); }

}  // namespace shardsafe
