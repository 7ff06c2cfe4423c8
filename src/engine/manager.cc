// CheckpointManager: step-tagged checkpoints under one root, the `latest`
// pointer, and retention. Retention runs on rank 0 as the last step of a
// commit (engine/save/commit.h) and never removes the newest checkpoint nor
// the one `latest` names.
#include "engine/catalog/checkpoint_dir.h"
#include "engine/save/save_driver.h"
#include "shardsafe/async_save.h"

namespace shardsafe {

CheckpointManager::CheckpointManager(std::string root, Options options)
    : root_(std::move(root)), options_(options) {}

CheckpointManager::~CheckpointManager() = default;

Result<std::shared_ptr<AsyncSaveHandle>> CheckpointManager::AsyncSave(int64_t step,
                                                                      const SaveState& state,
                                                                      Comm& comm,
                                                                      SaveOptions options) {
  if (step < 0) return InvalidArgumentError("step must be >= 0, got " + std::to_string(step));
  if (!options.fs) options.fs = options_.fs;
  SS_ASSIGN_OR_RETURN(const std::string tag, TagOf(step));
  if (!saver_) saver_ = std::make_unique<AsyncSaver>();
  return saver_->Save(state, root_, tag, comm, options, options.update_latest,
                      options_.keep_last, step);
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
  return saver_ ? saver_->WaitForPending() : Status();
}

Result<std::string> CheckpointManager::TagOf(int64_t step) const {
  SS_ASSIGN_OR_RETURN(TagFormat format, TagFormat::Parse(options_.tag_format));
  return format.Format(step);
}

Result<SaveStats> CheckpointManager::Save(int64_t step, const SaveState& state, Comm& comm,
                                          SaveOptions options) {
  if (step < 0) return InvalidArgumentError("step must be >= 0, got " + std::to_string(step));
  if (!options.fs) options.fs = options_.fs;
  SS_ASSIGN_OR_RETURN(const std::string tag, TagOf(step));
  // Saves of one manager happen in order: an async save in flight first
  // finishes (a failure of it is its handle's to report).
  WaitForAsyncSave().IgnoreError();
  // Retention is step 7 of the commit, on rank 0: a failure there is a
  // warning, not a failed save.
  return SaveToRoot(state, root_, tag, comm, options,
                    CommitOptions{options.overwrite, options.update_latest, step,
                                  options_.keep_last});
}

Result<std::optional<int64_t>> CheckpointManager::LatestStep() {
  SS_ASSIGN_OR_RETURN(FileSystem * fs, FileSystemFor(root_, options_.fs));
  if (!fs->Stat(root_).ok()) return std::optional<int64_t>();
  auto shared = LockRoot(*fs, root_, LockMode::kShared);  // as ListCheckpoints
  if (!shared.ok() && shared.status().code() != StatusCode::kNotFound) return shared.status();
  SS_ASSIGN_OR_RETURN(RootListing listing, ListRoot(*fs, root_, /*data_bytes=*/false));
  SS_RETURN_IF_ERROR(listing.latest_unknown);
  for (const CheckpointInfo& c : listing.checkpoints) {
    if (c.is_latest) return c.step;
  }
  return std::optional<int64_t>();
}

Result<LoadResult> CheckpointManager::Load(const LoadRequest& request, std::optional<int64_t> step,
                                           Comm& comm, LoadOptions options) {
  if (!options.fs) options.fs = options_.fs;
  std::string path = root_;
  if (step) {
    SS_ASSIGN_OR_RETURN(const std::string tag, TagOf(*step));
    path = JoinPath(root_, tag);
  }
  return shardsafe::Load(request, path, comm, options);
}

Result<std::vector<CheckpointInfo>> CheckpointManager::List() {
  return ListCheckpoints(root_, options_.fs);
}

Result<std::vector<std::string>> CheckpointManager::Prune(int keep,
                                                         std::vector<std::string>* warnings) {
  SS_ASSIGN_OR_RETURN(FileSystem * fs, FileSystemFor(root_, options_.fs));
  return PruneCheckpoints(*fs, root_, keep, warnings);
}

}  // namespace shardsafe
