// This rank's rings for one load (engine/shared_reads/shared_reads.h plans them,
// engine/shared_reads/shared_ring.h moves the bytes): the ring it fills, if any, and
// the data files it reads from rings instead of from the disk.
//
// Order, which keeps rings free of deadlock (docs/design.md "Shared
// reads"): a producer publishes its blocks in ring order (file, then
// offset; it reads a few ahead, each reader in that order); a consumer
// reads each ring on a thread of its own, in ascending file order and
// ascending offsets within a file, never going back. So each ring depends
// only on its own producer and consumers.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "engine/shared_reads/shared_reads.h"
#include "engine/shared_reads/shared_ring.h"
#include "shardsafe/comm.h"
#include "shardsafe/filesystem.h"

namespace shardsafe {

class RingReads {
 public:
  ~RingReads();

  // The file to read data file `f` through, or null when `f` is read from
  // the disk. Its reads must go forward (see above); one that goes back
  // fails with Internal.
  const RandomAccessFile* FileFor(uint32_t f) const;
  // The ring (index < num_rings()) data file `f` is read from, or -1.
  int RingOf(uint32_t f) const;
  size_t num_rings() const { return roles_.size(); }
  bool produces() const { return produced_ >= 0; }
  // The producer's loop: reads every block of its ring (O_DIRECT) from
  // `paths` (confined to `within`, ReadOptions::within) and publishes it.
  // On failure the consumers learn the message.
  Status Produce(FileSystem& fs, const std::vector<std::string>& paths,
                 const std::string& within) const;
  // This rank has read all it reads of data file `f` from its ring.
  void FileDone(uint32_t f) const;
  // This rank copies nothing more from ring `i` (done or stopped).
  void Detach(int i) const;

 private:
  friend Result<std::unique_ptr<RingReads>> SetUpRings(Comm&, const SharedReadPlan&,
                                                       const std::vector<uint64_t>&,
                                                       std::chrono::milliseconds);
  class RingFile;
  RingReads() = default;

  std::vector<RingRole> roles_;
  std::vector<std::unique_ptr<SharedRing>> rings_;  // by role
  std::vector<std::unique_ptr<RingFile>> files_;    // by data file; null: from disk
  std::vector<uint64_t> file_sizes_;                // by data file (ReadOptions::size)
  std::vector<int> ring_of_file_;                   // by data file: index into rings_
  int produced_ = -1;
};

// Collective when plan.rings_anywhere (else returns null at once): the
// producers create their rings, the consumers map them; two AllGathers
// tell every rank whether all of that worked. Null (and every ring
// removed) when any rank failed: the caller then reads shared files
// through the page cache. Only a failing Comm is an error.
Result<std::unique_ptr<RingReads>> SetUpRings(Comm& comm, const SharedReadPlan& plan,
                                              const std::vector<uint64_t>& file_sizes,
                                              std::chrono::milliseconds stall_timeout);

}  // namespace shardsafe
