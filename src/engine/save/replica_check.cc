#include "engine/save/replica_check.h"

#include <algorithm>
#include <memory>
#include <set>

#include "base/crc32c.h"

namespace shardsafe {
namespace {

// Device copies are checksummed through a host buffer of this size.
constexpr uint64_t kDeviceStep = uint64_t{8} << 20;

Result<uint32_t> DeviceCrc(const TensorShard& shard, uint64_t bytes, DeviceMemory& device) {
  auto buffer = std::make_unique<char[]>(std::min(bytes, kDeviceStep));
  uint32_t crc = 0;
  for (uint64_t at = 0; at < bytes; at += kDeviceStep) {
    const uint64_t n = std::min(kDeviceStep, bytes - at);
    const DeviceMemory::Copy copy{buffer.get(), static_cast<const char*>(shard.data) + at, n};
    SS_RETURN_IF_ERROR(device.CopyToHost({&copy, 1}).WithContext(
        "copying tensor \"" + shard.key + "\" from the device to check its replicas"));
    crc = Crc32cExtend(crc, buffer.get(), n);
  }
  return crc;
}

// The copy of `rank` differs from what was written for chunks [first,
// first + count): the writer of a chunk, or of the pieces it was cut into.
Status ReplicaMismatch(const SavePlan& plan, uint32_t first, uint32_t count, int rank) {
  const PlannedChunk& chunk = plan.chunks[first];
  std::string slice = SliceToString(chunk.slice), writers;
  if (count == 1) {
    writers = "ranks " + std::to_string(std::min(chunk.writer, rank)) + " and " +
              std::to_string(std::max(chunk.writer, rank));
  } else {
    // Pieces: flat ranges of one slice; name the slice without them.
    slice = SliceToString(Slice{chunk.slice.box, std::nullopt});
    std::set<int> ranks{rank};
    for (uint32_t p = first; p < first + count; ++p) ranks.insert(plan.chunks[p].writer);
    for (int r : ranks) writers += (writers.empty() ? "ranks " : ", ") + std::to_string(r);
  }
  return InvalidArgumentError(
      "tensor \"" + plan.tensors[chunk.tensor].key + "\": " + writers +
      " hold different bytes for the same slice " + slice +
      " (ranks that pass one key and slice must hold identical replicas: declare each "
      "rank's part of the global tensor, or save the data per rank)");
}

}  // namespace

Result<std::vector<CopyChecksum>> ChecksumCopies(const SavePlan& plan, int rank,
                                                 const SaveState& state, DeviceMemory* device) {
  auto first = std::lower_bound(plan.copies.begin(), plan.copies.end(), rank,
                                [](const HeldCopy& c, int r) { return c.rank < r; });
  std::vector<CopyChecksum> out;
  for (auto it = first; it != plan.copies.end() && it->rank == rank; ++it) {
    const TensorShard& shard = state.tensors[it->shard];
    uint64_t bytes = 0;
    for (uint32_t c = it->chunk; c < it->chunk + it->chunks; ++c) bytes += plan.chunks[c].bytes;
    uint32_t crc;
    if (shard.on_device) {
      if (device == nullptr) {
        return InvalidArgumentError("tensor \"" + shard.key +
                                    "\" is on a device, but no SaveOptions::device copies it");
      }
      SS_ASSIGN_OR_RETURN(crc, DeviceCrc(shard, bytes, *device));
    } else {
      crc = Crc32c(shard.data, bytes);
    }
    out.push_back({it->chunk, crc});
  }
  return out;
}

Status CheckReplicas(const SavePlan& plan, const std::vector<std::vector<WrittenFile>>& written,
                     const std::vector<std::vector<CopyChecksum>>& copies) {
  std::vector<uint32_t> crc(plan.chunks.size(), 0);
  for (const auto& files : written) {
    for (const WrittenFile& f : files) {
      if (f.plan_file >= plan.files.size()) return InternalError("bad file in save report");
      const PlannedFile& pf = plan.files[f.plan_file];
      for (size_t i = 0; i < pf.chunks.size() && i < f.chunks.size(); ++i) {
        crc[pf.chunks[i]] = f.chunks[i].crc32c;
      }
    }
  }
  // How many pieces each copy spans, by its first chunk (1 when not cut).
  std::vector<uint32_t> span(plan.chunks.size(), 1);
  for (const HeldCopy& h : plan.copies) span[h.chunk] = h.chunks;
  for (size_t rank = 0; rank < copies.size(); ++rank) {
    for (const CopyChecksum& c : copies[rank]) {
      if (c.chunk >= plan.chunks.size() || c.chunk + span[c.chunk] > plan.chunks.size()) {
        return InternalError("bad chunk in save report");
      }
      uint32_t written = crc[c.chunk];
      for (uint32_t p = c.chunk + 1; p < c.chunk + span[c.chunk]; ++p) {
        written = Crc32cCombine(written, crc[p], plan.chunks[p].bytes);
      }
      if (c.crc32c == written) continue;
      return ReplicaMismatch(plan, c.chunk, span[c.chunk], static_cast<int>(rank));
    }
  }
  return Status();
}

}  // namespace shardsafe
