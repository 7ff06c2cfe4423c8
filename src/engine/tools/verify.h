// Offline checks of a checkpoint (the engine behind `shardsafe verify`):
// every data file present with its recorded size and a valid safetensors
// header naming each chunk where the index says it is, every chunk's and
// blob's checksum, every tensor fully covered.
#pragma once

#include <string>
#include <vector>

#include "shardsafe/checkpoint.h"

namespace shardsafe {

struct VerifyReport {
  std::string path;  // what was verified
  bool native = false;
  std::vector<std::string> faults;  // one line each, naming file and tensor
  uint64_t files = 0;
  uint64_t tensors = 0;
  uint64_t chunks_verified = 0;  // checksums computed and matching
  uint64_t bytes_checked = 0;
  bool ok() const { return faults.empty(); }
};

// Checks everything at `path` (any source Load accepts). A checkpoint that
// cannot be opened at all yields a report with that one fault. Errors only
// for invalid arguments.
VerifyReport VerifyCheckpoint(const std::string& path, FileSystem* fs = nullptr,
                              int io_threads = 4, const ProgressFn& progress = nullptr);

}  // namespace shardsafe
