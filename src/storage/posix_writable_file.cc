// POSIX WritableFile, in two modes.
//
// Buffered: Append() calls pwrite straight from the caller's memory (no
// copy); the page cache does the rest.
//
// Direct (O_DIRECT): the kernel needs 4 KiB-aligned memory, offsets and
// lengths, which callers do not provide. So Append() copies into one of
// queue_depth + 1 aligned buffers of `capacity_` bytes; each full buffer is
// handed to one of queue_depth I/O threads, which pwrites it at its offset
// (buffer k covers [k * capacity_, (k + 1) * capacity_)), while the caller
// fills the next buffer. At most queue_depth writes are in flight; when all
// buffers are busy the caller waits for one to come back. The unfinished
// last buffer is written by Sync()/Close() padded with zeros to 4 KiB and
// then the file is cut back to its true size with ftruncate.
//
// Errors from I/O threads are kept and reported by the next Append, Sync or
// Close; once a file has failed, every later call returns that error.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <vector>

#include "base/crc32c.h"
#include "base/thread_pool.h"
#include "storage/aligned_buffer.h"
#include "storage/posix_file.h"

namespace shardsafe {
namespace {

// Writes all of data[0, n) at `offset`, retrying EINTR and short writes.
Status PwriteAll(int fd, const char* data, size_t n, uint64_t offset, const std::string& path) {
  while (n > 0) {
    ssize_t w = pwrite(fd, data, n, static_cast<off_t>(offset));
    if (w < 0) {
      if (errno == EINTR) continue;
      return ErrnoError(errno, "write", path);
    }
    if (w == 0) return UnavailableError("write " + path + ": wrote 0 bytes");
    data += w;
    n -= static_cast<size_t>(w);
    offset += static_cast<uint64_t>(w);
  }
  return Status();
}

// Reserves `bytes` for the file without changing its size. Only a definite
// "no room" is an error; file systems that cannot preallocate are fine.
Status Preallocate(int fd, uint64_t bytes, const std::string& path) {
  if (bytes == 0) return Status();
  int rc;
  do {
    rc = fallocate(fd, FALLOC_FL_KEEP_SIZE, 0, static_cast<off_t>(bytes));
  } while (rc != 0 && errno == EINTR);
  if (rc == 0) return Status();
  if (errno == ENOSPC || errno == EDQUOT || errno == EFBIG || errno == EIO) {
    return ErrnoError(errno, "preallocate " + std::to_string(bytes) + " bytes for", path);
  }
  return Status();  // EOPNOTSUPP, ENODEV, ...: preallocation is only a hint
}

// State and bookkeeping shared by both modes.
class PosixWritableFile : public WritableFile {
 public:
  PosixWritableFile(int fd, std::string path) : fd_(fd), path_(std::move(path)) {}
  uint64_t size() const override { return size_; }

 protected:
  // OK if the file may still be written; else the sticky error.
  Status CheckUsable() const {
    if (!error_.ok()) return error_;
    if (fd_ < 0) return FailedPreconditionError("write " + path_ + ": file is closed");
    return Status();
  }
  // Remembers the first failure so no later call can miss it.
  Status Fail(Status s) {
    if (!s.ok() && error_.ok()) error_ = s;
    return error_.ok() ? s : error_;
  }
  Status DataSync() {
    if (fdatasync(fd_) != 0) return Fail(ErrnoError(errno, "fdatasync", path_));
    return Status();
  }
  // Closes the descriptor (once); returns the sticky error or the close error.
  Status CloseFd() {
    if (fd_ < 0) return error_;
    int rc = close(fd_);
    fd_ = -1;
    if (rc != 0 && errno != EINTR) return Fail(ErrnoError(errno, "close", path_));
    return error_;
  }

  int fd_;
  const std::string path_;
  uint64_t size_ = 0;
  Status error_;
};

class BufferedWritableFile final : public PosixWritableFile {
 public:
  using PosixWritableFile::PosixWritableFile;
  ~BufferedWritableFile() override { Close().IgnoreError(); }

