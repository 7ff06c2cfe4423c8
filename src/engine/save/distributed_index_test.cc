// The index made by all ranks against the one rank 0 makes from the whole
// plan: on random layouts, thread ranks plan together (PlanOverComm), run
// rounds 7 and 8 (IndexOverComm), and rank 0's index of a save
// (IndexOfSave) must be the text IndexToCommit writes from BuildIndex over
// PlanSave's whole plan, and each home's part of the chunk table the bytes
// of that home's part, byte for byte. A message cut short fails every rank
// with one error.
#include "engine/save/distributed_index.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <thread>

#include "engine/plan/distributed_plan.h"
#include "engine/save/commit.h"
#include "engine/testing/plan_testing.h"
#include "format/index.h"
#include "layout/plan_part.h"

namespace shardsafe {
namespace {

using ::testing::HasSubstr;
using testing::RandomHoldings;
using testing::Rng;
using testing::Uniform;

constexpr char kSuffix[] = ".0123456789abcdef";

// A made-up checksum of the i-th blob entry of whole file f (both sides
// report the same).
uint32_t BlobCrc(uint32_t f, size_t i) { return f * 131 + static_cast<uint32_t>(i) + 7; }

// What the writers of `plan` (a whole plan or a rank's part) report for
// its files: each entry's offset from the file's layout, whole-plan file
// numbers, made-up blob checksums.
std::vector<WrittenFile> Reports(const SavePlan& plan) {
  std::vector<WrittenFile> out;
  for (uint32_t f = 0; f < plan.files.size(); ++f) {
    Result<SafetensorsLayout> layout = LayOutFile(plan, f);
    EXPECT_TRUE(layout.ok());
    const uint32_t whole = WholeFileNumber(plan, f);
    WrittenFile written{whole, layout->file_size, {}, {}};
    const size_t chunks = plan.files[f].chunks.size();
    for (size_t i = 0; i < layout->offsets.size(); ++i) {
      if (i < chunks) {
        written.chunks.push_back({layout->offsets[i], 0});
      } else {
        written.blobs.push_back({layout->offsets[i], BlobCrc(whole, i - chunks)});
      }
    }
    out.push_back(std::move(written));
  }
  return out;
}

struct Centralized {
  std::string text;
  std::map<int, std::string> parts;  // by home rank
};

// Rank 0's index and table as a save makes them today, from the whole plan.
Centralized FromWholePlan(const std::vector<RankHoldings>& holdings, const SavePlanOptions& options,
                          const UserJson& json, int64_t created) {
  const Result<SavePlan> whole = PlanSave(holdings, options);
  EXPECT_TRUE(whole.ok()) << whole.status().ToString();
  std::vector<std::vector<WrittenFile>> written(holdings.size());
  for (WrittenFile& f : Reports(*whole)) written[whole->files[f.plan_file].rank].push_back(f);
  Result<CheckpointIndex> index = BuildIndex(*whole, written, json, "step-7",
                                             static_cast<int>(holdings.size()), kSuffix,
                                             {.checksum_files = true});
  EXPECT_TRUE(index.ok()) << index.status().ToString();
  index->created_unix = created;
  Result<CommitIndex> committed = IndexToCommit(&*index, true, kSuffix);
  EXPECT_TRUE(committed.ok()) << committed.status().ToString();
  Centralized out{committed->text, {}};
  for (size_t p = 0; p < committed->table->parts.size(); ++p) {
    out.parts[committed->table->ranks[p]] = committed->table->bytes[p];
  }
  return out;
}

struct Distributed {
  std::vector<Status> status;
  std::vector<std::string> parts;  // by rank
  Result<IndexSkeleton> skeleton = InternalError("not run");
  std::vector<std::vector<WrittenFile>> written;
};

// Every rank plans and runs rounds 7 and 8 on a thread of its own;
// `corrupt(rank, part)` may change a rank's part of the plan before.
Distributed OverThreads(const std::vector<RankHoldings>& holdings, const SavePlanOptions& options,
                        const std::function<void(int, SavePlan&)>& corrupt = {}) {
  const int n = static_cast<int>(holdings.size());
  auto comms = MakeThreadComms(n);
  Distributed out;
  out.status.resize(n);
  out.parts.resize(n);
  out.written.resize(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      std::unique_ptr<KeyHome> home;
      Result<SavePlan> part = PlanOverComm(*comms[r], holdings[r], options, nullptr, &home);
      if (!part.ok()) {
        out.status[r] = part.status();
        return;
      }
      if (corrupt) corrupt(r, *part);
      out.written[r] = Reports(*part);
      Result<IndexSkeleton> skeleton = IndexOverComm(*comms[r], *part, home.get(), &out.parts[r]);
      out.status[r] = skeleton.status();
      if (r == 0) out.skeleton = std::move(skeleton);
    });
  }
  for (std::thread& t : threads) t.join();
  return out;
}

