// Step-3 reports, in full and compact: rank 0 fills a compact report from
// the layouts a full one left (FileLayouts); a report that does not match
// is an error, after which the next save reports in full. Copies and the
// replica digest travel as they are in both. A version-3 index reuses the
// chunk table made from the kept layouts.
#include "engine/save/save_driver.h"
#include "engine/save/save_messages.h"

#include <gtest/gtest.h>

#include "testing/layout/simulated_layouts.h"

namespace shardsafe {
namespace {

SavePlan SomePlan() {
  auto plan = simulated::SmallPlan();
  EXPECT_TRUE(plan.ok());
  return plan.ok() ? std::move(*plan) : SavePlan();
}

// Every rank's report of writing `plan` (offsets, sizes and checksums made
// up, distinct), with a checksum per replica it holds.
std::vector<RankReport> Reports(const SavePlan& plan, int world) {
  std::vector<RankReport> out(world);
  uint32_t n = 0;
  for (uint32_t f = 0; f < plan.files.size(); ++f) {
    const PlannedFile& pf = plan.files[f];
    WrittenFile w{f, 100000u + f, {}, {}};
    for (size_t i = 0; i < pf.chunks.size(); ++i) w.chunks.push_back({4096 + 64 * i, ++n});
    for (size_t i = 0; i < pf.blobs.size(); ++i) w.blobs.push_back({8192 + 64 * i, ++n});
    out[pf.rank].files.push_back(std::move(w));
  }
  for (const HeldCopy& h : plan.copies) out[h.rank].copies.push_back({h.chunk, ++n});
  for (RankReport& r : out) r.replica_digest = uint64_t{0xfeedbeef} << 24 | ++n;
  return out;
}

bool Same(const std::vector<WrittenEntry>& a, const std::vector<WrittenEntry>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].at != b[i].at || a[i].crc32c != b[i].crc32c) return false;
  }
  return true;
}

TEST(SaveMessagesTest, ACompactReportIsFilledFromTheLayoutsAFullOneLeft) {
  const SavePlan plan = SomePlan();
  const std::vector<RankReport> reports = Reports(plan, 4);
  ASSERT_FALSE(plan.copies.empty());
  FileLayouts layouts;
  std::vector<RankReport> received;
  for (const RankReport& r : reports) {
    ReportForm form{.compact = true};
    auto full = DecodeReport(EncodeReport(r), &form);
    ASSERT_TRUE(full.ok()) << full.status().ToString();
    EXPECT_FALSE(form.compact);
    received.push_back(std::move(*full));
  }
  EXPECT_FALSE(layouts.ready());
  layouts.Keep(plan, received);
  ASSERT_TRUE(layouts.ready());
  for (int rank = 0; rank < 4; ++rank) {
    const RankReport& sent = reports[rank];
    const std::string full = EncodeReport(sent);
    const std::string small = EncodeReport(sent, {.compact = true});
    EXPECT_LT(small.size(), full.size());
    ReportForm form;
    auto got = DecodeReport(small, &form);
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    EXPECT_TRUE(form.compact);
    EXPECT_TRUE(form.chunk_checksums);
    ASSERT_TRUE(layouts.Fill(&got->files).ok());
    EXPECT_EQ(got->replica_digest, sent.replica_digest);
    ASSERT_EQ(got->files.size(), sent.files.size());
    for (size_t f = 0; f < sent.files.size(); ++f) {
      EXPECT_EQ(got->files[f].plan_file, sent.files[f].plan_file);
      EXPECT_EQ(got->files[f].bytes, sent.files[f].bytes);
      EXPECT_TRUE(Same(got->files[f].chunks, sent.files[f].chunks)) << "rank " << rank;
      EXPECT_TRUE(Same(got->files[f].blobs, sent.files[f].blobs)) << "rank " << rank;
    }
    ASSERT_EQ(got->copies.size(), sent.copies.size());
    for (size_t c = 0; c < sent.copies.size(); ++c) {
      EXPECT_EQ(got->copies[c].chunk, sent.copies[c].chunk);
      EXPECT_EQ(got->copies[c].crc32c, sent.copies[c].crc32c);
    }
  }
}

TEST(SaveMessagesTest, ACompactReportThatDoesNotMatchIsAnErrorAndTheLayoutsAreForgotten) {
  const SavePlan plan = SomePlan();
  std::vector<RankReport> reports = Reports(plan, 4);
  FileLayouts layouts;
  layouts.Keep(plan, reports);
  ASSERT_TRUE(layouts.ready());

  RankReport& short_one = reports[1];
  ASSERT_FALSE(short_one.files.empty());
  short_one.files[0].chunks.pop_back();
  ReportForm form;
  auto got = DecodeReport(EncodeReport(short_one, {.compact = true}), &form);
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(layouts.Fill(&got->files).code(), StatusCode::kInternal);

  layouts.Forget();
  EXPECT_FALSE(layouts.ready());
  got = DecodeReport(EncodeReport(reports[2], {.compact = true}), &form);
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(layouts.Fill(&got->files).code(), StatusCode::kInternal);
}

