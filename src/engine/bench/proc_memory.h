// The process's memory, from /proc, for the benchmarks: resident sizes, the
// peak resident size (and resetting it), the memory the kernel can still
// give, and a limit on the process's heap so that a benchmark that needs
// more than there is fails with std::bad_alloc instead of pushing the
// machine into the out-of-memory killer. Linux only.
#pragma once

#include <malloc.h>
#include <sys/resource.h>

#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <string>

namespace shardsafe::bench {

// A size in bytes from a "Field:   N kB" line of `file` (/proc/self/status:
// "VmRSS:", "VmHWM:", "VmData:"; /proc/meminfo: "MemAvailable:"); 0 where
// unreadable.
inline uint64_t ProcKiBField(const char* file, const std::string& field) {
  std::ifstream in(file);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(field, 0) == 0) {
      return std::strtoull(line.c_str() + field.size(), nullptr, 10) << 10;
    }
  }
  return 0;
}

inline uint64_t StatusBytes(const std::string& field) {
  return ProcKiBField("/proc/self/status", field);
}

inline uint64_t MemAvailableBytes() { return ProcKiBField("/proc/meminfo", "MemAvailable:"); }

// Returns freed heap to the system and resets the peak resident size
// (VmHWM) to the current one, so that the peak read afterwards is that of
// what runs in between. False where the kernel refuses (clear_refs).
inline bool ResetPeakRss() {
  malloc_trim(0);
  std::ofstream clear("/proc/self/clear_refs");
  clear << "5";
  clear.flush();
  return clear.good() && StatusBytes("VmHWM:") > 0;
}

// While alive, limits the process's data segments (heap, anonymous
// mappings: RLIMIT_DATA) to what they hold now plus `extra` bytes, so that
// allocations past it throw std::bad_alloc; restores the limit after.
class HeapLimit {
 public:
  explicit HeapLimit(uint64_t extra) {
    set_ = getrlimit(RLIMIT_DATA, &old_) == 0;
    if (!set_) return;
    rlimit lower = old_;
    lower.rlim_cur = StatusBytes("VmData:") + extra;
    const bool lower_already = old_.rlim_cur != RLIM_INFINITY && old_.rlim_cur < lower.rlim_cur;
    set_ = !lower_already && setrlimit(RLIMIT_DATA, &lower) == 0;
  }
  ~HeapLimit() {
    if (set_) setrlimit(RLIMIT_DATA, &old_);
  }
  HeapLimit(const HeapLimit&) = delete;
  HeapLimit& operator=(const HeapLimit&) = delete;

 private:
  rlimit old_{};
  bool set_ = false;
};

}  // namespace shardsafe::bench