  Status Append(const void* data, size_t n) override {
    SS_RETURN_IF_ERROR(CheckUsable());
    SS_RETURN_IF_ERROR(Fail(PwriteAll(fd_, static_cast<const char*>(data), n, size_, path_)));
    size_ += n;
    return Status();
  }
  Status Sync() override {
    SS_RETURN_IF_ERROR(CheckUsable());
    return DataSync();
  }
  Status Close() override { return CloseFd(); }
};

class DirectWritableFile final : public PosixWritableFile {
 public:
  DirectWritableFile(int fd, std::string path, const WriteOptions& options)
      : PosixWritableFile(fd, std::move(path)),
        queue_depth_(std::max(options.queue_depth, 1)),
        capacity_(BufferCapacity(options)) {
    buffers_.reserve(queue_depth_ + 1);
  }
  ~DirectWritableFile() override { Close().IgnoreError(); }

  Status Append(const void* data, size_t n) override;
  // Checksums each 8 KiB block as it copies it into the buffer (one read of
  // `data`; the buffer is written with streaming stores, as only the disk
  // reads it).
  Status AppendChecksummed(const void* data, size_t n, uint32_t* crc) override;
  // Fills its buffers straight from `fill`, then checksums them.
  Status AppendFilled(uint64_t bytes, const Filler& fill, uint32_t* crc) override;
  Status AppendStable(const void* data, size_t n) override;
  Status WaitStable() override {
    SS_RETURN_IF_ERROR(CheckUsable());
    return Drain();
  }
  Status Sync() override;
  Status Close() override;

 private:
  // Schedules a pwrite of caller memory that stays valid until Drain.
  void SubmitStable(const char* data, size_t n, uint64_t offset);
  // A file known to be small gets one small buffer instead of several large.
  static size_t BufferCapacity(const WriteOptions& options) {
    uint64_t cap = AlignUp(std::max<size_t>(options.buffer_bytes, kDirectIoAlignment));
    if (options.size_hint > 0) cap = std::min(cap, AlignUp(options.size_hint));
    return cap;
  }
  // Append's copy into the buffers; with `crc`, the checksumming copy.
  Status CopyIn(const void* data, size_t n, uint32_t* crc);
  // Hands the next `n` bytes of the file, buffer space by buffer space, to
  // put(to, done, take) (`done` bytes put before), submitting full buffers.
  template <typename Put>
  Status PutIntoBuffers(uint64_t n, Put put);
  Status NextBuffer();
  void SubmitCurrent();
  Status Drain();
  Status WriteTail();

