// AlignedBuffer: 4 KiB-aligned staging memory for O_DIRECT writes, recycled
// through a small process-wide cache.
//
// On the machines shardsafe runs on, freshly allocated memory costs a page
// fault per 4 KiB page on first touch (0.5-1.5 GB/s, slower than the disk),
// and memory freed for a few seconds goes back to the host. So staging
// buffers are pre-faulted once when allocated (MADV_POPULATE_WRITE, with
// transparent huge pages requested) and, when a file is done with them, kept
// in a bounded cache for the next file instead of being freed. Buffers over
// 64 MiB (an async save's staging arena) are freed, never cached.
//
// Thread-safe: AcquireAlignedBuffer / the destructor may run on any thread.
#pragma once

#include <cstddef>
#include <cstdint>

namespace shardsafe {

inline constexpr size_t kDirectIoAlignment = 4096;

// Rounds `n` up to a multiple of kDirectIoAlignment.
constexpr uint64_t AlignUp(uint64_t n) {
  return (n + kDirectIoAlignment - 1) / kDirectIoAlignment * kDirectIoAlignment;
}
constexpr bool IsAligned(uint64_t n) { return n % kDirectIoAlignment == 0; }

// Owns `capacity` bytes aligned to kDirectIoAlignment. Move-only. On
// destruction the memory returns to the process-wide cache (or is freed when
// the cache is full).
class AlignedBuffer {
 public:
  AlignedBuffer() = default;
  ~AlignedBuffer();
  AlignedBuffer(AlignedBuffer&& other) noexcept;
  AlignedBuffer& operator=(AlignedBuffer&& other) noexcept;
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;

  char* data() const { return data_; }
  size_t capacity() const { return capacity_; }
  bool empty() const { return data_ == nullptr; }

 private:
  friend AlignedBuffer AcquireAlignedBuffer(size_t capacity);
  AlignedBuffer(char* data, size_t capacity) : data_(data), capacity_(capacity) {}
  void Release();

  char* data_ = nullptr;
  size_t capacity_ = 0;
};

// A pre-faulted buffer of exactly AlignUp(capacity) bytes, from the cache
// when one of that size is there. Throws std::bad_alloc like new.
AlignedBuffer AcquireAlignedBuffer(size_t capacity);

// Bytes currently held by the cache (for tests).
size_t AlignedBufferCacheBytes();

}  // namespace shardsafe
