// shardsafe._C.PrefixDownload: every object under a prefix of an object
// store (an s3:// URI; any path FileSystemFor knows) copied into a local
// directory, through the engine's FileSystem. The Python package stages
// other tools' checkpoints this way (their readers read local files):
// python/shardsafe/_paths.py staged().
//
// 1. The constructor lists the prefix recursively (ListDir) and opens every
//    object (NewRandomAccessFile: one HEAD each, on kThreads threads), so
//    the caller knows the total size before any byte is copied. A missing
//    or empty prefix lists nothing.
// 2. to(dir) creates every file under `dir` (which must exist; a file
//    already there is AlreadyExists) at its final size, then copies the
//    objects in pieces of kPieceBytes: kThreads workers each take the next
//    piece of any object, read it (ReadAt: one ranged GET) into a buffer of
//    their own and write it at its offset. Memory: kThreads pieces at most.
//    The first failure stops every worker; the files already written stay
//    (the caller removes its directory).
//
// Errors are one line naming the object: "s3://b/p/x.distcp: bytes
// [0, 8388608) into /tmp/d/x.distcp: ...". An object name that cannot be a
// local file name ("..", a NUL) is InvalidArgument. A progress callback,
// when given, is called with the bytes of each piece once written (with the
// GIL held, from the workers); an exception it raises stops the copy.
#include <fcntl.h>
#include <unistd.h>

#include <nanobind/nanobind.h>
#include <nanobind/stl/function.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "base/thread_pool.h"
#include "python/bindings.h"
#include "python/status_error.h"
#include "shardsafe/filesystem.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace shardsafe::python {
namespace {

constexpr size_t kPieceBytes = size_t{8} << 20;
constexpr size_t kThreads = 8;

struct Object {
  std::string name;  // relative to the prefix, '/'-separated
  std::unique_ptr<RandomAccessFile> file;
};

Status CheckName(const std::string& dir, const std::string& name) {
  if (name.empty() || name == "." || name == ".." || name.find('\0') != std::string::npos ||
      name.find('/') != std::string::npos) {
    return InvalidArgumentError(JoinPath(dir, name) +
                                ": the object's name cannot be a local file name");
  }
  return Status();
}

// Appends the names of the objects under `rel` (relative to `root`).
Status ListInto(FileSystem& fs, const std::string& root, const std::string& rel,
                std::vector<std::string>* names) {
  const std::string dir = rel.empty() ? root : JoinPath(root, rel);
  Result<std::vector<DirEntry>> entries = fs.ListDir(dir);
  if (!entries.ok() && entries.status().code() == StatusCode::kNotFound && rel.empty()) {
    return Status();  // nothing under the prefix
  }
  SS_RETURN_IF_ERROR(entries.status());
  for (const DirEntry& e : *entries) {
    SS_RETURN_IF_ERROR(CheckName(dir, e.name));
    const std::string name = rel.empty() ? e.name : JoinPath(rel, e.name);
    if (e.is_dir) {
      SS_RETURN_IF_ERROR(ListInto(fs, root, name, names));
    } else {
      names->push_back(name);
    }
  }
  return Status();
}

// Writes all of [data, data + n) at `offset` of the open file `fd`.
Status WriteAt(int fd, const char* data, size_t n, uint64_t offset, const std::string& path) {
  while (n > 0) {
    const ssize_t w = pwrite(fd, data, n, static_cast<off_t>(offset));
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) return ErrnoError(errno, "writing", path);
    data += w;
    n -= static_cast<size_t>(w);
    offset += static_cast<uint64_t>(w);
  }
  return Status();
}

// Creates `path` (and its parents) holding `size` zero bytes; AlreadyExists
// if it is there.
Status CreateSized(const std::string& path, uint64_t size) {
  std::error_code ec;
  std::filesystem::create_directories(std::filesystem::path(path).parent_path(), ec);
  if (ec) return ErrnoError(ec.value(), "creating the directory of", path);
  const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoError(errno, "creating", path);
  const int rc = ftruncate(fd, static_cast<off_t>(size));
  const int err = errno;
  close(fd);
  return rc == 0 ? Status() : ErrnoError(err, "sizing", path);
}

using Progress = std::function<Status(uint64_t bytes)>;

class Download {
 public:
  Download(Download&&) = default;
  Download(const Download&) = delete;  // holds open files
  Download& operator=(const Download&) = delete;

