#include "storage/shared_memory.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <vector>

namespace shardsafe {

constexpr size_t kMaxIov = IOV_MAX;

Result<std::unique_ptr<SharedMemory>> SharedMemory::Map(std::string path, int fd, uint64_t bytes,
                                                        uint64_t mapped) {
  mapped = std::min(mapped, bytes);
  void* p = mapped == 0 ? nullptr
                        : mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    const int err = errno;
    close(fd);
    return ErrnoError(err, "mmap", path);
  }
  return std::unique_ptr<SharedMemory>(
      new SharedMemory(std::move(path), fd, static_cast<char*>(p), mapped, bytes));
}

Result<std::unique_ptr<SharedMemory>> SharedMemory::Create(const std::string& dir,
                                                           const std::string& name,
                                                           uint64_t bytes, uint64_t mapped) {
  std::string path = JoinPath(dir, name);
  const int fd = open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) return ErrnoError(errno, "create", path);
  // The mapped part is allocated now, so that touching it cannot SIGBUS
  // on a full file system; the rest stays sparse until written.
  int err = ftruncate(fd, static_cast<off_t>(bytes)) == 0 ? 0 : errno;
  if (err == 0 && mapped > 0) err = posix_fallocate(fd, 0, static_cast<off_t>(std::min(mapped, bytes)));
  if (err != 0) {
    close(fd);
    unlink(path.c_str());
    return ErrnoError(err, "allocate", path);
  }
  auto result = Map(path, fd, bytes, mapped);
  if (!result.ok()) unlink(path.c_str());
  return result;
}

Result<std::unique_ptr<SharedMemory>> SharedMemory::Open(const std::string& dir,
                                                         const std::string& name,
                                                         uint64_t bytes, uint64_t mapped) {
  std::string path = JoinPath(dir, name);
  const int fd = open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) return ErrnoError(errno, "open", path);
  struct stat st;
  if (fstat(fd, &st) != 0 || static_cast<uint64_t>(st.st_size) != bytes) {
    close(fd);
    return FailedPreconditionError(path + ": not the expected shared memory of " +
                                   std::to_string(bytes) + " bytes");
  }
  return Map(std::move(path), fd, bytes, mapped);
}

SharedMemory::~SharedMemory() {
  if (mapped_ != nullptr) munmap(mapped_, mapped_bytes_);
  close(fd_);
}

Result<char*> SharedMemory::MapRange(uint64_t offset, uint64_t n) const {
  int err;
  do {
    err = posix_fallocate(fd_, static_cast<off_t>(offset), static_cast<off_t>(n));
  } while (err == EINTR);
  if (err != 0) return ErrnoError(err, "allocate", path_);
  void* p = mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_SHARED, fd_, static_cast<off_t>(offset));
  if (p == MAP_FAILED) return ErrnoError(errno, "mmap", path_);
  return static_cast<char*>(p);
}

void SharedMemory::UnmapRange(char* p, uint64_t n) { munmap(p, n); }

Status SharedMemory::Read(uint64_t offset, void* dst, size_t n) const {
  const RandomAccessFile::Piece piece{dst, n};
  return ReadScattered(offset, std::span(&piece, 1));
}

Status SharedMemory::ReadScattered(uint64_t offset,
                                   std::span<const RandomAccessFile::Piece> pieces) const {
  std::vector<iovec> iov;  // at most kMaxIov pieces not yet (fully) read
  size_t next = 0;         // first piece not yet in iov
  for (;;) {
    for (; next < pieces.size() && iov.size() < kMaxIov; ++next) {
      if (pieces[next].n > 0) iov.push_back({pieces[next].dst, pieces[next].n});
    }
    if (iov.empty()) return Status();
    const ssize_t r = preadv(fd_, iov.data(), static_cast<int>(iov.size()),
                             static_cast<off_t>(offset));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return ErrnoError(errno, "read", path_);
    if (r == 0) return DataLossError(path_ + ": read past the end");
    offset += static_cast<uint64_t>(r);
    // Drop what was read from the front of iov.
    size_t done = static_cast<size_t>(r), k = 0;
    while (k < iov.size() && done >= iov[k].iov_len) done -= iov[k++].iov_len;
    iov.erase(iov.begin(), iov.begin() + static_cast<std::ptrdiff_t>(k));
    if (done > 0) {
      iov.front().iov_base = static_cast<char*>(iov.front().iov_base) + done;
      iov.front().iov_len -= done;
    }
  }
}

Status SharedMemory::Unlink() const {
  return unlink(path_.c_str()) == 0 ? Status() : ErrnoError(errno, "unlink", path_);
}

// A shared (not FUTEX_PRIVATE) futex keys on the page's backing object, so
// it works across processes mapping the same file.
void FutexWait(const uint32_t* word, uint32_t expected, std::chrono::milliseconds timeout) {
  timespec ts{static_cast<time_t>(timeout.count() / 1000),
              static_cast<long>(timeout.count() % 1000) * 1000000L};
  syscall(SYS_futex, word, FUTEX_WAIT, expected, &ts, nullptr, 0);
}

void FutexWakeAll(const uint32_t* word) {
  syscall(SYS_futex, word, FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

}  // namespace shardsafe
