// AlignedBuffer allocation, pre-faulting and the process-wide buffer cache.
#include "storage/aligned_buffer.h"

#include <sys/mman.h>

#include <cstdlib>
#include <cstring>
#include <mutex>
#include <new>
#include <utility>
#include <vector>

namespace shardsafe {
namespace {

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

// The cache keeps at most this many bytes of idle buffers: a few files'
// worth of 16 MiB buffers at default queue depth.
constexpr size_t kMaxCachedBytes = size_t{256} << 20;
// Larger buffers (an async saver's staging arena) are freed, not cached:
// their owner is giving the memory back, and kept they would only fill the
// room the file buffers need.
constexpr size_t kMaxCachedBuffer = size_t{64} << 20;

struct Cache {
  std::mutex mu;
  std::vector<std::pair<char*, size_t>> idle;  // LIFO: most recently used last
  size_t bytes = 0;
};

Cache& GetCache() {
  static Cache* cache = new Cache;  // never destroyed: may be used at exit
  return *cache;
}

// Faults every page in now, so the writes that follow run at memcpy speed.
void PreFault(char* p, size_t n) {
  if (n >= (size_t{2} << 20)) madvise(p, n, MADV_HUGEPAGE);
  if (madvise(p, n, MADV_POPULATE_WRITE) != 0) {
    std::memset(p, 0, n);  // kernels before 5.14
  }
}

char* TakeFromCache(size_t capacity) {
  Cache& cache = GetCache();
  std::lock_guard<std::mutex> lock(cache.mu);
  for (size_t i = cache.idle.size(); i-- > 0;) {
    if (cache.idle[i].second == capacity) {
      char* p = cache.idle[i].first;
      cache.idle.erase(cache.idle.begin() + i);
      cache.bytes -= capacity;
      return p;
    }
  }
  return nullptr;
}

// Returns true if the cache took ownership of `p`.
bool GiveToCache(char* p, size_t capacity) {
  Cache& cache = GetCache();
  std::lock_guard<std::mutex> lock(cache.mu);
  if (capacity > kMaxCachedBuffer || cache.bytes + capacity > kMaxCachedBytes) return false;
  cache.idle.emplace_back(p, capacity);
  cache.bytes += capacity;
  return true;
}

}  // namespace

AlignedBuffer::~AlignedBuffer() { Release(); }

AlignedBuffer::AlignedBuffer(AlignedBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)), capacity_(std::exchange(other.capacity_, 0)) {}

AlignedBuffer& AlignedBuffer::operator=(AlignedBuffer&& other) noexcept {
  if (this != &other) {
    Release();
    data_ = std::exchange(other.data_, nullptr);
    capacity_ = std::exchange(other.capacity_, 0);
  }
  return *this;
}

void AlignedBuffer::Release() {
  if (data_ == nullptr) return;
  if (!GiveToCache(data_, capacity_)) std::free(data_);
  data_ = nullptr;
  capacity_ = 0;
}

AlignedBuffer AcquireAlignedBuffer(size_t capacity) {
  capacity = AlignUp(capacity == 0 ? 1 : capacity);
  if (char* cached = TakeFromCache(capacity)) return AlignedBuffer(cached, capacity);
  void* p = nullptr;
  if (posix_memalign(&p, kDirectIoAlignment, capacity) != 0) throw std::bad_alloc();
  PreFault(static_cast<char*>(p), capacity);
  return AlignedBuffer(static_cast<char*>(p), capacity);
}

size_t AlignedBufferCacheBytes() {
  Cache& cache = GetCache();
  std::lock_guard<std::mutex> lock(cache.mu);
  return cache.bytes;
}

}  // namespace shardsafe
