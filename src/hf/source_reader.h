// Reads pieces of source tensors (a flat range of a box, converted to an
// output dtype) into caller memory, batch by batch, and keeps track of
// which source chunks had their checksum verified on the way, so the rest
// can be verified at the end.
//
// A batch is planned and executed by the engine's load planner and
// executor (straight into the destination where the bytes are contiguous,
// coalesced reads, checksums of chunks a batch reads whole). A chunk that
// batches cut in pieces is not verified by them; VerifyRest reads each such
// chunk once more, whole, and checks it.
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

#include "engine/source.h"
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
  uint64_t chunks_verified() const { return chunks_verified_.load(); }

 private:
  Status VerifyChunk(const std::string& key, uint32_t chunk);

  const CheckpointSource& src_;
  FileSystem& fs_;
  bool verify_;
  std::vector<std::string> file_paths_;
  std::mutex mu_;
  std::set<std::pair<std::string, uint32_t>> verified_;  // (key, chunk)
  std::atomic<uint64_t> bytes_read_{0};
  std::atomic<uint64_t> chunks_verified_{0};
};

}  // namespace shardsafe