TEST(SaveMessagesTest, AReportWithoutChunkChecksumsGetsThemFromTheSecondRound) {
  const SavePlan plan = SomePlan();
  const std::vector<RankReport> reports = Reports(plan, 4);
  FileLayouts layouts;
  layouts.Keep(plan, reports);
  for (const RankReport& sent : reports) {
    const ReportForm without{.compact = true, .chunk_checksums = false};
    const std::string small = EncodeReport(sent, without);
    EXPECT_LT(small.size(), EncodeReport(sent, {.compact = true}).size());
    ReportForm form;
    auto got = DecodeReport(small, &form);
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    EXPECT_TRUE(form.compact);
    EXPECT_FALSE(form.chunk_checksums);
    ASSERT_TRUE(layouts.Fill(&got->files).ok());
    ASSERT_EQ(got->files.size(), sent.files.size());
    for (size_t f = 0; f < sent.files.size(); ++f) {
      EXPECT_TRUE(Same(got->files[f].blobs, sent.files[f].blobs));
      ASSERT_EQ(got->files[f].chunks.size(), sent.files[f].chunks.size());
      for (const WrittenEntry& e : got->files[f].chunks) EXPECT_EQ(e.crc32c, 0u);
    }
    auto second = DecodeReport(EncodeReport(sent, {.compact = true}), &form);
    ASSERT_TRUE(second.ok());
    ASSERT_TRUE(AddChunkChecksums(second->files, &got->files).ok());
    for (size_t f = 0; f < sent.files.size(); ++f) {
      EXPECT_TRUE(Same(got->files[f].chunks, sent.files[f].chunks));
    }
    EXPECT_TRUE(AddChunkChecksums({}, &got->files).ok()) << "no files: nothing to add";
    std::vector<WrittenFile> other = second->files;
    if (!other.empty()) {
      other[0].plan_file += 1;
      EXPECT_EQ(AddChunkChecksums(other, &got->files).code(), StatusCode::kInternal);
    }
  }
}

// A version-3 index: rank 0 makes the chunk table once from the layouts it
// kept and reuses it while the reports are filled from those layouts; from
// reports it did not keep (full ones, with layouts kept already) it makes a
// table anew, the same bytes.
TEST(SaveMessagesTest, AVersion3IndexReusesTheTableMadeFromTheKeptLayouts) {
  const SavePlan plan = SomePlan();
  std::vector<RankReport> sent = Reports(plan, 4);
  for (RankReport& r : sent) r.copies.clear();
  const auto encode = [&](ReportForm form) {
    std::vector<std::string> msgs;
    for (const RankReport& r : sent) msgs.push_back(EncodeReport(r, form));
    return msgs;
  };
  FileLayouts layouts;
  const SaveDirs dirs{"d", "d", ""};
  const auto make = [&](ReportForm form, bool expect_match) {
    bool match = !expect_match;
    auto reports = ReadReports(encode(form), plan, &layouts, &match);
    EXPECT_TRUE(reports.ok()) << reports.status().ToString();
    EXPECT_EQ(match, expect_match);
    auto made = MakeIndex(plan, FilesByRank(std::move(*reports)), UserJson(), "t", dirs, 4,
                          {true, &layouts, match});
    EXPECT_TRUE(made.ok()) << made.status().ToString();
    return made.ok() ? std::move(*made) : LeaderCommit();
  };
  const LeaderCommit first = make({.compact = false, .chunk_checksums = false}, true);
  ASSERT_NE(first.written.table, nullptr);
  EXPECT_FALSE(first.index.checksum_files.empty());
  EXPECT_EQ(layouts.table(), first.written.table) << "kept with the layouts";
  const LeaderCommit again = make({.compact = true, .chunk_checksums = false}, true);
  EXPECT_EQ(again.written.table, first.written.table) << "reused, not made again";
  EXPECT_EQ(again.index.checksum_files, first.index.checksum_files);
  const LeaderCommit anew = make({.compact = false, .chunk_checksums = false}, false);
  ASSERT_NE(anew.written.table, nullptr);
  EXPECT_NE(anew.written.table, first.written.table);
  EXPECT_EQ(anew.written.table->bytes, first.written.table->bytes);
}

TEST(SaveMessagesTest, TheStartOfASaveRoundTrips) {
  for (bool compact : {false, true}) {
    for (bool table : {false, true}) {
      auto start = DecodeSaveStart(EncodeSaveStart({SaveDirs{"t", "d", ".s"}, compact, table}));
      ASSERT_TRUE(start.ok());
      EXPECT_EQ(start->dirs.tmp, "t");
      EXPECT_EQ(start->dirs.data, "d");
      EXPECT_EQ(start->dirs.file_suffix, ".s");
      EXPECT_EQ(start->compact_reports, compact);
      EXPECT_EQ(start->chunk_table, table);
    }
  }
}

}  // namespace
}  // namespace shardsafe
