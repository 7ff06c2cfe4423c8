// Reads pieces of source tensors (a flat range of a box, converted to an
// output dtype) into caller memory, batch by batch, and keeps track of
// which source chunks had their checksum verified on the way, so the rest
// can be verified at the end.
//
// A batch is planned and executed by the engine's load planner and
// executor (straight into the destination where the bytes are contiguous,
// coalesced reads). Checksums are checked from the bytes as they stream
// through, across batches (engine/load/stream_checksums.h), so a chunk that
// batches cut in pieces is verified without a second read as long as its
// pieces arrive in order; VerifyRest reads the others once more, whole.
//
// Thread-safe: Read and VerifyRest may be called from several threads.
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "engine/load/source.h"
#include "engine/load/stream_checksums.h"
#include "shardsafe/checkpoint.h"

namespace shardsafe {

struct SourcePiece {
  const std::string* key = nullptr;  // source tensor
  Slice slice;                       // of it
  void* dst = nullptr;               // room for slice.NumElements() of `dtype`
  DType dtype = DType::kF32;
};

class SourceReader {
 public:
  // `src` must outlive the reader.
  SourceReader(const CheckpointSource& src, FileSystem& fs, bool verify_checksums);

  // Reads every piece. DataLoss naming file, tensor and chunk on a checksum
  // mismatch or a truncated file.
  Status Read(std::span<const SourcePiece> pieces, uint64_t max_read_bytes);

  // Verifies every checksummed chunk of `keys` that no Read verified, in
  // parallel on `threads` threads. DataLoss as Read.
  Status VerifyRest(const std::set<std::string>& keys, int threads);

  uint64_t bytes_read() const { return bytes_read_.load(); }
  uint64_t chunks_verified() const {
    return stream_.verified_count() + chunks_verified_again_.load();
  }

 private:
  Status VerifyChunk(const std::string& key, uint32_t chunk);

  const CheckpointSource& src_;
  FileSystem& fs_;
  bool verify_;
  std::vector<std::string> file_paths_;
  StreamChecksums stream_;
  std::atomic<uint64_t> bytes_read_{0};
  std::atomic<uint64_t> chunks_verified_again_{0};  // by VerifyRest
};

}  // namespace shardsafe
