// The save planner, in six steps over the gathered holdings:
//   1. index keys: one hash lookup per shard gives a tensor id; dtype and
//      shape must agree with the first rank that named the key;
//   2. find replicas: shards sorted by (tensor, slice hash, slice, rank), so
//      equal slices are adjacent; each run of equal slices is one chunk whose
//      holders are the run's ranks, ascending;
//   3. per tensor (in key order) sort its chunks row-major and check that
//      they tile the tensor; cut large replicated chunks into flat pieces;
//   4. choose writers: single-holder chunks first, then replicated chunks
//      and pieces largest first to the least-loaded holder (LPT; ties:
//      lowest rank); the other holders' copies are listed for the replica
//      check (every holder's, once, for a chunk cut into pieces);
//   5. blobs: per-rank ones to their rank, global ones to their lowest
//      supplier;
//   6. pack each rank's chunks and blobs into files, largest first into the
//      file with the least payload, never past the cap.
// No step depends on hash-table iteration order, so the plan is a function
// of the input alone.
#include "layout/save_planner.h"

#include <algorithm>
#include <map>
#include <numeric>
#include <queue>
#include <string_view>
#include <unordered_map>

#include "layout/box_math.h"
#include "layout/tiling.h"

namespace shardsafe {
namespace {

struct TensorInfo {
  std::string_view key;
  DType dtype;
  const Shape* shape;
  int first_rank;
  std::vector<uint32_t> uniques;  // ids into Planner::uniques_
};

// One shard held by one rank.
struct Held {
  uint32_t tensor;
  int rank;
  uint32_t shard;
  uint64_t hash;
};

// A run [begin, end) of Held entries with equal slices: one chunk.
struct Unique {
  uint32_t begin;
  uint32_t end;
};

uint64_t Mix(uint64_t h, uint64_t v) {
  h ^= v + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
  return h * 0xff51afd7ed558ccdULL;
}

uint64_t HashSlice(const Slice& s) {
  uint64_t h = s.box.rank();
  for (size_t d = 0; d < s.box.rank(); ++d) h = Mix(Mix(h, s.box.offset[d]), s.box.size[d]);
  if (s.flat) h = Mix(Mix(h + 1, s.flat->begin), s.flat->end);
  return h;
}

std::string Quoted(std::string_view key) { return std::string("\"").append(key).append("\""); }

std::string DescribeType(DType dtype, const Shape& shape) {
  return std::string(DTypeName(dtype)) + " " + ShapeToString(shape);
}

class Planner {
 public:
  Planner(std::span<const RankHoldings> holdings, const SavePlanOptions& options)
      : holdings_(holdings), options_(options) {}

  Result<SavePlan> Run() {
    SS_RETURN_IF_ERROR(IndexShards());
    SS_RETURN_IF_ERROR(FindReplicas());
    SS_RETURN_IF_ERROR(EmitTensors());
    plan_.bytes_per_rank.assign(holdings_.size(), 0);
    AssignWriters();
    SS_RETURN_IF_ERROR(PlanBlobs());
    PackFiles();
    return std::move(plan_);
  }

 private:
  const ShardInfo& ShardOf(const Held& h) const { return holdings_[h.rank].shards[h.shard]; }

  // Step 1.
  Status IndexShards() {
    std::unordered_map<std::string_view, uint32_t> ids;
    size_t total = 0;
    for (const RankHoldings& h : holdings_) total += h.shards.size();
    held_.reserve(total);
    for (int rank = 0; rank < static_cast<int>(holdings_.size()); ++rank) {
      const auto& shards = holdings_[rank].shards;
      for (uint32_t i = 0; i < shards.size(); ++i) {
        SS_ASSIGN_OR_RETURN(const uint32_t tensor, TensorId(shards[i], rank, &ids));
        held_.push_back(Held{tensor, rank, i, HashSlice(shards[i].slice)});
      }
    }
    return Status();
  }

