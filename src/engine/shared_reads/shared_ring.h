// A ring of blocks in shared memory through which one process (the
// producer) hands the bytes it reads from data files to the processes of
// its machine that need them too (the consumers): the disk reads each byte
// once, with O_DIRECT, and no one goes through the page cache.
//
// The segment (POSIX shared memory, /dev/shm) holds a header and `slots`
// slots of `slot_bytes`; the producer creates it (its space reserved, so
// a full /dev/shm fails there, not on first touch). Producer and consumers
// know the same list of blocks (engine/shared_reads/shared_reads.h computes it on every
// rank); block k travels in slot k % slots:
//
//   producer: wait until every consumer has released block k - slots,
//             read block k into its slot, publish it (published = k + 1);
//   consumer: wait until published > k, copy what it needs of block k,
//             release the blocks before the one it reads next
//             (released[c] = k), all of them when it is done.
//
// A consumer that stops early releases everything, so the producer never
// waits for it. A producer that fails marks the ring failed with its
// message, which every consumer waiting on the ring returns. A process
// that dies fails the others' waits on it within ~0.1 s: each records its
// pid, and a waiter without progress for 50 ms checks the processes it
// waits on (pidfds, so neither zombies nor reused pids fool it; processes
// in another pid namespace, or where pidfds are not allowed, are not
// checked). A wait with no progress for `stall_timeout` fails too (a
// process that hangs).
// Deadlock freedom across several rings: docs/design.md "Shared reads".
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "shardsafe/status.h"

namespace shardsafe {

class SharedRing {
 public:
  static constexpr uint32_t kMaxConsumers = 64;
  static constexpr uint32_t kDetached = UINT32_MAX;  // released: everything

  // Creates (exclusively) and maps the segment `name` ("/shardsafe-...")
  // for this process, the producer: consumer `self` of `consumers` (joined),
  // `rank`. When /dev/shm has no room for `slots` slots, fewer (halving, at
  // least 2; slots() says); ResourceExhausted when not even 2 fit.
  static Result<std::unique_ptr<SharedRing>> Create(const std::string& name, uint32_t slots,
                                                    uint64_t slot_bytes, uint32_t consumers,
                                                    uint32_t self, int rank,
                                                    std::chrono::milliseconds stall_timeout);
  // Maps a segment another process created; checks its header.
  static Result<std::unique_ptr<SharedRing>> Open(const std::string& name,
                                                  std::chrono::milliseconds stall_timeout);
  // Removes the name (mappings stay valid). Errors are ignored.
  static void Unlink(const std::string& name);
  // Removes the /dev/shm/shardsafe-* rings whose producer has exited (a
  // crash between Create and Unlink leaves one behind); rings of live
  // processes, of other pid namespaces, and anything not a ring stay.
  // Returns how many it removed.
  static int RemoveAbandoned();

  ~SharedRing();
  SharedRing(const SharedRing&) = delete;
  SharedRing& operator=(const SharedRing&) = delete;

  uint64_t slot_bytes() const;
  uint32_t slots() const;

  // This process (a consumer other than the producer) is consumer `c`, `rank`.
  void Join(uint32_t c, int rank);
  // Once every consumer has joined: the processes this one may wait on are
  // watched from now on (a consumer's: the producer; the producer's: the
  // consumers).
  void Watch();

  // Producer: the slot for block k, once every consumer has released
  // block k - slots. Fails after stall_timeout without a release.
  Result<char*> AcquireSlot(uint32_t block);
  // Producer: block k (the one after the last published) is in its slot.
  void Publish(uint32_t block);
  // Producer: no more blocks will come; consumers waiting get `message`.
  void Fail(const std::string& message);

  // Consumer: block k's bytes, once published. Fails if the producer failed
  // or after stall_timeout without a block.
  Result<const char*> WaitBlock(uint32_t block);
  // Consumer `c` no longer needs blocks [0, blocks); kDetached: any block.
  void Release(uint32_t c, uint32_t blocks);

 private:
  struct Header;
  struct Process;
  struct Watched {
    int pidfd;
    int rank;
    int32_t pid;
    uint32_t consumer;
  };
  SharedRing(void* base, size_t bytes, std::chrono::milliseconds stall_timeout);
  static Result<void*> Allocate(const std::string& name, size_t bytes);
  static int32_t ProducerOf(const std::string& name);
  char* Slot(uint32_t block) const;
  // The first watched process that `blocking(consumer index)` selects and
  // that has exited; null while they all live.
  template <typename Blocking>
  const Watched* ExitedPeer(Blocking blocking) const;
  static Status PeerExited(const Watched& w, const std::string& what);

  Header* header_;
  size_t mapped_bytes_;
  std::chrono::milliseconds stall_timeout_;
  std::vector<Watched> watched_;
};

}  // namespace shardsafe
