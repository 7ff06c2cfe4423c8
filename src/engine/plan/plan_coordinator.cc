// Rank 0's round of a distributed plan (distributed_plan.h, round 4): from
// every rank's summary, the chunk numbers, the writers of replicated chunks
// and pieces, the blobs and the totals, as PlanSave would choose them.
#include <algorithm>
#include <queue>
#include <unordered_map>

#include "comm/wire.h"
#include "engine/plan/distributed_plan.h"
#include "engine/plan/plan_home.h"

namespace shardsafe {
namespace {

struct ItemSummary {
  uint64_t position, bytes, elements;
  uint32_t set;
  uint32_t pieces = 1;
  uint64_t first_writer = 0;  // its pieces' writers: Coordinator::writers_ from here
};

struct KeySummary {
  std::string name;
  DType dtype;
  uint64_t chunks;
  std::vector<ItemSummary> items;
  uint64_t first = 0;
};

struct RankSummary {
  uint64_t own_bytes = 0;
  uint64_t unique_bytes = 0, held_bytes = 0;
  std::vector<uint32_t> sets;  // the ids of its holder lists (HolderSets)
  std::vector<KeySummary> keys;
};

// Every distinct holder list of the job's replicated chunks (the same DP
// group comes from many homes), and the least-loaded rank of one, as a scan
// in rank order finds it (ties: the lowest rank). A list of more than
// kScanHolders ranks keeps a heap of (load, rank) whose entries may be
// stale: a rank's load only grows, also through other lists, so a popped
// entry whose load is not the rank's now goes back with it, and the first
// that is current is the least. So choosing a writer costs a few heap
// operations, not a pass over thousands of holders.
class HolderSets {
 public:
  static constexpr uint64_t kScanHolders = 64;

  uint32_t Add(const std::vector<RankRun>& runs) {
    std::string key(reinterpret_cast<const char*>(runs.data()), runs.size() * sizeof(RankRun));
    auto [it, fresh] = ids_.try_emplace(std::move(key), static_cast<uint32_t>(ends_.size()));
    if (fresh) {
      uint64_t size = 0;
      for (const RankRun& run : runs) size += run.count;
      runs_.insert(runs_.end(), runs.begin(), runs.end());
      ends_.push_back(runs_.size());
      sizes_.push_back(size);
      heaps_.emplace_back();
    }
    return it->second;
  }

  uint64_t Size(uint32_t set) const { return sizes_[set]; }

  // The least-loaded rank of `set`; the caller adds to its load and then
  // calls Chosen.
  uint32_t LeastLoaded(uint32_t set, const std::vector<uint64_t>& loads) {
    const RankRun* begin = runs_.data() + (set ? ends_[set - 1] : 0);
    const RankRun* end = runs_.data() + ends_[set];
    if (sizes_[set] <= kScanHolders) {
      uint32_t best = begin->first;
      for (const RankRun* run = begin; run != end; ++run) {
        for (uint32_t k = 0, h = run->first; k < run->count; ++k, h += run->stride) {
          if (loads[h] < loads[best]) best = h;
        }
      }
      return best;
    }
    Heap& heap = heaps_[set];
    if (heap.empty()) {
      for (const RankRun* run = begin; run != end; ++run) {
        for (uint32_t k = 0, h = run->first; k < run->count; ++k, h += run->stride) {
          heap.push({loads[h], h});
        }
      }
    }
    while (true) {
      const auto [load, rank] = heap.top();
      heap.pop();
      if (load == loads[rank]) return rank;
      heap.push({loads[rank], rank});
    }
  }

  void Chosen(uint32_t set, uint32_t rank, uint64_t load) {
    if (sizes_[set] > kScanHolders) heaps_[set].push({load, rank});
  }

