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

// The largest sequence a record may hold (docs/format.md §1): 2^53, which
// every JSON reader holds exactly, and which a root committing a million
// checkpoints a second would reach in 285 years. A record beyond it comes
// from no real commit; a root whose newest record holds it takes no more
// commits (NextCommitRecord fails; it never wraps).
inline constexpr uint64_t kMaxCommitSequence = uint64_t{1} << 53;

// The record to commit a checkpoint under `root` with: the next sequence
// after every trusted record's there (records ReadCommitRecord refuses take
// no part), and the time now. ResourceExhausted, naming the checkpoint, when
// that sequence would pass kMaxCommitSequence.
Result<CommitRecord> NextCommitRecord(FileSystem& fs, const std::string& root,
                                      std::optional<int64_t> step, bool moves_latest);
std::string SerializeCommitRecord(const CommitRecord& record);
// The record of the checkpoint in `dir`: nullopt when it has no commit.json
// (committed before records existed). DataLoss naming the file and the
// problem when its record cannot be trusted: a commit.json that is not a
// regular file (a directory, a FIFO, a dangling or outward symbolic link),
// cannot be read, exceeds 4 KiB, is not one JSON object with unique keys,
// or holds a field out of range (sequence an integer in [1,
// kMaxCommitSequence], time_ns an integer >= 0, step an integer >= 0,
// moved_latest a boolean).
Result<std::optional<CommitRecord>> ReadCommitRecord(FileSystem& fs, const std::string& dir);

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

// A root's committed checkpoints in commit order, as ListCheckpoints
// gives them (CheckpointInfo: those whose order is unknown last, by tag),
// with what decided the latest.
struct RootListing {
  std::vector<CheckpointInfo> checkpoints;
  // The tag `latest` holds when it is a valid tag (named checkpoint or not).
  std::optional<std::string> latest_pointer;
  // DataLoss when the latest cannot be told (no checkpoint is_latest then):
  // a checkpoint whose order is unknown might be newer than the one the
  // rules of docs/format.md §1 pick. Names it and why.
  Status latest_unknown;
};

// ListCheckpoints without taking the root's lock: call with it held (either
// mode), or the listing may miss a checkpoint being renamed meanwhile.
// Without `data_bytes`, CheckpointInfo::bytes is left 0 (no data file is
// stat'ed: what resolving `latest` and retention need, under the lock).
Result<RootListing> ListRoot(FileSystem& fs, const std::string& root, bool data_bytes);
Result<std::vector<CheckpointInfo>> ListCommitted(FileSystem& fs, const std::string& root,
                                                  bool data_bytes);

// The tag of the latest checkpoint (docs/format.md §1); nullopt if the root
// holds none. NotFound if `root` does not exist; DataLoss when it cannot be
// told (RootListing::latest_unknown). Call with the root's lock held (either
// mode).
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
// `root` (commit order) until `keep` of those whose order is known remain
// (keep >= 1, else InvalidArgument), but never the newest one, the one
// `latest` names (it counts among the `keep`), one a load is reading (it
// stays beside the `keep`, never in place of a newer one, until a later
// prune finds it unused), nor one whose order is unknown (CheckpointInfo::order_fault:
// kept and counted apart, with a warning naming it and why in `*warnings`
// when set); each is hidden by an atomic rename to a temporary name (on an
// object store: its index is deleted, which un-commits it). Returns them,
// claimed, with their tags in `*tags` when it is set.
Result<std::vector<ClaimedDir>> HideOldCheckpoints(FileSystem& fs, const std::string& root,
                                                   int keep,
                                                   std::vector<std::string>* tags = nullptr,
                                                   std::vector<std::string>* warnings = nullptr);

// HideOldCheckpoints under the root's lock, then deletes what it hid and
// the leftovers of interrupted saves (ClaimLeftovers). Returns the tags
// removed; the checkpoints kept for an unknown order are in `*warnings`.
Result<std::vector<std::string>> PruneCheckpoints(FileSystem& fs, const std::string& root,
                                                  int keep,
                                                  std::vector<std::string>* warnings = nullptr);

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

}  // namespace shardsafe
