// Node-shared reads: when several ranks on one machine need the same bytes
// of a checkpoint (a resharded load: saved Shard(0), loaded Shard(1), every
// rank wants a column slice of every row), each of those bytes is read from
// the disk once, by one of them, into shared memory, and the others copy it
// from there. Without it every rank reads the whole of each chunk it needs
// a part of, and the machine's disk reads the checkpoint once per rank.
//
// Protocol (collective; docs/design.md "Node-shared reads"):
// 1. AllGather: each rank sends its machine key (host name and boot id),
//    the byte ranges its plan reads, a random token and its memory budget.
// 2. Every rank computes the same sharing plan for every machine: the file
//    ranges at least two of its ranks read, aligned out to 4 KiB and cut
//    into blocks of at most `block_bytes`, as many as the smallest budget of
//    the machine's ranks allows; block i is read by the machine's i-th rank
//    modulo their number.
// 3. The lowest rank of the machine creates the shared memory in `dir`
//    (AllGather of the outcome), the others open it and map its header
//    (AllGather of the outcome), the creator unlinks the name. A machine
//    where any of this fails shares nothing: its ranks read as before.
// 4. Each rank's reader threads read its blocks in file order (O_DIRECT
//    where it can) into a mapping of the block, checksum each 16 KiB piece
//    into the header and mark the block ready; its loader runs at the same
//    time and copies the bytes of a block out (pread) once it is ready. A
//    loader that needs only some of a range's bytes can take the checksum
//    of the rest from the piece checksums (RandomAccessFile::Crc32cOf).
//
// Nothing here can fail a load: a block its reader could not read (no
// memory for it, an I/O error) is marked unavailable, and a block that
// makes no progress for `stall_timeout` (its reader died) is given up on;
// in both cases the rank reads those bytes from the file itself, which
// reports any error with its own context. Only a failing Comm is an error.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "layout/load_planner.h"
#include "shardsafe/comm.h"
#include "shardsafe/filesystem.h"

namespace shardsafe {

struct SharedReadsOptions {
  // Off: this rank shares nothing (it still takes part in the collectives).
  bool enabled = true;
  std::string dir = "/dev/shm";  // a memory file system
  // Upper bound on the shared memory of one machine; the budget is also
  // capped by half the free space of `dir` and half the available memory.
  uint64_t max_bytes = uint64_t{8} << 30;
  // A machine shares only when its ranks read at least this many bytes in
  // common (a few replicated small tensors are not worth the collectives).
  uint64_t min_bytes = uint64_t{1} << 20;
  uint64_t block_bytes = uint64_t{16} << 20;  // rounded down to a multiple of 16 KiB
  int reader_threads = 2;
  std::chrono::milliseconds stall_timeout{60000};
};

class SharedReads {
 public:
  // Collective (see above). `plan` is null on a rank that has nothing to
  // read or failed before planning; `file_paths` index the plan's files and
  // are the same on every rank. Returns an object whose WrapFile serves the
  // shared ranges, or null when this rank shares nothing. `fs` must outlive
  // the object.
  static Result<std::unique_ptr<SharedReads>> Start(Comm& comm, const LoadPlan* plan,
                                                    const std::vector<std::string>& file_paths,
                                                    FileSystem& fs,
                                                    const SharedReadsOptions& options);
  ~SharedReads();  // Finish()

  // `file` (data file `index`, opened by the loader) with the shared
  // ranges of it served from shared memory, waiting for each block's reader.
  std::unique_ptr<RandomAccessFile> WrapFile(uint32_t index,
                                             std::unique_ptr<RandomAccessFile> file);
  // Waits until this rank's readers have read all its blocks. Other ranks
  // may be waiting for them, so call it before leaving the load, whatever
  // the outcome. Idempotent.
  void Finish();
  // Bytes this rank took from blocks other ranks read.
  uint64_t bytes_from_peers() const;

  struct State;  // implementation

 private:
  explicit SharedReads(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

}  // namespace shardsafe
