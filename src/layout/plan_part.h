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
// largest.
#pragma once

#include "layout/save_planner.h"

namespace shardsafe {

// The whole plan's totals a part carries (PlanPartInfo without the
// numbers and the rank's bytes); computed once for all parts.
PlanPartInfo PlanTotals(const SavePlan& whole);

// Rank `rank`'s part of `whole` (a whole plan, part unset), with `totals`
// from PlanTotals(whole):
// - files: the rank's, in order, their chunk and blob numbers local;
// - chunks: those of the files, then those of each held copy (consecutive,
//   as HeldCopy needs; a piece the rank both writes and holds a copy of
//   appears twice), each with its tensor number local;
// - tensors: those the chunks belong to, in key order, with the chunks of
//   the part's files (PlannedTensor::chunks);
// - blobs: those of the files; copies: the rank's, chunk numbers local;
// - bytes_per_rank empty, unique_bytes as in the whole plan;
// - part: whole-plan numbers of every file and chunk, the rank's bytes and
//   the totals.
SavePlan PartOfPlan(const SavePlan& whole, int rank, const PlanPartInfo& totals);

// What `rank` writes, and the most any rank writes, by a whole plan or by
// that rank's part.
uint64_t RankBytes(const SavePlan& plan, int rank);
uint64_t MaxRankBytes(const SavePlan& plan);

// A file's or chunk's number in the whole plan: the part's record of it,
// or `local` itself in a whole plan.
uint32_t WholeFileNumber(const SavePlan& plan, uint32_t local);
uint32_t WholeChunkNumber(const SavePlan& plan, uint32_t local);

}  // namespace shardsafe
