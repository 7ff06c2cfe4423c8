#include "engine/load/checksum_files.h"

#include <map>
#include <mutex>
#include <vector>

#include "base/thread_pool.h"
#include "format/checksum_file.h"
#include "format/index_packed.h"

namespace shardsafe {
namespace {

// Checksum files read at once: a disk's small reads are cheap; an object
// store's cost a round trip each.
size_t ParallelReads(const FileSystem& fs) { return fs.IsObjectStore() ? 16 : 4; }

// The checksum file (of `index`) of each rank that wrote chunks.
std::map<int, uint32_t> ChecksumFileOfRank(const CheckpointIndex& index) {
  std::map<int, uint32_t> file_of_rank;
  for (uint32_t f : index.checksum_files) file_of_rank[index.files[f].rank] = f;
  return file_of_rank;
}

// Reads and decodes each checksum file of `needed`, several at a time.
Status ReadNeeded(FileSystem& fs, const std::string& dir, const ReadOptions& options,
                  const CheckpointIndex& index,
                  std::map<uint32_t, std::vector<ChunkChecksum>>& needed, uint64_t* bytes_read) {
  ThreadPool pool(needed.size() > 1 ? ParallelReads(fs) : 0);
  TaskGroup reads(&pool);
  std::mutex mu;
  for (auto& [file, entries] : needed) {
    reads.Add([&, file = file, out = &entries]() -> Status {
      const IndexFile& f = index.files[file];
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
  return reads.Wait();
}

// The fill, over the chunks `each(f)` visits: f(key, chunk) for each chunk
// with `chunk` an accessor (bytes(), crc(), set(crc), file(), at(),
// slice()). Two passes: which files are needed, then the checksums.
template <typename Each>
Status Fill(FileSystem& fs, const std::string& dir, const ReadOptions& options,
            const CheckpointIndex& index, Each each, uint64_t* bytes_read) {
  if (index.checksum_files.empty()) return Status();
  const std::map<int, uint32_t> file_of_rank = ChecksumFileOfRank(index);
  std::map<uint32_t, std::vector<ChunkChecksum>> needed;
  Status missing;
  each([&](std::string_view key, auto& c) {
    if (c.bytes() == 0) c.set(0);  // the CRC-32C of no byte; listed in no file
    if (c.crc() || !missing.ok()) return;
    const int rank = index.files[c.file()].rank;
    auto it = file_of_rank.find(rank);
    if (it == file_of_rank.end()) {
      missing = DataLossError(JoinPath(dir, index.files[c.file()].name) + ": tensor \"" +
                              std::string(key) + "\": no checksum file of rank " +
                              std::to_string(rank) + ", which wrote the chunk " +
                              SliceToString(c.slice()));
      return;
    }
    needed.try_emplace(it->second);
  });
  SS_RETURN_IF_ERROR(missing);
  SS_RETURN_IF_ERROR(ReadNeeded(fs, dir, options, index, needed, bytes_read));
  each([&](std::string_view key, auto& c) {
    if (c.crc() || !missing.ok()) return;
    const uint32_t file = file_of_rank.at(index.files[c.file()].rank);
    const std::optional<uint32_t> crc = FindChecksum(needed[file], c.file(), c.at());
    if (crc) return c.set(*crc);
    missing = DataLossError(JoinPath(dir, index.files[file].name) + ": tensor \"" +
                            std::string(key) + "\": no checksum of its chunk " +
                            SliceToString(c.slice()) + " at " + std::to_string(c.at()) +
                            " in " + index.files[c.file()].name);
  });
  return missing;
}

// A chunk of an IndexTensors, and of a PackedTensors, as Fill sees it.
struct IndexChunkRef {
  IndexChunk& c;
  uint64_t bytes() const { return c.bytes; }
  uint32_t file() const { return c.file; }
  uint64_t at() const { return c.at; }
  const std::optional<uint32_t>& crc() const { return c.crc32c; }
  void set(uint32_t crc) { c.crc32c = crc; }
  const Slice& slice() const { return c.slice; }
};
struct PackedChunkRef {
  PackedTensors& p;
  size_t t;
  uint64_t n;
  uint64_t bytes() const { return p.bytes(n); }
  uint32_t file() const { return p.file(n); }
  uint64_t at() const { return p.at(n); }
  std::optional<uint32_t> crc() const { return p.crc32c(n); }
  void set(uint32_t crc) { p.SetCrc(n, crc); }
  Slice slice() const { return p.slice(t, n); }
};

}  // namespace

Status FillChecksums(FileSystem& fs, const std::string& dir, const ReadOptions& options,
                     CheckpointIndex* index, uint64_t* bytes_read) {
  auto each = [&](const auto& f) {
    for (auto& [key, tensor] : index->tensors) {
      for (IndexChunk& c : tensor.chunks) {
        IndexChunkRef ref{c};
        f(key, ref);
      }
    }
  };
  return Fill(fs, dir, options, *index, each, bytes_read);
}

Status FillChecksums(FileSystem& fs, const std::string& dir, const ReadOptions& options,
                     const CheckpointIndex& index, PackedTensors* tensors,
                     uint64_t* bytes_read) {
  auto each = [&](const auto& f) {
    for (size_t t = 0; t < tensors->size(); ++t) {
      const uint64_t first = tensors->first_chunk(t);
      for (uint64_t i = 0; i < tensors->chunk_count(t); ++i) {
        PackedChunkRef ref{*tensors, t, first + i};
        f(tensors->key(t), ref);
      }
    }
  };
  return Fill(fs, dir, options, index, each, bytes_read);
}

}  // namespace shardsafe
