// The messages ranks exchange during a save: what each rank holds (step 1
// of the protocol) and what each rank wrote (step 3).
#pragma once

#include <string>
#include <vector>

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

// `state` as its rank announces it: keys, dtypes, shapes, slices and sizes,
// and its values' fingerprints (UserJson); no data.
std::string EncodeHoldings(const std::string& destination, const SaveState& state,
                           const std::vector<std::pair<std::string, uint64_t>>& values);
Result<Announcement> DecodeHoldings(std::string_view msg);

// What a rank reports in step 3: the files it wrote, and the checksums of
// the replicated chunks it holds but did not write (replica_check.h).
struct RankReport {
  std::vector<WrittenFile> files;
  std::vector<CopyChecksum> copies;
};

std::string EncodeReport(const RankReport& report);
Result<RankReport> DecodeReport(std::string_view msg);

}  // namespace shardsafe
