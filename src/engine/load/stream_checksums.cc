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
          {c.at, c.at + c.bytes, *c.crc32c, c.at, 0, State::kPending, &key, &c, i});
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
  std::lock_guard<std::mutex> lock(f.mu);
  // Chunks do not overlap, so those that [offset, offset + n) touches are
  // consecutive, from the last one starting at or before `offset`.
  auto it = std::upper_bound(f.chunks.begin(), f.chunks.end(), offset,
                             [](uint64_t o, const Chunk& c) { return o < c.begin; });
  if (it != f.chunks.begin()) --it;
  for (; it != f.chunks.end() && it->begin < offset + n; ++it) {
    if (it->end > offset) Extend(*it, offset, n, data, file);
  }
}

void StreamChecksums::Extend(Chunk& c, uint64_t offset, uint64_t n, const char* data,
                             uint32_t file) {
  if (c.state != State::kPending) return;
  const uint64_t a = std::max(c.begin, offset), b = std::min(c.end, offset + n);
  if (a > c.next) {  // a gap: these bytes came before earlier ones
    c.state = State::kBroken;
    return;
  }
  if (b <= c.next) return;  // read again: already counted
  c.crc = Crc32cExtend(c.crc, data + (c.next - offset), b - c.next);
  c.next = b;
  if (c.next < c.end) return;
  if (c.crc == c.expected) {
    c.state = State::kVerified;
    ++verified_;
    return;
  }
  c.state = State::kBroken;
  char msg[96];
  std::snprintf(msg, sizeof msg, ": checksum mismatch (recorded %08x, computed %08x)", c.expected,
                c.crc);
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
