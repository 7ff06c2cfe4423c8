#include "engine/plan/plan_home.h"

#include <algorithm>
#include <array>

#include "layout/box_math.h"
#include "layout/tiling.h"

namespace shardsafe {

int HomeOf(std::string_view key, int world) {
  uint64_t h = 0xcbf29ce484222325ULL;  // FNV-1a
  for (unsigned char c : key) h = (h ^ c) * 0x100000001b3ULL;
  return static_cast<int>(h % static_cast<uint64_t>(std::max(world, 1)));
}
namespace {

Status Bad(const std::string& what) {
  return InternalError("bad distributed save plan message: " + what);
}

std::string Quoted(std::string_view key) { return std::string("\"").append(key).append("\""); }

std::string DescribeType(DType dtype, const Shape& shape) {
  return std::string(DTypeName(dtype)) + " " + ShapeToString(shape);
}

}  // namespace

Result<DType> GetDType(wire::Reader& r) {
  SS_ASSIGN_OR_RETURN(uint8_t dtype, r.U8());
  if (dtype >= kNumDTypes) return Bad("a dtype out of range");
  return static_cast<DType>(dtype);
}

Slice PieceSlice(const Slice& chunk, uint64_t lo, uint64_t hi) {
  const uint64_t base = chunk.flat ? chunk.flat->begin : 0;
  return Slice{chunk.box, FlatRange{base + lo, base + hi}};
}

uint64_t BytesOf(DType dtype, uint64_t n) {
  const Result<uint64_t> bytes = NumBytes(dtype, n);
  return bytes.ok() ? *bytes : 0;
}

Status KeyHome::Plan(const std::vector<std::string>& from_ranks) {
  Status s;
  for (int r = 0; r < static_cast<int>(from_ranks.size()) && s.ok(); ++r) {
    if (!from_ranks[r].empty()) s = Receive(r, from_ranks[r]);
  }
  for (auto it = keys_.begin(); it != keys_.end() && s.ok(); ++it) s = PlanKey(it->second);
  failed_ = !s.ok();
  return s;
}

Status KeyHome::Receive(int rank, std::string_view msg) {
  senders_.push_back(rank);
  own_bytes_.push_back(0);
  wire::Reader r(msg);
  SS_ASSIGN_OR_RETURN(uint64_t n, r.U64());
  for (uint64_t k = 0; k < n; ++k) {
    SS_ASSIGN_OR_RETURN(std::string name, r.Str());
    SS_ASSIGN_OR_RETURN(DType dtype, GetDType(r));
    SS_ASSIGN_OR_RETURN(Shape shape, r.Shape());
    if (HomeOf(name, world_) != rank_) return Bad("a key sent to the wrong home");
    auto [it, fresh] = keys_.try_emplace(name);
    Key& key = it->second;
    if (fresh) {
      key.name = name;
      key.dtype = dtype;
      key.shape = shape;
      key.first_rank = rank;
    } else if (key.dtype != dtype || key.shape != shape) {
      return InvalidArgumentError("tensor " + Quoted(name) + ": rank " + std::to_string(rank) +
                                  " has " + DescribeType(dtype, shape) + " but rank " +
                                  std::to_string(key.first_rank) + " has " +
                                  DescribeType(key.dtype, key.shape));
    }
    SS_ASSIGN_OR_RETURN(uint64_t shards, r.U64());
    for (uint64_t i = 0; i < shards; ++i) {
      Held h{{rank, 0}, {}};
      SS_ASSIGN_OR_RETURN(h.holder.shard, r.U32());
      SS_ASSIGN_OR_RETURN(h.slice, r.Slice());
      Status valid = ValidateSlice(h.slice, shape, dtype);
      if (!valid.ok()) {
        return valid.WithContext("tensor " + Quoted(name) + " on rank " + std::to_string(rank));
      }
      key.held.push_back(std::move(h));
    }
  }
  if (!r.done()) return Bad("trailing bytes in a layout for a home");
  return Status();
}

// As PlanSave: equal slices are one chunk held by their ranks (ascending),
// the chunks in slice order must tile the tensor, and empty chunks are
// dropped unless the tensor is empty.
Status KeyHome::PlanKey(Key& key) {
  std::vector<Held>& held = key.held;
  std::sort(held.begin(), held.end(), [](const Held& a, const Held& b) {
    if (SliceLess(a.slice, b.slice)) return true;
    if (SliceLess(b.slice, a.slice)) return false;
    return a.holder.rank < b.holder.rank;
  });
  std::vector<Slice> uniques;
  std::vector<std::pair<uint32_t, uint32_t>> runs;
  for (uint32_t i = 0, j; i < held.size(); i = j) {
    for (j = i + 1; j < held.size() && held[j].slice == held[i].slice; ++j) {
      if (held[j].holder.rank == held[j - 1].holder.rank) {
        return InvalidArgumentError("tensor " + Quoted(key.name) + ": rank " +
                                    std::to_string(held[j].holder.rank) + " holds slice " +
                                    SliceToString(held[j].slice) + " twice");
      }
    }
    uniques.push_back(std::move(held[i].slice));
    runs.emplace_back(i, j);
  }
  SS_RETURN_IF_ERROR(CheckTiling(key.name, key.shape, uniques));
  const Result<uint64_t> elements_of_tensor = NumElements(key.shape);
  const bool empty_tensor = elements_of_tensor.ok() && *elements_of_tensor == 0;
  for (size_t u = 0; u < uniques.size(); ++u) {
    const uint64_t elements = uniques[u].NumElements();
    if (elements == 0 && !empty_tensor) continue;
    Result<uint64_t> bytes = NumBytes(key.dtype, elements);
    if (!bytes.ok()) return bytes.status().WithContext("tensor " + Quoted(key.name));
    const auto begin = static_cast<uint32_t>(key.holders.size());
    for (uint32_t i = runs[u].first; i < runs[u].second; ++i) key.holders.push_back(held[i].holder);
    const auto end = static_cast<uint32_t>(key.holders.size());
    Chunk c{std::move(uniques[u]), *bytes, elements, begin, end, -1};
    const uint64_t holders = end - begin;
    unique_bytes_ += c.bytes;
    held_bytes_ += c.bytes * holders;
    if (holders == 1) {
      OwnBytes(key.holders[begin].rank) += c.bytes;
    } else {
      c.item = static_cast<int>(items_.size());
      items_.push_back(Item{&key, static_cast<uint32_t>(key.chunks.size()), SetOf(key, c), {}});
    }
    key.chunks.push_back(std::move(c));
  }
  std::vector<Held>().swap(held);
  return Status();
}

uint64_t& KeyHome::OwnBytes(int rank) {
  const auto it = std::lower_bound(senders_.begin(), senders_.end(), rank);
  return own_bytes_[it - senders_.begin()];  // every holder sent
}

uint32_t KeyHome::SetOf(const Key& key, const Chunk& c) {
  std::vector<int> ranks;
  for (uint32_t h = c.begin; h < c.end; ++h) ranks.push_back(key.holders[h].rank);
  auto [it, fresh] = set_ids_.try_emplace(std::move(ranks), static_cast<uint32_t>(sets_.size()));
  if (fresh) sets_.push_back(it->first);
  return it->second;
}

std::vector<std::string> KeyHome::OwnBytesMessages() const {
  std::vector<std::string> out(world_);
  for (size_t i = 0; i < senders_.size(); ++i) {
    wire::Writer w;
    w.U64(failed_ ? 0 : own_bytes_[i]);  // a failed home's error goes to rank 0
    out[senders_[i]] = w.Take();
  }
  return out;
}

void KeyHome::PutSummary(wire::Writer& w) const {
  w.U64(unique_bytes_);
  w.U64(held_bytes_);
  w.U64(sets_.size());
  for (const std::vector<int>& set : sets_) PutRanks(w, set);
  w.U64(keys_.size());
  auto item = items_.begin();
  for (const auto& [name, key] : keys_) {
    w.Str(name);
    w.U8(static_cast<uint8_t>(key.dtype));
    w.U64(key.chunks.size());
    const auto end = std::find_if(item, items_.end(), [&](const Item& i) { return i.key != &key; });
    w.U64(end - item);
    for (; item != end; ++item) {
      const Chunk& c = key.chunks[item->chunk];
      w.U64(item->chunk);
      w.U64(c.bytes);
      w.U64(c.elements);
      w.U64(item->set);
    }
  }
}

Status KeyHome::ReadDecision(wire::Reader& r) {
  SS_ASSIGN_OR_RETURN(split_bytes_, r.U64());
  for (auto& [name, key] : keys_) {
    SS_ASSIGN_OR_RETURN(key.first_number, r.U64());
  }
  for (Item& item : items_) {
    SS_ASSIGN_OR_RETURN(uint64_t pieces, r.U64());
    const Chunk& c = item.key->chunks[item.chunk];
    if (pieces != CutInto(c.elements, PieceCount(c.bytes, c.end - c.begin, split_bytes_)).pieces) {
      return Bad("a replicated chunk's piece count");
    }
    const auto first = item.key->holders.begin() + c.begin;
    const auto last = item.key->holders.begin() + c.end;
    for (uint64_t k = 0; k < pieces; ++k) {
      SS_ASSIGN_OR_RETURN(uint32_t writer, r.U32());
      const auto at = std::lower_bound(first, last, writer, [](const Holder& h, uint32_t w) {
        return static_cast<uint32_t>(h.rank) < w;
      });
      if (at == last || static_cast<uint32_t>(at->rank) != writer) {
        return Bad("a writer that does not hold the chunk");
      }
      item.writers.push_back(static_cast<int>(writer));
    }
  }
  if (!r.done()) return Bad("trailing bytes in a decision");
  return Status();
}

namespace {

struct Write {
  uint32_t shard;
  Slice slice;
  uint64_t bytes, offset;
  uint32_t holders, number;
};
struct Copy {
  uint32_t shard, first, count;
  uint64_t bytes, piece_bytes;
};
struct Group {
  std::vector<Write> writes;
  std::vector<Copy> copies;
};

void PutGroup(wire::Writer& w, std::string_view key, DType dtype, const Shape& shape,
              const Group& g) {
  w.U8(1);
  w.Str(key);
  w.U8(static_cast<uint8_t>(dtype));
  w.Shape(shape);
  w.U64(g.writes.size());
  for (const Write& x : g.writes) {
    w.U32(x.shard);
    w.Slice(x.slice);
    w.U64(x.bytes);
    w.U64(x.offset);
    w.U32(x.holders);
    w.U32(x.number);
  }
  w.U64(g.copies.size());
  for (const Copy& x : g.copies) {
    w.U32(x.shard);
    w.U32(x.first);
    w.U32(x.count);
    w.U64(x.bytes);
    w.U64(x.piece_bytes);
  }
}

}  // namespace

// Each chunk's holders learn what PlanSave's AssignWriters and EmitPieces
// would have given them: the writer its chunk (or piece), every other holder
// a copy; every holder of a chunk cut into pieces a copy of all of them.
std::vector<std::string> KeyHome::AssignmentMessages() const {
  std::vector<wire::Writer> writers(world_);
  std::vector<uint8_t> used(world_, 0);
  for (const auto& [name, key] : keys_) {
    std::map<int, Group> groups;
    uint64_t number = key.first_number;
    for (const Chunk& c : key.chunks) {
      const uint32_t holders = c.end - c.begin;
      const auto n32 = static_cast<uint32_t>(number);
      if (c.item < 0) {
        const Holder& h = key.holders[c.begin];
        groups[h.rank].writes.push_back({h.shard, c.slice, c.bytes, 0, 1, n32});
        ++number;
        continue;
      }
      const std::vector<int>& by = items_[c.item].writers;
      const PieceCut cut = CutInto(c.elements, PieceCount(c.bytes, holders, split_bytes_));
      if (!cut.cut) {
        for (uint32_t i = c.begin; i < c.end; ++i) {
          const Holder& h = key.holders[i];
          if (h.rank == by[0]) groups[h.rank].writes.push_back({h.shard, c.slice, c.bytes, 0, holders, n32});
          else groups[h.rank].copies.push_back({h.shard, n32, 1, c.bytes, c.bytes});
        }
        ++number;
        continue;
      }
      const uint64_t per = cut.per;
      const auto held_by = [&](int rank) {
        return std::lower_bound(key.holders.begin() + c.begin, key.holders.begin() + c.end, rank,
                                [](const Holder& h, int r) { return h.rank < r; })
            ->shard;
      };
      for (uint64_t k = 0; k < by.size(); ++k) {
        const uint64_t lo = k * per, hi = std::min(c.elements, lo + per);
        groups[by[k]].writes.push_back({held_by(by[k]), PieceSlice(c.slice, lo, hi),
                                        BytesOf(key.dtype, hi - lo), BytesOf(key.dtype, lo),
                                        holders, static_cast<uint32_t>(number + k)});
      }
      const uint64_t first_piece = BytesOf(key.dtype, std::min(c.elements, per));
      for (uint32_t i = c.begin; i < c.end; ++i) {
        const Holder& h = key.holders[i];
        groups[h.rank].copies.push_back(
            {h.shard, n32, static_cast<uint32_t>(by.size()), c.bytes, first_piece});
      }
      number += by.size();
    }
    for (const auto& [rank, g] : groups) {
      PutGroup(writers[rank], name, key.dtype, key.shape, g);
      used[rank] = 1;
    }
  }
  std::vector<std::string> out(world_);
  for (int r = 0; r < world_; ++r) {
    if (!used[r]) continue;
    writers[r].U8(0);
    out[r] = writers[r].Take();
  }
  return out;
}

std::vector<HomeTensor> KeyHome::IndexTensors() const {
  std::vector<HomeTensor> out;
  out.reserve(keys_.size());
  for (const auto& [name, key] : keys_) {
    HomeTensor& t = out.emplace_back();
    t.key = name;
    t.first_number = key.first_number;
    t.tensor.dtype = key.dtype;
    t.tensor.shape = key.shape;
    for (const Chunk& c : key.chunks) {
      const uint64_t count = c.item < 0 ? 1 : items_[c.item].writers.size();
      const PieceCut cut = CutInto(c.elements, PieceCount(c.bytes, c.end - c.begin, split_bytes_));
      if (c.item < 0 || !cut.cut) {
        t.tensor.chunks.push_back({c.slice, 0, 0, c.bytes, std::nullopt});
        continue;
      }
      for (uint64_t k = 0; k < count; ++k) {
        const uint64_t lo = k * cut.per, hi = std::min(c.elements, lo + cut.per);
        t.tensor.chunks.push_back(
            {PieceSlice(c.slice, lo, hi), 0, 0, BytesOf(key.dtype, hi - lo), std::nullopt});
      }
    }
  }
  return out;
}

Status ReadAssignment(std::string_view msg, int rank, std::vector<ReceivedChunk>* chunks,
                      std::map<std::string, PlannedTensor>* tensors,
                      std::vector<std::pair<HeldCopy, CopyShape>>* copies) {
  wire::Reader r(msg);
  while (true) {
    SS_ASSIGN_OR_RETURN(uint8_t more, r.U8());
    if (!more) break;
    PlannedTensor t;
    SS_ASSIGN_OR_RETURN(t.key, r.Str());
    SS_ASSIGN_OR_RETURN(t.dtype, GetDType(r));
    SS_ASSIGN_OR_RETURN(t.shape, r.Shape());
    SS_ASSIGN_OR_RETURN(uint64_t writes, r.U64());
    for (uint64_t i = 0; i < writes; ++i) {
      ReceivedChunk c;
      c.key = t.key;
      c.chunk.writer = rank;
      SS_ASSIGN_OR_RETURN(c.chunk.writer_shard, r.U32());
      SS_ASSIGN_OR_RETURN(c.chunk.slice, r.Slice());
      SS_ASSIGN_OR_RETURN(c.chunk.bytes, r.U64());
      SS_ASSIGN_OR_RETURN(c.chunk.shard_offset, r.U64());
      SS_ASSIGN_OR_RETURN(c.chunk.holders, r.U32());
      SS_ASSIGN_OR_RETURN(c.number, r.U32());
      chunks->push_back(std::move(c));
    }
    SS_ASSIGN_OR_RETURN(uint64_t n, r.U64());
    for (uint64_t i = 0; i < n; ++i) {
      HeldCopy h{rank, 0, 0, 1};
      CopyShape shape;
      SS_ASSIGN_OR_RETURN(h.shard, r.U32());
      SS_ASSIGN_OR_RETURN(h.chunk, r.U32());
      SS_ASSIGN_OR_RETURN(h.chunks, r.U32());
      SS_ASSIGN_OR_RETURN(shape.bytes, r.U64());
      SS_ASSIGN_OR_RETURN(shape.piece_bytes, r.U64());
      copies->emplace_back(h, shape);
    }
    const std::string key = t.key;
    tensors->try_emplace(key, std::move(t));
  }
  if (!r.done()) return Bad("trailing bytes in an assignment");
  return Status();
}

void PutRanks(wire::Writer& w, const std::vector<int>& ranks) {
  std::vector<std::array<uint64_t, 3>> runs;  // first, stride, count
  for (size_t i = 0; i < ranks.size();) {
    const uint64_t stride = i + 1 < ranks.size() ? ranks[i + 1] - ranks[i] : 1;
    size_t j = i + 1;
    while (j < ranks.size() && static_cast<uint64_t>(ranks[j] - ranks[j - 1]) == stride) ++j;
    runs.push_back({static_cast<uint64_t>(ranks[i]), stride, j - i});
    i = j;
  }
  w.U64(runs.size());
  for (const auto& [first, stride, count] : runs) {
    w.U64(first);
    w.U64(stride);
    w.U64(count);
  }
}

Result<std::vector<RankRun>> GetRankRuns(wire::Reader& r, int world) {
  SS_ASSIGN_OR_RETURN(uint64_t n, r.U64());
  if (n == 0) return Bad("a holder list of no rank");
  std::vector<RankRun> runs;
  for (uint64_t i = 0; i < n; ++i) {
    SS_ASSIGN_OR_RETURN(uint64_t first, r.U64());
    SS_ASSIGN_OR_RETURN(uint64_t stride, r.U64());
    SS_ASSIGN_OR_RETURN(uint64_t count, r.U64());
    const auto w = static_cast<uint64_t>(world);
    if (count == 0 || stride == 0 || first >= w || (count - 1) > (w - 1 - first) / stride ||
        (!runs.empty() && first <= runs.back().last())) {
      return Bad("a holder list out of range or order");
    }
    runs.push_back({static_cast<uint32_t>(first), static_cast<uint32_t>(stride),
                    static_cast<uint32_t>(count)});
  }
  return runs;
}

}  // namespace shardsafe