  const int queue_depth_;
  const size_t capacity_;
  std::vector<AlignedBuffer> buffers_;  // touched by the caller's thread only
  int current_ = -1;                    // buffer being filled, or -1
  size_t fill_ = 0;                     // bytes in the current buffer
  uint64_t current_offset_ = 0;         // file offset of the current buffer
  uint64_t tail_written_at_ = UINT64_MAX;  // size_ when WriteTail last wrote the tail
  std::unique_ptr<ThreadPool> io_;      // started with the first full buffer

  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<int> free_;  // guarded by mu_: indexes of idle buffers
  int in_flight_ = 0;      // guarded by mu_
  Status io_error_;        // guarded by mu_: first failure of an I/O thread
  std::atomic<bool> io_failed_{false};  // io_error_ is set; checked lock-free
};

Status DirectWritableFile::Append(const void* data, size_t n) {
  return CopyIn(data, n, nullptr);
}

Status DirectWritableFile::AppendChecksummed(const void* data, size_t n, uint32_t* crc) {
  uint32_t extended = *crc;
  SS_RETURN_IF_ERROR(CopyIn(data, n, &extended));
  *crc = extended;
  return Status();
}

Status DirectWritableFile::AppendFilled(uint64_t bytes, const Filler& fill, uint32_t* crc) {
  uint32_t extended = *crc;
  SS_RETURN_IF_ERROR(PutIntoBuffers(bytes, [&](char* to, uint64_t done, size_t take) {
    SS_RETURN_IF_ERROR(fill(to, done, take));
    extended = Crc32cExtend(extended, to, take);
    return Status();
  }));
  *crc = extended;
  return Status();
}

Status DirectWritableFile::CopyIn(const void* data, size_t n, uint32_t* crc) {
  const char* p = static_cast<const char*>(data);
  return PutIntoBuffers(n, [&](char* to, uint64_t done, size_t take) {
    if (crc != nullptr) {
      *crc = CopyWithCrc32c(to, p + done, take, *crc);
    } else {
      std::memcpy(to, p + done, take);
    }
    return Status();
  });
}

template <typename Put>
Status DirectWritableFile::PutIntoBuffers(uint64_t n, Put put) {
  SS_RETURN_IF_ERROR(CheckUsable());
  if (io_failed_.load(std::memory_order_acquire)) return Drain();
  for (uint64_t done = 0; done < n;) {
    if (current_ < 0) SS_RETURN_IF_ERROR(NextBuffer());
    const size_t take = static_cast<size_t>(std::min<uint64_t>(n - done, capacity_ - fill_));
    SS_RETURN_IF_ERROR(put(buffers_[current_].data() + fill_, done, take));
    fill_ += take;
    size_ += take;
    done += take;
    if (fill_ == capacity_) SubmitCurrent();
  }
  return Status();
}

// Aligned caller memory at an aligned file offset (nothing buffered) is
// written in place, queue_depth requests of capacity_ bytes in flight; the
// unaligned tail goes through a buffer as usual.
Status DirectWritableFile::AppendStable(const void* data, size_t n) {
  const char* p = static_cast<const char*>(data);
  if (current_ >= 0 || !IsAligned(size_) || !IsAligned(reinterpret_cast<uintptr_t>(p))) {
    return Append(data, n);
  }
  SS_RETURN_IF_ERROR(CheckUsable());
  if (io_failed_.load(std::memory_order_acquire)) return Drain();
  const size_t body = n / kDirectIoAlignment * kDirectIoAlignment;
  for (size_t done = 0; done < body;) {
    const size_t len = std::min(capacity_, body - done);
    SubmitStable(p + done, len, size_ + done);
    done += len;
  }
  size_ += body;
  current_offset_ = size_;
  return Append(p + body, n - body);
}

void DirectWritableFile::SubmitStable(const char* data, size_t n, uint64_t offset) {
  if (!io_) io_ = std::make_unique<ThreadPool>(queue_depth_);
  {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [this] { return in_flight_ < queue_depth_; });
    ++in_flight_;
  }
  io_->Schedule([this, data, n, offset] {
    Status s = PwriteAll(fd_, data, n, offset, path_);
    std::lock_guard<std::mutex> lock(mu_);
    if (!s.ok() && io_error_.ok()) {
      io_error_ = s;
      io_failed_.store(true, std::memory_order_release);
    }
    --in_flight_;
    cv_.notify_all();
  });
}

// Makes an idle buffer current: a recycled one, a new one while fewer than
// queue_depth + 1 exist, or else the first one an I/O thread gives back.
Status DirectWritableFile::NextBuffer() {
  std::unique_lock<std::mutex> lock(mu_);
  if (free_.empty() && buffers_.size() < static_cast<size_t>(queue_depth_) + 1) {
    lock.unlock();
    buffers_.push_back(AcquireAlignedBuffer(capacity_));
    current_ = static_cast<int>(buffers_.size()) - 1;
    return Status();
  }
  cv_.wait(lock, [this] { return !free_.empty(); });
  if (!io_error_.ok()) return Fail(io_error_);  // stop filling: the file is lost
  current_ = free_.back();
  free_.pop_back();
  return Status();
}

void DirectWritableFile::SubmitCurrent() {
  if (!io_) io_ = std::make_unique<ThreadPool>(queue_depth_);
  const int index = std::exchange(current_, -1);
  const char* data = buffers_[index].data();
  const uint64_t offset = current_offset_;
  current_offset_ += capacity_;
  fill_ = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++in_flight_;
  }
  io_->Schedule([this, index, data, offset] {
    Status s = PwriteAll(fd_, data, capacity_, offset, path_);
    std::lock_guard<std::mutex> lock(mu_);
    if (!s.ok() && io_error_.ok()) {
      io_error_ = s;
      io_failed_.store(true, std::memory_order_release);
    }
    free_.push_back(index);
    --in_flight_;
    cv_.notify_all();  // under the lock: the file may be destroyed right after
  });
}

