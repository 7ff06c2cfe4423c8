// Shared reads: when several ranks on one machine read the same bytes of a
// checkpoint (a resharded load: saved Shard(0), loaded Shard(1), every rank
// wants a column slice of every row and reads each chunk whole, because its
// checksum covers the whole; or tensors every rank loads in full), the disk
// should read those bytes once, not once per rank.
//
// Protocol (collective; docs/design.md "Shared reads"): one AllGather in
// which each rank sends its machine key (host name and boot id) and the
// byte ranges its plan reads. A rank shares a data file when the bytes it
// reads of it that another rank of its machine reads too are at least
// `min_bytes` and at least half of what it reads of the file. Every rank
// computes the same assignment for every machine: a file that two or more
// ranks of a machine share is read once by one of them (its producer, the
// files spread over the ranks) into a shared-memory ring the others copy
// from (engine/shared_reads/shared_ring.h, engine/shared_reads/ring_reads.h). If the rings cannot be
// set up, shared files are read through the page cache instead.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "layout/load_planner.h"
#include "shardsafe/comm.h"

namespace shardsafe {

// A block of a data file that travels through a ring.
struct RingBlock {
  uint32_t file = 0;
  uint64_t offset = 0;
  uint64_t length = 0;
};

// A ring, as every rank that takes part in it knows it.
struct RingRole {
  int producer = -1;              // the rank that reads the blocks
  std::string name;               // shared memory name
  std::vector<RingBlock> blocks;  // in order: by file, then offset
  uint32_t consumers = 0;         // ranks that copy from it (the producer too)
  uint32_t consumer = 0;          // this rank's index among them
  uint32_t slots = 0;
  uint64_t slot_bytes = 0;
};

struct SharedReadsOptions {
  // Off: this rank reads alone (it still takes part in the collective).
  bool enabled = true;
  // Fewer shared bytes in a file than this are not worth the page cache
  // (a few replicated small tensors).
  uint64_t min_bytes = uint64_t{1} << 20;
  // Which machine this rank is on; empty: host name and boot id. Tests set
  // it to put ranks of one process on different machines.
  std::string machine;
  // Rings: no. Shared files are then read through the page cache.
  bool rings = true;
  uint64_t ring_slot_bytes = uint64_t{8} << 20;  // the most per block
  uint32_t ring_slots = 8;
};

struct SharedReadPlan {
  // By data file index: this rank shares the file. It reads it from its
  // ring when `ring_of_file` names one and the rings are set up, else
  // through the page cache.
  std::vector<bool> buffered;
  uint64_t bytes_shared = 0;  // in shared files, bytes another rank reads too
  // Some machine has a ring: SetUpRings is collective on every rank.
  bool rings_anywhere = false;
  std::vector<RingRole> rings;     // rings this rank produces or consumes
  std::vector<int> ring_of_file;   // by data file: index into `rings`, or -1
  int produced = -1;               // index into `rings` of the one it fills
};

// Collective. `plan` is null on a rank that has nothing to read or failed
// before planning (it shares nothing); `file_sizes` has one entry per data
// file, the same on every rank. Only a failing Comm is an error.
Result<SharedReadPlan> PlanSharedReads(Comm& comm, const LoadPlan* plan,
                                       const std::vector<uint64_t>& file_sizes,
                                       const SharedReadsOptions& options);

}  // namespace shardsafe