TEST(DistributedIndexTest, RandomLayoutsGiveTheIndexAndTableRankZeroMakesFromTheWholePlan) {
  Rng rng(4242);
  UserJson json;
  json.values = R"({"step":7})";
  json.layout = R"({"tp":2})";
  for (int iter = 0; iter < 300; ++iter) {
    const std::vector<RankHoldings> holdings = RandomHoldings(rng);
    SavePlanOptions options{Uniform(rng, 1, 300)};
    if (iter % 2) options.min_split_bytes = 1;
    const Centralized expected = FromWholePlan(holdings, options, json, 1795305600);
    Distributed got = OverThreads(holdings, options);
    for (const Status& s : got.status) ASSERT_TRUE(s.ok()) << s.ToString();
    ASSERT_TRUE(got.skeleton.ok());
    Result<CheckpointIndex> index =
        IndexOfSave(*got.skeleton, got.written, json, "step-7", kSuffix);
    ASSERT_TRUE(index.ok()) << index.status().ToString();
    index->created_unix = 1795305600;
    EXPECT_EQ(SerializeIndex(*index), expected.text) << "iteration " << iter;
    for (int r = 0; r < static_cast<int>(holdings.size()); ++r) {
      const auto it = expected.parts.find(r);
      EXPECT_EQ(got.parts[r], it == expected.parts.end() ? "" : it->second)
          << "rank " << r << ", iteration " << iter;
    }
    // What rank 0 keeps is a few numbers per file, key and blob: no chunk.
    for (const auto& [key, t] : got.skeleton->index.tensors) EXPECT_TRUE(t.chunks.empty());
    if (HasFailure()) FAIL() << "iteration " << iter;
  }
}

// A random layout of at least `n` ranks.
std::vector<RankHoldings> RanksAtLeast(Rng& rng, size_t n) {
  std::vector<RankHoldings> holdings;
  while (holdings.size() < n) holdings = RandomHoldings(rng);
  return holdings;
}

TEST(DistributedIndexTest, AChunkNoWriterPlacedFailsEveryRankWithOneError) {
  Rng rng(99);
  const std::vector<RankHoldings> holdings = RanksAtLeast(rng, 3);
  // The last rank that writes a chunk forgets its last one.
  int forgetful = -1;
  {
    Distributed probe = OverThreads(holdings, {});
    for (int r = 0; r < static_cast<int>(holdings.size()); ++r) {
      for (const WrittenFile& f : probe.written[r]) {
        if (!f.chunks.empty()) forgetful = r;
      }
    }
  }
  ASSERT_GE(forgetful, 0);
  Distributed got = OverThreads(holdings, {}, [&](int r, SavePlan& part) {
    if (r != forgetful) return;
    for (auto f = part.files.rbegin(); f != part.files.rend(); ++f) {
      if (f->chunks.empty()) continue;
      f->chunks.pop_back();
      return;
    }
  });
  for (const Status& s : got.status) {
    EXPECT_EQ(s.code(), StatusCode::kInternal) << s.ToString();
    EXPECT_THAT(s.message(), HasSubstr("that no writer placed"));
    EXPECT_EQ(s.ToString(), got.status[0].ToString());
  }
}

TEST(DistributedIndexTest, ASummaryCutShortIsAnInternalErrorNamingTheRank) {
  Rng rng(5);
  const std::vector<RankHoldings> holdings = RanksAtLeast(rng, 2);
  std::vector<std::string> summaries;
  {
    auto comms = MakeThreadComms(static_cast<int>(holdings.size()));
    std::vector<std::thread> threads;
    summaries.resize(holdings.size());
    for (int r = 0; r < static_cast<int>(holdings.size()); ++r) {
      threads.emplace_back([&, r] {
        std::unique_ptr<KeyHome> home;
        Result<SavePlan> part = PlanOverComm(*comms[r], holdings[r], {}, nullptr, &home);
        ASSERT_TRUE(part.ok());
        IndexRounds rounds(r, comms[r]->size(), *part, home.get());
        Result<std::vector<std::string>> in = comms[r]->AllToAll(rounds.ToHomes());
        ASSERT_TRUE(in.ok());
        summaries[r] = rounds.Summary(*in);
      });
    }
    for (std::thread& t : threads) t.join();
  }
  ASSERT_TRUE(IndexRounds::Assemble(summaries).ok());
  for (size_t r = 0; r < summaries.size(); ++r) {
    for (size_t cut = 0; cut < summaries[r].size(); ++cut) {
      std::vector<std::string> damaged = summaries;
      damaged[r].resize(cut);
      const Result<IndexSkeleton> s = IndexRounds::Assemble(damaged);
      ASSERT_FALSE(s.ok()) << "rank " << r << " cut at " << cut;
      EXPECT_THAT(s.status().message(), HasSubstr("rank " + std::to_string(r)));
    }
  }
}

}  // namespace
}  // namespace shardsafe
