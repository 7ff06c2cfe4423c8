// Checks chunk checksums from bytes that arrive over many reads and many
// load plans: each read's bytes are checksummed where they land (on the
// reading thread, outside any lock), kept as segments per chunk, and
// adjacent segments are joined with Crc32cCombine; once one segment covers
// a chunk, its checksum is compared. So a chunk that a caller reads piece by
// piece, in any order and on any threads (an export's windows cutting
// through a column-split shard, a device load's parallel reads into a
// staging buffer), is verified without being read again. Bytes read twice
// count once.
//
// A chunk not wholly read is left unverified; Unverified() lists those, so
// the caller can read them again whole.
// Thread-safe: Add may be called from several threads (one lock per data
// file, held only to record segments).
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
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
  struct Segment {
    uint64_t end = 0;
    uint32_t crc = 0;
  };
  struct Chunk {
    uint64_t begin = 0, end = 0;  // byte range in the file
    uint32_t expected = 0;
    State state = State::kPending;
    std::map<uint64_t, Segment> segments;  // bytes seen: start -> (end, checksum)
    const std::string* key = nullptr;
    const IndexChunk* chunk = nullptr;
    uint32_t index = 0;
  };
  struct File {
    std::mutex mu;
    std::vector<Chunk> chunks;  // checksummed, non-empty, sorted by begin
  };

  // Records bytes [a, b) of `c`, whose checksum is `crc` (of data[a - offset
  // ...]), then checks the chunk once it is whole. Holds the file's lock.
  void Record(Chunk& c, uint64_t a, uint64_t b, uint32_t crc, uint64_t offset, const char* data,
              uint32_t file);
  void Check(Chunk& c, uint32_t file);

  std::vector<std::string> file_paths_;
  std::vector<std::unique_ptr<File>> files_;
  mutable std::mutex error_mu_;
  Status error_;
  std::atomic<uint64_t> verified_{0};
};

}  // namespace shardsafe
