// Shared reads: when several ranks on one machine read the same bytes of a
// checkpoint (a resharded load: saved Shard(0), loaded Shard(1), every rank
// wants a column slice of every row and reads each chunk whole, because its
// checksum covers the whole; or tensors every rank loads in full), they read
// those files through the page cache instead of with O_DIRECT, so that the
// disk reads each byte once and the other ranks copy it from memory. With
// O_DIRECT each rank would read it from the disk again.
//
// Protocol (collective; docs/design.md "Shared reads"): one AllGather in
// which each rank sends its machine key (host name and boot id) and the
// byte ranges its plan reads; each rank then counts, per data file, the
// bytes it reads that another rank of its machine reads too, and reads the
// file through the page cache when those are at least `min_bytes` and at
// least half of what it reads of the file.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "layout/load_planner.h"
#include "shardsafe/comm.h"

namespace shardsafe {

struct SharedReadsOptions {
  // Off: this rank reads alone (it still takes part in the collective).
  bool enabled = true;
  // Fewer shared bytes in a file than this are not worth the page cache
  // (a few replicated small tensors).
  uint64_t min_bytes = uint64_t{1} << 20;
  // Which machine this rank is on; empty: host name and boot id. Tests set
  // it to put ranks of one process on different machines.
  std::string machine;
};

struct SharedReadPlan {
  std::vector<bool> buffered;  // by data file index
  uint64_t bytes_shared = 0;   // in buffered files, bytes another rank reads too
};

// Collective. `plan` is null on a rank that has nothing to read or failed
// before planning (it shares nothing); `num_files` is the number of data
// files, the same on every rank. Only a failing Comm is an error.
Result<SharedReadPlan> PlanSharedReads(Comm& comm, const LoadPlan* plan, size_t num_files,
                                       const SharedReadsOptions& options);

}  // namespace shardsafe
