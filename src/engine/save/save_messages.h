// The messages ranks exchange during a save: what each rank holds (step 1
// of the protocol) and what each rank wrote (step 3).
#pragma once

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "engine/save/commit.h"
#include "engine/save/replica_check.h"
#include "engine/save/save_writer.h"
#include "format/chunk_table.h"
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
// A layout as EncodeLayout gave it, appended to *h.
Status DecodeLayout(std::string_view msg, RankHoldings* h);
// The layout part of an encoded announcement.
Result<std::string_view> LayoutOf(std::string_view msg);
// Every rank saves to the same place, and every global value a rank passes
// is rank 0's (values are saved once, from rank 0: a value that differs, or
// that rank 0 lacks, would be lost). InvalidArgument naming the rank.
Status CheckAgreement(const std::vector<Announcement>& announced);

// What a rank reports in step 3: the files it wrote and its replica digest
// (replica_check.h); the checksums of the replicated chunks it holds but
// did not write only when asked for them (an async save's report always
// has them).
struct RankReport {
  std::vector<WrittenFile> files;
  std::vector<CopyChecksum> copies;
  uint64_t replica_digest = 0;
};

// Whether the reports' replica digests add up to 0: no copy differs from
// what was written, but with probability 2^-64 (replica_check.h).
bool DigestsAddUp(const std::vector<RankReport>& reports);

// The files of each report, by rank.
std::vector<std::vector<WrittenFile>> FilesByRank(std::vector<RankReport> reports);

// How a report is encoded. In full it carries each file's size and the
// offsets of its entries; a compact one only the entries' checksums. Rank
// 0 takes the rest from the layouts it kept from an earlier save of the
// same plan (FileLayouts::Fill). So a repeated save sends 4 bytes per entry
// instead of 4 and the offset's varint (up to 5 bytes in a 2 GiB file).
// Without chunk checksums (a version-3 save: they are in the rank's
// checksum file) a compact report is a count per file and its blobs'
// checksums. Copies, when sent, take a chunk number (a varint) and a
// checksum each.
struct ReportForm {
  bool compact = false;
  bool chunk_checksums = true;
};
std::string EncodeReport(const RankReport& report, ReportForm form = {});

// Sets the chunks' checksums of `into` from `from`: the same files in the
// same order, whose chunks have their checksums (the second round of a
// version-3 save); nothing when `from` is empty. InternalError when they
// are other files.
Status AddChunkChecksums(const std::vector<WrittenFile>& from, std::vector<WrittenFile>* into);

// Renumbers the files of a report made with a rank's part of a plan
// (layout/plan_part.h) into the whole plan's numbers, which rank 0 reads
// it with (its copies name whole-plan chunks already); a no-op for a whole
// plan.
void NumberAsWhole(const SavePlan& plan, RankReport* report);
// A compact report's files have their sizes and offsets 0, one without
// chunk checksums its chunks' checksums 0 (*form says which).
Result<RankReport> DecodeReport(std::string_view msg, ReportForm* form);

// Rank 0's record of each file's size and entry offsets under one plan
// (by whole plan file), kept from the full reports of a save so that the
// next saves of the plan report compactly; and the chunk table of a
// version-3 index made with them, which follows from the plan and the
// layouts alone, so that the next saves reuse it. Set once; thread-safe.
class FileLayouts {
 public:
  bool ready() const;
  // Keeps the layouts of the files `reports` name (every rank's full
  // report, every file of `plan`) unless kept already. True when kept now.
  bool Keep(const SavePlan& plan, const std::vector<RankReport>& reports);
  // Sets the sizes and offsets of compactly reported files. InternalError
  // when none were kept or a file's entries do not match.
  Status Fill(std::vector<WrittenFile>* files) const;
  // Drops what was kept: the next save reports in full (after a compact
  // report that did not match, so that one failure does not repeat).
  void Forget();
  // The chunk table of a version-3 index of the kept layouts, once kept
  // (null before); KeepTable keeps one while layouts are kept.
  std::shared_ptr<const EncodedChunkTable> table() const;
  void KeepTable(std::shared_ptr<const EncodedChunkTable> table);

 private:
  struct Layout {
    uint64_t bytes = 0;
    std::vector<uint64_t> chunks, blobs;  // offsets
  };
  mutable std::mutex mu_;
  std::vector<Layout> files_;  // by whole plan file; empty until kept
  std::shared_ptr<const EncodedChunkTable> table_;
};

// How step 1 starts a save (rank 0 to every rank): where it writes,
// whether reports may be compact (rank 0 kept the plan's file layouts),
// and whether the save writes a chunk table (a version-3 index: then each
// rank that writes chunks writes its checksum file, and reports no chunk
// checksum).
struct SaveStart {
  SaveDirs dirs;
  bool compact_reports = false;
  bool chunk_table = false;
};
std::string EncodeSaveStart(const SaveStart& start);
Result<SaveStart> DecodeSaveStart(std::string_view msg);

}  // namespace shardsafe
