#include "storage/shared_memory.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <climits>

#include "shardsafe/filesystem.h"

namespace shardsafe {

Result<std::unique_ptr<SharedMemory>> SharedMemory::Map(std::string path, int fd,
                                                        uint64_t bytes) {
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    const int err = errno;
    close(fd);
    return ErrnoError(err, "mmap", path);
  }
  return std::unique_ptr<SharedMemory>(
      new SharedMemory(std::move(path), fd, static_cast<char*>(p), bytes));
}

Result<std::unique_ptr<SharedMemory>> SharedMemory::Create(const std::string& dir,
                                                           const std::string& name,
                                                           uint64_t bytes) {
  std::string path = JoinPath(dir, name);
  const int fd = open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) return ErrnoError(errno, "create", path);
  if (ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    const int err = errno;
    close(fd);
    unlink(path.c_str());
    return ErrnoError(err, "ftruncate", path);
  }
  auto mapped = Map(path, fd, bytes);
  if (!mapped.ok()) unlink(path.c_str());
  return mapped;
}

Result<std::unique_ptr<SharedMemory>> SharedMemory::Open(const std::string& dir,
                                                         const std::string& name,
                                                         uint64_t bytes) {
  std::string path = JoinPath(dir, name);
  const int fd = open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) return ErrnoError(errno, "open", path);
  struct stat st;
  if (fstat(fd, &st) != 0 || static_cast<uint64_t>(st.st_size) != bytes) {
    close(fd);
    return FailedPreconditionError(path + ": not the expected shared memory of " +
                                   std::to_string(bytes) + " bytes");
  }
  return Map(std::move(path), fd, bytes);
}

SharedMemory::~SharedMemory() {
  munmap(data_, size_);
  close(fd_);
}

Status SharedMemory::Reserve(uint64_t offset, uint64_t n) const {
  int r;
  do {
    r = fallocate(fd_, 0, static_cast<off_t>(offset), static_cast<off_t>(n));
  } while (r != 0 && errno == EINTR);
  return r == 0 ? Status() : ErrnoError(errno, "fallocate", path_);
}

Status SharedMemory::Unlink() const {
  return unlink(path_.c_str()) == 0 ? Status() : ErrnoError(errno, "unlink", path_);
}

// A shared (not FUTEX_PRIVATE) futex keys on the physical page, so it works
// across processes mapping the same file.
void FutexWait(const uint32_t* word, uint32_t expected, std::chrono::milliseconds timeout) {
  timespec ts{static_cast<time_t>(timeout.count() / 1000),
              static_cast<long>(timeout.count() % 1000) * 1000000L};
  syscall(SYS_futex, word, FUTEX_WAIT, expected, &ts,
          nullptr, 0);
}

void FutexWakeAll(const uint32_t* word) {
  syscall(SYS_futex, word, FUTEX_WAKE, INT_MAX, nullptr,
          nullptr, 0);
}

}  // namespace shardsafe
