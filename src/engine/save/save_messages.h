// The messages ranks exchange during a save: what each rank holds (step 1
// of the protocol) and what each rank wrote (step 3).
#pragma once

#include <string>
#include <vector>

#include "engine/save/commit.h"
#include "engine/save/replica_check.h"
#include "engine/save/save_writer.h"
#include "layout/save_planner.h"

namespace shardsafe {

// What a rank announces in step 1.
struct Announcement {
  std::string destination;  // the checkpoint path the rank saves to
  RankHoldings holdings;    // shard i is state.tensors[i], blob j state.blobs[j]
  // A fingerprint of each global JSON value the rank passes (its key, and
  // the CRC-32C and length of its serialization), to find values that
  // differ between ranks without sending them.
  std::vector<std::pair<std::string, uint64_t>> values;
};

// The two parts of an announcement. The layout: `state`'s keys, dtypes,
// shapes, slices and blob sizes (what planning depends on; no data). The
// agreement: the destination and the values' fingerprints (UserJson),
// which ranks must agree on.
std::string EncodeLayout(const SaveState& state);
std::string EncodeAgreement(const std::string& destination,
                            const std::vector<std::pair<std::string, uint64_t>>& values);
// An announcement from its two parts, and back.
std::string EncodeHoldings(std::string_view layout, std::string_view agreement);
Result<Announcement> DecodeHoldings(std::string_view msg);
// The layout part of an encoded announcement.
Result<std::string_view> LayoutOf(std::string_view msg);

// What a rank reports in step 3: the files it wrote, and the checksums of
// the replicated chunks it holds but did not write (replica_check.h).
struct RankReport {
  std::vector<WrittenFile> files;
  std::vector<CopyChecksum> copies;
};

std::string EncodeReport(const RankReport& report);

// Renumbers a report made with a rank's part of a plan (layout/plan_part.h)
// into the whole plan's numbers, which rank 0 reads it with; a no-op for a
// whole plan.
void NumberAsWhole(const SavePlan& plan, RankReport* report);
Result<RankReport> DecodeReport(std::string_view msg);

// Where a save writes (step 1, rank 0 to every rank).
std::string EncodeSaveDirs(const SaveDirs& dirs);
Result<SaveDirs> DecodeSaveDirs(std::string_view msg);

}  // namespace shardsafe
