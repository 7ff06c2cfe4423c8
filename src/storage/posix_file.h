// The POSIX file objects behind DefaultFileSystem(): a WritableFile that
// writes buffered (pwrite straight from the caller's memory) or with
// O_DIRECT (through pipelined aligned buffers), and a RandomAccessFile that
// reads with pread, using an O_DIRECT descriptor for aligned requests.
//
// Exposed separately from the file system so tests can reach the details
// (did O_DIRECT take effect?).
#pragma once

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

// Opens `path` for reading. NotFound if missing.
Result<std::unique_ptr<RandomAccessFile>> NewPosixRandomAccessFile(const std::string& path,
                                                                   const ReadOptions& options);

// True if `file` (from NewPosixWritableFile) writes with O_DIRECT.
bool IsDirectWritableFile(const WritableFile& file);

// True if `file` (from NewPosixRandomAccessFile) holds an O_DIRECT descriptor.
bool IsDirectRandomAccessFile(const RandomAccessFile& file);

}  // namespace shardsafe
