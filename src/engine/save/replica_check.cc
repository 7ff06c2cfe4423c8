#include "engine/save/replica_check.h"

#include <algorithm>
#include <map>
#include <memory>
#include <set>
#include <span>

#include "base/crc32c.h"
#include "comm/wire.h"
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

// The copy `rank` holds of `slice` of tensor `key` differs from what
// `writers` wrote: one writer, or with `pieces` the writers of the pieces
// its chunk was cut into (`slice` the first's).
Status ReplicaMismatch(std::string_view key, const Slice& slice, const std::set<int>& writers,
                       bool pieces, int rank) {
  std::string named, shown = SliceToString(slice);
  if (!pieces) {
    const int writer = *writers.begin();
    named = "ranks " + std::to_string(std::min(writer, rank)) + " and " +
            std::to_string(std::max(writer, rank));
  } else {
    // Pieces: flat ranges of one slice; name the slice without them.
    shown = SliceToString(Slice{slice.box, std::nullopt});
    std::set<int> ranks = writers;
    ranks.insert(rank);
    for (int r : ranks) named += (named.empty() ? "ranks " : ", ") + std::to_string(r);
  }
  return InvalidArgumentError(
      "tensor \"" + std::string(key) + "\": " + named +
      " hold different bytes for the same slice " + shown +
      " (ranks that pass one key and slice must hold identical replicas: declare each "
      "rank's part of the global tensor, or save the data per rank)");
}

// The same for chunks [first, first + count) of a whole plan.
Status ReplicaMismatch(const SavePlan& plan, uint32_t first, uint32_t count, int rank) {
  const PlannedChunk& chunk = plan.chunks[first];
  std::set<int> writers;
  for (uint32_t p = first; p < first + count; ++p) writers.insert(plan.chunks[p].writer);
  return ReplicaMismatch(plan.tensors[chunk.tensor].key, chunk.slice, writers, count > 1, rank);
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

namespace {

Status BadRound(const std::string& what) {
  return InternalError("bad replica check message: " + what);
}

// A replicated chunk as its writer reported it in the second round.
struct WrittenReplica {
  uint32_t crc32c = 0;
  uint64_t bytes = 0;
  int writer = -1;  // -1: not reported
  std::string key;
  Slice slice;
};

}  // namespace

std::string EncodeReplicaRound(const SavePlan& part, int rank,
                               const std::vector<CopyChecksum>& copies,
                               const std::vector<WrittenFile>& written) {
  wire::Writer w;
  const auto [first, end] = CopiesOf(part, rank);
  w.U64(std::min(copies.size(), end - first));
  for (size_t i = 0; i < copies.size() && first + i < end; ++i) {
    w.U32(copies[i].chunk);
    w.U32(part.copies[first + i].chunks);
    w.Fixed32(copies[i].crc32c);
  }
  // A rank's files are numbered consecutively in the whole plan.
  const uint32_t base = part.files.empty() ? 0 : WholeFileNumber(part, 0);
  wire::Writer chunks;
  uint64_t n = 0;
  for (const WrittenFile& f : written) {
    if (f.plan_file < base || f.plan_file - base >= part.files.size()) continue;
    const PlannedFile& pf = part.files[f.plan_file - base];
    for (size_t i = 0; i < pf.chunks.size() && i < f.chunks.size(); ++i) {
      const PlannedChunk& c = part.chunks[pf.chunks[i]];
      if (c.holders < 2) continue;
      chunks.U32(WholeChunkNumber(part, pf.chunks[i]));
      chunks.Fixed32(f.chunks[i].crc32c);
      chunks.U64(c.bytes);
      chunks.Str(part.tensors[c.tensor].key);
      chunks.Slice(c.slice);
      ++n;
    }
  }
  w.U64(n);
  std::string out = w.Take();
  return out + chunks.Take();
}

Status CheckReplicaRounds(const std::vector<std::string>& msgs) {
  std::map<uint32_t, WrittenReplica> written;
  struct Copy {
    uint32_t first, pieces, crc32c;
    int rank;
  };
  std::vector<Copy> copies;
  for (int r = 0; r < static_cast<int>(msgs.size()); ++r) {
    wire::Reader in(msgs[r]);
    SS_ASSIGN_OR_RETURN(uint64_t n, in.U64());
    for (uint64_t i = 0; i < n; ++i) {
      Copy c{0, 0, 0, r};
      SS_ASSIGN_OR_RETURN(c.first, in.U32());
      SS_ASSIGN_OR_RETURN(c.pieces, in.U32());
      SS_ASSIGN_OR_RETURN(c.crc32c, in.Fixed32());
      if (c.pieces == 0) return BadRound("a copy of no chunk");
      copies.push_back(c);
    }
    SS_ASSIGN_OR_RETURN(n, in.U64());
    for (uint64_t i = 0; i < n; ++i) {
      SS_ASSIGN_OR_RETURN(uint32_t number, in.U32());
      WrittenReplica& w = written[number];
      if (w.writer >= 0) return BadRound("a chunk written twice");
      w.writer = r;
      SS_ASSIGN_OR_RETURN(w.crc32c, in.Fixed32());
      SS_ASSIGN_OR_RETURN(w.bytes, in.U64());
      SS_ASSIGN_OR_RETURN(w.key, in.Str());
      SS_ASSIGN_OR_RETURN(w.slice, in.Slice());
    }
    if (!in.done()) return BadRound("trailing bytes");
  }
  for (const Copy& c : copies) {
    uint32_t crc = 0;
    std::set<int> writers;
    for (uint32_t p = c.first; p < c.first + c.pieces; ++p) {
      const auto it = written.find(p);
      if (it == written.end()) return BadRound("a copy of a chunk no rank wrote");
      crc = p == c.first ? it->second.crc32c
                         : Crc32cCombine(crc, it->second.crc32c, it->second.bytes);
      writers.insert(it->second.writer);
    }
    if (crc == c.crc32c) continue;
    const WrittenReplica& head = written.at(c.first);
    return ReplicaMismatch(head.key, head.slice, writers, c.pieces > 1, c.rank);
  }
  return Status();
}

}  // namespace shardsafe
