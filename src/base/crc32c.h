// CRC-32C (Castagnoli), the checksum of every chunk shardsafe writes.
//
// Hardware accelerated through ISA-L (~30 GB/s on this machine class). The
// value is the standard one (iSCSI, RFC 3720): Crc32c("123456789") ==
// 0xE3069283. Extend() lets a checksum be computed over data that arrives in
// pieces: Crc32cExtend(Crc32cExtend(0, a), b) == Crc32c(a + b).
// Thread-safe (pure functions).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

namespace shardsafe {

// Checksum of `data` continuing from `crc` (0 for a fresh checksum).
uint32_t Crc32cExtend(uint32_t crc, const void* data, size_t n);

inline uint32_t Crc32c(const void* data, size_t n) { return Crc32cExtend(0, data, n); }
inline uint32_t Crc32c(std::span<const std::byte> data) {
  return Crc32cExtend(0, data.data(), data.size());
}

// The checksum of A followed by B, from Crc32c(A), Crc32c(B) and B's length:
// lets pieces of one chunk be checksummed on different threads.
uint32_t Crc32cCombine(uint32_t crc_a, uint32_t crc_b, uint64_t len_b);

// Copies `n` bytes from `src` to `dst` (non-overlapping) and returns the
// checksum of the bytes, extending `crc`. Works in cache-sized blocks, so
// the source is read from memory once: the checksum reads a block, the copy
// takes it from the cache. On x86-64 the copy uses non-temporal stores,
// which neither read nor cache the destination: ~1.4x faster here, for a
// destination the CPU does not read soon (staging for O_DIRECT writes). The
// checksum is of the source: `src` must not change during the call.
uint32_t CopyWithCrc32c(void* dst, const void* src, size_t n, uint32_t crc);

}  // namespace shardsafe
