// Asynchronous save: the caller is blocked only while its state is copied
// into reusable staging memory; writing, syncing and the commit run in the
// background.
//
//   shardsafe::AsyncSaver saver;                      // one per rank, long-lived
//   auto handle = saver.Save(state, root, "step-100", *comm, {});
//   // ... the caller may modify its tensors right away and keep training ...
//   auto stats = (*handle)->Wait();                   // committed, or the failure
//
// The call itself is collective, like Save: every rank calls it at the same
// point of its program, and it plans the save and creates the temporary
// directory with collectives. The background completion uses no
// collectives at all (docs/design.md, "Async save"): each rank writes its
// files from staging, syncs them and leaves a completion marker in the
// temporary directory; rank 0's background thread commits once it has seen
// every marker, and the other ranks' handles complete when they see the
// committed index (or rank 0's abort marker). So the training thread never
// has to enter a collective at a particular moment.
//
// Memory: one staging arena per saver, sized to the files this rank writes
// (headers included, each file image 4 KiB aligned), allocated once,
// pre-faulted, grown when a save needs more, reused across saves; Reserve
// allocates it ahead of the first save. Checksums are computed during the
// copy.
//
// At most one save is in flight per saver: a new Save first waits for the
// previous one. A background failure commits nothing and is reported once,
// by its handle (and by WaitForPending); the next Save is attempted as
// usual, and removes what the failed one left.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "shardsafe/checkpoint.h"

namespace shardsafe {

// The outcome of one asynchronous save. Thread-safe.
class AsyncSaveHandle {
 public:
  virtual ~AsyncSaveHandle() = default;
  // True once the save has committed or failed.
  virtual bool Done() const = 0;
  // Blocks until committed (returns the stats) or failed (the error).
  virtual Result<SaveStats> Wait() = 0;
  // Seconds the Save call blocked the caller.
  virtual double blocked_seconds() const = 0;
};

class AsyncSaver {
 public:
  AsyncSaver();
  ~AsyncSaver();  // waits for the save in flight
  AsyncSaver(const AsyncSaver&) = delete;
  AsyncSaver& operator=(const AsyncSaver&) = delete;

  // Collective. Saves `state` as ROOT/TAG in the background; when
  // `update_latest`, points ROOT/latest at it after the commit; then, when
  // `keep_last` > 0, removes older checkpoints (CheckpointManager rules).
  // `step` is recorded in the commit record.
  // Returns once this rank's data is staged. Errors as Save (the plan is
  // checked before returning); a failure of the previous save is its
  // handle's to report, not this call's.
  // options.overwrite is not supported (InvalidArgument); a rank's
  // background waits options.peer_timeout for the others.
  Result<std::shared_ptr<AsyncSaveHandle>> Save(const SaveState& state, const std::string& root,
                                                const std::string& tag, Comm& comm,
                                                const SaveOptions& options,
                                                bool update_latest = false, int keep_last = 0,
                                                std::optional<int64_t> step = std::nullopt);

  // Collective, like Save: plans the save of `state` and allocates (and
  // pre-faults) the staging memory for this rank's files now, so that the
  // first Save of a state of the same tensors blocks only for its copy
  // rather than also for fresh memory (seconds per GiB on some hosts).
  // Call it once the state has its final tensors (optimizers that create
  // their state at the first step: after that step). Touches no file.
  // Errors as Save's planning, plus the failure of the save in flight
  // (which it waits for); ResourceExhausted when the memory is not there.
  Status Reserve(const SaveState& state, Comm& comm, const SaveOptions& options = {});

  // Waits for the save in flight, if any; returns its outcome (OK if none).
  Status WaitForPending();

  // Bytes of staging memory held (for tests and benchmarks).
  size_t staging_bytes() const;

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace shardsafe