  Result<uint32_t> TensorId(const ShardInfo& shard, int rank,
                            std::unordered_map<std::string_view, uint32_t>* ids) {
    auto [it, inserted] = ids->try_emplace(shard.key, static_cast<uint32_t>(tensors_.size()));
    if (inserted) tensors_.push_back({shard.key, shard.dtype, &shard.shape, rank, {}});
    const TensorInfo& t = tensors_[it->second];
    if (t.dtype != shard.dtype || *t.shape != shard.shape) {
      return InvalidArgumentError("tensor " + Quoted(shard.key) + ": rank " +
                                  std::to_string(rank) + " has " +
                                  DescribeType(shard.dtype, shard.shape) + " but rank " +
                                  std::to_string(t.first_rank) + " has " +
                                  DescribeType(t.dtype, *t.shape));
    }
    Status s = ValidateSlice(shard.slice, shard.shape, shard.dtype);
    if (!s.ok()) {
      return s.WithContext("tensor " + Quoted(shard.key) + " on rank " + std::to_string(rank));
    }
    return it->second;
  }

  // Step 2. Sorting compares hashes only; equal slices then sit in runs of
  // equal hash, ranks ascending. A run whose slices differ (a collision) is
  // re-sorted by slice.
  Status FindReplicas() {
    std::sort(held_.begin(), held_.end(), [](const Held& a, const Held& b) {
      return std::tie(a.tensor, a.hash, a.rank) < std::tie(b.tensor, b.hash, b.rank);
    });
    for (uint32_t i = 0, j; i < held_.size(); i = j) {
      for (j = i + 1; j < held_.size() && held_[j].tensor == held_[i].tensor &&
                      held_[j].hash == held_[i].hash;) {
        ++j;
      }
      SS_RETURN_IF_ERROR(SplitEqualSlices(i, j));
    }
    return Status();
  }

  // Turns held_[begin, end) (one tensor, one hash) into unique chunks.
  Status SplitEqualSlices(uint32_t begin, uint32_t end) {
    const auto same = [this](const Held& a, const Held& b) {
      return ShardOf(a).slice == ShardOf(b).slice;
    };
    if (!std::all_of(held_.begin() + begin, held_.begin() + end,
                     [&](const Held& h) { return same(h, held_[begin]); })) {
      std::stable_sort(held_.begin() + begin, held_.begin() + end,
                       [this](const Held& a, const Held& b) {
                         return SliceLess(ShardOf(a).slice, ShardOf(b).slice);
                       });
    }
    for (uint32_t i = begin, j; i < end; i = j) {
      for (j = i + 1; j < end && same(held_[j], held_[i]);) {
        if (held_[j].rank == held_[j - 1].rank) return HeldTwice(held_[j]);
        ++j;
      }
      tensors_[held_[i].tensor].uniques.push_back(static_cast<uint32_t>(uniques_.size()));
      uniques_.push_back(Unique{i, j});
    }
    return Status();
  }

  Status HeldTwice(const Held& h) const {
    return InvalidArgumentError("tensor " + Quoted(ShardOf(h).key) + ": rank " +
                                std::to_string(h.rank) + " holds slice " +
                                SliceToString(ShardOf(h).slice) + " twice");
  }

  // Step 3.
  Status EmitTensors() {
    split_bytes_ = SplitBytes(UniqueBytes(), holdings_.size(), options_);
    std::vector<uint32_t> order(tensors_.size());
    std::iota(order.begin(), order.end(), 0);
    std::sort(order.begin(), order.end(),
              [this](uint32_t a, uint32_t b) { return tensors_[a].key < tensors_[b].key; });
    plan_.chunks.reserve(uniques_.size());
    chunk_unique_.reserve(uniques_.size());
    for (uint32_t t : order) SS_RETURN_IF_ERROR(EmitTensor(tensors_[t]));
    return Status();
  }

  const Slice& UniqueSlice(uint32_t u) const { return ShardOf(held_[uniques_[u].begin]).slice; }

  uint64_t UniqueBytes() const {
    uint64_t total = 0;
    for (uint32_t u = 0; u < uniques_.size(); ++u) {
      const DType dtype = tensors_[held_[uniques_[u].begin].tensor].dtype;
      const Result<uint64_t> bytes = NumBytes(dtype, UniqueSlice(u).NumElements());
      if (bytes.ok()) total += *bytes;  // an overflow fails when the chunk is emitted
    }
    return total;
  }

