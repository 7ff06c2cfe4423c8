#include "engine/shared_reads.h"

#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <tuple>

#include "engine/wire.h"

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
  std::vector<Extent> extents;  // sorted, disjoint
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

std::vector<Extent> PlanExtents(const LoadPlan& plan) {
  std::vector<Extent> all;
  for (const ReadGroup& g : plan.groups) {
    for (const ReadOp& r : g.reads) all.push_back({r.file, r.offset, r.offset + r.length});
  }
  return Merge(std::move(all));
}

std::string EncodeOffer(const Offer& o) {
  wire::Writer w;
  w.U8(o.enabled);
  w.Str(o.machine);
  w.U64(o.extents.size());
  for (const Extent& e : o.extents) {
    w.U32(e.file);
    w.U64(e.begin);
    w.U64(e.end);
  }
  return w.Take();
}

Result<Offer> DecodeOffer(std::string_view msg) {
  wire::Reader r(msg);
  Offer o;
  SS_ASSIGN_OR_RETURN(uint8_t enabled, r.U8());
  o.enabled = enabled != 0;
  SS_ASSIGN_OR_RETURN(o.machine, r.Str());
  SS_ASSIGN_OR_RETURN(uint64_t n, r.U64());
  if (n > msg.size()) return InternalError("shared reads: malformed offer");
  o.extents.resize(n);
  for (Extent& e : o.extents) {
    SS_ASSIGN_OR_RETURN(e.file, r.U32());
    SS_ASSIGN_OR_RETURN(e.begin, r.U64());
    SS_ASSIGN_OR_RETURN(e.end, r.U64());
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

}  // namespace

Result<SharedReadPlan> PlanSharedReads(Comm& comm, const LoadPlan* plan, size_t num_files,
                                       const SharedReadsOptions& options) {
  SharedReadPlan out;
  out.buffered.assign(num_files, false);
  if (comm.size() < 2) return out;
  Offer mine;
  mine.enabled = options.enabled && plan != nullptr;
  if (mine.enabled) {
    mine.machine = options.machine.empty() ? MachineKey() : options.machine;
    mine.extents = PlanExtents(*plan);
  }
  SS_ASSIGN_OR_RETURN(std::vector<std::string> msgs, comm.AllGather(EncodeOffer(mine)));
  if (!mine.enabled) return out;
  std::vector<Extent> others;
  for (size_t r = 0; r < msgs.size(); ++r) {
    if (static_cast<int>(r) == comm.rank()) continue;
    SS_ASSIGN_OR_RETURN(Offer o, DecodeOffer(msgs[r]));
    if (o.enabled && o.machine == mine.machine) {
      others.insert(others.end(), o.extents.begin(), o.extents.end());
    }
  }
  std::vector<uint64_t> shared(num_files), total(num_files);
  CountShared(mine.extents, Merge(std::move(others)), &shared, &total);
  for (size_t f = 0; f < num_files; ++f) {
    if (shared[f] >= options.min_bytes && 2 * shared[f] >= total[f]) {
      out.buffered[f] = true;
      out.bytes_shared += shared[f];
    }
  }
  return out;
}

}  // namespace shardsafe
