#include "engine/load/device_load.h"

#include <algorithm>
#include <cstdlib>
#include <functional>
#include <future>
#include <set>

namespace shardsafe {
namespace {

constexpr uint64_t kMinBufferBytes = uint64_t{1} << 20;
constexpr uint64_t kBufferAlign = 4096;
constexpr uint64_t kPieceAlign = 64;  // where a piece starts in its buffer

uint64_t RoundUp(uint64_t n, uint64_t to) { return (n + to - 1) / to * to; }

// A piece of a device target: a slice of the saved tensor, and where its
// bytes go in the target and in its batch's buffer.
struct Piece {
  DeviceTarget dt;
  Slice slice;
  uint64_t target_offset = 0;
  uint64_t bytes = 0;
  uint64_t buffer_offset = 0;
};

// Cuts every target into pieces of at most `max_bytes`.
Result<std::vector<Piece>> CutIntoPieces(const std::vector<DeviceTarget>& targets,
                                         uint64_t max_bytes) {
  std::vector<Piece> pieces;
  for (const DeviceTarget& dt : targets) {
    const TensorTarget& t = *dt.target;
    const uint64_t n = t.slice.NumElements();
    SS_ASSIGN_OR_RETURN(uint64_t bytes, NumBytes(t.dtype, n));
    if (bytes == 0) continue;
    if (bytes <= max_bytes) {
      pieces.push_back({dt, t.slice, 0, bytes});
      continue;
    }
    // A multiple of 8 elements: whole bytes of every dtype, sub-byte ones too.
    const uint64_t per = std::max<uint64_t>(max_bytes * 8 / DTypeBits(t.dtype) / 8 * 8, 8);
    const uint64_t base = t.slice.flat ? t.slice.flat->begin : 0;
    for (uint64_t lo = 0; lo < n; lo += per) {
      const uint64_t hi = std::min(n, lo + per);
      SS_ASSIGN_OR_RETURN(uint64_t at, NumBytes(t.dtype, lo));
      SS_ASSIGN_OR_RETURN(uint64_t piece_bytes, NumBytes(t.dtype, hi - lo));
      pieces.push_back({dt, Slice{t.slice.box, FlatRange{base + lo, base + hi}}, at, piece_bytes});
    }
  }
  return pieces;
}

// Packs the pieces, in order, into buffers of `buffer_bytes` (sets each
// piece's buffer_offset). Returns the first piece of every batch, then the
// number of pieces.
std::vector<size_t> PackIntoBatches(std::vector<Piece>& pieces, uint64_t buffer_bytes) {
  std::vector<size_t> starts;
  uint64_t used = buffer_bytes;  // the first piece opens a batch
  for (size_t i = 0; i < pieces.size(); ++i) {
    uint64_t at = RoundUp(used, kPieceAlign);
    if (at + pieces[i].bytes > buffer_bytes) {
      starts.push_back(i);
      at = 0;
    }
    pieces[i].buffer_offset = at;
    used = at + pieces[i].bytes;
  }
  starts.push_back(pieces.size());
  return starts;
}

// The host buffers: `count` of `bytes` each, carved from the caller's
// registered memory (LoadOptions::device_staging_memory) when it holds
// them all, else allocated and registered with the device while they live.
class Staging {
 public:
  static Result<std::unique_ptr<Staging>> Create(DeviceMemory& device, uint64_t bytes,
                                                 size_t count, std::span<char> lent) {
    auto staging = std::unique_ptr<Staging>(new Staging());
    const bool fits = lent.size() >= bytes * count &&
                      reinterpret_cast<uintptr_t>(lent.data()) % kBufferAlign == 0;
    for (size_t i = 0; i < count; ++i) {
      if (fits) {
        staging->buffers_.emplace_back(lent.data() + i * bytes, [](char*) {});
        continue;
      }
      char* buffer = static_cast<char*>(std::aligned_alloc(kBufferAlign, bytes));
      if (buffer == nullptr) {
        return ResourceExhaustedError("no memory for a " + std::to_string(bytes) +
                                      "-byte staging buffer of a device load");
      }
      staging->buffers_.emplace_back(buffer, [&device, bytes](char* b) {
        device.Unregister(b, bytes);
        std::free(b);
      });
      device.Register(buffer, bytes);
    }
    return staging;
  }
  Staging(const Staging&) = delete;
  Staging& operator=(const Staging&) = delete;

