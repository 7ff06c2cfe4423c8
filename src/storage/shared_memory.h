// SharedMemory: a file in a memory file system (/dev/shm) mapped into every
// process of one machine that opens it, for handing bytes between processes
// without a copy through a socket. And the two futex calls that let one
// process wait for a word another process sets in such a mapping.
//
// Lifetime: the creator names the file, the others open it by name, and
// once all have it mapped the creator unlinks the name; the memory lives
// until the last process unmaps it (the destructor) or exits. A process
// that dies between Create and Unlink leaves the file behind in the
// directory (its name starts with "shardsafe-").
//
// Thread-safety: the object is immutable after construction; the mapped
// memory is shared and its users synchronise themselves.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "shardsafe/status.h"

namespace shardsafe {

class SharedMemory {
 public:
  // Creates `dir`/`name` (which must not exist) of `bytes` bytes (sparse:
  // no memory is used until written) and maps it.
  static Result<std::unique_ptr<SharedMemory>> Create(const std::string& dir,
                                                      const std::string& name, uint64_t bytes);
  // Opens and maps an existing one; FailedPrecondition if its size is not
  // `bytes` (another file of that name).
  static Result<std::unique_ptr<SharedMemory>> Open(const std::string& dir,
                                                    const std::string& name, uint64_t bytes);
  ~SharedMemory();
  SharedMemory(const SharedMemory&) = delete;
  SharedMemory& operator=(const SharedMemory&) = delete;

  char* data() const { return data_; }
  uint64_t size() const { return size_; }
  const std::string& path() const { return path_; }

  // Allocates memory for [offset, offset + n) (fallocate), so that writing
  // it cannot fail for lack of space: ResourceExhausted when the file
  // system is full.
  Status Reserve(uint64_t offset, uint64_t n) const;
  // Removes the name; processes that have it mapped keep the memory.
  Status Unlink() const;

 private:
  SharedMemory(std::string path, int fd, char* data, uint64_t size)
      : path_(std::move(path)), fd_(fd), data_(data), size_(size) {}
  static Result<std::unique_ptr<SharedMemory>> Map(std::string path, int fd, uint64_t bytes);

  const std::string path_;
  const int fd_;
  char* const data_;
  const uint64_t size_;
};

// `word` is 4-byte aligned, in shared memory, and accessed by its users
// through std::atomic_ref. Blocks while `*word` == `expected`, for at most `timeout` (a futex shared
// between processes). Returns early on a wake-up or a spurious wake; the
// caller re-reads the word.
void FutexWait(const uint32_t* word, uint32_t expected,
               std::chrono::milliseconds timeout);
// Wakes every process and thread waiting on `word`.
void FutexWakeAll(const uint32_t* word);

}  // namespace shardsafe
