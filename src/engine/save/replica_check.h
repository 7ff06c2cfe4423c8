// Replicas are checked, not assumed. When several ranks hold the same slice
// of a tensor, the save writes it once (layout/save_planner.h); if the ranks'
// bytes differed (per-rank data passed under one key, e.g. ZeRO partitions
// or tensor-parallel shards passed as whole tensors), every copy but the
// writer's would be lost. So each holder that does not write a replicated
// chunk computes the CRC-32C of its copy (host copies read in place, device
// copies through the save's DeviceMemory in bounded pieces), and the copies
// are compared with the checksums their writers computed while writing,
// before anything is committed. A mismatch fails the save on every rank,
// naming the tensor, the slice and two ranks.
//
// The comparison costs 8 bytes per rank when the replicas agree. Each rank
// sends a digest (ReplicaDigest) in its step-4 report: the sum, modulo
// 2^64, of Hash(chunk, checksum) over every piece of every copy it holds,
// less, for every chunk it writes, the number of copies held of it times
// Hash(chunk, its written checksum). When every copy equals what was
// written the digests of all ranks add up to 0; a copy that differs
// leaves Hash(c, its checksum) - Hash(c, the written one), which is not 0
// but with probability 2^-64 (Hash mixes 64 bits). Only when they do not
// add up do the ranks send the copies' checksums themselves (8 bytes per
// copy) in a second round, and rank 0 compares them one by one
// (CheckReplicas), which names the tensor, or finds nothing wrong (a rank
// that skipped the check) and commits. An async save, whose reports are
// files, always sends the copies; rank 0 compares them all on its path,
// and only when the digests do not add up when planned together.
//
// Cost: one CRC-32C pass over the replicated bytes a rank holds but does not
// write; SaveOptions::verify_replicas = false skips it (the rank's digest is
// then 0, and its copies are not compared).
#pragma once

#include <cstdint>
#include <vector>

#include "engine/save/save_writer.h"
#include "layout/save_planner.h"
#include "shardsafe/checkpoint.h"

namespace shardsafe {

// The checksum of one held copy of a replicated chunk.
struct CopyChecksum {
  uint32_t chunk = 0;  // the copy's first chunk (HeldCopy::chunk, the whole plan's)
  uint32_t crc32c = 0;
};

// The copies `rank` holds but does not write (plan.copies), checksummed:
// one CopyChecksum per copy, and the digest
// of their pieces (the first term of ReplicaDigest).
struct HeldChecksums {
  std::vector<CopyChecksum> copies;
  uint64_t digest = 0;
};

// Device shards are read through `device`; an error names the tensor.
Result<HeldChecksums> ChecksumCopies(const SavePlan& plan, int rank, const SaveState& state,
                                     DeviceMemory* device);

// `rank`'s digest (above): held.digest less what the chunks it wrote
// (`written`, as WriteRankFiles returns them for `plan`) owe.
uint64_t ReplicaDigest(const SavePlan& plan, int rank, const HeldChecksums& held,
                       const std::vector<WrittenFile>& written);

// Rank 0: compares every reported copy (by rank) with the chunk its writer
// wrote (nothing to do when no rank sent copies). InvalidArgument naming
// the tensor, the slice and both ranks.
Status CheckReplicas(const SavePlan& plan, const std::vector<std::vector<WrittenFile>>& written,
                     const std::vector<std::vector<CopyChecksum>>& copies);

// A save planned together (distributed_save.h) leaves no whole plan on
// rank 0, so its second round's messages carry what rank 0 compares: each
// copy the rank holds (U64 copies, each U32 first chunk, U32 pieces,
// Fixed32 checksum) and each replicated chunk it wrote (U64 chunks, each
// U32 chunk, Fixed32 checksum, U64 bytes, Str key, Slice), in whole-plan
// numbers. `copies` as ChecksumCopies gives them for `part`, `written` as
// WriteRankFiles does, numbered as the whole plan (NumberAsWhole).
std::string EncodeReplicaRound(const SavePlan& part, int rank,
                               const std::vector<CopyChecksum>& copies,
                               const std::vector<WrittenFile>& written);
// Rank 0: every rank's second-round message (by rank), each copy compared
// with its chunk's writers' checksums, as CheckReplicas does.
Status CheckReplicaRounds(const std::vector<std::string>& msgs);

}  // namespace shardsafe
