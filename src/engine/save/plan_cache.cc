#include "engine/save/plan_cache.h"

#include <isa-l/crc64.h>

#include <algorithm>
#include <list>
#include <mutex>
#include <utility>

namespace shardsafe {
namespace {

constexpr size_t kMaxEntries = 64;

struct Entry {
  int size;
  int rank;
  CachedPlan cached;
};

std::mutex& Mu() {
  static std::mutex mu;
  return mu;
}

// Most recently used first.
std::list<Entry>& Entries() {
  static std::list<Entry> entries;
  return entries;
}

uint64_t Extend(uint64_t (*crc)(uint64_t, const uint8_t*, uint64_t), uint64_t h,
                std::string_view part) {
  const uint64_t n = part.size();
  h = crc(h, reinterpret_cast<const uint8_t*>(&n), sizeof n);
  return crc(h, reinterpret_cast<const uint8_t*>(part.data()), part.size());
}

}  // namespace

Digest DigestOf(const std::vector<std::string_view>& parts) {
  Digest d{0, 0};
  for (std::string_view p : parts) {
    d[0] = Extend(crc64_ecma_refl, d[0], p);
    d[1] = Extend(crc64_jones_refl, d[1], p);
  }
  return d;
}

std::optional<CachedPlan> LookUpPlan(const Comm& comm) {
  std::lock_guard<std::mutex> lock(Mu());
  auto& entries = Entries();
  auto it = std::find_if(entries.begin(), entries.end(), [&](const Entry& e) {
    return e.size == comm.size() && e.rank == comm.rank();
  });
  if (it == entries.end()) return std::nullopt;
  entries.splice(entries.begin(), entries, it);
  return it->cached;
}

void StorePlan(const Comm& comm, CachedPlan cached) {
  std::lock_guard<std::mutex> lock(Mu());
  auto& entries = Entries();
  entries.remove_if([&](const Entry& e) { return e.size == comm.size() && e.rank == comm.rank(); });
  entries.push_front({comm.size(), comm.rank(), std::move(cached)});
  if (entries.size() > kMaxEntries) entries.pop_back();
}

}  // namespace shardsafe
