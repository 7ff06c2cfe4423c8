// DefaultFileSystem(): the POSIX FileSystem. File objects live in
// posix_writable_file.cc and posix_random_access_file.cc; this file holds
// the directory operations.
//
// Rename keeps the contract "a file target is replaced, a directory target
// never is": it first tries renameat2(RENAME_NOREPLACE), which cannot touch
// an existing target, and only when the target turns out to be a file falls
// back to rename(2), which replaces it atomically.
#include <dirent.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <mutex>
#include <set>

#include "storage/posix_file.h"

namespace shardsafe {
namespace {

// Closes a descriptor when it goes out of scope.
class FdCloser {
 public:
  explicit FdCloser(int fd) : fd_(fd) {}
  ~FdCloser() {
    if (fd_ >= 0) close(fd_);
  }
  FdCloser(const FdCloser&) = delete;
  FdCloser& operator=(const FdCloser&) = delete;

 private:
  int fd_;
};

bool IsDirEntry(int dir_fd, const dirent& e) {
  if (e.d_type != DT_UNKNOWN) return e.d_type == DT_DIR;
  struct stat st;
  return fstatat(dir_fd, e.d_name, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISDIR(st.st_mode);
}

bool IsDotOrDotDot(const char* name) {
  return name[0] == '.' && (name[1] == '\0' || (name[1] == '.' && name[2] == '\0'));
}

// Removes everything inside the directory open as `dir_fd` (which it takes
// over and closes). Symbolic links are removed, never followed.
Status RemoveContents(int dir_fd, const std::string& path) {
  DIR* dir = fdopendir(dir_fd);
  if (dir == nullptr) {
    Status s = ErrnoError(errno, "open directory", path);
    close(dir_fd);
    return s;
  }
  Status status;
  while (dirent* e = readdir(dir)) {
    if (IsDotOrDotDot(e->d_name)) continue;
    const std::string child = JoinPath(path, e->d_name);
    if (IsDirEntry(dir_fd, *e)) {
      int child_fd = openat(dir_fd, e->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
      if (child_fd < 0 && errno == ENOENT) continue;  // removed by someone else meanwhile
      Status s = child_fd < 0 ? ErrnoError(errno, "open directory", child)
                              : RemoveContents(child_fd, child);
      if (s.ok() && unlinkat(dir_fd, e->d_name, AT_REMOVEDIR) != 0 && errno != ENOENT) {
        s = ErrnoError(errno, "remove directory", child);
      }
      if (!s.ok() && status.ok()) status = s;
    } else if (unlinkat(dir_fd, e->d_name, 0) != 0 && errno != ENOENT && status.ok()) {
      status = ErrnoError(errno, "remove", child);
    }
  }
  closedir(dir);
  return status;
}

// The scheme of a URI ("s3" of "s3://bucket/key"), or empty.
std::string_view UriScheme(std::string_view path) {
  const size_t colon = path.find("://");
  if (colon == std::string_view::npos || colon == 0 || !std::isalpha(path[0])) return {};
  for (char c : path.substr(0, colon)) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '+' && c != '-' && c != '.') return {};
  }
  return path.substr(0, colon);
}

// Every path is checked before any system call (CheckLocalPath): a
// checkpoint meant for a bucket must not land in the working directory.
Status PathOk(const std::string& path) { return CheckLocalPath(path); }

class PosixFileSystem final : public FileSystem {
 public:
  Result<std::unique_ptr<WritableFile>> NewWritableFile(const std::string& path,
                                                        const WriteOptions& options) override {
    SS_RETURN_IF_ERROR(PathOk(path));
    return NewPosixWritableFile(path, options);
  }
  Result<std::unique_ptr<RandomAccessFile>> NewRandomAccessFile(
      const std::string& path, const ReadOptions& options) override {
    SS_RETURN_IF_ERROR(PathOk(path));
    return NewPosixRandomAccessFile(path, options);
  }
  Result<FileInfo> Stat(const std::string& path) override;
  Result<std::vector<DirEntry>> ListDir(const std::string& path) override;
  Status CreateDir(const std::string& path) override {
    SS_RETURN_IF_ERROR(PathOk(path));
    if (mkdir(path.c_str(), 0755) != 0) return ErrnoError(errno, "create directory", path);
    return Status();
  }
  Status RemoveFile(const std::string& path) override {
    SS_RETURN_IF_ERROR(PathOk(path));
    if (unlink(path.c_str()) != 0) return ErrnoError(errno, "remove", path);
    return Status();
  }
  Status RemoveAll(const std::string& path) override;
  Status Rename(const std::string& from, const std::string& to) override;
  Status RenameExchange(const std::string& a, const std::string& b) override;
  Status SyncDir(const std::string& path) override;
  Result<uint64_t> FreeBytes(const std::string& dir) override {
    SS_RETURN_IF_ERROR(PathOk(dir));
    struct statvfs st;
    if (statvfs(dir.c_str(), &st) != 0) return ErrnoError(errno, "statvfs", dir);
    return static_cast<uint64_t>(st.f_bavail) * st.f_frsize;
  }
  Result<std::unique_ptr<FileLock>> TryLock(const std::string& path, LockMode mode) override;
};

// A flock lock belongs to the open file description, which a forked child
// shares: a child forked while a lock was held (a data loader's worker
// during a save's commit) would hold it for its whole life. So a child
// closes its copies of every lock's descriptor at once (pthread_atfork);
// the parent's copy keeps the lock.
class FlockLock final : public FileLock {
 public:
  explicit FlockLock(int fd) : fd_(fd) {
    std::call_once(atfork_once_, [] { pthread_atfork(&LockAll, &UnlockAll, &ForgetAllInChild); });
    std::lock_guard<std::mutex> lock(mu_);
    live_.insert(this);
  }
  ~FlockLock() override {
    std::lock_guard<std::mutex> lock(mu_);
    live_.erase(this);
    if (fd_ >= 0) close(fd_);  // releases the lock
  }

