#include "base/crc32c.h"

#include <isa-l/crc.h>

#include <algorithm>
#include <climits>
#include <cstring>

namespace shardsafe {

uint32_t Crc32cExtend(uint32_t crc, const void* data, size_t n) {
  // ISA-L works on the raw register: pre- and post-invert for the standard
  // value, and feed it at most INT_MAX bytes per call (its length is an int).
  uint32_t reg = ~crc;
  auto* p = static_cast<unsigned char*>(const_cast<void*>(data));
  while (n > 0) {
    const size_t step = std::min<size_t>(n, 1u << 30);
    reg = crc32_iscsi(p, static_cast<int>(step), reg);
    p += step;
    n -= step;
  }
  return ~reg;
}

uint32_t CopyWithCrc32c(void* dst, const void* src, size_t n, uint32_t crc) {
  // 256 KiB blocks: the copied block is still in L2 when the checksum reads it.
  constexpr size_t kBlock = 256 * 1024;
  auto* d = static_cast<char*>(dst);
  auto* s = static_cast<const char*>(src);
  for (size_t done = 0; done < n; done += kBlock) {
    const size_t len = std::min(kBlock, n - done);
    std::memcpy(d + done, s + done, len);
    crc = Crc32cExtend(crc, d + done, len);
  }
  return crc;
}

}  // namespace shardsafe
