// Helpers over any FileSystem: atomic whole-file writes, whole-file reads,
// and path arithmetic. They use only the FileSystem interface, so they work
// (and are tested) on the fault-injecting wrapper too. Also the default
// WritableFile::AppendChecksummed (checksum, then Append) and AppendFilled
// (through a bounce buffer).
#include <algorithm>
#include <memory>
#include <random>

#include "shardsafe/filesystem.h"

#include "base/crc32c.h"

namespace shardsafe {

Status WritableFile::AppendChecksummed(const void* data, size_t n, uint32_t* crc) {
  const uint32_t extended = Crc32cExtend(*crc, data, n);
  SS_RETURN_IF_ERROR(Append(data, n));
  *crc = extended;
  return Status();
}

Status WritableFile::AppendFilled(uint64_t bytes, const Filler& fill, uint32_t* crc) {
  const size_t size = static_cast<size_t>(std::min<uint64_t>(bytes, kFillBounceBytes));
  auto bounce = std::make_unique_for_overwrite<char[]>(size);
  uint32_t extended = *crc;
  for (uint64_t done = 0; done < bytes;) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(size, bytes - done));
    SS_RETURN_IF_ERROR(fill(bounce.get(), done, n));
    SS_RETURN_IF_ERROR(AppendChecksummed(bounce.get(), n, &extended));
    done += n;
  }
  *crc = extended;
  return Status();
}

std::string BaseName(std::string_view path) {
  while (path.size() > 1 && path.back() == '/') path.remove_suffix(1);
  const size_t slash = path.rfind('/');
  return std::string(slash == std::string_view::npos ? path : path.substr(slash + 1));
}

Status CreateDirs(FileSystem& fs, const std::string& path) {
  auto info = fs.Stat(path);
  if (info.ok()) {
    if (info->is_dir) return Status();
    return FailedPreconditionError(path + " exists and is not a directory");
  }
  // Only a missing path is created (a URI or a permission error is returned
  // as is, never "fixed" by creating a prefix of it).
  if (info.status().code() != StatusCode::kNotFound) return info.status();
  const std::string parent = ParentDir(path);
  if (parent != path && parent != "." && parent != "/") SS_RETURN_IF_ERROR(CreateDirs(fs, parent));
  Status s = fs.CreateDir(path);
  if (s.code() == StatusCode::kAlreadyExists) return Status();
  return s;
}

std::string RandomSuffix() {
  // Drawn from the OS each time, not from a seeded generator: a forked
  // child would repeat its parent's sequence.
  std::random_device rd;
  static constexpr char kDigits[] = "0123456789abcdef";
  uint64_t x = uint64_t{rd()} << 32 | rd();
  std::string s(16, '0');
  for (char& c : s) {
    c = kDigits[x & 15];
    x >>= 4;
  }
  return s;
}

namespace {

Status WriteAndSync(FileSystem& fs, const std::string& path, std::string_view data) {
  WriteOptions options;
  options.size_hint = data.size();
  SS_ASSIGN_OR_RETURN(auto file, fs.NewWritableFile(path, options));
  SS_RETURN_IF_ERROR(file->Append(data.data(), data.size()));
  SS_RETURN_IF_ERROR(file->Sync());
  return file->Close();
}

}  // namespace

Status RandomAccessFile::ReadScattered(uint64_t offset, std::span<const Piece> pieces) const {
  for (const Piece& p : pieces) {
    SS_RETURN_IF_ERROR(ReadAt(offset, p.dst, p.n));
    offset += p.n;
  }
  return Status();
}

Status WriteFileAtomically(FileSystem& fs, const std::string& path, std::string_view data) {
  // An object appears whole when its upload completes.
  if (fs.IsObjectStore()) return WriteAndSync(fs, path, data).WithContext("writing " + path);
  const std::string parent = ParentDir(path);
  const std::string tmp = JoinPath(parent, "." + BaseName(path) + ".tmp." + RandomSuffix());
  // 1. Write and sync the temporary. 2. Rename it over `path`. Before step 2
  // completes, readers see the old file; after it, the new one.
  Status s = WriteAndSync(fs, tmp, data);
  if (s.ok()) s = fs.Rename(tmp, path);
  if (!s.ok()) {
    fs.RemoveFile(tmp).IgnoreError();  // may not exist
    return s.WithContext("writing " + path);
  }
  // 3. Make the rename itself durable.
  return fs.SyncDir(parent).WithContext("writing " + path);
}

Result<std::string> ReadFileToString(FileSystem& fs, const std::string& path,
                                     uint64_t max_bytes, const ReadOptions& options) {
  if (fs.IsObjectStore()) {  // one GET, where opening would add a HEAD
    std::string version;
    return fs.ReadFileVersioned(path, max_bytes, &version);
  }
  SS_ASSIGN_OR_RETURN(auto file, fs.NewRandomAccessFile(path, options));
  const uint64_t size = file->size();
  if (size > max_bytes) {
    return ResourceExhaustedError("reading " + path + ": file has " + std::to_string(size) +
                                  " bytes, more than the limit of " + std::to_string(max_bytes));
  }
  std::string data(size, '\0');
  SS_RETURN_IF_ERROR(file->ReadAt(0, data.data(), data.size()));
  return data;
}

std::string JoinPath(std::string_view dir, std::string_view name) {
  if (dir.empty()) return std::string(name);
  std::string out(dir);
  if (out.back() != '/') out += '/';
  out += name;
  return out;
}

std::string ParentDir(std::string_view path) {
  while (path.size() > 1 && path.back() == '/') path.remove_suffix(1);
  size_t slash = path.rfind('/');
  if (slash == std::string_view::npos) return ".";
  if (slash == 0) return "/";
  path = path.substr(0, slash);
  while (path.size() > 1 && path.back() == '/') path.remove_suffix(1);
  return std::string(path);
}

}  // namespace shardsafe
