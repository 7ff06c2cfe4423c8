#include "engine/shared_reads/shared_reads.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <map>
#include <random>
#include <tuple>

#include "engine/shared_reads/shared_ring.h"
#include "comm/wire.h"

namespace shardsafe {
namespace {

// A byte range [begin, end) of data file `file`.
struct Extent {
  uint32_t file = 0;
  uint64_t begin = 0;
  uint64_t end = 0;
};

bool Before(const Extent& a, const Extent& b) {
  return std::tie(a.file, a.begin) < std::tie(b.file, b.begin);
}

// What each rank tells the others.
struct Offer {
  bool enabled = false;
  std::string machine;
  uint64_t nonce = 0;           // names the ring this rank may produce
  std::vector<Extent> extents;  // sorted, disjoint
  // Files whose reads overlap one another (a ring consumer reads forward only).
  std::vector<uint32_t> no_ring;
};

std::string MachineKey() {
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  std::ifstream in("/proc/sys/kernel/random/boot_id");
  std::string boot;
  std::getline(in, boot);
  return std::string(host) + "/" + boot;
}

// Sorts `all` and merges ranges that touch or overlap.
std::vector<Extent> Merge(std::vector<Extent> all) {
  std::sort(all.begin(), all.end(), Before);
  std::vector<Extent> merged;
  for (const Extent& e : all) {
    if (!merged.empty() && merged.back().file == e.file && merged.back().end >= e.begin) {
      merged.back().end = std::max(merged.back().end, e.end);
    } else {
      merged.push_back(e);
    }
  }
  return merged;
}

std::vector<Extent> PlanExtents(const LoadPlan& plan, std::vector<uint32_t>* overlapping) {
  std::vector<Extent> all;
  for (const ReadGroup& g : plan.groups) {
    for (const ReadOp& r : g.reads) all.push_back({r.file, r.offset, r.offset + r.length});
  }
  std::sort(all.begin(), all.end(), Before);
  for (size_t i = 1; i < all.size(); ++i) {
    if (all[i].file == all[i - 1].file && all[i].begin < all[i - 1].end &&
        (overlapping->empty() || overlapping->back() != all[i].file)) {
      overlapping->push_back(all[i].file);
    }
  }
  return Merge(std::move(all));
}

std::string EncodeOffer(const Offer& o) {
  wire::Writer w;
  w.U8(o.enabled);
  w.Str(o.machine);
  w.Fixed64(o.nonce);
  w.U64(o.extents.size());
  for (const Extent& e : o.extents) {
    w.U32(e.file);
    w.U64(e.begin);
    w.U64(e.end);
  }
  w.U64(o.no_ring.size());
  for (uint32_t f : o.no_ring) w.U32(f);
  return w.Take();
}

Result<Offer> DecodeOffer(std::string_view msg) {
  wire::Reader r(msg);
  Offer o;
  SS_ASSIGN_OR_RETURN(uint8_t enabled, r.U8());
  o.enabled = enabled != 0;
  SS_ASSIGN_OR_RETURN(o.machine, r.Str());
  SS_ASSIGN_OR_RETURN(o.nonce, r.Fixed64());
  SS_ASSIGN_OR_RETURN(uint64_t n, r.U64());
  if (n > msg.size()) return InternalError("shared reads: malformed offer");
  o.extents.resize(n);
  for (Extent& e : o.extents) {
    SS_ASSIGN_OR_RETURN(e.file, r.U32());
    SS_ASSIGN_OR_RETURN(e.begin, r.U64());
    SS_ASSIGN_OR_RETURN(e.end, r.U64());
  }
  SS_ASSIGN_OR_RETURN(n, r.U64());
  if (n > msg.size()) return InternalError("shared reads: malformed offer");
  o.no_ring.resize(n);
  for (uint32_t& f : o.no_ring) {
    SS_ASSIGN_OR_RETURN(f, r.U32());
  }
  return o;
}

// Per file: the bytes of `mine` (sorted, disjoint) that lie in `others`
// (sorted, disjoint), and the bytes of `mine`.
void CountShared(const std::vector<Extent>& mine, const std::vector<Extent>& others,
                 std::vector<uint64_t>* shared, std::vector<uint64_t>* total) {
  size_t j = 0;
  for (const Extent& m : mine) {
    if (m.file >= total->size()) continue;  // a malformed plan shares nothing
    (*total)[m.file] += m.end - m.begin;
    while (j < others.size() && (others[j].file < m.file ||
                                 (others[j].file == m.file && others[j].end <= m.begin))) {
      ++j;
    }
    for (size_t k = j; k < others.size() && others[k].file == m.file && others[k].begin < m.end;
         ++k) {
      (*shared)[m.file] += std::min(m.end, others[k].end) - std::max(m.begin, others[k].begin);
    }
  }
}

// Per file, whether `rank` shares it (see the header), given every offer.
std::vector<bool> SharesFiles(const std::vector<Offer>& offers, int rank, size_t num_files,
                              const SharedReadsOptions& options, uint64_t* bytes_shared) {
  std::vector<Extent> others;
  for (size_t r = 0; r < offers.size(); ++r) {
    if (static_cast<int>(r) != rank && offers[r].enabled &&
        offers[r].machine == offers[rank].machine) {
      others.insert(others.end(), offers[r].extents.begin(), offers[r].extents.end());
    }
  }
  std::vector<uint64_t> shared(num_files), total(num_files);
  CountShared(offers[rank].extents, Merge(std::move(others)), &shared, &total);
  std::vector<bool> out(num_files, false);
  for (size_t f = 0; f < num_files; ++f) {
    out[f] = shared[f] >= options.min_bytes && 2 * shared[f] >= total[f];
    if (out[f] && bytes_shared) *bytes_shared += shared[f];
  }
  return out;
}

// The blocks of `file` that the ring carries: what its consumers read,
// widened to 4 KiB (O_DIRECT) and cut into pieces of at most `slot_bytes`.
void AddBlocks(const std::vector<Offer>& offers, const std::vector<int>& consumers, uint32_t file,
               uint64_t file_size, uint64_t slot_bytes, std::vector<RingBlock>* blocks) {
  constexpr uint64_t kAlign = 4096;
  std::vector<Extent> wanted;
  for (int r : consumers) {
    for (const Extent& e : offers[r].extents) {
      if (e.file != file) continue;
      wanted.push_back({file, e.begin / kAlign * kAlign,
                        std::min(file_size, (e.end + kAlign - 1) / kAlign * kAlign)});
    }
  }
  for (const Extent& e : Merge(std::move(wanted))) {
    for (uint64_t at = e.begin; at < e.end; at += slot_bytes) {
      blocks->push_back({file, at, std::min(slot_bytes, e.end - at)});
    }
  }
}

// Rings for the ranks of every machine, from every offer and which files
// each rank shares; this rank's roles in `out`.
void AssignRings(const std::vector<Offer>& offers, const std::vector<std::vector<bool>>& shares,
                 int me, const std::vector<uint64_t>& file_sizes, const SharedReadsOptions& options,
                 SharedReadPlan* out) {
  const size_t num_files = file_sizes.size();
  std::map<std::string, std::vector<int>> machines;
  for (size_t r = 0; r < offers.size(); ++r) {
    if (offers[r].enabled) machines[offers[r].machine].push_back(static_cast<int>(r));
  }
  for (const auto& [machine, ranks] : machines) {
    if (ranks.size() < 2) continue;
    // participants[f]: the ranks of this machine that share file f.
    std::vector<std::vector<int>> participants(num_files);
    for (int r : ranks) {
      for (size_t f = 0; f < num_files; ++f) {
        const auto& no = offers[r].no_ring;
        if (shares[r][f] && std::find(no.begin(), no.end(), f) == no.end()) {
          participants[f].push_back(r);
        }
      }
    }
    // The producer of file f: participant f mod count (files spread over ranks).
    std::map<int, std::vector<uint32_t>> produced;
    for (uint32_t f = 0; f < num_files; ++f) {
      const auto& p = participants[f];
      if (p.size() >= 2 && p.size() <= SharedRing::kMaxConsumers) {
        produced[p[f % p.size()]].push_back(f);
      }
    }
    for (const auto& [producer, files] : produced) {
      out->rings_anywhere = true;
      std::vector<int> consumers;
      for (uint32_t f : files) {
        consumers.insert(consumers.end(), participants[f].begin(), participants[f].end());
      }
      std::sort(consumers.begin(), consumers.end());
      consumers.erase(std::unique(consumers.begin(), consumers.end()), consumers.end());
      const auto mine = std::find(consumers.begin(), consumers.end(), me);
      if (consumers.size() > SharedRing::kMaxConsumers || mine == consumers.end()) continue;
      RingRole role;
      role.producer = producer;
      char nonce[17];
      std::snprintf(nonce, sizeof nonce, "%016llx",
                    static_cast<unsigned long long>(offers[producer].nonce));
      role.name = "/shardsafe-" + std::string(nonce) + "-" + std::to_string(producer);
      role.consumers = static_cast<uint32_t>(consumers.size());
      role.consumer = static_cast<uint32_t>(mine - consumers.begin());
      for (uint32_t f : files) {
        AddBlocks(offers, participants[f], f, file_sizes[f], options.ring_slot_bytes,
                  &role.blocks);
      }
      uint64_t longest = 0;
      for (const RingBlock& b : role.blocks) longest = std::max(longest, b.length);
      role.slot_bytes = (longest + 4095) / 4096 * 4096;
      role.slots = std::max<uint32_t>(options.ring_slots, 2);
      const int index = static_cast<int>(out->rings.size());
      for (uint32_t f : files) {
        if (std::binary_search(participants[f].begin(), participants[f].end(), me)) {
          out->ring_of_file[f] = index;
        }
      }
      if (producer == me) out->produced = index;
      out->rings.push_back(std::move(role));
    }
  }
}

}  // namespace

Result<SharedReadPlan> PlanSharedReads(Comm& comm, const LoadPlan* plan,
                                       const std::vector<uint64_t>& file_sizes,
                                       const SharedReadsOptions& options) {
  const size_t num_files = file_sizes.size();
  SharedReadPlan out;
  out.buffered.assign(num_files, false);
  out.ring_of_file.assign(num_files, -1);
  if (comm.size() < 2) return out;
  Offer mine;
  mine.enabled = options.enabled && plan != nullptr;
  if (mine.enabled) {
    mine.machine = options.machine.empty() ? MachineKey() : options.machine;
    mine.nonce = std::random_device{}() * (uint64_t{1} << 32) ^ std::random_device{}();
    mine.extents = PlanExtents(*plan, &mine.no_ring);
  }
  SS_ASSIGN_OR_RETURN(std::vector<std::string> msgs, comm.AllGather(EncodeOffer(mine)));
  const int me = comm.rank();
  std::vector<Offer> offers(msgs.size());
  for (size_t r = 0; r < msgs.size(); ++r) {
    if (static_cast<int>(r) == me) {
      offers[r] = mine;
    } else {
      SS_ASSIGN_OR_RETURN(offers[r], DecodeOffer(msgs[r]));
    }
  }
  // Which files each rank shares: every rank's when rings are planned (all
  // ranks must reach the same assignment), else only this rank's.
  std::vector<std::vector<bool>> shares(offers.size());
  for (size_t r = 0; r < offers.size(); ++r) {
    const bool is_me = static_cast<int>(r) == me;
    if (offers[r].enabled && (options.rings || is_me)) {
      shares[r] = SharesFiles(offers, static_cast<int>(r), num_files, options,
                              is_me ? &out.bytes_shared : nullptr);
    }
  }
  if (options.rings) AssignRings(offers, shares, me, file_sizes, options, &out);
  if (mine.enabled) out.buffered = shares[me];
  return out;
}

}  // namespace shardsafe
