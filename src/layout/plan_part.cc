#include "layout/plan_part.h"

#include <algorithm>
#include <unordered_map>

namespace shardsafe {
namespace {

// Builds a part: whole-plan chunks and tensors taken in, renumbered.
class PartBuilder {
 public:
  PartBuilder(const SavePlan& whole, SavePlan* part) : whole_(whole), part_(*part) {}

  // The local number of a new copy of whole-plan chunk `c`.
  uint32_t AddChunk(uint32_t c) {
    const uint32_t local = static_cast<uint32_t>(part_.chunks.size());
    part_.chunks.push_back(whole_.chunks[c]);
    part_.part->chunks.push_back(c);
    tensors_.push_back(whole_.chunks[c].tensor);
    return local;
  }

  // The local number of whole-plan blob `b`.
  uint32_t AddBlob(uint32_t b) {
    part_.blobs.push_back(whole_.blobs[b]);
    return static_cast<uint32_t>(part_.blobs.size() - 1);
  }

  // Renumbers the chunks' tensors, taking each tensor in once in key order
  // (the whole plan's order); a tensor lists its chunks.
  void TakeTensors() {
    std::vector<uint32_t> used = tensors_;
    std::sort(used.begin(), used.end());
    used.erase(std::unique(used.begin(), used.end()), used.end());
    std::unordered_map<uint32_t, uint32_t> local;
    for (uint32_t t : used) {
      local.emplace(t, static_cast<uint32_t>(part_.tensors.size()));
      const PlannedTensor& whole = whole_.tensors[t];
      part_.tensors.push_back(PlannedTensor{whole.key, whole.dtype, whole.shape, {}});
    }
    for (uint32_t c = 0; c < part_.chunks.size(); ++c) {
      PlannedChunk& chunk = part_.chunks[c];
      chunk.tensor = local.at(chunk.tensor);
      part_.tensors[chunk.tensor].chunks.push_back(c);
    }
  }

 private:
  const SavePlan& whole_;
  SavePlan& part_;
  std::vector<uint32_t> tensors_;  // whole-plan tensor of each part chunk
};

}  // namespace

PlanPartInfo PlanTotals(const SavePlan& whole) {
  PlanPartInfo totals;
  totals.whole_files = whole.files.size();
  for (const PlannedChunk& c : whole.chunks) totals.held_bytes += c.bytes * c.holders;
  totals.max_rank_bytes = MaxRankBytes(whole);
  return totals;
}

SavePlan PartOfPlan(const SavePlan& whole, int rank, const PlanPartInfo& totals) {
  SavePlan part;
  part.part = totals;
  part.part->rank_bytes = whole.bytes_per_rank[rank];
  part.unique_bytes = whole.unique_bytes;
  PartBuilder builder(whole, &part);

  // Files are sorted by rank, copies by (rank, chunk).
  auto file = std::lower_bound(whole.files.begin(), whole.files.end(), rank,
                               [](const PlannedFile& f, int r) { return f.rank < r; });
  for (; file != whole.files.end() && file->rank == rank; ++file) {
    PlannedFile mine{file->rank, file->number, {}, {}, file->payload_bytes};
    for (uint32_t c : file->chunks) mine.chunks.push_back(builder.AddChunk(c));
    for (uint32_t b : file->blobs) mine.blobs.push_back(builder.AddBlob(b));
    part.part->files.push_back(static_cast<uint32_t>(file - whole.files.begin()));
    part.files.push_back(std::move(mine));
  }
  auto copy = std::lower_bound(whole.copies.begin(), whole.copies.end(), rank,
                               [](const HeldCopy& h, int r) { return h.rank < r; });
  for (; copy != whole.copies.end() && copy->rank == rank; ++copy) {
    CopyShape shape{0, whole.chunks[copy->chunk].bytes};
    for (uint32_t c = copy->chunk; c < copy->chunk + copy->chunks; ++c) {
      shape.bytes += whole.chunks[c].bytes;
    }
    part.copies.push_back(*copy);
    part.part->copy_shapes.push_back(shape);
  }
  builder.TakeTensors();
  return part;
}

std::vector<CopyPiece> PiecesOf(const SavePlan& plan, size_t copy) {
  const HeldCopy& h = plan.copies[copy];
  std::vector<CopyPiece> pieces(h.chunks);
  if (!plan.part) {
    for (uint32_t k = 0; k < h.chunks; ++k) pieces[k] = {h.chunk + k, plan.chunks[h.chunk + k].bytes};
    return pieces;
  }
  const CopyShape& shape = plan.part->copy_shapes[copy];
  uint64_t left = shape.bytes;
  for (uint32_t k = 0; k < h.chunks; ++k) {
    pieces[k] = {h.chunk + k, k + 1 < h.chunks ? shape.piece_bytes : left};
    left -= pieces[k].bytes;
  }
  return pieces;
}

uint64_t RankBytes(const SavePlan& plan, int rank) {
  return plan.part ? plan.part->rank_bytes : plan.bytes_per_rank[rank];
}

uint64_t MaxRankBytes(const SavePlan& plan) {
  if (plan.part) return plan.part->max_rank_bytes;
  uint64_t most = 0;
  for (uint64_t b : plan.bytes_per_rank) most = std::max(most, b);
  return most;
}

uint32_t WholeFileNumber(const SavePlan& plan, uint32_t local) {
  return plan.part ? plan.part->files[local] : local;
}

uint32_t WholeChunkNumber(const SavePlan& plan, uint32_t local) {
  return plan.part ? plan.part->chunks[local] : local;
}

}  // namespace shardsafe
