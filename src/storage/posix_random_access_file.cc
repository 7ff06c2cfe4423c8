// POSIX RandomAccessFile: pread loops on a buffered descriptor, plus an
// O_DIRECT descriptor (when asked for and the file system allows it). With
// O_DIRECT, bytes already in the page cache are still read from it (a
// buffered preadv2 with RWF_NOWAIT takes the cached prefix). That probe is
// skipped when cachestat(2) says nothing of the range is cached: a
// RWF_NOWAIT read of uncached pages still starts readahead, which would read
// the range's first megabytes twice and fill the page cache. For the rest, a
// request whose offset, length and destination are 4 KiB
// aligned is read straight into the destination; a large unaligned request
// (>= kMinBounceRead) reads the aligned range around it in pieces through
// pre-faulted bounce buffers, two pieces in flight (the caller and a helper
// thread), and copies out (a memcpy is far faster than the
// disk, and the page cache, slow to fill on this kind of VM, is bypassed);
// small requests use the buffered descriptor, where readahead helps. Both
// descriptors are only read with pread, which has no shared file position,
// so concurrent ReadAt calls are safe.
#include <fcntl.h>
#include <limits.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <span>
#include <system_error>
#include <thread>
#include <vector>

#include "storage/aligned_buffer.h"
#include "storage/posix_file.h"

namespace shardsafe {
namespace {

int OpenForRead(const std::string& path, int extra_flags) {
  int fd;
  do {
    fd = open(path.c_str(), O_RDONLY | O_CLOEXEC | extra_flags);
  } while (fd < 0 && errno == EINTR);
  return fd;
}

// cachestat(2) (Linux 6.5): page-cache residency of a file range, without
// starting any I/O. Not yet in every libc's headers.
#ifndef __NR_cachestat
#define __NR_cachestat 451  // the same number on every architecture
#endif
struct CachestatRange {
  uint64_t off;
  uint64_t len;
};
struct Cachestat {
  uint64_t nr_cache;
  uint64_t nr_dirty;
  uint64_t nr_writeback;
  uint64_t nr_evicted;
  uint64_t nr_recently_evicted;
};

// Pages of [offset, offset + n) in the page cache, or -1 when the kernel
// cannot tell.
int64_t CachedPages(int fd, uint64_t offset, size_t n) {
  static std::atomic<bool> unsupported{false};
  if (unsupported.load(std::memory_order_relaxed)) return -1;
  CachestatRange range{offset, n};
  Cachestat stat{};
  if (syscall(__NR_cachestat, fd, &range, &stat, 0) != 0) {
    if (errno == ENOSYS || errno == EPERM) unsupported.store(true, std::memory_order_relaxed);
    return -1;
  }
  return static_cast<int64_t>(stat.nr_cache);
}

uint64_t PageSize() {
  static const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  return page;
}

// True when no page of [offset, offset + n) is in the page cache; false
// when some are, or the kernel cannot tell. cachestat walks every cached
// folio of its range, and a buffered read leaves 4 KiB ones (2 GiB: 3.8 ms,
// ~7 ns a page; one page 0.37 us), so the first page is asked alone first:
// when it is cached, as in every hot read, that settles it.
bool NothingCached(int fd, uint64_t offset, size_t n) {
  const uint64_t page = PageSize();
  const size_t head = std::min<uint64_t>(n, page - offset % page);
  if (CachedPages(fd, offset, head) != 0) return false;
  return head == n || CachedPages(fd, offset + head, n - head) == 0;
}

// Where a path leads once every symbolic link is resolved; empty if that
// cannot be told.
std::string Resolved(const char* path) {
  char buf[PATH_MAX];
  return realpath(path, buf) != nullptr ? std::string(buf) : std::string();
}

// The open file `fd` (opened as `path`) must lie inside directory `within`
// (ReadOptions::within). The check is of the descriptor's own path, so a
// link swapped in after the open cannot slip past it.
Status CheckWithin(int fd, const std::string& path, const std::string& within) {
  if (within.empty()) return Status();
  std::string file = Resolved(("/proc/self/fd/" + std::to_string(fd)).c_str());
  if (file.empty()) file = Resolved(path.c_str());  // no /proc
  const std::string dir = Resolved(within.c_str());
  if (dir.empty()) return ErrnoError(errno, "resolve", within);
  const bool inside = dir == "/" || (file.size() > dir.size() && file[dir.size()] == '/' &&
                                     file.compare(0, dir.size(), dir) == 0);
  if (inside) return Status();
  return InvalidArgumentError("open " + path + ": a symbolic link leading outside " + within +
                              " (to " + (file.empty() ? std::string("?") : file) + ")");
}

std::atomic<CheckedOpenHook> checked_open_hook{nullptr};

// An O_DIRECT descriptor of the file `fd` has open (`st`, as checked), or
// -1. Opened through /proc/self/fd, which reaches the open file itself
// whatever its path names now; where that is missing, by path. Either way
// it must be the same file (device and inode), so a FIFO or a link swapped
// in at `path` after the checked open is never opened nor followed.
int ReopenDirect(int fd, const std::string& path, const struct stat& st) {
  int direct = OpenForRead("/proc/self/fd/" + std::to_string(fd), O_DIRECT | O_NONBLOCK);
  if (direct < 0 && errno == ENOENT) direct = OpenForRead(path, O_DIRECT | O_NONBLOCK);
  if (direct < 0) return -1;
  struct stat again;
  if (fstat(direct, &again) != 0 || again.st_dev != st.st_dev || again.st_ino != st.st_ino) {
    close(direct);
    return -1;
  }
  fcntl(direct, F_SETFL, fcntl(direct, F_GETFL) & ~O_NONBLOCK);
  return direct;
}

class PosixRandomAccessFile final : public RandomAccessFile {
 public:
  PosixRandomAccessFile(int fd, int direct_fd, uint64_t size, std::string path)
      : fd_(fd), direct_fd_(direct_fd), size_(size), path_(std::move(path)) {}
  ~PosixRandomAccessFile() override {
    close(fd_);
    if (direct_fd_ >= 0) close(direct_fd_);
  }