  Status EmitTensor(TensorInfo& t) {
    std::vector<uint32_t>& u = t.uniques;
    std::sort(u.begin(), u.end(),
              [this](uint32_t a, uint32_t b) { return SliceLess(UniqueSlice(a), UniqueSlice(b)); });
    std::vector<Slice> slices;
    slices.reserve(u.size());
    for (uint32_t id : u) slices.push_back(UniqueSlice(id));
    SS_RETURN_IF_ERROR(CheckTiling(t.key, *t.shape, slices));
    const bool empty_tensor = *NumElements(*t.shape) == 0;
    PlannedTensor& out = plan_.tensors.emplace_back();
    out.key = std::string(t.key);
    out.dtype = t.dtype;
    out.shape = *t.shape;
    for (size_t i = 0; i < u.size(); ++i) {
      // Empty chunks are kept only so that an empty tensor still appears.
      if (slices[i].NumElements() == 0 && !empty_tensor) continue;
      SS_RETURN_IF_ERROR(EmitChunk(t, u[i], std::move(slices[i])));
    }
    return Status();
  }

  Status EmitChunk(const TensorInfo& t, uint32_t id, Slice slice) {
    const uint32_t holders = uniques_[id].end - uniques_[id].begin;
    auto bytes = NumBytes(t.dtype, slice.NumElements());
    if (!bytes.ok()) return bytes.status().WithContext("tensor " + Quoted(t.key));
    if (PieceCount(*bytes, holders, split_bytes_) > 1) return EmitPieces(t, id, slice, *bytes);
    AddChunk(id, std::move(slice), *bytes, 0);
    return Status();
  }

  // Cuts replicated chunk `id` into up to one flat piece per holder, of
  // about split_bytes_ each.
  Status EmitPieces(const TensorInfo& t, uint32_t id, const Slice& slice, uint64_t bytes) {
    const uint32_t holders = uniques_[id].end - uniques_[id].begin;
    const uint64_t n = slice.NumElements();
    const uint64_t per = PieceElements(n, PieceCount(bytes, holders, split_bytes_));
    const uint64_t base = slice.flat ? slice.flat->begin : 0;
    const auto first = static_cast<uint32_t>(plan_.chunks.size());
    for (uint64_t lo = 0; lo < n; lo += per) {
      const uint64_t hi = std::min(n, lo + per);
      SS_ASSIGN_OR_RETURN(uint64_t offset, NumBytes(t.dtype, lo));
      SS_ASSIGN_OR_RETURN(uint64_t piece_bytes, NumBytes(t.dtype, hi - lo));
      AddChunk(id, Slice{slice.box, FlatRange{base + lo, base + hi}}, piece_bytes, offset);
    }
    splits_.push_back({first, static_cast<uint32_t>(plan_.chunks.size() - first), id});
    return Status();
  }

  void AddChunk(uint32_t id, Slice slice, uint64_t bytes, uint64_t shard_offset) {
    plan_.tensors.back().chunks.push_back(static_cast<uint32_t>(plan_.chunks.size()));
    PlannedChunk c;
    c.tensor = static_cast<uint32_t>(plan_.tensors.size() - 1);
    c.slice = std::move(slice);
    c.bytes = bytes;
    c.shard_offset = shard_offset;
    c.holders = uniques_[id].end - uniques_[id].begin;
    plan_.chunks.push_back(std::move(c));
    chunk_unique_.push_back(id);
  }

  // Step 4.
  void AssignWriters() {
    std::vector<bool> piece(plan_.chunks.size(), false);
    for (const Split& split : splits_) {
      std::fill_n(piece.begin() + split.first, split.count, true);
      const Unique& u = uniques_[split.unique];
      for (uint32_t h = u.begin; h < u.end; ++h) {
        plan_.copies.push_back(HeldCopy{held_[h].rank, held_[h].shard, split.first, split.count});
      }
    }
    std::vector<uint32_t> replicated;
    for (uint32_t c = 0; c < plan_.chunks.size(); ++c) {
      if (plan_.chunks[c].holders == 1) SetWriter(c, held_[uniques_[chunk_unique_[c]].begin]);
      else replicated.push_back(c);
    }
    std::stable_sort(replicated.begin(), replicated.end(), [this](uint32_t a, uint32_t b) {
      return plan_.chunks[a].bytes > plan_.chunks[b].bytes;
    });
    for (uint32_t c : replicated) {
      const Unique& u = uniques_[chunk_unique_[c]];
      uint32_t best = u.begin;  // holders are in ascending rank order
      for (uint32_t h = u.begin + 1; h < u.end; ++h) {
        if (plan_.bytes_per_rank[held_[h].rank] < plan_.bytes_per_rank[held_[best].rank]) best = h;
      }
      SetWriter(c, held_[best]);
      if (piece[c]) continue;  // its holders' copies are listed per split
      for (uint32_t h = u.begin; h < u.end; ++h) {
        if (h != best) plan_.copies.push_back(HeldCopy{held_[h].rank, held_[h].shard, c});
      }
    }
    std::sort(plan_.copies.begin(), plan_.copies.end(), [](const HeldCopy& a, const HeldCopy& b) {
      return std::tie(a.rank, a.chunk) < std::tie(b.rank, b.chunk);
    });
  }