  char* buffer(size_t i) const { return buffers_[i].get(); }

 private:
  Staging() = default;

  std::vector<std::unique_ptr<char, std::function<void(char*)>>> buffers_;
};

// Keys of the tensors some target takes whole: their chunks are all read,
// so each must be checked.
std::set<std::string> WholeKeys(const std::vector<DeviceTarget>& targets) {
  std::set<std::string> keys;
  for (const DeviceTarget& dt : targets) {
    const TensorTarget& t = *dt.target;
    if (!t.slice.flat && t.slice.box == Box::Whole(t.shape)) keys.insert(*dt.key);
  }
  return keys;
}

}  // namespace

Result<DeviceLoadStats> LoadIntoDevice(const std::vector<DeviceTarget>& targets,
                                       const CheckpointSource& src, FileSystem& fs,
                                       const LoadOptions& options) {
  DeviceMemory& device = *options.device;
  const uint64_t buffer_bytes =
      std::max(options.device_staging_bytes / 2 / kBufferAlign * kBufferAlign, kMinBufferBytes);
  SS_ASSIGN_OR_RETURN(std::vector<Piece> pieces, CutIntoPieces(targets, buffer_bytes));
  const std::vector<size_t> starts = PackIntoBatches(pieces, buffer_bytes);
  const size_t batches = starts.size() - 1;
  SS_ASSIGN_OR_RETURN(auto staging,
                      Staging::Create(device, buffer_bytes, std::min<size_t>(batches, 2),
                                      options.device_staging_memory));
  // The load's own threads and scratch: one batch at a time is read, so
  // it may use everything a host load would.
  SourceReader reader(src, fs, options.verify_checksums,
                      {options.io_threads, options.scratch_bytes, options.direct_io});
  // Reads small enough that every thread has one in each batch.
  const uint64_t threads = std::max(options.io_threads, 1);
  const uint64_t read_bytes =
      std::min(options.scratch_bytes, RoundUp(buffer_bytes / threads, kBufferAlign));
  std::future<Status> copying[2];
  Status status;
  auto finish = [&](size_t k) {
    if (!copying[k].valid()) return;
    Status s = copying[k].get();
    if (status.ok()) status = s;
  };
  for (size_t b = 0; b < batches && status.ok(); ++b) {
    const size_t k = b % 2;
    finish(k);  // the buffer's previous batch is on the device
    if (!status.ok()) break;
    std::vector<SourcePiece> batch;
    std::vector<DeviceMemory::Copy> copies;
    for (size_t i = starts[b]; i < starts[b + 1]; ++i) {
      const Piece& p = pieces[i];
      char* host = staging->buffer(k) + p.buffer_offset;
      batch.push_back({p.dt.key, p.slice, host, p.dt.target->dtype});
      copies.push_back({static_cast<char*>(p.dt.target->data) + p.target_offset, host, p.bytes});
    }
    status = reader.Read(batch, read_bytes);
    if (!status.ok()) break;
    copying[k] = std::async(std::launch::async, [&device, copies = std::move(copies)] {
      return device.CopyToDevice(copies);
    });
  }
  finish(0);
  finish(1);
  if (status.ok()) status = reader.VerifyRest(WholeKeys(targets), options.io_threads);
  SS_RETURN_IF_ERROR(status);
  return DeviceLoadStats{reader.bytes_read(), reader.chunks_verified()};
}

}  // namespace shardsafe
