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
//
// Memory: 24 bytes a checksummed chunk of the index, and the segments of
// the chunks seen in part so far.
// Thread-safe: Add may be called from several threads (one lock per data
// file, held only to record segments).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "format/index_packed.h"

namespace shardsafe {

class StreamChecksums {
 public:
  // `tensors` (an index's, with `files` data files) must outlive this
  // object; file_paths[i] names data file i in error messages.
  StreamChecksums(const PackedTensors& tensors, std::vector<std::string> file_paths);

  // Bytes [offset, offset + n) of data file `file` were read into `data`.
  void Add(uint32_t file, uint64_t offset, uint64_t n, const char* data);

  // The first mismatch seen (DataLoss naming file, tensor and chunk), or OK.
  Status status() const;
  // The checksummed chunks not verified (yet) of the tensors whose keys
  // `of` accepts (or which `keys` holds): (key, chunk).
  std::vector<std::pair<std::string, uint32_t>> Unverified(
      const std::function<bool(std::string_view)>& of) const;
  std::vector<std::pair<std::string, uint32_t>> Unverified(
      const std::set<std::string>& keys) const;
  uint64_t verified_count() const { return verified_.load(); }

 private:
  enum class State : uint8_t { kPending, kVerified, kBroken };
  struct Segment {
    uint64_t end = 0;
    uint32_t crc = 0;
  };
  using Segments = std::map<uint64_t, Segment>;  // bytes seen: start -> (end, checksum)
  struct Chunk {
    uint64_t begin = 0;   // its `at`
    uint64_t number = 0;  // in the PackedTensors
    uint32_t tensor = 0;
    State state = State::kPending;
  };
  struct File {
    std::mutex mu;
    std::vector<Chunk> chunks;  // checksummed, non-empty, sorted by begin
    std::unordered_map<uint64_t, Segments> seen;  // of chunks (by number) seen in part
  };

  uint64_t End(const Chunk& c) const { return c.begin + tensors_.bytes(c.number); }
  // Records bytes [a, b) of `c`, whose checksum is `crc` (of data[a - offset
  // ...]), then checks the chunk once it is whole. Holds the file's lock.
  void Record(File& f, Chunk& c, uint64_t a, uint64_t b, uint32_t crc, uint64_t offset,
              const char* data, uint32_t file);
  void Check(Chunk& c, uint32_t crc, uint32_t file);

  const PackedTensors& tensors_;
  std::vector<std::string> file_paths_;
  std::vector<std::unique_ptr<File>> files_;
  mutable std::mutex error_mu_;
  Status error_;
  std::atomic<uint64_t> verified_{0};
};

}  // namespace shardsafe
