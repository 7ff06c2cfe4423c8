#include "engine/load/checksum_files.h"

#include <map>
#include <mutex>
#include <vector>

#include "base/thread_pool.h"
#include "format/checksum_file.h"

namespace shardsafe {
namespace {

// Checksum files read at once: a disk's small reads are cheap; an object
// store's cost a round trip each.
size_t ParallelReads(const FileSystem& fs) { return fs.IsObjectStore() ? 16 : 4; }

}  // namespace

Status FillChecksums(FileSystem& fs, const std::string& dir, const ReadOptions& options,
                     CheckpointIndex* index, uint64_t* bytes_read) {
  if (index->checksum_files.empty()) return Status();
  std::map<int, uint32_t> file_of_rank;  // the checksum file of each writing rank
  for (uint32_t f : index->checksum_files) file_of_rank[index->files[f].rank] = f;
  // The checksum files the chunks without a checksum need.
  std::map<uint32_t, std::vector<ChunkChecksum>> needed;
  for (auto& [key, tensor] : index->tensors) {
    for (IndexChunk& c : tensor.chunks) {
      if (c.bytes == 0) c.crc32c = 0;  // the CRC-32C of no byte; listed in no file
      if (c.crc32c) continue;
      auto it = file_of_rank.find(index->files[c.file].rank);
      if (it == file_of_rank.end()) {
        return DataLossError(JoinPath(dir, index->files[c.file].name) + ": tensor \"" + key +
                             "\": no checksum file of rank " +
                             std::to_string(index->files[c.file].rank) +
                             ", which wrote the chunk " + SliceToString(c.slice));
      }
      needed.try_emplace(it->second);
    }
  }
  ThreadPool pool(needed.size() > 1 ? ParallelReads(fs) : 0);
  TaskGroup reads(&pool);
  std::mutex mu;
  for (auto& [file, entries] : needed) {
    reads.Add([&, file = file, out = &entries]() -> Status {
      const IndexFile& f = index->files[file];
      const std::string path = JoinPath(dir, f.name);
      Result<std::string> read = ReadFileToString(fs, path, f.bytes, options);
      if (read.status().code() == StatusCode::kResourceExhausted) {  // longer than recorded
        return DataLossError(path + ": checksum file is larger than the " +
                             std::to_string(f.bytes) + " bytes the index records");
      }
      SS_ASSIGN_OR_RETURN(std::string bytes, std::move(read));
      if (bytes.size() != f.bytes) {
        return DataLossError(path + ": checksum file is " + std::to_string(bytes.size()) +
                             " bytes, the index records " + std::to_string(f.bytes));
      }
      SS_ASSIGN_OR_RETURN(*out, DecodeChecksumFile(bytes, path));
      if (bytes_read != nullptr) {
        std::lock_guard<std::mutex> lock(mu);
        *bytes_read += bytes.size();
      }
      return Status();
    });
  }
  SS_RETURN_IF_ERROR(reads.Wait());
  for (auto& [key, tensor] : index->tensors) {
    for (IndexChunk& c : tensor.chunks) {
      if (c.crc32c) continue;
      const uint32_t file = file_of_rank[index->files[c.file].rank];
      c.crc32c = FindChecksum(needed[file], c.file, c.at);
      if (!c.crc32c) {
        return DataLossError(JoinPath(dir, index->files[file].name) + ": tensor \"" + key +
                             "\": no checksum of its chunk " + SliceToString(c.slice) + " at " +
                             std::to_string(c.at) + " in " + index->files[c.file].name);
      }
    }
  }
  return Status();
}

}  // namespace shardsafe