 private:
  static void LockAll() { mu_.lock(); }
  static void UnlockAll() { mu_.unlock(); }
  static void ForgetAllInChild() {
    for (FlockLock* l : live_) {
      close(l->fd_);
      l->fd_ = -1;
    }
    mu_.unlock();
  }

  int fd_;
  static inline std::mutex mu_;
  static inline std::set<FlockLock*> live_;
  static inline std::once_flag atfork_once_;
};

Result<FileInfo> PosixFileSystem::Stat(const std::string& path) {
  SS_RETURN_IF_ERROR(PathOk(path));
  struct stat st;
  if (stat(path.c_str(), &st) != 0) return ErrnoError(errno, "stat", path);
  FileInfo info;
  info.size = static_cast<uint64_t>(st.st_size);
  info.is_dir = S_ISDIR(st.st_mode);
  info.mtime_seconds = st.st_mtim.tv_sec;
  info.mtime_ns = st.st_mtim.tv_sec * int64_t{1000000000} + st.st_mtim.tv_nsec;
  return info;
}

Result<std::vector<DirEntry>> PosixFileSystem::ListDir(const std::string& path) {
  SS_RETURN_IF_ERROR(PathOk(path));
  DIR* dir = opendir(path.c_str());
  if (dir == nullptr) return ErrnoError(errno, "list directory", path);
  std::vector<DirEntry> entries;
  Status s;
  for (;;) {
    errno = 0;  // readdir returns null both at the end and on error
    dirent* e = readdir(dir);
    if (e == nullptr) {
      if (errno != 0) s = ErrnoError(errno, "list directory", path);
      break;
    }
    if (!IsDotOrDotDot(e->d_name)) entries.push_back({e->d_name, IsDirEntry(dirfd(dir), *e)});
  }
  closedir(dir);
  if (!s.ok()) return s;
  return entries;
}

Status PosixFileSystem::RemoveAll(const std::string& path) {
  SS_RETURN_IF_ERROR(PathOk(path));
  struct stat st;
  if (lstat(path.c_str(), &st) != 0) {
    return errno == ENOENT ? Status() : ErrnoError(errno, "stat", path);
  }
  if (!S_ISDIR(st.st_mode)) {
    if (unlink(path.c_str()) != 0 && errno != ENOENT) return ErrnoError(errno, "remove", path);
    return Status();
  }
  int fd = open(path.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return errno == ENOENT ? Status() : ErrnoError(errno, "open directory", path);
  SS_RETURN_IF_ERROR(RemoveContents(fd, path));
  if (rmdir(path.c_str()) != 0 && errno != ENOENT) {
    return ErrnoError(errno, "remove directory", path);
  }
  return Status();
}

Status PosixFileSystem::Rename(const std::string& from, const std::string& to) {
  SS_RETURN_IF_ERROR(PathOk(from));
  SS_RETURN_IF_ERROR(PathOk(to));
  const std::string what = from + " to";
  if (renameat2(AT_FDCWD, from.c_str(), AT_FDCWD, to.c_str(), RENAME_NOREPLACE) == 0) {
    return Status();
  }
  const int err = errno;
  if (err != EEXIST && err != EINVAL && err != ENOSYS) return ErrnoError(err, "rename " + what, to);
  // The target exists (or NOREPLACE is unsupported): only a file may be replaced.
  struct stat st;
  if (lstat(to.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
    return AlreadyExistsError("rename " + from + " to " + to + ": target directory exists");
  }
  if (rename(from.c_str(), to.c_str()) != 0) return ErrnoError(errno, "rename " + what, to);
  return Status();
}

Status PosixFileSystem::RenameExchange(const std::string& a, const std::string& b) {
  SS_RETURN_IF_ERROR(PathOk(a));
  SS_RETURN_IF_ERROR(PathOk(b));
  if (renameat2(AT_FDCWD, a.c_str(), AT_FDCWD, b.c_str(), RENAME_EXCHANGE) == 0) return Status();
  if (errno == EINVAL || errno == ENOSYS) {
    return UnimplementedError("atomic exchange of " + a + " and " + b + " is not supported");
  }
  return ErrnoError(errno, "exchange " + a + " with", b);
}

Status PosixFileSystem::SyncDir(const std::string& path) {
  SS_RETURN_IF_ERROR(PathOk(path));
  int fd = open(path.c_str(), O_DIRECTORY | O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoError(errno, "open directory", path);
  FdCloser closer(fd);
  if (fsync(fd) != 0) return ErrnoError(errno, "fsync directory", path);
  return Status();
}

Result<std::unique_ptr<FileLock>> PosixFileSystem::TryLock(const std::string& path,
                                                           LockMode mode) {
  SS_RETURN_IF_ERROR(PathOk(path));
  int fd = open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return ErrnoError(errno, "open for locking", path);
  std::unique_ptr<FileLock> lock(new FlockLock(fd));  // closes fd on every path
  int rc;
  do {
    rc = flock(fd, (mode == LockMode::kShared ? LOCK_SH : LOCK_EX) | LOCK_NB);
  } while (rc != 0 && errno == EINTR);
  if (rc != 0) {
    if (errno == EWOULDBLOCK) return FailedPreconditionError(path + " is locked (in use)");
    if (errno == ENOLCK || errno == EOPNOTSUPP || errno == ENOSYS) {  // e.g. NFS without locks
      return UnimplementedError("locking " + path + " is not supported here");
    }
    return ErrnoError(errno, "lock", path);
  }
  // Locked what the path named at open: it must still name it.
  struct stat held, now;
  if (fstat(fd, &held) != 0) return ErrnoError(errno, "stat", path);
  if (stat(path.c_str(), &now) != 0) return ErrnoError(errno, "stat", path);
  if (held.st_dev != now.st_dev || held.st_ino != now.st_ino) {
    return NotFoundError(path + " was replaced while it was being locked");
  }
  return lock;
}

}  // namespace

Status CheckLocalPath(std::string_view path) {
  if (std::string_view scheme = UriScheme(path); scheme == "s3") {
    return UnimplementedError(std::string(path) +
                              ": the local file system does not take object storage URIs "
                              "(FileSystemFor picks the S3 one)");
  } else if (!scheme.empty()) {
    return UnimplementedError(std::string(path) + ": no storage for " + std::string(scheme) +
                              ":// URIs; shardsafe reads and writes local paths and s3://");
  }
  if (path.find('\0') == std::string_view::npos) return Status();
  std::string shown(path);
  std::replace(shown.begin(), shown.end(), '\0', '?');
  return InvalidArgumentError(shown + ": the path holds a NUL byte");
}

FileSystem* DefaultFileSystem() {
  static PosixFileSystem* fs = new PosixFileSystem;  // never destroyed
  return fs;
}

}  // namespace shardsafe
