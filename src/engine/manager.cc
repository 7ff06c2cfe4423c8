// CheckpointManager: step-tagged checkpoints under one root, the `latest`
// pointer, and retention. Retention runs on rank 0 as the last step of a
// commit (engine/save/commit.h) and never removes the newest checkpoint nor
// the one `latest` names. With a memory tier (engine/tier/memory_tier.h)
// saves go to the tier's folder, a root of its own, and every
// persist_every-th is copied to the root in the background (Persister).
#include "comm/agree.h"
#include "engine/catalog/checkpoint_dir.h"
#include "engine/save/save_driver.h"
#include "engine/tier/memory_tier.h"
#include "engine/tier/persister.h"
#include "shardsafe/async_save.h"

namespace shardsafe {

CheckpointManager::CheckpointManager(std::string root, Options options)
    : root_(std::move(root)), options_(options) {
  if (options_.memory && options_.memory->dir.empty()) {
    options_.memory->dir = DefaultMemoryDir(root_);
  }
}

CheckpointManager::~CheckpointManager() {
  if (saver_) saver_->WaitForPending().IgnoreError();
  persister_.reset();  // waits for the persist in flight
}

Status CheckpointManager::CheckOptions(const std::string& root, const Options& options) {
  if (!options.memory) return Status();
  const MemoryTierOptions& m = *options.memory;
  if (m.keep_last < 1 || m.replicas < 0 || options.persist_every < 1) {
    return InvalidArgumentError("memory tier: keep_last (" + std::to_string(m.keep_last) +
                                ") and persist_every (" + std::to_string(options.persist_every) +
                                ") must be >= 1, replicas (" + std::to_string(m.replicas) +
                                ") >= 0");
  }
  if (root.rfind("s3://", 0) == 0) {
    return InvalidArgumentError("memory tier: persisting to an object store root (" + root +
                                ") is not supported; use a local root");
  }
  return Status();
}

std::string CheckpointManager::memory_dir() const {
  return options_.memory ? options_.memory->dir : "";
}

// Where a save of `step` commits: the memory tier (checked, on the first
// save, to be one folder that every rank shares) or the root.
Result<std::string> CheckpointManager::SaveRoot(int64_t step, Comm& comm) {
  if (step < 0) return InvalidArgumentError("step must be >= 0, got " + std::to_string(step));
  if (!options_.memory) return root_;
  SS_RETURN_IF_ERROR(CheckOptions(root_, options_));
  if (!tier_checked_) {
    SS_RETURN_IF_ERROR(CheckSharedFolder(comm, options_.memory->dir));
    tier_checked_ = true;
  }
  return options_.memory->dir;
}

// With a memory tier, after a save of `step` into it: every persist_every-th
// is copied to the root by rank 0 in the background, once `after` (an async
// save's handle; null: the save is committed) has committed.
void CheckpointManager::Persist(int64_t step, const std::string& tag, Comm& comm,
                                std::shared_ptr<AsyncSaveHandle> after) {
  if (!options_.memory || ++saves_since_persist_ < options_.persist_every) return;
  saves_since_persist_ = 0;
  if (comm.rank() != 0) return;
  if (!persister_) persister_ = std::make_unique<Persister>();
  persister_->Start(options_.fs, JoinPath(options_.memory->dir, tag), root_, tag,
                    CommitOptions{false, true, step, options_.keep_last}, std::move(after));
}

Result<std::shared_ptr<AsyncSaveHandle>> CheckpointManager::AsyncSave(int64_t step,
                                                                      const SaveState& state,
                                                                      Comm& comm,
                                                                      SaveOptions options) {
  SS_ASSIGN_OR_RETURN(const std::string root, SaveRoot(step, comm));
  if (!options.fs) options.fs = options_.fs;
  SS_ASSIGN_OR_RETURN(const std::string tag, TagOf(step));
  if (!saver_) saver_ = std::make_unique<AsyncSaver>();
  const int keep = options_.memory ? options_.memory->keep_last : options_.keep_last;
  SS_ASSIGN_OR_RETURN(std::shared_ptr<AsyncSaveHandle> handle,
                      saver_->Save(state, root, tag, comm, options, options.update_latest, keep,
                                   step));
  Persist(step, tag, comm, handle);
  return handle;
}

Status CheckpointManager::ReserveAsyncSave(const SaveState& state, Comm& comm,
                                           const SaveOptions& options) {
  if (!saver_) saver_ = std::make_unique<AsyncSaver>();
  return saver_->Reserve(state, comm, options);
}

size_t CheckpointManager::async_staging_bytes() const {
  return saver_ ? saver_->staging_bytes() : 0;
}

Status CheckpointManager::WaitForAsyncSave() {
  Status saved = saver_ ? saver_->WaitForPending() : Status();
  Status persisted = persister_ ? persister_->Wait() : Status();
  return saved.ok() ? persisted : saved;
}

Result<std::string> CheckpointManager::TagOf(int64_t step) const {
  SS_ASSIGN_OR_RETURN(TagFormat format, TagFormat::Parse(options_.tag_format));
  return format.Format(step);
}

Result<SaveStats> CheckpointManager::Save(int64_t step, const SaveState& state, Comm& comm,
                                          SaveOptions options) {
  SS_ASSIGN_OR_RETURN(const std::string root, SaveRoot(step, comm));
  if (!options.fs) options.fs = options_.fs;
  SS_ASSIGN_OR_RETURN(const std::string tag, TagOf(step));
  // Saves of one manager happen in order: an async save in flight first
  // finishes (a failure of it is its handle's to report).
  if (saver_) saver_->WaitForPending().IgnoreError();
  // Retention is step 7 of the commit, on rank 0: a failure there is a
  // warning, not a failed save.
  const int keep = options_.memory ? options_.memory->keep_last : options_.keep_last;
  SS_ASSIGN_OR_RETURN(SaveStats stats,
                      SaveToRoot(state, root, tag, comm, options,
                                 CommitOptions{options.overwrite, options.update_latest, step,
                                               keep}));
  Persist(step, tag, comm, nullptr);
  return stats;
}

Result<std::optional<int64_t>> CheckpointManager::LatestStep() {
  SS_ASSIGN_OR_RETURN(std::optional<int64_t> latest, LatestStepOf(options_.fs, root_));
  if (!options_.memory) return latest;
  SS_ASSIGN_OR_RETURN(std::optional<int64_t> memory,
                      LatestStepOf(options_.fs, options_.memory->dir));
  return memory && (!latest || *memory > *latest) ? memory : latest;
}

Result<std::vector<TierCopy>> CheckpointManager::LoadOrder(std::optional<int64_t> step,
                                                           Comm& comm) {
  if (!options_.memory) {
    std::string path = root_;
    if (step) {
      SS_ASSIGN_OR_RETURN(const std::string tag, TagOf(*step));
      path = JoinPath(root_, tag);
    }
    return std::vector<TierCopy>{TierCopy{kRootTier, path, step.value_or(-1)}};
  }
  Result<std::string> order = [&]() -> Result<std::string> {
    if (comm.rank() != 0) return std::string();
    SS_ASSIGN_OR_RETURN(std::vector<TierListing> tiers,
                        ListTiers(options_.fs, options_.memory->dir, root_));
    SS_ASSIGN_OR_RETURN(std::vector<TierCopy> copies, OrderCopies(tiers, step));
    return EncodeCopies(copies);
  }();
  SS_ASSIGN_OR_RETURN(std::string agreed, BroadcastOrFail(comm, 0, order, /*name_root=*/false));
  return DecodeCopies(agreed);
}

Result<LoadResult> CheckpointManager::Load(const LoadRequest& request, std::optional<int64_t> step,
                                           Comm& comm, LoadOptions options) {
  if (!options.fs) options.fs = options_.fs;
  SS_RETURN_IF_ERROR(CheckOptions(root_, options_));
  SS_ASSIGN_OR_RETURN(std::vector<TierCopy> copies, LoadOrder(step, comm));
  std::vector<std::string> warnings;
  for (size_t i = 0; i < copies.size(); ++i) {
    const TierCopy& c = copies[i];
    Result<LoadResult> r = shardsafe::Load(request, c.path, comm, options);
    if (r.ok()) {
      if (c.step != copies[0].step) {
        warnings.push_back("step " + std::to_string(copies[0].step) +
                           " could not be loaded from any tier; loaded step " +
                           std::to_string(c.step) + ", the newest that could");
      }
      if (options_.memory) r->step = c.step;
      r->bytes_by_tier = {{c.tier, r->bytes_read}};
      r->warnings = std::move(warnings);
      return r;
    }
    if (!CopyIsBroken(r.status()) || i + 1 == copies.size()) return r.status();
    warnings.push_back(c.tier + " copy of step " + std::to_string(c.step) + " (" + c.path +
                       ") passed over: " + r.status().ToString());
  }
  return NotFoundError(root_ + ": no checkpoint to load");
}

Result<std::vector<CheckpointInfo>> CheckpointManager::List() {
  if (!options_.memory) return ListCheckpoints(root_, options_.fs);
  SS_ASSIGN_OR_RETURN(std::vector<TierListing> tiers,
                        ListTiers(options_.fs, options_.memory->dir, root_));
  return MergeListings(tiers);
}

Result<std::vector<std::string>> CheckpointManager::Prune(int keep,
                                                         std::vector<std::string>* warnings) {
  SS_ASSIGN_OR_RETURN(FileSystem * fs, FileSystemFor(root_, options_.fs));
  return PruneCheckpoints(*fs, root_, keep, warnings);
}

}  // namespace shardsafe
