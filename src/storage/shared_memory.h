// SharedMemory: a file in a memory file system (/dev/shm) that the
// processes of one machine open by name, to hand bytes to each other
// without a socket. Its first `mapped` bytes are mapped into each process
// (words the processes synchronise on). The rest is written through
// mappings of ranges, by one process each, and read through the descriptor
// (pread): a read costs a copy but no page faults, which a mapping of the
// whole in every process would cost per 4 KiB page and process. And the
// two futex calls that let one process wait for a word another process sets
// in the mapped part.
//
// Lifetime: the creator names the file, the others open it by name, and
// once all have it open the creator unlinks the name; the memory lives
// until the last process closes it (the destructor) or exits. A process
// that dies between Create and Unlink leaves the file behind in the
// directory.
//
// Thread-safety: the object is immutable after construction; its methods
// are safe from any thread; the users synchronise access to the
// bytes themselves.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "shardsafe/filesystem.h"
#include "shardsafe/status.h"

namespace shardsafe {

class SharedMemory {
 public:
  // Creates `dir`/`name` (which must not exist) of `bytes` bytes (sparse:
  // no memory is used until written) and maps its first `mapped` bytes.
  static Result<std::unique_ptr<SharedMemory>> Create(const std::string& dir,
                                                      const std::string& name, uint64_t bytes,
                                                      uint64_t mapped);
  // Opens and maps an existing one; FailedPrecondition if its size is not
  // `bytes` (another file of that name).
  static Result<std::unique_ptr<SharedMemory>> Open(const std::string& dir,
                                                    const std::string& name, uint64_t bytes,
                                                    uint64_t mapped);
  ~SharedMemory();
  SharedMemory(const SharedMemory&) = delete;
  SharedMemory& operator=(const SharedMemory&) = delete;

  char* mapped() const { return mapped_; }  // the first `mapped` bytes
  uint64_t size() const { return size_; }
  const std::string& path() const { return path_; }

  // Allocates [offset, offset + n) and maps it (offset 4 KiB aligned), for
  // a writer that wants the bytes in place (an O_DIRECT read into it):
  // ResourceExhausted when the file system is full. Unmap with UnmapRange.
  Result<char*> MapRange(uint64_t offset, uint64_t n) const;
  static void UnmapRange(char* p, uint64_t n);
  // Copies out of the file at `offset`.
  Status Read(uint64_t offset, void* dst, size_t n) const;
  // Reads consecutive bytes at `offset` into the pieces, in order.
  Status ReadScattered(uint64_t offset, std::span<const RandomAccessFile::Piece> pieces) const;
  // Removes the name; processes that have it open keep the memory.
  Status Unlink() const;

 private:
  SharedMemory(std::string path, int fd, char* mapped, uint64_t mapped_bytes, uint64_t size)
      : path_(std::move(path)), fd_(fd), mapped_(mapped), mapped_bytes_(mapped_bytes),
        size_(size) {}
  static Result<std::unique_ptr<SharedMemory>> Map(std::string path, int fd, uint64_t bytes,
                                                   uint64_t mapped);

  const std::string path_;
  const int fd_;
  char* const mapped_;
  const uint64_t mapped_bytes_;
  const uint64_t size_;
};

// `word` is 4-byte aligned, in the mapped part, and accessed by its users
// through std::atomic_ref. Blocks while `*word` == `expected`, for at most
// `timeout` (a futex shared between processes). Returns early on a wake-up
// or a spurious wake; the caller re-reads the word.
void FutexWait(const uint32_t* word, uint32_t expected, std::chrono::milliseconds timeout);
// Wakes every process and thread waiting on `word`.
void FutexWakeAll(const uint32_t* word);

}  // namespace shardsafe
