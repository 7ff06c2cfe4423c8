// The POSIX file objects behind DefaultFileSystem(): a WritableFile that
// writes buffered (pwrite straight from the caller's memory) or with
// O_DIRECT (through pipelined aligned buffers), and a RandomAccessFile that
// reads with pread, using an O_DIRECT descriptor for aligned requests.
//
// Exposed separately from the file system so tests can reach the details
// (did O_DIRECT take effect?).
#pragma once

#include <sys/stat.h>

#include <memory>
#include <string>

#include "shardsafe/filesystem.h"

namespace shardsafe {

// Creates (or truncates) `path`. See WriteOptions for the modes; with
// options.direct on a file system that refuses O_DIRECT (EINVAL), the file
// is written buffered. Errors: those of open(2) and fallocate(2), mapped by
// ErrnoError (ENOSPC from preallocation -> ResourceExhausted).
Result<std::unique_ptr<WritableFile>> NewPosixWritableFile(const std::string& path,
                                                           const WriteOptions& options);

// The one checked open of a file for reading: opens `path` without
// waiting (O_NONBLOCK, so a FIFO or device returns at once), requires a
// regular file that lies inside `within` when that is not empty (the
// descriptor's own resolved path, ReadOptions::within), then clears
// O_NONBLOCK. Returns the descriptor (the caller closes it) with `*st` its
// fstat. NotFound if missing; InvalidArgument naming the path for a
// directory, a FIFO or other non-regular file, or a link leading outside.
// Whatever reads the file afterwards uses this descriptor, or one checked
// to be the same file (device and inode), never the path again.
Result<int> OpenCheckedForRead(const std::string& path, const std::string& within,
                               struct stat* st);

// Tests only: called with the path after every checked open, before any
// other descriptor of the file is opened (a test swaps the path here).
// Null to stop.
using CheckedOpenHook = void (*)(const std::string& path);
void SetCheckedOpenHookForTest(CheckedOpenHook hook);

// Opens `path` for reading (OpenCheckedForRead; with options.direct, an
// O_DIRECT descriptor of the same file beside it). NotFound if missing.
Result<std::unique_ptr<RandomAccessFile>> NewPosixRandomAccessFile(const std::string& path,
                                                                   const ReadOptions& options);

// True if `file` (from NewPosixWritableFile) writes with O_DIRECT.
bool IsDirectWritableFile(const WritableFile& file);

// True if `file` (from NewPosixRandomAccessFile) holds an O_DIRECT descriptor.
bool IsDirectRandomAccessFile(const RandomAccessFile& file);

}  // namespace shardsafe