  void SetWriter(uint32_t c, const Held& h) {
    plan_.chunks[c].writer = h.rank;
    plan_.chunks[c].writer_shard = h.shard;
    plan_.bytes_per_rank[h.rank] += plan_.chunks[c].bytes;
    plan_.unique_bytes += plan_.chunks[c].bytes;
  }

  // Step 5. Ranks are visited in ascending order, so the first supplier of a
  // name is its lowest rank and a repeat on one rank follows directly.
  struct BlobSeen {
    int first_rank;
    int last_rank;
    bool per_rank;
  };

  Status PlanBlobs() {
    std::map<std::string_view, BlobSeen> seen;
    for (int rank = 0; rank < static_cast<int>(holdings_.size()); ++rank) {
      const auto& blobs = holdings_[rank].blobs;
      for (uint32_t i = 0; i < blobs.size(); ++i) {
        SS_RETURN_IF_ERROR(AddBlob(blobs[i], rank, i, &seen));
      }
    }
    std::sort(plan_.blobs.begin(), plan_.blobs.end(),
              [](const PlannedBlob& a, const PlannedBlob& b) {
                return std::tie(a.name, a.rank) < std::tie(b.name, b.rank);
              });
    for (const PlannedBlob& b : plan_.blobs) {
      plan_.bytes_per_rank[b.rank] += b.bytes;
      plan_.unique_bytes += b.bytes;
    }
    return Status();
  }

  Status AddBlob(const BlobInfo& blob, int rank, uint32_t index,
                 std::map<std::string_view, BlobSeen>* seen) {
    auto [it, first] = seen->try_emplace(blob.name, BlobSeen{rank, rank, blob.per_rank});
    const auto [first_rank, last_rank, per_rank] = it->second;
    it->second.last_rank = rank;
    const std::string where = "blob " + Quoted(blob.name) + ": ";
    if (per_rank != blob.per_rank) {
      return InvalidArgumentError(where + "per-rank on rank " +
                                  std::to_string(per_rank ? first_rank : rank) +
                                  " but global on rank " +
                                  std::to_string(per_rank ? rank : first_rank));
    }
    if (!first && last_rank == rank) {
      return InvalidArgumentError(where + "supplied twice by rank " + std::to_string(rank));
    }
    if (blob.per_rank || first) {
      plan_.blobs.push_back(PlannedBlob{blob.name, blob.per_rank, rank, index, blob.bytes});
      return Status();
    }
    const uint64_t expected = holdings_[first_rank].blobs[FindBlob(first_rank, blob.name)].bytes;
    if (expected == blob.bytes) return Status();
    return InvalidArgumentError(where + std::to_string(blob.bytes) + " bytes on rank " +
                                std::to_string(rank) + " but " + std::to_string(expected) +
                                " on rank " + std::to_string(first_rank));
  }

  uint32_t FindBlob(int rank, std::string_view name) const {
    const auto& blobs = holdings_[rank].blobs;
    for (uint32_t i = 0; i < blobs.size(); ++i) {
      if (blobs[i].name == name) return i;
    }
    return 0;  // unreachable: `name` was seen on `rank`
  }

  // Step 6.
  struct Item {
    uint64_t bytes;
    bool blob;
    uint32_t index;
  };

  void PackFiles() {
    std::vector<std::vector<Item>> items(holdings_.size());
    for (uint32_t c = 0; c < plan_.chunks.size(); ++c) {
      items[plan_.chunks[c].writer].push_back({plan_.chunks[c].bytes, false, c});
    }
    for (uint32_t b = 0; b < plan_.blobs.size(); ++b) {
      items[plan_.blobs[b].rank].push_back({plan_.blobs[b].bytes, true, b});
    }
    for (int rank = 0; rank < static_cast<int>(items.size()); ++rank) {
      if (!items[rank].empty()) PackRank(rank, items[rank]);
    }
  }