  Status ReadAt(uint64_t offset, void* dst, size_t n) const override;
  Status ReadScattered(uint64_t offset, std::span<const Piece> pieces) const override;
  uint64_t size() const override { return size_; }
  bool FullyCached(uint64_t offset, size_t n) const override {
    if (n == 0) return true;
    const uint64_t page = PageSize();
    const uint64_t pages = (offset + n + page - 1) / page - offset / page;
    return CachedPages(fd_, offset, n) == static_cast<int64_t>(pages);
  }
  bool direct() const { return direct_fd_ >= 0; }

 private:
  bool CanReadDirect(uint64_t offset, const char* dst, size_t n) const {
    return direct_fd_ >= 0 && IsAligned(offset) && IsAligned(n) &&
           IsAligned(reinterpret_cast<uintptr_t>(dst));
  }
  Status Truncated(uint64_t offset, size_t n) const;
  // Reads the leading part of [offset, offset + n) that is already in the
  // page cache (a buffered read that refuses to wait for the disk); returns
  // how many bytes it read. 0 when nothing is cached or RWF_NOWAIT is
  // unsupported.
  size_t ReadCachedPrefix(uint64_t offset, char* dst, size_t n) const;
  // ReadAt without the cache probe.
  Status ReadFromDisk(uint64_t offset, char* dst, size_t n) const;
  // Reads the consecutive file bytes from `offset` into `pieces` with
  // O_DIRECT through bounce buffers. Returns false in *used if the
  // descriptor refused (the caller falls back).
  Status ReadBounced(uint64_t offset, std::span<const Piece> pieces, bool* used) const;

  const int fd_;
  const int direct_fd_;  // -1 when not reading directly
  const uint64_t size_;  // at open time
  const std::string path_;
};

constexpr size_t kMinBounceRead = 256 << 10;
constexpr size_t kBouncePiece = 8 << 20;

// Where the request's bytes go: `pieces` laid end to end from byte 0.
class PieceMap {
 public:
  explicit PieceMap(std::span<const RandomAccessFile::Piece> pieces) : pieces_(pieces) {
    uint64_t at = 0;
    for (const auto& p : pieces) {
      starts_.push_back(at);
      at += p.n;
    }
    size_ = at;
  }
  uint64_t size() const { return size_; }
  // Copies `len` bytes of the request, starting at byte `at`, from `src`.
  void CopyIn(uint64_t at, const char* src, uint64_t len) const {
    size_t i = std::upper_bound(starts_.begin(), starts_.end(), at) - starts_.begin() - 1;
    while (len > 0) {
      const uint64_t into = at - starts_[i];
      const uint64_t n = std::min<uint64_t>(len, pieces_[i].n - into);
      std::memcpy(static_cast<char*>(pieces_[i].dst) + into, src, n);
      src += n;
      at += n;
      len -= n;
      ++i;
    }
  }

