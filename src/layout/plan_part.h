// One rank's part of a save plan: what the rank needs to write its files
// and checksum its replicas, without the rest of the job.
//
// A whole plan (save_planner.h) describes every rank's chunks: at 16,384
// ranks millions of them. Only the rank that commits needs all of them (to
// check replicas and build the index); every other rank needs its own
// files, the chunks and blobs in them, the chunks its held copies cover
// (HeldCopy), and those chunks' tensors. PartOfPlan cuts that out, in local
// numbers, with the whole plan's numbers alongside (PlanPartInfo) so that
// the rank's reports name files and chunks as the committing rank knows
// them. A part is proportional to the rank's own files and copies, whatever
// the job's size: of the per-rank totals it keeps the rank's own and the
// largest. A copy takes a few numbers however many pieces its chunk was
// cut into (the pieces are equal but the last: CopyShape), so that a part
// does not grow with the holders a replica is spread over.
#pragma once

#include "layout/save_planner.h"

namespace shardsafe {

// The whole plan's totals a part carries (PlanPartInfo without the
// numbers and the rank's bytes); computed once for all parts.
PlanPartInfo PlanTotals(const SavePlan& whole);

// Rank `rank`'s part of `whole` (a whole plan, part unset), with `totals`
// from PlanTotals(whole):
// - files: the rank's, in order, their chunk and blob numbers local;
// - chunks: those of the files, each with its tensor number local;
// - tensors: those the chunks belong to, in key order, with their chunks
//   (PlannedTensor::chunks);
// - blobs: those of the files; copies: the rank's, with the whole plan's
//   chunk numbers (the part holds none of their chunks), and their
//   CopyShapes;
// - bytes_per_rank empty, unique_bytes as in the whole plan;
// - part: whole-plan numbers of every file and chunk, the rank's bytes and
//   the totals.
SavePlan PartOfPlan(const SavePlan& whole, int rank, const PlanPartInfo& totals);

// One piece of a copy: the whole plan's chunk number and its bytes.
struct CopyPiece {
  uint32_t chunk = 0;
  uint64_t bytes = 0;
};
// The pieces of copy `copy` (an index into plan.copies) of a whole plan or
// a part, in order.
std::vector<CopyPiece> PiecesOf(const SavePlan& plan, size_t copy);

// What `rank` writes, and the most any rank writes, by a whole plan or by
// that rank's part.
uint64_t RankBytes(const SavePlan& plan, int rank);
uint64_t MaxRankBytes(const SavePlan& plan);

// A file's or chunk's number in the whole plan: the part's record of it,
// or `local` itself in a whole plan.
uint32_t WholeFileNumber(const SavePlan& plan, uint32_t local);
uint32_t WholeChunkNumber(const SavePlan& plan, uint32_t local);

}  // namespace shardsafe