  // Step 1 of the file comment.
  static Result<Download> Open(const std::string& uri) {
    SS_ASSIGN_OR_RETURN(FileSystem * fs, FileSystemFor(uri));
    std::vector<std::string> names;
    SS_RETURN_IF_ERROR(ListInto(*fs, uri, "", &names));
    std::sort(names.begin(), names.end());
    Download d(uri);
    d.objects_.resize(names.size());
    ThreadPool pool(std::min(kThreads, names.size()));
    TaskGroup group(&pool);
    for (size_t i = 0; i < names.size(); ++i) {
      group.Add([&, i] {
        Object& o = d.objects_[i];
        o.name = names[i];
        SS_ASSIGN_OR_RETURN(o.file, fs->NewRandomAccessFile(JoinPath(uri, o.name), {}));
        return Status();
      });
    }
    SS_RETURN_IF_ERROR(group.Wait());
    return d;
  }

  uint64_t total_bytes() const {
    uint64_t total = 0;
    for (const Object& o : objects_) total += o.file->size();
    return total;
  }

  std::vector<std::pair<std::string, uint64_t>> objects() const {
    std::vector<std::pair<std::string, uint64_t>> out;
    for (const Object& o : objects_) out.emplace_back(o.name, o.file->size());
    return out;
  }

  // Step 2 of the file comment.
  Status To(const std::string& dir, const Progress& progress) const {
    SS_RETURN_IF_ERROR(CheckLocalPath(dir));
    std::vector<Piece> pieces;
    for (size_t i = 0; i < objects_.size(); ++i) {
      const uint64_t size = objects_[i].file->size();
      SS_RETURN_IF_ERROR(CreateSized(JoinPath(dir, objects_[i].name), size));
      for (uint64_t at = 0; at < size; at += kPieceBytes) {
        pieces.push_back({i, at, static_cast<size_t>(std::min<uint64_t>(kPieceBytes, size - at))});
      }
    }
    // Each worker takes the next piece until none is left or one failed (a
    // pool that got no threads runs the first worker inline: it copies all).
    std::atomic<size_t> next{0};
    std::atomic<bool> failed{false};
    const size_t workers = std::min(kThreads, pieces.size());
    ThreadPool pool(workers);
    TaskGroup group(&pool);
    for (size_t w = 0; w < workers; ++w) {
      group.Add([&] {
        std::vector<char> buffer;
        for (size_t p = next++; p < pieces.size() && !failed; p = next++) {
          Status s = Copy(pieces[p], dir, &buffer, progress);
          if (!s.ok()) {
            failed = true;
            return s;
          }
        }
        return Status();
      });
    }
    return group.Wait();
  }

 private:
  struct Piece {
    size_t object;
    uint64_t offset;
    size_t n;
  };

  explicit Download(std::string uri) : uri_(std::move(uri)) {}

  Status Copy(const Piece& p, const std::string& dir, std::vector<char>* buffer,
              const Progress& progress) const {
    const Object& o = objects_[p.object];
    const std::string path = JoinPath(dir, o.name);
    Status s = CopyPiece(o, p, path, buffer);
    if (s.ok() && progress) s = progress(p.n);
    return s.WithContext(JoinPath(uri_, o.name) + ": bytes [" + std::to_string(p.offset) + ", " +
                         std::to_string(p.offset + p.n) + ") into " + path);
  }

  static Status CopyPiece(const Object& o, const Piece& p, const std::string& path,
                          std::vector<char>* buffer) {
    if (buffer->size() < p.n) buffer->resize(p.n);
    SS_RETURN_IF_ERROR(o.file->ReadAt(p.offset, buffer->data(), p.n));
    const int fd = open(path.c_str(), O_WRONLY | O_CLOEXEC);
    if (fd < 0) return ErrnoError(errno, "opening", path);
    Status s = WriteAt(fd, buffer->data(), p.n, p.offset, path);
    close(fd);
    return s;
  }

  std::string uri_;
  std::vector<Object> objects_;
};

// The Python callback as a Progress: an exception it raises becomes the
// copy's error (the GIL is taken for each call).
Progress PythonProgress(nb::object callback) {
  if (callback.is_none()) return {};
  auto held = std::make_shared<nb::object>(std::move(callback));
  return [held](uint64_t bytes) {
    nb::gil_scoped_acquire gil;
    try {
      (*held)(bytes);
      return Status();
    } catch (const nb::python_error& e) {
      return UnavailableError("the progress callback raised " +
                              nb::cast<std::string>(nb::str(e.value())));
    }
  };
}

}  // namespace

void BindDownload(nb::module_& m) {
  nb::class_<Download>(m, "PrefixDownload")
      .def("__init__",
           [](Download* self, const std::string& uri) {
             new (self) Download(Released([&] { return Download::Open(uri); }));
           },
           "uri"_a)
      .def_prop_ro("total_bytes", &Download::total_bytes)
      .def_prop_ro("objects", &Download::objects)
      .def(
          "to",
          [](const Download& d, const std::string& dir, nb::object progress) {
            Progress p = PythonProgress(std::move(progress));
            CheckReleased([&] { return d.To(dir, p); });
          },
          "dir"_a, "progress"_a = nb::none());
}

}  // namespace shardsafe::python