 private:
  using Entry = std::pair<uint64_t, uint32_t>;  // load, rank
  using Heap = std::priority_queue<Entry, std::vector<Entry>, std::greater<Entry>>;
  std::unordered_map<std::string, uint32_t> ids_;
  std::vector<RankRun> runs_;
  std::vector<uint64_t> ends_;  // set i: runs_[ends_[i - 1] (or 0), ends_[i])
  std::vector<uint64_t> sizes_;
  std::vector<Heap> heaps_;  // filled on first use
};

Status ReadKeys(wire::Reader& r, RankSummary& s) {
  SS_ASSIGN_OR_RETURN(uint64_t keys, r.U64());
  for (uint64_t k = 0; k < keys; ++k) {
    KeySummary& key = s.keys.emplace_back();
    SS_ASSIGN_OR_RETURN(key.name, r.Str());
    SS_ASSIGN_OR_RETURN(uint8_t dtype, r.U8());
    if (dtype >= kNumDTypes) return InternalError("a dtype out of range");
    key.dtype = static_cast<DType>(dtype);
    SS_ASSIGN_OR_RETURN(key.chunks, r.U64());
    SS_ASSIGN_OR_RETURN(uint64_t items, r.U64());
    if (items > r.left()) return InternalError("more replicated chunks than bytes");
    key.items.reserve(items);
    for (uint64_t i = 0; i < items; ++i) {
      ItemSummary item;
      SS_ASSIGN_OR_RETURN(item.position, r.U64());
      SS_ASSIGN_OR_RETURN(item.bytes, r.U64());
      SS_ASSIGN_OR_RETURN(item.elements, r.U64());
      SS_ASSIGN_OR_RETURN(item.set, r.U32());
      const bool ordered = key.items.empty() || key.items.back().position < item.position;
      if (item.set >= s.sets.size() || item.position >= key.chunks || !ordered) {
        return InternalError("a replicated chunk out of range");
      }
      key.items.push_back(std::move(item));
    }
  }
  return Status();
}

// Decodes a summary; its sender's own error, if it sent one, in *sent.
Status ReadSummary(std::string_view msg, int world, RankSummary& s, RankHoldings& blobs,
                   HolderSets& sets, Status* sent) {
  wire::Reader r(msg);
  SS_RETURN_IF_ERROR(r.Status(sent));
  if (!sent->ok()) return Status();
  SS_ASSIGN_OR_RETURN(s.own_bytes, r.U64());
  SS_ASSIGN_OR_RETURN(uint64_t n, r.U64());
  for (uint64_t i = 0; i < n; ++i) {
    BlobInfo& b = blobs.blobs.emplace_back();
    SS_ASSIGN_OR_RETURN(b.name, r.Str());
    SS_ASSIGN_OR_RETURN(b.bytes, r.U64());
    SS_ASSIGN_OR_RETURN(uint8_t per_rank, r.U8());
    b.per_rank = per_rank != 0;
  }
  SS_ASSIGN_OR_RETURN(s.unique_bytes, r.U64());
  SS_ASSIGN_OR_RETURN(s.held_bytes, r.U64());
  SS_ASSIGN_OR_RETURN(uint64_t lists, r.U64());
  for (uint64_t i = 0; i < lists; ++i) {
    SS_ASSIGN_OR_RETURN(std::vector<RankRun> runs, GetRankRuns(r, world));
    if (runs.size() == 1 && runs[0].count < 2) {
      return InternalError("a replica held by fewer than two ranks");
    }
    s.sets.push_back(sets.Add(runs));
  }
  SS_RETURN_IF_ERROR(ReadKeys(r, s));
  if (!r.done()) return InternalError("trailing bytes");
  return Status();
}

// One piece (or a whole replicated chunk) to give a writer: its slot in
// Coordinator::writers_ and its holders (a HolderSets id).
struct Piece {
  uint64_t bytes;
  uint64_t slot;
  uint32_t set;
};

class Coordinator {
 public:
  Coordinator(const std::vector<std::string>& summaries, const SavePlanOptions& options)
      : world_(static_cast<int>(summaries.size())), options_(options), ranks_(world_),
        blobs_(world_) {
    for (int r = 0; r < world_ && error_.ok(); ++r) {
      Status sent;
      Status s = ReadSummary(summaries[r], world_, ranks_[r], blobs_[r], sets_, &sent);
      if (!s.ok()) error_ = s.WithContext("distributed save plan: summary of rank " + std::to_string(r));
      else if (!sent.ok()) error_ = sent;
    }
  }

  std::vector<std::string> Run() {
    if (error_.ok()) error_ = Plan();
    std::vector<std::string> out(world_);
    for (int r = 0; r < world_; ++r) out[r] = Decision(r);
    return out;
  }

