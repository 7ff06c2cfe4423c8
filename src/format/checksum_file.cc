#include "format/checksum_file.h"

#include <algorithm>

#include "base/crc32c.h"
#include "format/little_endian.h"

namespace shardsafe {
namespace {

using le::Get;
using le::Put;

bool Before(const ChunkChecksum& a, const ChunkChecksum& b) {
  return a.file != b.file ? a.file < b.file : a.at < b.at;
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
  // The entries the bytes hold, compared with the count (no overflow).
  if ((bytes.size() - ChecksumFileBytes(0)) % 16 != 0 ||
      (bytes.size() - ChecksumFileBytes(0)) / 16 != count) {
    return loss("is " + std::to_string(bytes.size()) + " bytes, not what a count of " +
                std::to_string(count) + " entries needs");
  }
  const size_t body = bytes.size() - sizeof(uint32_t);
  const char* tail = bytes.data() + body;
  if (Get<uint32_t>(tail) != Crc32c(bytes.data(), body)) return loss("checksum mismatch");
  std::vector<ChunkChecksum> entries;
  entries.reserve(count);
  for (uint64_t i = 0; i < count; ++i) {
    ChunkChecksum e;
    e.file = Get<uint32_t>(p);
    e.crc32c = Get<uint32_t>(p);
    e.at = Get<uint64_t>(p);
    if (entries.empty() || Before(entries.back(), e)) {
      entries.push_back(e);
      continue;
    }
    // An earlier writer listed empty chunks too, with checksum 0, at the
    // place of the entry that follows them: such a repeat keeps the other
    // entry's checksum. Any other repeat, or an entry out of order, is loss.
    ChunkChecksum& before = entries.back();
    const bool empty_one = before.file == e.file && before.at == e.at &&
                           (before.crc32c == 0 || e.crc32c == 0 || before.crc32c == e.crc32c);
    if (!empty_one) return loss("entry " + std::to_string(i) + " is out of order or repeats one");
    before.crc32c |= e.crc32c;  // one of them is 0, or both are equal
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
