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

// The step of a "step-N" tag; nullopt for other tags.
std::optional<int64_t> StepOfTag(std::string_view tag);

// True if `dir` is a committed checkpoint (has an index).
bool IsCommitted(FileSystem& fs, const std::string& dir);

// The tag `latest` names if it is committed, else the newest committed
// checkpoint's tag; nullopt if the root holds none. NotFound if `root` does
// not exist.
Result<std::optional<std::string>> ResolveLatestTag(FileSystem& fs, const std::string& root);

// Removes `.tmp-*` directories and `.latest.tmp.*` files left in `root` by
// interrupted saves; a `.tmp-*` directory that another save holds locked
// (FileSystem::TryLock) is in use and stays. Best effort: failures are
// returned but harmless.
Status CleanLeftovers(FileSystem& fs, const std::string& root);

// Creates `path` and any missing parents.
Status CreateDirs(FileSystem& fs, const std::string& path);

// The last component of a path ("a/b/" -> "b").
std::string BaseName(std::string_view path);

}  // namespace shardsafe