 private:
  std::span<const RandomAccessFile::Piece> pieces_;
  std::vector<uint64_t> starts_;
  uint64_t size_ = 0;
};

Status PosixRandomAccessFile::ReadBounced(uint64_t offset, std::span<const Piece> dsts,
                                          bool* used) const {
  const PieceMap map(dsts);
  const uint64_t n = map.size();
  const uint64_t first = offset / kDirectIoAlignment * kDirectIoAlignment;  // aligned start
  const uint64_t end = offset + n;
  const uint64_t pieces = (AlignUp(end) - first + kBouncePiece - 1) / kBouncePiece;
  // Stream s reads pieces s, s + streams, ...: while one copies a piece out,
  // the other's read is at the disk.
  const int streams = pieces >= 2 ? 2 : 1;
  std::vector<Status> status(streams);
  std::vector<char> refused(streams, 0);  // the descriptor said EINVAL
  auto stream = [&](int s) {
    thread_local AlignedBuffer bounce;
    if (bounce.capacity() < kBouncePiece) bounce = AcquireAlignedBuffer(kBouncePiece);
    for (uint64_t k = s; k < pieces; k += streams) {
      const uint64_t pos = first + k * kBouncePiece;
      const size_t want = std::min<uint64_t>(kBouncePiece, AlignUp(end) - pos);
      ssize_t r;
      do {
        r = pread(direct_fd_, bounce.data(), want, static_cast<off_t>(pos));
      } while (r < 0 && errno == EINTR);
      if (r < 0 && errno == EINVAL) {
        refused[s] = 1;
        return;
      }
      if (r < 0) {
        status[s] = ErrnoError(errno, "read", path_);
        return;
      }
      // Bytes of the request inside [pos, pos + r).
      const uint64_t lo = std::max(pos, offset), hi = std::min<uint64_t>(pos + r, end);
      if (hi <= lo || (static_cast<size_t>(r) < want && hi < end)) {
        status[s] = Truncated(offset, n);
        return;
      }
      map.CopyIn(lo - offset, bounce.data() + (lo - pos), hi - lo);
    }
  };
  std::thread helper;
  if (streams > 1) {
    try {
      helper = std::thread(stream, 1);
    } catch (const std::system_error&) {  // no thread to be had: one stream after the other
    }
  }
  stream(0);
  if (helper.joinable()) {
    helper.join();
  } else if (streams > 1) {
    stream(1);
  }
  *used = !refused[0] && (streams < 2 || !refused[1]);
  if (!*used) return Status();
  for (Status& st : status) SS_RETURN_IF_ERROR(st);
  return Status();
}

size_t PosixRandomAccessFile::ReadCachedPrefix(uint64_t offset, char* dst, size_t n) const {
  static std::atomic<bool> unsupported{false};
  size_t done = 0;
  while (done < n && !unsupported.load(std::memory_order_relaxed)) {
    iovec iov{dst + done, n - done};
    ssize_t r = preadv2(fd_, &iov, 1, static_cast<off_t>(offset + done), RWF_NOWAIT);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0 && (errno == EOPNOTSUPP || errno == EINVAL || errno == ENOSYS)) {
      unsupported.store(true, std::memory_order_relaxed);
    }
    if (r <= 0) break;  // EAGAIN: not cached; 0: end of file (ReadAt reports it)
    done += static_cast<size_t>(r);
  }
  return done;
}

Status PosixRandomAccessFile::ReadAt(uint64_t offset, void* dst, size_t n) const {
  char* p = static_cast<char*>(dst);
  // Small unaligned reads always take the buffered descriptor: no probe
  // (a row of a column-split tensor can be a few hundred bytes, and a
  // syscall more per read would double its cost).
  if (direct_fd_ < 0 || (n < kMinBounceRead && !CanReadDirect(offset, p, n))) {
    return ReadFromDisk(offset, p, n);
  }
  // Data already in the page cache is copied from there (as fast as it
  // gets); only the rest goes to the disk with O_DIRECT.
  if (NothingCached(fd_, offset, n)) return ReadFromDisk(offset, p, n);
  const size_t cached = ReadCachedPrefix(offset, p, n);
  if (cached == n) return Status();
  Status s = ReadFromDisk(offset + cached, p + cached, n - cached);
  return s.code() == StatusCode::kDataLoss ? Truncated(offset, n) : s;
}

Status PosixRandomAccessFile::ReadFromDisk(uint64_t offset, char* p, size_t n) const {
  if (direct_fd_ >= 0 && n >= kMinBounceRead && !CanReadDirect(offset, p, n)) {
    bool used = false;
    const Piece whole{p, n};
    Status s = ReadBounced(offset, {&whole, 1}, &used);
    if (used) return s;
  }
  size_t done = 0;
  bool direct_ok = true;  // cleared if the O_DIRECT descriptor refuses a read
  while (done < n) {
    const bool direct = direct_ok && CanReadDirect(offset + done, p + done, n - done);
    ssize_t r = pread(direct ? direct_fd_ : fd_, p + done, n - done,
                      static_cast<off_t>(offset + done));
    if (r < 0) {
      if (errno == EINTR) continue;
      if (direct && errno == EINVAL) {
        direct_ok = false;
        continue;
      }
      return ErrnoError(errno, "read", path_);
    }
    if (r == 0) return Truncated(offset, n);
    done += static_cast<size_t>(r);
  }
  return Status();
}

// Buffered descriptor: preadv in batches of IOV_MAX pieces, resuming after
// short reads. With O_DIRECT, a large uncached range is one bounced read
// copied out into the pieces; anything else takes the buffered path.
Status PosixRandomAccessFile::ReadScattered(uint64_t offset,
                                            std::span<const Piece> pieces) const {
  std::vector<iovec> iov;
  uint64_t total = 0;
  for (const Piece& p : pieces) {
    if (p.n == 0) continue;
    iov.push_back({p.dst, p.n});
    total += p.n;
  }
  if (direct_fd_ >= 0 && total >= kMinBounceRead && NothingCached(fd_, offset, total)) {
    bool used = false;
    Status s = ReadBounced(offset, pieces, &used);
    if (used) return s;
  }
  size_t first = 0;  // iov[first..] still to read; iov[first] maybe partly done
  uint64_t pos = offset;
  while (first < iov.size()) {
    const int count = static_cast<int>(std::min<size_t>(iov.size() - first, IOV_MAX));
    ssize_t r = preadv(fd_, &iov[first], count, static_cast<off_t>(pos));
    if (r < 0) {
      if (errno == EINTR) continue;
      return ErrnoError(errno, "read", path_);
    }
    if (r == 0) return Truncated(offset, total);
    pos += static_cast<uint64_t>(r);
    for (size_t left = static_cast<size_t>(r); left > 0;) {
      const size_t take = std::min(left, iov[first].iov_len);
      iov[first].iov_base = static_cast<char*>(iov[first].iov_base) + take;
      iov[first].iov_len -= take;
      left -= take;
      if (iov[first].iov_len == 0) ++first;
    }
  }
  return Status();
}

Status PosixRandomAccessFile::Truncated(uint64_t offset, size_t n) const {
  struct stat st;
  uint64_t now = fstat(fd_, &st) == 0 ? static_cast<uint64_t>(st.st_size) : size_;
  return DataLossError(path_ + ": file truncated: wanted " + std::to_string(n) +
                       " bytes at offset " + std::to_string(offset) + ", file has " +
                       std::to_string(now));
}

}  // namespace

