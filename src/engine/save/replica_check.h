// Replicas are checked, not assumed. When several ranks hold the same slice
// of a tensor, the save writes it once (layout/save_planner.h); if the ranks'
// bytes differed (per-rank data passed under one key, e.g. ZeRO partitions
// or tensor-parallel shards passed as whole tensors), every copy but the
// writer's would be lost. So each holder that does not write a replicated
// chunk computes the CRC-32C of its copy (host copies read in place, device
// copies through the save's DeviceMemory in bounded pieces), sends it with
// its step-3 report, and rank 0 compares each with the checksum the writer
// computed while writing, before anything is committed. A mismatch fails
// the save on every rank, naming the tensor, the slice and two ranks.
// Cost: one CRC-32C pass over the replicated bytes a rank holds but does not
// write; SaveOptions::verify_replicas = false skips it.
#pragma once

#include <cstdint>
#include <vector>

#include "engine/save/save_writer.h"
#include "layout/save_planner.h"
#include "shardsafe/checkpoint.h"

namespace shardsafe {

// The checksum of one held copy of a replicated chunk.
struct CopyChecksum {
  uint32_t chunk = 0;  // index into SavePlan::chunks
  uint32_t crc32c = 0;
};

// Checksums of the copies `rank` holds but does not write (plan.copies).
// Device shards are read through `device`; an error names the tensor.
Result<std::vector<CopyChecksum>> ChecksumCopies(const SavePlan& plan, int rank,
                                                 const SaveState& state, DeviceMemory* device);

// Rank 0: compares every reported copy (by rank) with the chunk its writer
// wrote. InvalidArgument naming the tensor, the slice and both ranks.
Status CheckReplicas(const SavePlan& plan, const std::vector<std::vector<WrittenFile>>& written,
                     const std::vector<std::vector<CopyChecksum>>& copies);

}  // namespace shardsafe
