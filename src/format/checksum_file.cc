#include "format/checksum_file.h"

#include <algorithm>
#include <bit>
#include <cstring>

#include "base/crc32c.h"

namespace shardsafe {
namespace {

static_assert(std::endian::native == std::endian::little, "the file is read in place");

bool Before(const ChunkChecksum& a, const ChunkChecksum& b) {
  return a.file != b.file ? a.file < b.file : a.at < b.at;
}

template <typename T>
void Put(std::string& out, T v) {
  out.append(reinterpret_cast<const char*>(&v), sizeof(v));
}

template <typename T>
T Get(const char*& p) {
  T v;
  std::memcpy(&v, p, sizeof(v));
  p += sizeof(v);
  return v;
}

}  // namespace

std::string EncodeChecksumFile(std::vector<ChunkChecksum> entries) {
  std::sort(entries.begin(), entries.end(), Before);
  std::string out;
  out.reserve(ChecksumFileBytes(entries.size()));
  out.append(kChecksumFileMagic);
  Put<uint64_t>(out, entries.size());
  for (const ChunkChecksum& e : entries) {
    Put<uint32_t>(out, e.file);
    Put<uint32_t>(out, e.crc32c);
    Put<uint64_t>(out, e.at);
  }
  Put<uint32_t>(out, Crc32c(out.data(), out.size()));
  return out;
}

Result<std::vector<ChunkChecksum>> DecodeChecksumFile(std::string_view bytes,
                                                      std::string_view source) {
  auto loss = [&](const std::string& message) {
    return DataLossError(std::string(source) + ": checksum file " + message);
  };
  if (bytes.size() < ChecksumFileBytes(0) || !bytes.starts_with(kChecksumFileMagic)) {
    return loss("does not start with SSCRC32C and a count");
  }
  const char* p = bytes.data() + kChecksumFileMagic.size();
  const uint64_t count = Get<uint64_t>(p);
  if (count > (bytes.size() - ChecksumFileBytes(0)) / 16 ||
      bytes.size() != ChecksumFileBytes(count)) {
    return loss("is " + std::to_string(bytes.size()) + " bytes, its count of " +
                std::to_string(count) + " entries needs " +
                std::to_string(ChecksumFileBytes(std::min<uint64_t>(count, UINT64_MAX / 32))));
  }
  const size_t body = bytes.size() - sizeof(uint32_t);
  const char* tail = bytes.data() + body;
  if (Get<uint32_t>(tail) != Crc32c(bytes.data(), body)) return loss("checksum mismatch");
  std::vector<ChunkChecksum> entries(count);
  for (uint64_t i = 0; i < count; ++i) {
    ChunkChecksum& e = entries[i];
    e.file = Get<uint32_t>(p);
    e.crc32c = Get<uint32_t>(p);
    e.at = Get<uint64_t>(p);
    if (i > 0 && !Before(entries[i - 1], e)) {
      return loss("entry " + std::to_string(i) + " is out of order or repeats one");
    }
  }
  return entries;
}

std::optional<uint32_t> FindChecksum(const std::vector<ChunkChecksum>& entries, uint32_t file,
                                     uint64_t at) {
  const ChunkChecksum key{file, at, 0};
  auto it = std::lower_bound(entries.begin(), entries.end(), key, Before);
  if (it == entries.end() || it->file != file || it->at != at) return std::nullopt;
  return it->crc32c;
}

}  // namespace shardsafe