void SetCheckedOpenHookForTest(CheckedOpenHook hook) { checked_open_hook.store(hook); }

Result<int> OpenCheckedForRead(const std::string& path, const std::string& within,
                               struct stat* st) {
  // O_NONBLOCK: opening a FIFO (or a device) must not wait for a writer; only
  // regular files are read (a FIFO as a data file or index hung every reader).
  int fd = OpenForRead(path, O_NONBLOCK);
  if (fd < 0) return ErrnoError(errno, "open", path);
  if (fstat(fd, st) != 0) {
    Status s = ErrnoError(errno, "stat", path);
    close(fd);
    return s;
  }
  if (!S_ISREG(st->st_mode)) {
    close(fd);
    return InvalidArgumentError("open " + path + ": " +
                                (S_ISDIR(st->st_mode) ? "is a directory" : "is not a regular file"));
  }
  if (Status s = CheckWithin(fd, path, within); !s.ok()) {
    close(fd);
    return s;
  }
  fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  if (CheckedOpenHook hook = checked_open_hook.load()) hook(path);
  return fd;
}

Result<std::unique_ptr<RandomAccessFile>> NewPosixRandomAccessFile(const std::string& path,
                                                                   const ReadOptions& options) {
  struct stat st;
  SS_ASSIGN_OR_RETURN(const int fd, OpenCheckedForRead(path, options.within, &st));
  // No O_DIRECT (tmpfs: EINVAL) just means every read goes through fd.
  const int direct_fd = options.direct ? ReopenDirect(fd, path, st) : -1;
  return std::unique_ptr<RandomAccessFile>(
      new PosixRandomAccessFile(fd, direct_fd, static_cast<uint64_t>(st.st_size), path));
}

bool IsDirectRandomAccessFile(const RandomAccessFile& file) {
  auto* posix = dynamic_cast<const PosixRandomAccessFile*>(&file);
  return posix != nullptr && posix->direct();
}

}  // namespace shardsafe