 private:
  Status Plan() {
    std::vector<KeySummary*> keys;
    uint64_t unique = 0;
    for (RankSummary& s : ranks_) {
      unique += s.unique_bytes;
      held_bytes_ += s.held_bytes;
      for (KeySummary& k : s.keys) keys.push_back(&k);
    }
    std::sort(keys.begin(), keys.end(),
              [](const KeySummary* a, const KeySummary* b) { return a->name < b->name; });
    for (size_t i = 1; i < keys.size(); ++i) {
      if (keys[i]->name == keys[i - 1]->name) {
        return InternalError("distributed save plan: two homes planned \"" + keys[i]->name + "\"");
      }
    }
    split_bytes_ = SplitBytes(unique, world_, options_);
    AssignWriters(keys);
    SS_ASSIGN_OR_RETURN(SavePlan blob_plan, PlanSave(blobs_, options_));
    writes_blob_.resize(world_);
    for (int r = 0; r < world_; ++r) writes_blob_[r].assign(blobs_[r].blobs.size(), 0);
    for (const PlannedBlob& b : blob_plan.blobs) writes_blob_[b.rank][b.writer_blob] = 1;
    unique_bytes_ = unique + blob_plan.unique_bytes;
    for (int r = 0; r < world_; ++r) {
      bytes_per_rank_[r] += blob_plan.bytes_per_rank[r];
      max_rank_bytes_ = std::max(max_rank_bytes_, bytes_per_rank_[r]);
    }
    return Status();
  }

  // Numbers the chunks (keys by name, pieces in place of the chunk they
  // were cut from), then gives each replicated chunk or piece, largest
  // first (ties: the lower number), to its least-loaded holder (ties: the
  // lowest rank), over what each rank alone holds.
  void AssignWriters(const std::vector<KeySummary*>& keys) {
    uint64_t items = 0;
    for (const KeySummary* key : keys) items += key->items.size();
    std::vector<Piece> pieces;
    pieces.reserve(items);  // more where replicas are cut
    writers_.reserve(items);
    uint64_t number = 0;
    for (KeySummary* key : keys) {
      key->first = number;
      number += key->chunks;
      const RankSummary& home = ranks_[HomeOf(key->name, world_)];
      for (ItemSummary& item : key->items) {
        const uint32_t set = home.sets[item.set];
        const PieceCut cut =
            CutInto(item.elements, PieceCount(item.bytes, sets_.Size(set), split_bytes_));
        item.first_writer = writers_.size();
        item.pieces = static_cast<uint32_t>(cut.pieces);
        for (uint64_t lo = 0, k = 0; k < item.pieces; lo += cut.per, ++k) {
          const uint64_t bytes = cut.cut
              ? BytesOf(key->dtype, std::min(item.elements, lo + cut.per) - lo) : item.bytes;
          pieces.push_back({bytes, writers_.size(), set});
          writers_.push_back(0);
        }
        number += item.pieces - 1;  // the chunk itself was counted with the key's
      }
    }
    std::stable_sort(pieces.begin(), pieces.end(),
                     [](const Piece& a, const Piece& b) { return a.bytes > b.bytes; });
    bytes_per_rank_.resize(world_);
    for (int r = 0; r < world_; ++r) bytes_per_rank_[r] = ranks_[r].own_bytes;
    for (const Piece& p : pieces) {
      const uint32_t best = sets_.LeastLoaded(p.set, bytes_per_rank_);
      bytes_per_rank_[best] += p.bytes;
      sets_.Chosen(p.set, best, bytes_per_rank_[best]);
      writers_[p.slot] = static_cast<int>(best);
    }
  }

  std::string Decision(int r) const {
    wire::Writer w;
    w.Status(error_);
    if (!error_.ok()) return w.Take();
    w.U64(unique_bytes_);
    w.U64(held_bytes_);
    w.U64(max_rank_bytes_);
    w.U64(bytes_per_rank_[r]);
    w.U64(writes_blob_[r].size());
    for (uint8_t b : writes_blob_[r]) w.U8(b);
    w.U64(split_bytes_);
    for (const KeySummary& k : ranks_[r].keys) w.U64(k.first);
    for (const KeySummary& k : ranks_[r].keys) {
      for (const ItemSummary& item : k.items) {
        w.U64(item.pieces);
        for (uint32_t p = 0; p < item.pieces; ++p) {
          w.U32(static_cast<uint32_t>(writers_[item.first_writer + p]));
        }
      }
    }
    return w.Take();
  }

  int world_;
  SavePlanOptions options_;
  std::vector<RankSummary> ranks_;
  std::vector<RankHoldings> blobs_;  // each rank's blobs, no shards
  HolderSets sets_;
  Status error_;
  uint64_t split_bytes_ = 0, unique_bytes_ = 0, held_bytes_ = 0, max_rank_bytes_ = 0;
  std::vector<uint64_t> bytes_per_rank_;
  std::vector<int> writers_;  // of every piece, by ItemSummary::first_writer
  std::vector<std::vector<uint8_t>> writes_blob_;
};

}  // namespace

std::vector<std::string> RankPlanner::Coordinate(const std::vector<std::string>& summaries,
                                                 const SavePlanOptions& options) {
  return Coordinator(summaries, options).Run();
}

}  // namespace shardsafe
