#include "engine/tier/memory_tier.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <map>

#include "comm/agree.h"
#include "comm/wire.h"
#include "engine/catalog/checkpoint_dir.h"

namespace shardsafe {
namespace {

std::string HostName() {
  char name[256] = {};
  if (gethostname(name, sizeof name - 1) != 0) return "?";
  return name;
}

}  // namespace

std::string DefaultMemoryDir(const std::string& root) {
  uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a, 64 bits
  for (unsigned char c : root) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(h));
  return std::string("/dev/shm/shardsafe-") + hex;
}

Status CheckSharedFolder(Comm& comm, const std::string& dir) {
  const std::string mine = HostName() + ":" + dir;
  SS_ASSIGN_OR_RETURN(std::vector<std::string> all, AllGatherOrFail(comm, Status(), mine));
  for (size_t r = 1; r < all.size(); ++r) {
    if (all[r] == all[0]) continue;
    return FailedPreconditionError(
        "memory tier: ranks use different folders (rank 0 " + all[0] + ", rank " +
        std::to_string(r) + " " + all[r] +
        "): the memory tier spans one node, whose ranks share one folder, until replicas on "
        "peer nodes are built; use one folder on one node, or no memory tier");
  }
  return Status();
}

Result<std::optional<int64_t>> LatestStepOf(FileSystem* given, const std::string& root) {
  SS_ASSIGN_OR_RETURN(FileSystem * fs, FileSystemFor(root, given));
  if (!fs->Stat(root).ok()) return std::optional<int64_t>();
  auto shared = LockRoot(*fs, root, LockMode::kShared);  // as ListCheckpoints
  if (!shared.ok() && shared.status().code() != StatusCode::kNotFound) return shared.status();
  SS_ASSIGN_OR_RETURN(RootListing listing, ListRoot(*fs, root, /*data_bytes=*/false));
  SS_RETURN_IF_ERROR(listing.latest_unknown);
  for (const CheckpointInfo& c : listing.checkpoints) {
    if (c.is_latest) return c.step;
  }
  return std::optional<int64_t>();
}

Result<std::vector<TierListing>> ListTiers(FileSystem* fs, const std::string& memory_dir,
                                           const std::string& root) {
  std::vector<TierListing> tiers;
  for (const auto& [tier, dir] : {std::pair{kMemoryTier, &memory_dir}, {kRootTier, &root}}) {
    SS_ASSIGN_OR_RETURN(FileSystem * on, FileSystemFor(*dir, fs));
    TierListing listing{tier, {}, std::nullopt};
    if (on->Stat(*dir).ok()) {
      SS_ASSIGN_OR_RETURN(listing.latest, LatestStepOf(on, *dir));
      SS_ASSIGN_OR_RETURN(listing.checkpoints, ListCheckpoints(*dir, on));
    }
    tiers.push_back(std::move(listing));
  }
  return tiers;
}

bool CopyIsBroken(const Status& load_failure) {
  return load_failure.code() == StatusCode::kDataLoss;
}

Result<std::vector<TierCopy>> OrderCopies(const std::vector<TierListing>& tiers,
                                          std::optional<int64_t> step) {
  std::optional<int64_t> newest = step;
  if (!step) {
    for (const TierListing& t : tiers) {
      if (t.latest && (!newest || *t.latest > *newest)) newest = t.latest;
    }
    if (!newest) return NotFoundError("no committed checkpoint with a step in any tier");
  }
  std::vector<TierCopy> copies;
  for (size_t i = 0; i < tiers.size(); ++i) {
    for (const CheckpointInfo& c : tiers[i].checkpoints) {
      if (!c.step || *c.step > *newest || (step && *c.step != *step)) continue;
      copies.push_back(TierCopy{tiers[i].tier, c.path, *c.step});
    }
  }
  // Newest step first; at one step, the tiers' order (fastest first).
  std::stable_sort(copies.begin(), copies.end(),
                   [](const TierCopy& a, const TierCopy& b) { return a.step > b.step; });
  if (copies.empty()) {
    std::string names;
    for (const TierListing& t : tiers) names += (names.empty() ? "" : ", ") + t.tier;
    return NotFoundError("step " + std::to_string(*newest) + " is in no tier (" + names + ")");
  }
  return copies;
}

std::vector<CheckpointInfo> MergeListings(const std::vector<TierListing>& tiers) {
  std::map<std::string, CheckpointInfo> by_tag;
  std::vector<std::string> order;
  for (const TierListing& t : tiers) {
    for (const CheckpointInfo& c : t.checkpoints) {
      auto [it, added] = by_tag.try_emplace(c.tag, c);
      if (added) order.push_back(c.tag);
      it->second.tiers.push_back(t.tier);
    }
  }
  std::vector<CheckpointInfo> merged;
  for (const std::string& tag : order) merged.push_back(std::move(by_tag[tag]));
  std::stable_sort(merged.begin(), merged.end(),
                   [](const CheckpointInfo& a, const CheckpointInfo& b) {
                     if (a.step.has_value() != b.step.has_value()) return a.step.has_value();
                     if (a.step && *a.step != *b.step) return *a.step < *b.step;
                     return !a.step && a.tag < b.tag;
                   });
  return merged;
}

std::string EncodeCopies(const std::vector<TierCopy>& copies) {
  wire::Writer w;
  w.U64(copies.size());
  for (const TierCopy& c : copies) {
    w.Str(c.tier);
    w.Str(c.path);
    w.U64(static_cast<uint64_t>(c.step));
  }
  return w.Take();
}

Result<std::vector<TierCopy>> DecodeCopies(std::string_view message) {
  wire::Reader r(message);
  SS_ASSIGN_OR_RETURN(uint64_t n, r.U64());
  std::vector<TierCopy> copies;
  for (uint64_t i = 0; i < n; ++i) {
    TierCopy c;
    SS_ASSIGN_OR_RETURN(c.tier, r.Str());
    SS_ASSIGN_OR_RETURN(c.path, r.Str());
    SS_ASSIGN_OR_RETURN(uint64_t step, r.U64());
    c.step = static_cast<int64_t>(step);
    copies.push_back(std::move(c));
  }
  return copies;
}

}  // namespace shardsafe
