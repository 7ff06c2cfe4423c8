// Where a save writes, how it commits, and how it writes the small files
// beside its data (checksum files, chunk table parts, the index): what the
// writers (save_writer.h), the POSIX commit (commit.h) and the object-store
// commit (object_store_commit.h) share.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "format/chunk_table.h"
#include "shardsafe/filesystem.h"

namespace shardsafe {

// Where a save writes. On POSIX, `tmp` is the temporary directory the
// data files are written into and that step 5 renames; `data` is `tmp`
// and `file_suffix` "". On an object store (docs/design.md, "Object
// storage"), `tmp` is ROOT/.tmp-TAG.NONCE, private to the save and holding
// only an async save's markers; the data files go straight to `data`,
// ROOT/TAG, named data-RRRRR-FFF`file_suffix`.safetensors with
// `file_suffix` ".NONCE", a name no other save uses.
struct SaveDirs {
  std::string tmp;
  std::string data;
  std::string file_suffix;
};

// A save's directories and the lock rank 0 holds on the temporary one until
// the save is committed or abandoned (null where the file system has no
// locks).
struct TmpDir {
  SaveDirs dirs;
  std::shared_ptr<FileLock> lock;
};

// How a save commits (commit.h, steps 4-7).
struct CommitOptions {
  bool overwrite = false;      // step 5 swaps out an existing checkpoint
  bool update_latest = false;  // step 6 runs
  std::optional<int64_t> step; // recorded in the commit record
  int keep_last = 0;           // step 7 runs when > 0
};

// Writes a file of a save beside its data files: synced (in an object
// store one PUT).
Status WriteSaveFile(FileSystem& fs, const std::string& path, const std::string& bytes);

// OK when `bytes` fit in what the file system under `root` (or its
// nearest existing parent) has free (FileSystem::FreeBytes), or when it
// does not know; else ResourceExhausted naming `root` and both sizes.
Status CheckFreeSpace(FileSystem& fs, const std::string& root, uint64_t bytes);

// Writes the parts of `table` into `dir` (WriteSaveFile), several at once.
Status WriteChunkTable(FileSystem& fs, const std::string& dir, const EncodedChunkTable& table);

}  // namespace shardsafe
