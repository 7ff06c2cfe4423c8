// Naming and discovery of checkpoints under a root directory
// (docs/format.md §1): tags, the `latest` pointer, committed checkpoints and
// leftovers of interrupted saves.
#pragma once

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

// The tag `latest` names if it is committed, else the newest committed
// checkpoint's tag by commit order (preferring those that moved `latest`);
// nullopt if the root holds none. NotFound if `root` does not exist.
Result<std::optional<std::string>> ResolveLatestTag(FileSystem& fs, const std::string& root);

// Removes the oldest committed checkpoints under `root` (commit order)
// until `keep` remain (keep >= 1, else InvalidArgument), but never the
// newest one nor the latest one. Each is hidden by an atomic rename before
// it is deleted. Returns the tags removed.
Result<std::vector<std::string>> PruneCheckpoints(FileSystem& fs, const std::string& root,
                                                  int keep);

// Removes `.tmp-*` directories and `.latest.tmp.*` files left in `root` by
// interrupted saves; a `.tmp-*` directory that another save holds locked
// (FileSystem::TryLock) is in use and stays. Best effort: failures are
// returned but harmless.
Status CleanLeftovers(FileSystem& fs, const std::string& root);

}  // namespace shardsafe
