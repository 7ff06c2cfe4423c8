// Engine-internal entry points shared by Save, the manager and the CLI.
#pragma once

#include <string>

#include "shardsafe/checkpoint.h"

namespace shardsafe {

// Saves `state` as ROOT/TAG; when `update_latest`, points ROOT/latest at it.
Result<SaveStats> SaveToRoot(const SaveState& state, const std::string& root,
                             const std::string& tag, Comm& comm, const SaveOptions& options,
                             bool update_latest);

}  // namespace shardsafe
