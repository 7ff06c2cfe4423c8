#include "engine/save/replica_check.h"

#include <algorithm>
#include <memory>
#include <set>
#include <span>

#include "base/crc32c.h"
#include "layout/plan_part.h"

namespace shardsafe {
namespace {

// Device copies are checksummed through a host buffer of this size.
constexpr uint64_t kDeviceStep = uint64_t{8} << 20;

// The CRC-32C of bytes [at, at + bytes) of a device shard.
Result<uint32_t> DeviceCrc(const TensorShard& shard, uint64_t at, uint64_t bytes,
                           DeviceMemory& device) {
  auto buffer = std::make_unique<char[]>(std::min(bytes, kDeviceStep));
  uint32_t crc = 0;
  for (uint64_t done = 0; done < bytes; done += kDeviceStep) {
    const uint64_t n = std::min(kDeviceStep, bytes - done);
    const DeviceMemory::Copy copy{buffer.get(), static_cast<const char*>(shard.data) + at + done,
                                  n};
    SS_RETURN_IF_ERROR(device.CopyToHost({&copy, 1}).WithContext(
        "copying tensor \"" + shard.key + "\" from the device to check its replicas"));
    crc = Crc32cExtend(crc, buffer.get(), n);
  }
  return crc;
}

// The CRC-32C of bytes [at, at + bytes) of a shard, wherever it lies.
Result<uint32_t> ShardCrc(const TensorShard& shard, uint64_t at, uint64_t bytes,
                          DeviceMemory* device) {
  if (!shard.on_device) return Crc32c(static_cast<const char*>(shard.data) + at, bytes);
  if (device == nullptr) {
    return InvalidArgumentError("tensor \"" + shard.key +
                                "\" is on a device, but no SaveOptions::device copies it");
  }
  return DeviceCrc(shard, at, bytes, *device);
}

// Hash(chunk, checksum) of the digest (replica_check.h): the finalizer of
// SplitMix64, which maps distinct inputs to distinct, well-mixed outputs.
uint64_t ReplicaHash(uint32_t whole_chunk, uint32_t crc) {
  uint64_t x = (uint64_t{whole_chunk} << 32 | crc) + 0x9e3779b97f4a7c15u;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9u;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebu;
  return x ^ (x >> 31);
}

// The indices in plan.copies of `rank`'s held copies (sorted by rank).
std::pair<size_t, size_t> CopiesOf(const SavePlan& plan, int rank) {
  const auto before = [](const HeldCopy& c, int r) { return c.rank < r; };
  auto first = std::lower_bound(plan.copies.begin(), plan.copies.end(), rank, before);
  auto end = std::lower_bound(first, plan.copies.end(), rank + 1, before);
  return {first - plan.copies.begin(), end - plan.copies.begin()};
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

Result<HeldChecksums> ChecksumCopies(const SavePlan& plan, int rank, const SaveState& state,
                                     DeviceMemory* device) {
  HeldChecksums out;
  const auto [first, end] = CopiesOf(plan, rank);
  for (size_t i = first; i < end; ++i) {
    const HeldCopy& h = plan.copies[i];
    const TensorShard& shard = state.tensors[h.shard];
    uint64_t at = 0;
    uint32_t crc = 0;
    for (const CopyPiece& p : PiecesOf(plan, i)) {  // the pieces, in order
      SS_ASSIGN_OR_RETURN(uint32_t piece, ShardCrc(shard, at, p.bytes, device));
      out.digest += ReplicaHash(p.chunk, piece);
      crc = p.chunk == h.chunk ? piece : Crc32cCombine(crc, piece, p.bytes);
      at += p.bytes;
    }
    out.copies.push_back({h.chunk, crc});
  }
  return out;
}

uint64_t ReplicaDigest(const SavePlan& plan, int rank, const HeldChecksums& held,
                       const std::vector<WrittenFile>& written) {
  // The copies held of a chunk: every holder but its writer, or, for the
  // pieces of a cut chunk, every holder (the writer too: it holds the whole
  // copy, listed with the others).
  std::set<uint32_t> own_copies;  // whole numbers of the pieces this rank holds a copy of
  const auto [first, end] = CopiesOf(plan, rank);
  for (size_t i = first; i < end; ++i) {
    const HeldCopy& h = plan.copies[i];
    for (uint32_t c = h.chunk; c < h.chunk + h.chunks; ++c) own_copies.insert(c);
  }
  uint64_t digest = held.digest;
  for (const WrittenFile& f : written) {
    const PlannedFile& pf = plan.files[f.plan_file];
    for (size_t i = 0; i < pf.chunks.size() && i < f.chunks.size(); ++i) {
      const PlannedChunk& chunk = plan.chunks[pf.chunks[i]];
      const uint32_t whole = WholeChunkNumber(plan, pf.chunks[i]);
      const uint64_t copies = chunk.holders - 1 + own_copies.count(whole);
      digest -= copies * ReplicaHash(whole, f.chunks[i].crc32c);
    }
  }
  return digest;
}

Status CheckReplicas(const SavePlan& plan, const std::vector<std::vector<WrittenFile>>& written,
                     const std::vector<std::vector<CopyChecksum>>& copies) {
  // Only the second round and an async save send copies.
  if (std::all_of(copies.begin(), copies.end(), [](const auto& c) { return c.empty(); })) {
    return Status();
  }
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
