#include "engine/load/stream_checksums.h"

#include <algorithm>
#include <cstdio>

#include "base/crc32c.h"

namespace shardsafe {

StreamChecksums::StreamChecksums(const PackedTensors& tensors, std::vector<std::string> file_paths)
    : tensors_(tensors), file_paths_(std::move(file_paths)) {
  for (size_t i = 0; i < file_paths_.size(); ++i) files_.push_back(std::make_unique<File>());
  // Each file's chunks at their exact count: counted, then placed.
  auto each = [&](auto f) {
    for (size_t t = 0; t < tensors.size(); ++t) {
      const uint64_t first = tensors.first_chunk(t);
      for (uint64_t c = first; c < first + tensors.chunk_count(t); ++c) {
        if (!tensors.crc32c(c) || tensors.bytes(c) == 0 || tensors.file(c) >= files_.size()) {
          continue;
        }
        f(t, c);
      }
    }
  };
  std::vector<size_t> count(files_.size());
  each([&](size_t, uint64_t c) { ++count[tensors.file(c)]; });
  for (size_t f = 0; f < files_.size(); ++f) files_[f]->chunks.reserve(count[f]);
  each([&](size_t t, uint64_t c) {
    files_[tensors.file(c)]->chunks.push_back(
        {tensors.at(c), c, static_cast<uint32_t>(t), State::kPending});
  });
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
    const uint64_t end = End(*it);
    if (end <= offset) continue;
    const uint64_t a = std::max(it->begin, offset), b = std::min(end, offset + n);
    const uint32_t crc = Crc32c(data + (a - offset), b - a);
    std::lock_guard<std::mutex> lock(f.mu);
    Record(f, *it, a, b, crc, offset, data, file);
  }
}

void StreamChecksums::Record(File& f, Chunk& c, uint64_t a, uint64_t b, uint32_t crc,
                             uint64_t offset, const char* data, uint32_t file) {
  if (c.state != State::kPending) return;
  const uint64_t end = End(c);
  if (a == c.begin && b == end && !f.seen.count(c.number)) return Check(c, crc, file);  // whole
  Segments& segs = f.seen[c.number];
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
  if (segs.size() != 1) return;
  const auto& [start, seg] = *segs.begin();
  if (start != c.begin || seg.end != end) return;
  const uint32_t whole = seg.crc;
  f.seen.erase(c.number);
  Check(c, whole, file);
}

void StreamChecksums::Check(Chunk& c, uint32_t crc, uint32_t file) {
  const uint32_t expected = *tensors_.crc32c(c.number);
  if (crc == expected) {
    c.state = State::kVerified;
    ++verified_;
    return;
  }
  c.state = State::kBroken;
  char msg[96];
  std::snprintf(msg, sizeof msg, ": checksum mismatch (recorded %08x, computed %08x)", expected,
                crc);
  std::lock_guard<std::mutex> lock(error_mu_);
  if (error_.ok()) {
    error_ = DataLossError("tensor \"" + std::string(tensors_.key(c.tensor)) + "\" chunk " +
                           SliceToString(tensors_.slice(c.tensor, c.number)) + " in " +
                           file_paths_[file] + msg);
  }
}

Status StreamChecksums::status() const {
  std::lock_guard<std::mutex> lock(error_mu_);
  return error_;
}

std::vector<std::pair<std::string, uint32_t>> StreamChecksums::Unverified(
    const std::function<bool(std::string_view)>& of) const {
  std::vector<std::pair<std::string, uint32_t>> out;
  for (const auto& f : files_) {
    std::lock_guard<std::mutex> lock(f->mu);
    for (const Chunk& c : f->chunks) {
      if (c.state == State::kVerified) continue;
      const std::string_view key = tensors_.key(c.tensor);
      if (!of(key)) continue;
      out.emplace_back(key, static_cast<uint32_t>(c.number - tensors_.first_chunk(c.tensor)));
    }
  }
  return out;
}

std::vector<std::pair<std::string, uint32_t>> StreamChecksums::Unverified(
    const std::set<std::string>& keys) const {
  return Unverified([&](std::string_view key) { return keys.count(std::string(key)) > 0; });
}

}  // namespace shardsafe
