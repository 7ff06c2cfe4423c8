// A fixed-size pool of worker threads, and a TaskGroup that runs a batch of
// fallible tasks on it and reports the first failure.
//
// The engine uses one pool for I/O (large pwrite/pread calls that block in
// the kernel) so several files and requests are in flight at once. A pool of
// size 0 runs every task inline on the caller's thread, which makes tests
// deterministic.
//
// Thread-safe: Schedule() may be called from any thread, including from a
// task. The destructor drains the queue and joins the workers.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "shardsafe/status.h"

namespace shardsafe {

class ThreadPool {
 public:
  // Starts up to `num_threads` workers; if the system refuses a thread
  // (EAGAIN), the pool runs with the ones it got, or inline with none,
  // instead of failing.
  explicit ThreadPool(size_t num_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  size_t num_threads() const { return workers_.size(); }

  // Runs `task` on a worker (or inline when the pool has no threads).
  void Schedule(std::function<void()> task);

 private:
  void WorkerLoop();

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  bool stopping_ = false;
  std::vector<std::thread> workers_;
};

// Runs fallible tasks on a pool and waits for all of them. Once a task has
// failed, tasks that have not started yet are skipped. Wait() returns the
// first failure (in completion order) or OK. Not copyable; Wait() must be
// called before destruction if any task was added.
class TaskGroup {
 public:
  explicit TaskGroup(ThreadPool* pool) : pool_(pool) {}
  ~TaskGroup() { Wait().IgnoreError(); }

  void Add(std::function<Status()> task);
  Status Wait();
  // True once every added task has finished; waits at most `timeout`.
  bool WaitFor(std::chrono::milliseconds timeout);

 private:
  ThreadPool* pool_;
  std::mutex mu_;
  std::condition_variable cv_;
  size_t pending_ = 0;
  Status first_error_;
};

}  // namespace shardsafe
