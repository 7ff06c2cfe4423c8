// Writes one rank's share of a SavePlan: its data files, each a safetensors
// file holding the chunks and blobs the plan assigned to it, checksummed as
// they stream out, and synced.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "engine/save/save_dirs.h"
#include "format/safetensors.h"
#include "layout/save_planner.h"
#include "shardsafe/checkpoint.h"

namespace shardsafe {

struct WrittenEntry {
  uint64_t at = 0;  // absolute byte offset in the file
  uint32_t crc32c = 0;
};

struct WrittenFile {
  uint32_t plan_file = 0;  // index into SavePlan::files
  uint64_t bytes = 0;      // file size
  std::vector<WrittenEntry> chunks;  // parallel to PlannedFile::chunks
  std::vector<WrittenEntry> blobs;   // parallel to PlannedFile::blobs
};

// "data-00003-001.safetensors", or with a suffix (SaveDirs, save_dirs.h)
// "data-00003-001.1a2b3c4d5e6f7a8b.safetensors".
std::string DataFileName(int rank, uint32_t number, std::string_view suffix);

// "checksums-00003.crc32c", or with a suffix
// "checksums-00003.1a2b3c4d5e6f7a8b.crc32c": the rank's checksum file in a
// version-3 checkpoint (format/checksum_file.h).
inline constexpr std::string_view kChecksumFileExtension = ".crc32c";
std::string ChecksumFileName(int rank, std::string_view suffix);

// "chunks-00003.chunks", or with a suffix "chunks-00003.1a2b3c4d5e6f7a8b.chunks":
// the part of the chunk table rank 3 is home to (docs/format.md §3c).
std::string ChunkTableFileName(int rank, std::string_view suffix);

// The bytes of one entry of a data file, in the caller's memory (or, when
// `device` is set, at a device address the engine reads through it).
struct Payload {
  const void* data = nullptr;
  uint64_t bytes = 0;
  DeviceMemory* device = nullptr;
  const std::string* key = nullptr;  // the tensor's, for messages (device payloads)
};

// What one planned file holds: its header and, per entry (input order of
// layout.offsets), where the bytes are.
struct FileImage {
  SafetensorsLayout layout;
  std::vector<Payload> payloads;  // chunks first, then blobs (PlannedFile order)
};

// The header and entry offsets of planned file `file`: they follow from
// the plan alone.
Result<SafetensorsLayout> LayOutFile(const SavePlan& plan, uint32_t file);

// The image of planned file `file`; shards on_device read through `device`.
Result<FileImage> DescribeFile(const SavePlan& plan, uint32_t file, const SaveState& state,
                               DeviceMemory* device);

// How a data file of `size` bytes is opened for writing under `options`.
WriteOptions DataFileOptions(const SaveOptions& options, uint64_t size);

// The report of a written file from its image and the entries' checksums.
WrittenFile ReportOf(const SavePlan& plan, uint32_t file, const FileImage& image,
                     const std::vector<uint32_t>& crcs);

// Writes every file of `plan` assigned to `rank` into dirs.data, up to
// options.io_threads files at once, each fdatasync'ed before returning.
// `progress` is advanced by payload bytes as they are written. Errors carry
// the file name.
Result<std::vector<WrittenFile>> WriteRankFiles(const SavePlan& plan, int rank,
                                                const SaveState& state, const SaveDirs& dirs,
                                                FileSystem& fs, const SaveOptions& options,
                                                std::atomic<uint64_t>* progress);

// A version-3 save: writes `rank`'s checksum file into dirs.data, synced,
// listing every chunk of `written` (numbered as `plan`, a whole plan or
// the rank's part) by its whole-plan file and offset; nothing when the
// rank wrote no chunk.
Status WriteChecksumFile(const SavePlan& plan, int rank, const std::vector<WrittenFile>& written,
                         const SaveDirs& dirs, FileSystem& fs);

}  // namespace shardsafe