  void PackRank(int rank, const std::vector<Item>& items) {
    std::vector<uint64_t> bytes;
    for (const Item& it : items) bytes.push_back(it.bytes);
    const auto files = PackIntoFiles(bytes, options_.max_file_bytes);
    for (uint32_t number = 0; number < files.size(); ++number) {
      PlannedFile& file = plan_.files.emplace_back(PlannedFile{rank, number, {}, {}, 0});
      for (uint32_t i : files[number]) AddToFile(file, items[i]);
      std::sort(file.chunks.begin(), file.chunks.end());
      std::sort(file.blobs.begin(), file.blobs.end());
    }
  }

  static void AddToFile(PlannedFile& file, const Item& it) {
    (it.blob ? file.blobs : file.chunks).push_back(it.index);
    file.payload_bytes += it.bytes;
  }

  std::span<const RankHoldings> holdings_;
  SavePlanOptions options_;
  std::vector<TensorInfo> tensors_;  // in order of first appearance
  std::vector<Held> held_;
  std::vector<Unique> uniques_;
  std::vector<uint32_t> chunk_unique_;  // plan chunk -> unique id
  // A replicated chunk cut into pieces: plan chunks [first, first + count).
  struct Split {
    uint32_t first;
    uint32_t count;
    uint32_t unique;
  };
  std::vector<Split> splits_;
  uint64_t split_bytes_ = 0;
  SavePlan plan_;
};

}  // namespace

Result<SavePlan> PlanSave(std::span<const RankHoldings> holdings, const SavePlanOptions& options) {
  return Planner(holdings, options).Run();
}

// A sixteenth of the ideal share lets LPT balance writers within 1.1x of
// the ideal (an eighth, or a 4 MiB floor, left 1.11x at 65,536 ranks of
// TP x PP x DP, where a rank's share of the replicated weights is 2.4 MB).
uint64_t SplitBytes(uint64_t unique_bytes, size_t ranks, const SavePlanOptions& options) {
  return std::max<uint64_t>(unique_bytes / std::max<size_t>(ranks, 1) / 16,
                            std::max<uint64_t>(options.min_split_bytes, 1));
}

uint64_t PieceCount(uint64_t bytes, uint64_t holders, uint64_t split_bytes) {
  if (holders < 2 || bytes <= split_bytes) return 1;
  return std::min<uint64_t>(holders, (bytes + split_bytes - 1) / split_bytes);
}

uint64_t PieceElements(uint64_t elements, uint64_t count) {
  return ((elements + count - 1) / count + 7) / 8 * 8;
}

PieceCut CutInto(uint64_t elements, uint64_t count) {
  if (count <= 1) return {false, elements, 1};
  const uint64_t per = PieceElements(elements, count);
  return {true, per, (elements + per - 1) / per};
}

std::vector<std::vector<uint32_t>> PackIntoFiles(std::span<const uint64_t> item_bytes,
                                                 uint64_t max_file_bytes) {
  std::vector<uint32_t> order(item_bytes.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](uint32_t a, uint32_t b) { return item_bytes[a] > item_bytes[b]; });
  const uint64_t cap = std::max<uint64_t>(max_file_bytes, 1);
  uint64_t small = 0, small_count = 0;
  for (uint64_t b : item_bytes) {
    if (b <= cap) small += b, ++small_count;
  }
  std::vector<std::vector<uint32_t>> files(small_count ? std::max<uint64_t>(1, (small + cap - 1) / cap)
                                                      : 0);
  using Slot = std::pair<uint64_t, uint32_t>;  // payload, file number
  std::priority_queue<Slot, std::vector<Slot>, std::greater<Slot>> heap;
  for (uint32_t f = 0; f < files.size(); ++f) heap.push({0, f});
  for (uint32_t i : order) {
    const uint64_t bytes = item_bytes[i];
    uint32_t number;
    if (bytes > cap || heap.empty() || heap.top().first + bytes > cap) {
      number = static_cast<uint32_t>(files.size());
      files.emplace_back();
      if (bytes <= cap) heap.push({bytes, number});
    } else {
      auto [payload, f] = heap.top();
      heap.pop();
      heap.push({payload + bytes, f});
      number = f;
    }
    files[number].push_back(i);
  }
  return files;
}

}  // namespace shardsafe
