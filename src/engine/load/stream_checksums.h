// Checks chunk checksums from bytes that arrive over many reads and many
// load plans: each chunk's CRC-32C is extended as its bytes are read, in
// file order, and compared once its last byte has been seen. So a chunk that
// a caller reads piece by piece (an export's windows cutting through a
// column-split shard) is verified without being read again.
//
// A chunk whose bytes do not arrive in order (a gap: a later piece read
// first, by another thread or another plan) is left unverified; Unverified()
// lists those, so the caller can read them again whole.
// Thread-safe: Add may be called from several threads (one lock per data
// file).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "format/index.h"

namespace shardsafe {

class StreamChecksums {
 public:
  // `index` must outlive this object; file_paths[i] names data file i in
  // error messages.
  StreamChecksums(const CheckpointIndex& index, std::vector<std::string> file_paths);

  // Bytes [offset, offset + n) of data file `file` were read into `data`.
  void Add(uint32_t file, uint64_t offset, uint64_t n, const char* data);

  // The first mismatch seen (DataLoss naming file, tensor and chunk), or OK.
  Status status() const;
  // The checksummed chunks of tensors `keys` not verified (yet): (key, chunk).
  std::vector<std::pair<std::string, uint32_t>> Unverified(
      const std::set<std::string>& keys) const;
  uint64_t verified_count() const { return verified_.load(); }

 private:
  enum class State : uint8_t { kPending, kVerified, kBroken };
  struct Chunk {
    uint64_t begin = 0, end = 0;  // byte range in the file
    uint32_t expected = 0;
    uint64_t next = 0;  // bytes [begin, next) are in `crc`
    uint32_t crc = 0;
    State state = State::kPending;
    const std::string* key = nullptr;
    const IndexChunk* chunk = nullptr;
    uint32_t index = 0;
  };
  struct File {
    std::mutex mu;
    std::vector<Chunk> chunks;  // checksummed, non-empty, sorted by begin
  };

  void Extend(Chunk& c, uint64_t offset, uint64_t n, const char* data, uint32_t file);

  std::vector<std::string> file_paths_;
  std::vector<std::unique_ptr<File>> files_;
  mutable std::mutex error_mu_;
  Status error_;
  std::atomic<uint64_t> verified_{0};
};

}  // namespace shardsafe
