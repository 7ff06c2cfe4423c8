#include "engine/load/stream_checksums.h"

#include <algorithm>
#include <cstdio>

#include "base/crc32c.h"

namespace shardsafe {

StreamChecksums::StreamChecksums(const CheckpointIndex& index, std::vector<std::string> file_paths)
    : file_paths_(std::move(file_paths)) {
  for (size_t i = 0; i < index.files.size(); ++i) files_.push_back(std::make_unique<File>());
  for (const auto& [key, tensor] : index.tensors) {
    for (uint32_t i = 0; i < tensor.chunks.size(); ++i) {
      const IndexChunk& c = tensor.chunks[i];
      if (!c.crc32c || c.bytes == 0 || c.file >= files_.size()) continue;
      files_[c.file]->chunks.push_back(
          {c.at, c.at + c.bytes, *c.crc32c, State::kPending, {}, &key, &c, i});
    }
  }
  for (auto& f : files_) {
    std::sort(f->chunks.begin(), f->chunks.end(),
              [](const Chunk& a, const Chunk& b) { return a.begin < b.begin; });
  }
}

void StreamChecksums::Add(uint32_t file, uint64_t offset, uint64_t n, const char* data) {
  if (file >= files_.size() || n == 0) return;
  File& f = *files_[file];
  // Chunks do not overlap, so those that [offset, offset + n) touches are
  // consecutive, from the last one starting at or before `offset`. Their
  // ranges never change: they are found, and their bytes checksummed,
  // without the lock.
  auto it = std::upper_bound(f.chunks.begin(), f.chunks.end(), offset,
                             [](uint64_t o, const Chunk& c) { return o < c.begin; });
  if (it != f.chunks.begin()) --it;
  for (; it != f.chunks.end() && it->begin < offset + n; ++it) {
    if (it->end <= offset) continue;
    const uint64_t a = std::max(it->begin, offset), b = std::min(it->end, offset + n);
    const uint32_t crc = Crc32c(data + (a - offset), b - a);
    std::lock_guard<std::mutex> lock(f.mu);
    Record(*it, a, b, crc, offset, data, file);
  }
}

void StreamChecksums::Record(Chunk& c, uint64_t a, uint64_t b, uint32_t crc, uint64_t offset,
                             const char* data, uint32_t file) {
  if (c.state != State::kPending) return;
  auto& segs = c.segments;
  // The parts of [a, b) no segment holds yet (bytes read twice count once).
  std::vector<std::pair<uint64_t, uint64_t>> fresh;
  auto next = segs.upper_bound(a);
  uint64_t at = a;
  if (next != segs.begin() && std::prev(next)->second.end > at) at = std::prev(next)->second.end;
  for (; at < b; ++next) {
    const uint64_t stop = next == segs.end() ? b : std::min(b, next->first);
    if (at < stop) fresh.emplace_back(at, stop);
    if (next == segs.end()) break;
    at = std::max(at, next->second.end);
  }
  for (const auto& [lo, hi] : fresh) {
    const uint32_t piece =
        lo == a && hi == b ? crc : Crc32c(data + (lo - offset), hi - lo);
    auto inserted = segs.emplace(lo, Segment{hi, piece}).first;
    // Join with the segment that ends where this one starts, and with the
    // one that starts where it ends.
    if (inserted != segs.begin()) {
      auto left = std::prev(inserted);
      if (left->second.end == lo) {
        left->second.crc = Crc32cCombine(left->second.crc, piece, hi - lo);
        left->second.end = hi;
        segs.erase(inserted);
        inserted = left;
      }
    }
    auto right = std::next(inserted);
    if (right != segs.end() && right->first == inserted->second.end) {
      inserted->second.crc = Crc32cCombine(inserted->second.crc, right->second.crc,
                                           right->second.end - right->first);
      inserted->second.end = right->second.end;
      segs.erase(right);
    }
  }
  Check(c, file);
}

void StreamChecksums::Check(Chunk& c, uint32_t file) {
  if (c.segments.size() != 1) return;
  const auto& [start, seg] = *c.segments.begin();
  if (start != c.begin || seg.end != c.end) return;
  const uint32_t crc = seg.crc;
  c.segments.clear();
  if (crc == c.expected) {
    c.state = State::kVerified;
    ++verified_;
    return;
  }
  c.state = State::kBroken;
  char msg[96];
  std::snprintf(msg, sizeof msg, ": checksum mismatch (recorded %08x, computed %08x)", c.expected,
                crc);
  std::lock_guard<std::mutex> lock(error_mu_);
  if (error_.ok()) {
    error_ = DataLossError("tensor \"" + *c.key + "\" chunk " + SliceToString(c.chunk->slice) +
                           " in " + file_paths_[file] + msg);
  }
}

Status StreamChecksums::status() const {
  std::lock_guard<std::mutex> lock(error_mu_);
  return error_;
}

std::vector<std::pair<std::string, uint32_t>> StreamChecksums::Unverified(
    const std::set<std::string>& keys) const {
  std::vector<std::pair<std::string, uint32_t>> out;
  for (const auto& f : files_) {
    std::lock_guard<std::mutex> lock(f->mu);
    for (const Chunk& c : f->chunks) {
      if (c.state != State::kVerified && keys.count(*c.key)) out.emplace_back(*c.key, c.index);
    }
  }
  return out;
}

}  // namespace shardsafe
