// AsyncSaver: the save driver (save_driver.h) with step 3 split between
// the caller's thread and a background thread, and the reports sent
// through marker files (MarkerReports), since the background enters no
// collective.
//
// Foreground (collective, on the caller's thread):
//   a. wait for this saver's previous save (a failure of it is its handle's
//      to report);
//   b. steps 0-2: plan and create the temporary directory (PlanAndPrepare);
//   c. copy this rank's file images (header + chunks + blobs) into the
//      staging arena, computing each entry's CRC-32C during the copy;
//      shards on a device are copied by SaveOptions::device meanwhile (its
//      DMA into the arena, which it may have page-locked); then checksum
//      the replicas it holds but does not write.
// Background (no collectives; started before c, so the first writes overlap
// the rest of the copy):
//   d. write the images from staging (O_DIRECT, in place, several requests
//      in flight) as far as c has staged them, fdatasync each file; at the
//      same time, once c is over, checksum what the device copied (so the
//      caller does not wait for that);
//   e. steps 3 (the rest) to 6 (ReportAndCommit over MarkerReports): each
//      rank leaves `done-RRRRR` or `failed-RRRRR`; rank 0 waits for all,
//      commits (index, rename, `latest`, retention) or leaves `aborted`;
//      the other ranks wait for the committed index or `aborted`.
//
// Crash analysis: before rank 0 commits, everything lives in
// .tmp-TAG.NONCE, which readers ignore and the next save removes; the
// commit is the same rename as a synchronous save's, with the same
// guarantees after it.
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
#include "engine/save/save_driver.h"
#include "engine/save/save_messages.h"
#include "engine/save/save_writer.h"
#include "engine/save/staging.h"

namespace shardsafe {
namespace {

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
  PreparedSave save;  // steps 0-2; rank 0's lock keeps other saves' cleanup away
  int rank = 0, world = 1;
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
  FileSystem& fs = *job.save.fs;
  const StagedFile& f = job.files[index];
  const PlannedFile& planned = job.save.plan->files[f.plan_file];
  const SaveDirs& dirs = job.save.dirs;
  const std::string path =
      JoinPath(dirs.data, DataFileName(planned.rank, planned.number, dirs.file_suffix));
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
  FillReports(*job.save.plan, job);
  return Status();
}

// The whole background part for one rank, started while the foreground
// copy runs: step d, then steps 3-6 (ReportAndCommit over markers). A
// failure of the copy still goes through the markers, so that rank 0
// aborts and nobody waits for this rank. Returns the warnings (rank 0's).
Result<std::vector<std::string>> RunBackground(Job& job) {
  Status staged = WriteAllStaged(job);
  // The files' reports are filled in once the foreground is over
  // (WriteAllStaged waited for it when OK), and so are the held checksums.
  Result<std::vector<WrittenFile>> written = std::vector<WrittenFile>();
  if (staged.ok()) {
    for (const StagedFile& f : job.files) written->push_back(f.report);
  } else {
    written = staged;
  }
  auto channel = MarkerReports(job.save, job.rank, job.world, job.options.verify_replicas,
                               job.options.peer_timeout);
  return ReportAndCommit(job.save, job.rank, job.world, *channel, std::move(written), job.held,
                         job.commit);
}

// The background thread's whole work: RunBackground, then `handle`
// finished with its outcome and statistics.
void RunJob(const std::shared_ptr<Job>& job, Handle& handle) {
  LowerThreadPriority();
  Result<std::vector<std::string>> warnings = RunBackground(*job);
  // The foreground may still be copying after a write failed: the job (its
  // pieces) and the arena stay in use until the copy is over.
  job->progress->WaitFinished().IgnoreError();
  SaveStats stats = StatsOf(*job->save.plan, job->rank);
  stats.plan_reused = job->save.plan_reused;
  if (warnings.ok()) stats.warnings = std::move(*warnings);
  stats.seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - job->start).count();
  handle.Finish(warnings.status(), std::move(stats));
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
  // Step c, second half (the foreground): the staging copy, then the
  // checksums of the replicas this rank holds but does not write.
  Status CopyAndChecksum(Job& job, const SaveState& state, const SaveOptions& options,
                         const std::vector<DeviceMemory::Copy>& device_copies);
  StagingArena staging_;
  std::thread worker_;
  std::shared_ptr<Handle> pending_;
};

Status AsyncSaver::Impl::CopyAndChecksum(Job& job, const SaveState& state,
                                         const SaveOptions& options,
                                         const std::vector<DeviceMemory::Copy>& device_copies) {
  Status copied;
  try {
    copied = staging_.Copy(&job, options.device.get(), device_copies);
  } catch (const std::bad_alloc&) {
    copied = ResourceExhaustedError("no memory for the staging copy's task list");
  }
  // The caller may change its tensors once this call returns: the replicas
  // it does not write are checksummed now.
  if (copied.ok() && options.verify_replicas) {
    auto held = ChecksumCopies(*job.save.plan, job.rank, state, options.device.get());
    if (held.ok()) job.held = std::move(*held);
    else copied = held.status();
  }
  return copied;
}

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
  job->save = std::move(prepared);
  job->options = options;
  job->options.device.reset();  // the background copies nothing from the device
  job->commit = CommitOptions{.update_latest = update_latest, .step = step, .keep_last = keep_last};
  job->start = start;
  auto handle = std::make_shared<Handle>();
  pending_ = handle;
  worker_ = std::thread([job, handle] { RunJob(job, *handle); });
  // c, second half, while the background writes what is staged.
  if (laid_out.ok()) job->progress->Finish(CopyAndChecksum(*job, state, options, device_copies));
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
