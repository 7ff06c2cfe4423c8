// How many collectives a save and a load make (each is a job-wide wait, so
// one that another already covers is a cost), and how a rank's failure
// before the call reaches every rank through the first of them.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <filesystem>

#include "shardsafe/checkpoint.h"
#include "shardsafe/source.h"
#include "testing/test_util.h"

namespace shardsafe {
namespace {

using ::testing::HasSubstr;

// Counts the collectives that pass through it, and the bytes this rank
// sends and receives in them (what a collective hands each rank, not what
// a network algorithm moves).
class CountingComm : public Comm {
 public:
  explicit CountingComm(Comm& inner) : inner_(inner) {}
  int rank() const override { return inner_.rank(); }
  int size() const override { return inner_.size(); }
  Result<std::vector<std::string>> AllGather(std::string_view mine) override {
    ++count;
    return Received(mine.size(), inner_.AllGather(mine));
  }
  Result<std::vector<std::string>> Gather(std::string_view mine, int root) override {
    ++count;
    gathered.push_back(mine.size());
    return Received(mine.size(), inner_.Gather(mine, root));
  }
  Result<std::string> Scatter(const std::vector<std::string>& parts, int root) override {
    ++count;
    auto out = inner_.Scatter(parts, root);
    for (size_t r = 0; rank() == root && r < parts.size(); ++r) {
      if (static_cast<int>(r) != root) bytes += parts[r].size();
    }
    if (out.ok() && rank() != root) bytes += out->size();
    return out;
  }
  Result<std::string> Broadcast(std::string_view data, int root) override {
    ++count;
    auto out = inner_.Broadcast(data, root);
    if (out.ok()) bytes += rank() == root ? data.size() : out->size();
    return out;
  }
  Result<std::vector<uint64_t>> AllReduceMax(std::span<const uint64_t> values) override {
    ++count;
    bytes += 2 * values.size() * sizeof(uint64_t);
    return inner_.AllReduceMax(values);
  }
  Status Barrier() override {
    ++count;
    return inner_.Barrier();
  }
  int count = 0;
  uint64_t bytes = 0;
  std::vector<uint64_t> gathered;  // what this rank sent in each Gather

 private:
  Result<std::vector<std::string>> Received(size_t sent,
                                            Result<std::vector<std::string>> out) {
    bytes += sent;
    for (size_t r = 0; out.ok() && r < out->size(); ++r) {
      if (static_cast<int>(r) != rank()) bytes += (*out)[r].size();
    }
    return out;
  }

  Comm& inner_;
};

class CollectivesTest : public ::testing::Test {
 protected:
  static constexpr int kRanks = 2;
  void SetUp() override { root_ = testing::MakeTempDir("collectives"); }
  void TearDown() override { std::filesystem::remove_all(root_); }

  // Runs `call` on every rank; returns each rank's collective count.
  std::vector<int> Count(const std::function<Status(int, Comm&)>& call) {
    std::vector<int> counts(kRanks);
    testing::RunRanks(kRanks, [&](int r, Comm& comm) {
      CountingComm counting(comm);
      Status s = call(r, counting);
      EXPECT_TRUE(s.ok()) << s.ToString();
      counts[r] = counting.count;
    });
    return counts;
  }

  // Rank r's half of the rows of an 8 x 4 tensor.
  static OwnedShard Half(int r, const std::string& key = "w") {
    return MakeShard(key, DType::kF32, kShape, {Box{{4ull * r, 0}, {4, 4}}, std::nullopt});
  }

  // A state of one shard.
  static SaveState StateOf(const OwnedShard& shard) {
    SaveState state;
    state.tensors.push_back(shard.View());
    return state;
  }

