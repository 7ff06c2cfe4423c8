// Naming and discovery of checkpoints under a root directory
// (docs/format.md §1): tags, the `latest` pointer, committed checkpoints and
// leftovers of interrupted saves.
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "shardsafe/checkpoint.h"

namespace shardsafe {

inline constexpr std::string_view kLatestFileName = "latest";
inline constexpr std::string_view kTmpPrefix = ".tmp-";
inline constexpr std::string_view kCommitFileName = "commit.json";

// The step of a "step-N" tag; nullopt for other tags.
std::optional<int64_t> StepOfTag(std::string_view tag);

// A manager's tag format: a tag with one "{step}" or "{step:0Nd}" in it
// (docs/format.md §1), e.g. "step-{step:08d}", "global_step{step}".
class TagFormat {
 public:
  // InvalidArgument unless `format` has exactly one placeholder and makes
  // valid tags.
  static Result<TagFormat> Parse(std::string_view format);
  std::string Format(int64_t step) const;

 private:
  std::string prefix_, suffix_;
  int width_ = 0;
};

// The commit record, commit.json (docs/format.md §1): the commit order of
// the checkpoints of a root, and the step a manager saved.
struct CommitRecord {
  uint64_t sequence = 0;
  int64_t time_ns = 0;
  std::optional<int64_t> step;
  bool moved_latest = false;
};

// The record to commit a checkpoint under `root` with: the next sequence
// after every committed checkpoint's there, and the time now.
Result<CommitRecord> NextCommitRecord(FileSystem& fs, const std::string& root,
                                      std::optional<int64_t> step, bool moves_latest);
std::string SerializeCommitRecord(const CommitRecord& record);
// The record of the checkpoint in `dir`; nullopt if it has none (older
// checkpoints) or it cannot be parsed.
std::optional<CommitRecord> ReadCommitRecord(FileSystem& fs, const std::string& dir);

// True if `dir` is a committed checkpoint (has an index).
bool IsCommitted(FileSystem& fs, const std::string& dir);

// A file a save writes beside the index: a data file (*.safetensors), a
// chunk table or a part of one (*.chunks, docs/format.md §3a, §3c) or a
// checksum file (*.crc32c, §3b).
bool IsSavedFile(std::string_view name);
// In an object store, whether file `name` was written by the save whose
// files end with `suffix` (".NONCE"): data-R-F.NONCE.safetensors,
// checksums-R.NONCE.crc32c, chunks-R.NONCE.chunks (or, from version 3,
// shardsafe.NONCE.chunks).
bool WrittenBySave(std::string_view name, std::string_view suffix);

// ListCheckpoints without taking the root's lock: call with it held (either
// mode), or the listing may miss a checkpoint being renamed meanwhile.
// Without `data_bytes`, CheckpointInfo::bytes is left 0 (no data file is
// stat'ed: what resolving `latest` and retention need, under the lock).
Result<std::vector<CheckpointInfo>> ListCommitted(FileSystem& fs, const std::string& root,
                                                  bool data_bytes);

// The tag `latest` names if it is committed, else the newest committed
// checkpoint's tag by commit order (preferring those that moved `latest`);
// nullopt if the root holds none. NotFound if `root` does not exist. Call
// with the root's lock held (either mode).
Result<std::optional<std::string>> ResolveLatestTag(FileSystem& fs, const std::string& root);

// The lock on a root's names (docs/design.md, "Locks"): held exclusively
// while a process creates, renames or removes a name directly under `root`
// (a temporary directory or file, the commit rename, `latest`, retention),
// so that one process's cleanup never removes another's fresh temporary
// name and commit sequences stay unique; held shared while a reader lists
// the root (and resolves and pins its latest), so that it sees no rename
// half done. Held for directory operations only, never while data is
// written or deleted. Waits while a conflicting holder has it, up to
// kRootLockWait (then FailedPrecondition); null where the file system has
// no locks.
inline constexpr std::chrono::seconds kRootLockWait{300};
Result<std::unique_ptr<FileLock>> LockRoot(FileSystem& fs, const std::string& root,
                                           LockMode mode = LockMode::kExclusive);

// A directory to delete, held exclusively (null where the file system has
// no locks) so no other cleanup touches it, and removed outside the root's
// lock by RemoveClaimed.
struct ClaimedDir {
  std::string path;
  std::unique_ptr<FileLock> lock;
  std::unique_ptr<FileLock> index_lock;
};
Status RemoveClaimed(FileSystem& fs, std::vector<ClaimedDir> dirs);

// Claims `dir` for deletion: nullopt while it is in use, i.e. a save holds
// the directory or a load holds its index (FileSystem::TryLock).
std::optional<ClaimedDir> ClaimDir(FileSystem& fs, const std::string& dir);

// With the root locked: hides the oldest committed checkpoints under
// `root` (commit order) until `keep` remain (keep >= 1, else
// InvalidArgument), but never the newest one, the latest one, nor one a
// load is reading (it stays until a later prune finds it unused); each is
// hidden by an atomic rename to a temporary name (on an object store: its
// index is deleted, which un-commits it). Returns them, claimed,
// with their tags in `*tags` when it is set.
Result<std::vector<ClaimedDir>> HideOldCheckpoints(FileSystem& fs, const std::string& root,
                                                   int keep,
                                                   std::vector<std::string>* tags = nullptr);

// HideOldCheckpoints under the root's lock, then deletes what it hid and
// the leftovers of interrupted saves (ClaimLeftovers). Returns the tags
// removed.
Result<std::vector<std::string>> PruneCheckpoints(FileSystem& fs, const std::string& root,
                                                  int keep);

// With the root locked: removes `.latest.tmp.*` files left in `root` by
// interrupted saves and claims the `.tmp-*` directories nobody uses (a save
// in progress holds its own locked; ClaimDir). On an object store, where
// nothing is locked, it claims the `.tmp-*` prefixes and the tags without
// an index whose newest object is older than ObjectLeftoverAge().
std::vector<ClaimedDir> ClaimLeftovers(FileSystem& fs, const std::string& root);

// How old what a save left on an object store must be before another
// process takes it for a killed save's and removes it: 1 hour, or
// SHARDSAFE_S3_LEFTOVER_AGE seconds.
std::chrono::seconds ObjectLeftoverAge();

// ClaimLeftovers under the root's lock, then deletes what it claimed. Best
// effort: failures are returned but harmless.
Status CleanLeftovers(FileSystem& fs, const std::string& root);

}  // namespace shardsafe
