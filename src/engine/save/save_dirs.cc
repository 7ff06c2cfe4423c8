#include "engine/save/save_dirs.h"

#include <algorithm>

#include "base/thread_pool.h"

namespace shardsafe {
namespace {

// Parts of a chunk table written at once.
constexpr size_t kParallelTableWrites = 8;

// Writes `text` as the file `path`, fdatasync'ed.
Status WriteSynced(FileSystem& fs, const std::string& path, const std::string& text) {
  SS_ASSIGN_OR_RETURN(auto file, fs.NewWritableFile(path, WriteOptions{}));
  SS_RETURN_IF_ERROR(file->Append(text.data(), text.size()));
  SS_RETURN_IF_ERROR(file->Sync());
  return file->Close();
}

}  // namespace

Status WriteSaveFile(FileSystem& fs, const std::string& path, const std::string& bytes) {
  // In an object store one PUT, under a private name as the data's.
  return fs.IsObjectStore() ? WriteFileAtomically(fs, path, bytes) : WriteSynced(fs, path, bytes);
}

Status WriteChunkTable(FileSystem& fs, const std::string& dir, const EncodedChunkTable& table) {
  const size_t parts = table.parts.size();
  ThreadPool pool(parts > 1 ? std::min<size_t>(kParallelTableWrites, parts) : 0);
  TaskGroup writes(&pool);
  for (size_t p = 0; p < parts; ++p) {
    writes.Add([&fs, &bytes = table.bytes[p], path = JoinPath(dir, table.parts[p].name)] {
      return WriteSaveFile(fs, path, bytes);
    });
  }
  return writes.Wait();
}

Status CheckFreeSpace(FileSystem& fs, const std::string& root, uint64_t bytes) {
  std::string dir = root;
  while (!fs.Stat(dir).ok() && ParentDir(dir) != dir) dir = ParentDir(dir);
  Result<uint64_t> free = fs.FreeBytes(dir);
  if (!free.ok() || bytes <= *free) return Status();
  return ResourceExhaustedError(root + ": " + std::to_string(bytes) +
                                " bytes to write, the file system there has " +
                                std::to_string(*free) + " bytes free; nothing was written");
}

}  // namespace shardsafe