  static inline const Shape kShape = {8, 4};
  std::string root_;
};

// Save: the reduction that checks whether the layout is unchanged
// (engine/save/plan_cache.h), the gather on rank 0 of every layout and the
// scatter of each rank's part of the plan (not when it is unchanged), the
// broadcast of rank 0's temporary directory (created only once every rank
// agreed), the gather on rank 0 of what each rank wrote, the broadcast of
// the outcome. The key is this test's own, so the first save plans.
TEST_F(CollectivesTest, SaveMakesSixThenFourWithAnUnchangedLayout) {
  for (int expected : {6, 4, 4}) {
    auto counts = Count([&](int r, Comm& comm) {
      OwnedShard shard = Half(r, "save-makes-six");
      return Save(StateOf(shard), root_ + "/a" + std::to_string(expected), comm, {.overwrite = true})
          .status();
    });
    EXPECT_THAT(counts, ::testing::Each(expected));
  }
}

// A manager's save prunes on rank 0 inside the commit: still six, then
// four.
TEST_F(CollectivesTest, ManagerSaveWithRetentionMakesSixThenFour) {
  for (int64_t step : {1, 2, 3}) {
    auto counts = Count([&](int r, Comm& comm) {
      OwnedShard shard = Half(r, "manager-makes-six");
      CheckpointManager manager(root_ + "/m", {.keep_last = 1});
      return manager.Save(step, StateOf(shard), comm, {}).status();
    });
    EXPECT_THAT(counts, ::testing::Each(step == 1 ? 6 : 4)) << "step " << step;
  }
  CheckpointManager manager(root_ + "/m", {});
  auto list = manager.List();
  ASSERT_TRUE(list.ok());
  ASSERT_EQ(list->size(), 1u);
  EXPECT_EQ((*list)[0].step, 3);
}

// Load: the broadcast of the index rank 0 read and the agreement on the
// outcome; shared reads add the gather of what each rank reads.
TEST_F(CollectivesTest, LoadMakesTwoOrThreeWithSharedReads) {
  Count([&](int r, Comm& comm) {
    OwnedShard shard = Half(r);
    return Save(StateOf(shard), root_ + "/l", comm, {}).status();
  });
  for (bool share : {false, true}) {
    auto counts = Count([&](int r, Comm& comm) {
      // Each rank loads the other's rows: nothing for the other to share.
      OwnedTarget t = MakeTarget("w", DType::kF32, kShape,
                                 {Box{{4ull * (1 - r), 0}, {4, 4}}, std::nullopt});
      LoadOptions options;
      options.share_reads = share;
      return Load(LoadRequest{{t.target}}, root_ + "/l", comm, options).status();
    });
    EXPECT_THAT(counts, ::testing::Each(share ? 3 : 2)) << "share_reads " << share;
  }
}

// A caller's reports travel in the load's first collective: every rank
// checks every rank's before anything is read, and a rank's failure
// preparing its part fails every rank, naming it.
TEST_F(CollectivesTest, ReportsAndALocalFailureTravelInTheLoadsFirstCollective) {
  Count([&](int r, Comm& comm) {
    OwnedShard shard = Half(r);
    return Save(StateOf(shard), root_ + "/r", comm, {}).status();
  });
  std::vector<std::vector<std::string>> seen(kRanks);
  auto load = [&](int r, Comm& comm, Status failure, bool refuse) {
    OwnedTarget t = MakeTarget("w", DType::kF32, kShape, {Box{{4ull * r, 0}, {4, 4}}, std::nullopt});
    std::fill_n(static_cast<float*>(t.target.data), 16, -1.0f);
    LoadOptions options;
    options.share_reads = false;
    options.local_failure = std::move(failure);
    options.report = "from " + std::to_string(r);
    options.check_reports = [&, r](const std::vector<std::string>& reports) {
      seen[r] = reports;
      return refuse ? FailedPreconditionError("keys do not match") : Status();
    };
    Status s = Load(LoadRequest{{t.target}}, root_ + "/r", comm, options).status();
    const bool untouched = static_cast<float*>(t.target.data)[0] == -1.0f;
    return s.ok() || untouched ? s : InternalError("read before the check failed: " + s.ToString());
  };
  EXPECT_THAT(Count([&](int r, Comm& comm) { return load(r, comm, Status(), false); }),
              ::testing::Each(3));
  for (const auto& reports : seen) {
    EXPECT_THAT(reports, ::testing::ElementsAre("from 0", "from 1"));
  }
  testing::RunRanks(kRanks, [&](int r, Comm& comm) {
    Status refused = load(r, comm, Status(), true);
    EXPECT_EQ(refused.code(), StatusCode::kFailedPrecondition) << refused.ToString();
    EXPECT_THAT(refused.message(), HasSubstr("keys do not match"));
    Status failed = load(r, comm, r == 1 ? InvalidArgumentError("bad state") : Status(), false);
    EXPECT_EQ(failed.code(), StatusCode::kInvalidArgument) << failed.ToString();
    EXPECT_THAT(failed.message(), HasSubstr("rank 1: bad state"));
  });
}

// Another tool's checkpoint that rank 0's caller found travels in the
// open's one broadcast: every rank gets its name, and rank 0 opens nothing
// (the path holds no shardsafe checkpoint, so an open would fail).
TEST_F(CollectivesTest, AnotherFormatFoundOnRankZeroReachesEveryRankInTheOpensBroadcast) {
  std::vector<std::string> formats(kRanks);
  auto counts = Count([&](int r, Comm& comm) {
    SS_ASSIGN_OR_RETURN(CheckpointSource src,
                        OpenSourceCollectivePacked(root_, comm, r == 0 ? "dcp" : "ignored"));
    EXPECT_EQ(src.path, root_);
    EXPECT_EQ(src.packed, nullptr);
    formats[r] = src.other_format;
    return Status();
  });
  EXPECT_THAT(counts, ::testing::Each(1));
  EXPECT_THAT(formats, ::testing::Each(std::string("dcp")));
  // Without one, the same path fails on every rank with rank 0's error.
  testing::RunRanks(kRanks, [&](int, Comm& comm) {
    EXPECT_FALSE(OpenSourceCollectivePacked(root_, comm).ok());
  });
}

// A repeated save of an unchanged layout: a rank other than 0 sends and
// receives a few hundred bytes, whatever the job's size (the reduction,
// its own report, two broadcasts); rank 0 receives every rank's report.
TEST_F(CollectivesTest, ARepeatedSaveCostsARankOtherThanZeroUnderOneKilobyte) {
  constexpr int kMany = 16;
  std::vector<uint64_t> bytes(kMany);
  for (int save = 0; save < 2; ++save) {
    testing::RunRanks(kMany, [&](int r, Comm& comm) {
      CountingComm counting(comm);
      OwnedShard shard =
          MakeShard("repeat", DType::kF32, {kMany, 4}, {Box{{1ull * r, 0}, {1, 4}}, std::nullopt});
      auto saved = Save(StateOf(shard), root_ + "/r" + std::to_string(save), counting, {});
      EXPECT_TRUE(saved.ok()) << saved.status().ToString();
      EXPECT_EQ(saved.ok() && saved->plan_reused, save == 1);
      bytes[r] = counting.bytes;
    });
  }
  for (int r = 1; r < kMany; ++r) EXPECT_LE(bytes[r], 1024u) << "rank " << r;
}

// Rank 0 keeps where a plan's files put their entries from the first
// save's reports, so a repeated save's report carries checksums alone (4
// bytes an entry, not 4 and a varint offset, and no file size); the index records the same
// offsets and sizes, and the checkpoint loads.
TEST_F(CollectivesTest, ARepeatedSaveReportsChecksumsWithoutOffsets) {
  constexpr int kTensors = 16;
  std::vector<std::vector<uint64_t>> report_bytes(2, std::vector<uint64_t>(kRanks));
  for (int save = 0; save < 2; ++save) {
    testing::RunRanks(kRanks, [&](int r, Comm& comm) {
      CountingComm counting(comm);
      std::vector<OwnedShard> shards;
      SaveState state;
      for (int t = 0; t < kTensors; ++t) {
        shards.push_back(MakeShard("c" + std::to_string(t), DType::kF32, {kRanks, 8},
                                   {Box{{1ull * r, 0}, {1, 8}}, std::nullopt}));
      }
      for (const OwnedShard& s : shards) state.tensors.push_back(s.View());
      auto saved = Save(state, root_ + "/c" + std::to_string(save), counting, {});
      EXPECT_TRUE(saved.ok() && saved->plan_reused == (save == 1)) << saved.status().ToString();
      ASSERT_FALSE(counting.gathered.empty());
      report_bytes[save][r] = counting.gathered.back();  // step 3 is the save's last gather
    });
  }
  for (int r = 0; r < kRanks; ++r) {
    // The offsets left out: 2 bytes each here, as varints.
    EXPECT_LE(report_bytes[1][r] + 2 * kTensors, report_bytes[0][r]) << "rank " << r;
  }
  auto first = OpenSource(*DefaultFileSystem(), root_ + "/c0");
  auto second = OpenSource(*DefaultFileSystem(), root_ + "/c1");
  ASSERT_TRUE(first.ok() && second.ok());
  ASSERT_EQ(first->index.files.size(), second->index.files.size());
  for (size_t f = 0; f < first->index.files.size(); ++f) {
    EXPECT_EQ(first->index.files[f].bytes, second->index.files[f].bytes);
  }
  for (const auto& [key, t] : first->index.tensors) {
    const IndexTensor& again = second->index.tensors.at(key);
    ASSERT_EQ(t.chunks.size(), again.chunks.size()) << key;
    for (size_t c = 0; c < t.chunks.size(); ++c) {
      EXPECT_EQ(t.chunks[c].at, again.chunks[c].at) << key;
      EXPECT_EQ(t.chunks[c].crc32c, again.chunks[c].crc32c) << key;
    }
  }
  for (int t = 0; t < kTensors; ++t) {
    OwnedTarget target = MakeTarget("c" + std::to_string(t), DType::kF32, {kRanks, 8},
                                    {Box::Whole({kRanks, 8}), std::nullopt});
    auto comm = MakeSingleProcessComm();
    ASSERT_TRUE(Load(LoadRequest{{target.target}}, root_ + "/c1", *comm, {}).ok());
    EXPECT_TRUE(MatchesOracle(target)) << t;
  }
}

// Replicas are compared through one 8-byte digest per rank: when every
// copy equals what was written (small replicas, and one large enough to be
// cut into pieces written by different ranks) the reports carry no copies:
// a first save gathers the layouts and the reports, a repeated one the
// reports only. A copy that differs brings one more gather, of the copies'
// checksums, and the save fails naming it.
TEST_F(CollectivesTest, ReplicasThatAgreeAreComparedWithoutSendingTheirChecksums) {
  constexpr int kMany = 4;
  const Shape small{16, 16}, large{1024, 2048};  // F32: 1 KiB, 8 MiB (cut in 4)
  std::vector<std::vector<OwnedShard>> held(kMany);
  for (int r = 0; r < kMany; ++r) {
    for (int t = 0; t < 8; ++t) {
      held[r].push_back(MakeShard("rep" + std::to_string(t), DType::kF32, small,
                                  {Box::Whole(small), std::nullopt}));
    }
    held[r].push_back(MakeShard("large", DType::kF32, large, {Box::Whole(large), std::nullopt}));
  }
  // Each rank's outcome, and what it sent in each gather.
  std::vector<std::vector<uint64_t>> gathered(kMany);
  const auto save = [&](const std::string& name) {
    std::vector<Status> out(kMany);
    testing::RunRanks(kMany, [&](int r, Comm& comm) {
      CountingComm counting(comm);
      SaveState state;
      for (const OwnedShard& s : held[r]) state.tensors.push_back(s.View());
      out[r] = Save(state, root_ + "/" + name, counting, {}).status();
      gathered[r] = counting.gathered;
    });
    return out;
  };
  for (const std::string name : {"first", "repeated"}) {
    for (const Status& st : save(name)) EXPECT_TRUE(st.ok()) << st.ToString();
    for (int r = 0; r < kMany; ++r) {
      ASSERT_EQ(gathered[r].size(), name == "first" ? 2u : 1u)
          << name << ", rank " << r << ": the digests did not add up";
      EXPECT_LT(gathered[r].back(), 200u) << name << ", rank " << r << " sent its copies";
    }
  }
  auto src = OpenSource(*DefaultFileSystem(), root_ + "/repeated");
  ASSERT_TRUE(src.ok()) << src.status().ToString();
  ASSERT_EQ(src->index.tensors.at("large").chunks.size(), 4u);

  held[3][5].bytes[7] ^= std::byte{1};  // rank 3's "replica" of rep5 holds other data
  for (const Status& st : save("differ")) {
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.ToString();
    EXPECT_THAT(st.message(), HasSubstr("tensor \"rep5\""));
    EXPECT_THAT(st.message(), HasSubstr("and 3 hold different bytes"));
  }
  for (int r = 0; r < kMany; ++r) EXPECT_EQ(gathered[r].size(), 2u) << "rank " << r;
}

// With a chunk table the reports carry no chunk checksum (they are in the
// writers' checksum files), so when the digests do not add up the second
// round brings the writers' checksums with the copies': a rank that skips
// the check costs a round and commits; a copy that differs is named.
TEST_F(CollectivesTest, AChunkTableSaveComparesCopiesWithTheWritersChecksumsInASecondRound) {
  constexpr int kMany = 4;
  const Shape small{16, 16}, large{1024, 2048};
  std::vector<std::vector<OwnedShard>> held(kMany);
  for (int r = 0; r < kMany; ++r) {
    for (int t = 0; t < 4; ++t) {
      held[r].push_back(MakeShard("rep" + std::to_string(t), DType::kF32, small,
                                  {Box::Whole(small), std::nullopt}));
    }
    held[r].push_back(MakeShard("large", DType::kF32, large, {Box::Whole(large), std::nullopt}));
  }
  std::vector<std::vector<uint64_t>> gathered(kMany);
  const auto save = [&](const std::string& name, int unchecked) {
    std::vector<Status> out(kMany);
    testing::RunRanks(kMany, [&](int r, Comm& comm) {
      CountingComm counting(comm);
      SaveState state;
      for (const OwnedShard& s : held[r]) state.tensors.push_back(s.View());
      SaveOptions options;
      options.chunk_table_min_chunks = 1;
      options.verify_replicas = r != unchecked;
      out[r] = Save(state, root_ + "/" + name, counting, options).status();
      gathered[r] = counting.gathered;
    });
    return out;
  };
  // A first save: the layouts' gather and the reports'.
  for (const Status& st : save("agree", -1)) EXPECT_TRUE(st.ok()) << st.ToString();
  for (int r = 0; r < kMany; ++r) EXPECT_EQ(gathered[r].size(), 2u) << "rank " << r;
  // Repeated saves: the reports', then the second round's.
  for (const Status& st : save("unchecked", 2)) EXPECT_TRUE(st.ok()) << st.ToString();
  for (int r = 0; r < kMany; ++r) EXPECT_EQ(gathered[r].size(), 2u) << "rank " << r;
  auto src = OpenSource(*DefaultFileSystem(), root_ + "/unchecked");
  ASSERT_TRUE(src.ok()) << src.status().ToString();
  EXPECT_EQ(src->index.version, 4);
  EXPECT_EQ(src->index.tensors.at("large").chunks.size(), 4u);
  for (const std::string key : {"rep1", "large"}) {
    const Shape& shape = key == "large" ? large : small;
    OwnedTarget target = MakeTarget(key, DType::kF32, shape, {Box::Whole(shape), std::nullopt});
    auto comm = MakeSingleProcessComm();
    ASSERT_TRUE(Load(LoadRequest{{target.target}}, root_ + "/unchecked", *comm, {}).ok());
    EXPECT_TRUE(MatchesOracle(target)) << key;
  }

  held[3][4].bytes[12345] ^= std::byte{1};  // rank 3's copy of a piece of "large" differs
  for (const Status& st : save("differ", -1)) {
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.ToString();
    EXPECT_THAT(st.message(), HasSubstr("tensor \"large\""));
    EXPECT_THAT(st.message(), HasSubstr("hold different bytes"));
  }
  for (int r = 0; r < kMany; ++r) EXPECT_EQ(gathered[r].size(), 2u) << "rank " << r;
}

// A first save: a rank other than 0 sends its own layout and receives its
// own part of the plan, so its bytes do not grow with the job, not with
// every rank's layout and report.
TEST_F(CollectivesTest, AFirstSaveCostsARankOtherThanZeroItsOwnPartOnly) {
  const auto first_save_bytes = [&](int ranks) {
    std::vector<uint64_t> bytes(ranks);
    testing::RunRanks(ranks, [&](int r, Comm& comm) {
      CountingComm counting(comm);
      OwnedShard shard = MakeShard("first-" + std::to_string(ranks), DType::kF32, {64, 4},
                                   {Box{{64ull / ranks * r, 0}, {64ull / ranks, 4}}, std::nullopt});
      auto saved = Save(StateOf(shard), root_ + "/f" + std::to_string(ranks), counting, {});
      EXPECT_TRUE(saved.ok() && !saved->plan_reused) << saved.status().ToString();
      bytes[r] = counting.bytes;
    });
    return bytes;
  };
  const std::vector<uint64_t> few = first_save_bytes(4), many = first_save_bytes(32);
  for (int r = 1; r < 4; ++r) {
    EXPECT_LE(many[r], few[r] + 16) << "rank " << r;
  }
  EXPECT_GT(many[0], few[0]) << "rank 0 gathers every rank's layout and report";
}

// A rank that failed before the call (SaveOptions::local_failure) fails it
// on every rank, named, and nothing is left behind: the first collective
// (the reduction of the layout check) finds it, and the failing rank
// broadcasts its error.
TEST_F(CollectivesTest, LocalFailureReachesEveryRankThroughTheFirstCollective) {
  std::vector<Status> out(3);
  testing::RunRanks(3, [&](int r, Comm& comm) {
    CountingComm counting(comm);
    OwnedShard shard = MakeShard("w", DType::kF32, {3}, {Box{{1ull * r}, {1}}, std::nullopt});
    SaveOptions options;
    if (r == 1) options.local_failure = InvalidArgumentError("state walk: bad value 'x'");
    out[r] = Save(StateOf(shard), root_ + "/f", counting, options).status();
    EXPECT_EQ(counting.count, 2) << "rank " << r;
  });
  for (const Status& s : out) {
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
    EXPECT_THAT(s.message(), HasSubstr("rank 1: state walk: bad value 'x'"));
  }
  EXPECT_TRUE(std::filesystem::is_empty(root_));
}

}  // namespace
}  // namespace shardsafe