// Waits for every in-flight write; returns the first I/O failure.
Status DirectWritableFile::Drain() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [this] { return in_flight_ == 0; });
  return Fail(io_error_);
}

// Writes the partly filled buffer, padded to 4 KiB, then trims the padding.
// The buffer stays current: later appends keep filling it and rewrite it.
// Nothing appended since the last call: nothing to write (so Close after
// Sync leaves the synced file untouched).
Status DirectWritableFile::WriteTail() {
  if (current_ < 0 || fill_ == 0 || tail_written_at_ == size_) return Status();
  char* data = buffers_[current_].data();
  const size_t padded = AlignUp(fill_);
  std::memset(data + fill_, 0, padded - fill_);
  SS_RETURN_IF_ERROR(Fail(PwriteAll(fd_, data, padded, current_offset_, path_)));
  if (padded != fill_ && ftruncate(fd_, static_cast<off_t>(size_)) != 0) {
    return Fail(ErrnoError(errno, "ftruncate", path_));
  }
  tail_written_at_ = size_;
  return Status();
}

Status DirectWritableFile::Sync() {
  SS_RETURN_IF_ERROR(CheckUsable());
  SS_RETURN_IF_ERROR(Drain());
  SS_RETURN_IF_ERROR(WriteTail());
  return DataSync();
}

Status DirectWritableFile::Close() {
  if (fd_ < 0) return error_;
  if (Drain().ok()) WriteTail().IgnoreError();  // a failure is kept in error_
  io_.reset();
  Status s = CloseFd();
  buffers_.clear();  // back to the process-wide cache
  current_ = -1;
  return s;
}

// Returns the descriptor, or -errno.
int OpenForWrite(const std::string& path, bool direct) {
  int flags = O_CREAT | O_TRUNC | O_WRONLY | O_CLOEXEC | (direct ? O_DIRECT : 0);
  int fd;
  do {
    fd = open(path.c_str(), flags, 0644);
  } while (fd < 0 && errno == EINTR);
  return fd >= 0 ? fd : -errno;
}

}  // namespace

Result<std::unique_ptr<WritableFile>> NewPosixWritableFile(const std::string& path,
                                                           const WriteOptions& options) {
  bool direct = options.direct;
  int fd = OpenForWrite(path, direct);
  if (fd == -EINVAL && direct) {
    direct = false;  // e.g. tmpfs before Linux 6.6: write through the page cache
    fd = OpenForWrite(path, false);
  }
  if (fd < 0) return ErrnoError(-fd, "create", path);
  Status s = Preallocate(fd, options.size_hint, path);
  if (!s.ok()) {
    close(fd);
    return s;
  }
  if (direct) return std::unique_ptr<WritableFile>(new DirectWritableFile(fd, path, options));
  return std::unique_ptr<WritableFile>(new BufferedWritableFile(fd, path));
}

bool IsDirectWritableFile(const WritableFile& file) {
  return dynamic_cast<const DirectWritableFile*>(&file) != nullptr;
}

}  // namespace shardsafe
