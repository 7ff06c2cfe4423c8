#include "engine/shared_reads/shared_reads.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <mutex>
#include <thread>
#include <utility>

#include "engine/shared_reads/ring_reads.h"
#include "testing/test_util.h"

namespace shardsafe {
namespace {

constexpr uint64_t kMiB = 1 << 20;
constexpr uint64_t kFileSize = 64 * kMiB;

struct Range {
  uint32_t file;
  uint64_t begin;
  uint64_t end;
};

// A plan of one group per range.
LoadPlan PlanOf(const std::vector<Range>& ranges) {
  LoadPlan plan;
  for (const Range& r : ranges) {
    ReadGroup g;
    g.reads.push_back({r.file, r.begin, r.end - r.begin, {}});
    plan.groups.push_back(std::move(g));
  }
  return plan;
}

// Rank r plans ranges[r] (none: a null plan) on machine machines[r] over 3
// data files; returns each rank's outcome.
SharedReadsOptions NoRings() {
  SharedReadsOptions o;
  o.rings = false;
  return o;
}

std::vector<SharedReadPlan> PlanAll(const std::vector<std::vector<Range>>& ranges,
                                    const std::vector<std::string>& machines,
                                    SharedReadsOptions options = NoRings()) {
  const int n = static_cast<int>(ranges.size());
  std::vector<SharedReadPlan> out(n);
  RunRanks(n, [&](int r, Comm& comm) {
    SharedReadsOptions o = options;
    o.machine = machines[r];
    const LoadPlan plan = PlanOf(ranges[r]);
    auto shared = PlanSharedReads(comm, ranges[r].empty() ? nullptr : &plan, {kFileSize, kFileSize, kFileSize}, o);
    ASSERT_TRUE(shared.ok()) << shared.status().ToString();
    out[r] = std::move(*shared);
  });
  return out;
}

const std::vector<bool> kNone = {false, false, false};

TEST(SharedReadsTest, FilesWhoseBytesAnotherRankReadsGoThroughThePageCache) {
  // Both read all of file 0 (in different pieces); file 1 is split.
  const auto out = PlanAll({{{0, 0, 2 * kMiB}, {0, 2 * kMiB, 4 * kMiB}, {1, 0, 2 * kMiB}},
                            {{0, 0, 3 * kMiB}, {0, 3 * kMiB, 4 * kMiB}, {1, 2 * kMiB, 4 * kMiB}}},
                           {"m", "m"});
  for (const SharedReadPlan& p : out) {
    EXPECT_EQ(p.buffered, (std::vector<bool>{true, false, false}));
    EXPECT_EQ(p.bytes_shared, 4 * kMiB);
  }
}

TEST(SharedReadsTest, AFileIsSharedWhenAtLeastHalfOfWhatARankReadsOfItIs) {
  // Rank 0 reads 8 MiB of file 2, 2 MiB of which rank 1 reads too: rank 0
  // reads alone, rank 1 (all of whose reads are shared) through the cache.
  const auto out = PlanAll({{{2, 0, 8 * kMiB}}, {{2, 6 * kMiB, 8 * kMiB}}}, {"m", "m"});
  EXPECT_EQ(out[0].buffered, kNone);
  EXPECT_EQ(out[0].bytes_shared, 0u);
  EXPECT_EQ(out[1].buffered, (std::vector<bool>{false, false, true}));
  EXPECT_EQ(out[1].bytes_shared, 2 * kMiB);
}

TEST(SharedReadsTest, FewSharedBytesAreNotWorthIt) {
  const auto out = PlanAll({{{0, 0, kMiB / 2}}, {{0, 0, kMiB / 2}}}, {"m", "m"});
  for (const SharedReadPlan& p : out) EXPECT_EQ(p.buffered, kNone);
  SharedReadsOptions low = NoRings();
  low.min_bytes = 4096;
  for (const SharedReadPlan& p : PlanAll({{{0, 0, kMiB / 2}}, {{0, 0, kMiB / 2}}}, {"m", "m"}, low)) {
    EXPECT_EQ(p.buffered, (std::vector<bool>{true, false, false}));
  }
}

TEST(SharedReadsTest, RanksOnOtherMachinesDoNotCount) {
  const std::vector<std::vector<Range>> same = {{{0, 0, 4 * kMiB}}, {{0, 0, 4 * kMiB}},
                                                {{0, 0, 4 * kMiB}}};
  const auto out = PlanAll(same, {"a", "b", "a"});
  EXPECT_EQ(out[0].buffered[0], true);
  EXPECT_EQ(out[1].buffered, kNone) << "alone on machine b";
  EXPECT_EQ(out[2].buffered[0], true);
}

TEST(SharedReadsTest, DisabledOrEmptyRanksShareNothing) {
  SharedReadsOptions off = NoRings();
  off.enabled = false;
  for (const SharedReadPlan& p : PlanAll({{{0, 0, 4 * kMiB}}, {{0, 0, 4 * kMiB}}}, {"m", "m"}, off)) {
    EXPECT_EQ(p.buffered, kNone);
  }
  // Rank 1 has no plan: rank 0 has no one to share with.
  for (const SharedReadPlan& p : PlanAll({{{0, 0, 4 * kMiB}}, {}}, {"m", "m"})) {
    EXPECT_EQ(p.buffered, kNone);
  }
  // One rank: no collective, nothing shared.
  for (const SharedReadPlan& p : PlanAll({{{0, 0, 4 * kMiB}}}, {"m"})) EXPECT_EQ(p.buffered, kNone);
}

TEST(SharedReadsTest, SharedFilesAreSpreadOverRingsOneRankReadsEach) {
  // Both ranks read all of files 0 and 1; only rank 1 reads file 2.
  const std::vector<Range> all = {{0, 100, 5 * kMiB}, {1, 0, 3 * kMiB}};
  std::vector<Range> more = all;
  more.push_back({2, 0, 4 * kMiB});
  SharedReadsOptions small_blocks;
  small_blocks.ring_slot_bytes = 2 * kMiB;
  const auto out = PlanAll({all, more}, {"m", "m"}, small_blocks);
  for (int r = 0; r < 2; ++r) {
    const SharedReadPlan& p = out[r];
    EXPECT_TRUE(p.rings_anywhere);
    EXPECT_EQ(p.buffered, (std::vector<bool>{true, true, false}));
    ASSERT_EQ(p.rings.size(), 2u);
    EXPECT_EQ(p.ring_of_file, (std::vector<int>{0, 1, -1})) << "rings, not the page cache";
    EXPECT_EQ(p.produced, r) << "file r is read by rank r";
    for (int i = 0; i < 2; ++i) {
      const RingRole& role = p.rings[i];
      EXPECT_EQ(role.producer, i);
      EXPECT_EQ(role.consumers, 2u);
      EXPECT_EQ(role.consumer, static_cast<uint32_t>(r));
      EXPECT_EQ(role.slot_bytes, 2 * kMiB);
      EXPECT_EQ(role.name, out[0].rings[i].name) << "every rank names it alike";
    }
    // File 0's bytes [100, 5 MiB) widened to 4 KiB, in blocks of 2 MiB.
    const auto& b0 = p.rings[0].blocks;
    ASSERT_EQ(b0.size(), 3u);
    EXPECT_EQ(b0[0].offset, 0u);
    EXPECT_EQ(b0[1].offset, 2 * kMiB);
    EXPECT_EQ(b0[2].offset + b0[2].length, 5 * kMiB);
    for (const RingBlock& b : b0) EXPECT_EQ(b.file, 0u);
  }
  EXPECT_NE(out[0].rings[0].name, out[0].rings[1].name);
}

TEST(SharedReadsTest, NoRingAcrossMachinesNorForReadsThatOverlap) {
  const std::vector<Range> whole = {{0, 0, 4 * kMiB}};
  for (const SharedReadPlan& p : PlanAll({whole, whole}, {"a", "b"}, {})) {
    EXPECT_FALSE(p.rings_anywhere);
  }
  // Rank 1 reads part of file 0 twice: it cannot follow a ring, which only
  // goes forward, so it does not take part; rank 0 would be the only
  // reader left, so there is no ring, and both share through the page cache.
  const std::vector<Range> twice = {{0, 0, 3 * kMiB}, {0, 2 * kMiB, 4 * kMiB}};
  const auto out = PlanAll({whole, twice}, {"m", "m"}, {});
  for (const SharedReadPlan& p : out) {
    EXPECT_FALSE(p.rings_anywhere);
    EXPECT_EQ(p.buffered, (std::vector<bool>{true, false, false}));
  }
}

// Two ranks read all of a 3 MiB file through a ring of 2 slots of 64 KiB:
// the producer reuses each slot ~24 times, the readers cross block edges.
TEST(SharedRingTest, ManyBlocksThroughFewSlotsArriveIntact) {
  const std::string dir = testing::MakeTempDir("ring");
  const std::string path = dir + "/data";
  std::string bytes(3 * kMiB + 1000, '\0');
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<char>(i * 7 + i / 4096);
  {
    auto out = DefaultFileSystem()->NewWritableFile(path, WriteOptions{});
    ASSERT_TRUE(out.ok());
    ASSERT_TRUE((*out)->Append(bytes.data(), bytes.size()).ok());
    ASSERT_TRUE((*out)->Close().ok());
  }
  SharedReadsOptions o;
  o.machine = "m";
  o.min_bytes = 4096;
  o.ring_slot_bytes = 64 << 10;
  o.ring_slots = 2;
  // A ring left by a producer killed during setup: this load's producer
  // removes it (SetUpRings, SharedRing::RemoveAbandoned).
  const std::string abandoned = "/shardsafe-test-left-" + std::to_string(getpid());
  if (const pid_t child = fork(); child == 0) {
    _exit(SharedRing::Create(abandoned, 2, 4096, 1, 0, 0, std::chrono::seconds(1)).ok() ? 0 : 1);
  } else {
    int status = 0;
    waitpid(child, &status, 0);
    ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  }
  ASSERT_TRUE(std::filesystem::exists("/dev/shm" + abandoned));
  RunRanks(2, [&](int r, Comm& comm) {
    const LoadPlan plan = PlanOf({{0, 0, bytes.size()}});
    auto shared = PlanSharedReads(comm, &plan, {bytes.size()}, o);
    ASSERT_TRUE(shared.ok());
    ASSERT_EQ(shared->produced, 0 == r ? 0 : -1);
    auto rings = SetUpRings(comm, *shared, {bytes.size()}, std::chrono::seconds(30));
    ASSERT_TRUE(rings.ok() && *rings) << rings.status().ToString();
    Status produced;
    std::thread producer([&] { produced = (*rings)->Produce(*DefaultFileSystem(), {path}, ""); });
    const RandomAccessFile* file = (*rings)->FileFor(0);
    ASSERT_NE(file, nullptr);
    std::string got(bytes.size(), '\0');
    // Steps that are not a multiple of the block size: some lie in one
    // block (View gives the slot), some cross into the next (ReadAt copies).
    const size_t step = 10000 + r * 3333;
    int viewed = 0, copied = 0;
    for (size_t at = 0; at < got.size(); at += step) {
      const size_t n = std::min(step, got.size() - at);
      auto view = file->View(at, n);
      ASSERT_TRUE(view.ok()) << view.status().ToString();
      if (*view) {
        std::memcpy(got.data() + at, *view, n);
        ++viewed;
      } else {
        ASSERT_TRUE(file->ReadAt(at, got.data() + at, n).ok());
        ++copied;
      }
    }
    EXPECT_TRUE(got == bytes) << "rank " << r;
    EXPECT_GT(viewed, 0);
    EXPECT_GT(copied, 0);
    const Status back = file->ReadAt(0, got.data(), 10);
    EXPECT_EQ(back.code(), StatusCode::kInternal) << "a ring does not go back";
    (*rings)->Detach(0);
    producer.join();
    EXPECT_TRUE(produced.ok()) << produced.ToString();
  });
  EXPECT_FALSE(std::filesystem::exists("/dev/shm" + abandoned));
  std::filesystem::remove_all(dir);
}

// Many files per producer, and ranks that read only some of a ring's
// files: a ring's 8 slots wrap while each rank also waits on other rings.
// (This layout does not reproduce the deadlock the demo found, a rank
// holding blocks of a file it does not read; tests/python/test_cli.py
// runs a demo large enough to.)
TEST(SharedRingTest, RanksThatReadSomeOfARingsFilesDoNotBlockIt) {
  const std::string root = testing::MakeTempDir("rings") + "/ckpt";
  constexpr int kRanks = 4, kTensors = 16;
  const Shape shape = {512, 2048};  // F32: 4 MiB, 1 MiB per saved row shard
  auto key = [](int t) { return "t" + std::to_string(t); };
  RunRanks(kRanks, [&](int r, Comm& comm) {
    std::vector<OwnedShard> shards;
    for (int t = 0; t < kTensors; ++t) {
      shards.push_back(MakeShard(key(t), DType::kF32, shape,
                                 {Box{{r * 128ull, 0}, {128, 2048}}, std::nullopt}));
    }
    SaveState state;
    for (const auto& sh : shards) state.tensors.push_back(sh.View());
    SaveOptions one_chunk_per_file;
    one_chunk_per_file.max_file_bytes = 1 << 20;
    ASSERT_TRUE(Save(state, root, comm, one_chunk_per_file).ok());
  });
  // Rank r loads a column half of every tensor t with t % 4 != r: each file
  // has 3 readers, and each ring carries files one of its readers skips.
  std::vector<uint64_t> shared(kRanks);
  RunRanks(kRanks, [&](int r, Comm& comm) {
    std::vector<OwnedTarget> targets;
    for (int t = 0; t < kTensors; ++t) {
      if (t % kRanks == r) continue;
      targets.push_back(MakeTarget(key(t), DType::kF32, shape,
                                   {Box{{0, (r % 2) * 1024ull}, {512, 1024}}, std::nullopt}));
    }
    LoadRequest req;
    for (auto& t : targets) req.tensors.push_back(t.target);
    Result<LoadResult> loaded = Load(req, root, comm, LoadOptions{});
    ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
    shared[r] = loaded->bytes_shared;
    for (const auto& t : targets) EXPECT_TRUE(MatchesOracle(t)) << "rank " << r << " " << t.target.key;
  });
  for (int r = 0; r < kRanks; ++r) {
    EXPECT_EQ(shared[r], uint64_t{kTensors * 3 / 4} * (4 << 20)) << "rank " << r << " shares all it reads";
  }
  std::filesystem::remove_all(std::filesystem::path(root).parent_path());
}

// Records the data files opened, in order, and whether for O_DIRECT reads.
class RecordingFs final : public testing::ForwardingFileSystem {
 public:
  RecordingFs() : ForwardingFileSystem(DefaultFileSystem()) {}
  Result<std::unique_ptr<RandomAccessFile>> NewRandomAccessFile(const std::string& path,
                                                                const ReadOptions& o) override {
    const std::string name = std::filesystem::path(path).filename();
    if (name.rfind("data-", 0) == 0) {
      std::lock_guard<std::mutex> lock(mu_);
      (o.direct ? direct_ : buffered_)++;
      opened_.push_back(name);
      if (fail_reads_) return std::unique_ptr<RandomAccessFile>(new FailingFile(path));
    }
    return base_->NewRandomAccessFile(path, o);
  }
  // Every later read of a data file fails.
  void FailReads() { fail_reads_ = true; }
  std::pair<int, int> TakeCounts() {  // {direct, buffered}
    std::lock_guard<std::mutex> lock(mu_);
    opened_.clear();
    return {std::exchange(direct_, 0), std::exchange(buffered_, 0)};
  }
  std::vector<std::string> TakeOpened() {
    std::lock_guard<std::mutex> lock(mu_);
    direct_ = buffered_ = 0;
    return std::exchange(opened_, {});
  }

 private:
  class FailingFile final : public RandomAccessFile {
   public:
    explicit FailingFile(std::string path) : path_(std::move(path)) {}
    Status ReadAt(uint64_t, void*, size_t) const override {
      return UnavailableError("read " + path_ + ": injected I/O error");
    }
    uint64_t size() const override { return 0; }

   private:
    std::string path_;
  };

  std::mutex mu_;
  int direct_ = 0;
  int buffered_ = 0;
  std::vector<std::string> opened_;
  bool fail_reads_ = false;
};

class SharedLoadTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = testing::MakeTempDir("shared-load") + "/ckpt";
    // 4 MiB of w in rows, a small tensor b in halves, over two ranks.
    RunRanks(2, [&](int r, Comm& comm) {
      std::vector<OwnedShard> shards = {
          MakeShard("w", DType::kF32, kShape, {Box{{r * 512ull, 0}, {512, 2048}}, std::nullopt}),
          MakeShard("b", DType::kBF16, {1024}, {Box{{r * 512ull}, {512}}, std::nullopt})};
      SaveState state;
      for (const auto& s : shards) state.tensors.push_back(s.View());
      ASSERT_TRUE(Save(state, root_, comm, SaveOptions{}).ok());
    });
  }
  void TearDown() override { std::filesystem::remove_all(std::filesystem::path(root_).parent_path()); }

  // Rank r loads column half r of w (or row half r, `same`), and all of b,
  // checking the bytes. Returns each rank's result.
  std::vector<LoadResult> Load2(bool same, LoadOptions options) {
    std::vector<LoadResult> out;
    for (Result<LoadResult>& r : Try2(same, options)) {
      EXPECT_TRUE(r.ok()) << r.status().ToString();
      out.push_back(r.ok() ? std::move(*r) : LoadResult{});
    }
    return out;
  }
  // As Load2, but returns each rank's outcome (bytes checked only on success).
  std::vector<Result<LoadResult>> Try2(bool same, LoadOptions options) {
    std::vector<Result<LoadResult>> out(2, InternalError("not run"));
    RunRanks(2, [&](int r, Comm& comm) {
      LoadOptions mine = options;
      mine.fs = r == 0 ? &fs_ : &fs1_;
      const Box box = same ? Box{{r * 512ull, 0}, {512, 2048}} : Box{{0, r * 1024ull}, {1024, 1024}};
      // push_back moves: a copy's target.data would point at the original.
      std::vector<OwnedTarget> targets;
      targets.push_back(MakeTarget("w", DType::kF32, kShape, {box, std::nullopt}));
      targets.push_back(MakeTarget("b", DType::kBF16, {1024}, {Box{{0}, {1024}}, std::nullopt}));
      LoadRequest req;
      for (auto& t : targets) req.tensors.push_back(t.target);
      out[r] = Load(req, root_, comm, mine);
      if (!out[r].ok()) return;
      for (const auto& t : targets) EXPECT_TRUE(MatchesOracle(t)) << "rank " << r << " " << t.target.key;
    });
    return out;
  }

  const Shape kShape = {1024, 2048};
  // The counts of both ranks together.
  std::pair<int, int> TakeCounts() {
    const auto [a, b] = fs_.TakeCounts();
    const auto [c, d] = fs1_.TakeCounts();
    return {a + c, b + d};
  }
  // The data files each rank opened, in order.
  std::vector<std::vector<std::string>> TakeOpened() { return {fs_.TakeOpened(), fs1_.TakeOpened()}; }

  std::string root_;
  RecordingFs fs_, fs1_;  // rank 0's, rank 1's
};

TEST_F(SharedLoadTest, ReshardedLoadReadsEachSharedFileOnceIntoARing) {
  for (const LoadResult& r : Load2(/*same=*/false, LoadOptions{})) {
    // Each rank wants half of every row of both files, and reads them whole.
    EXPECT_GE(r.bytes_shared, 4 * kMiB - kMiB / 4);
    EXPECT_LE(r.bytes_shared, r.bytes_read);
    EXPECT_GT(r.chunks_verified, 0u);
  }
  // Rank r reads file r from the disk (O_DIRECT) into its ring; the other
  // rank copies it from there.
  EXPECT_EQ(TakeOpened(), (std::vector<std::vector<std::string>>{{"data-00000-000.safetensors"},
                                                                 {"data-00001-000.safetensors"}}));
}

// Each rank copies its half of every row of w out of the ring and
// checksums the row's other half (a gap it never copies) in the ring: a
// flipped byte in either half fails both ranks, naming the chunk.
TEST_F(SharedLoadTest, ACorruptByteInARingFailsEveryRankThatReadsItsChunk) {
  const std::string file = root_ + "/data-00000-000.safetensors";
  // Inside w's 2 MiB chunk whatever the header's size (b's is 1 KiB); the
  // two bytes are half a row (4 KiB) apart: one in each rank's columns.
  const uint64_t middle = std::filesystem::file_size(file) - kMiB;
  for (uint64_t at : {middle, middle + 4096}) {
    testing::FlipByte(file, at, 0x20);
    for (const Result<LoadResult>& r : Try2(/*same=*/false, LoadOptions{})) {
      ASSERT_FALSE(r.ok()) << "byte " << at;
      EXPECT_EQ(r.status().code(), StatusCode::kDataLoss) << r.status().ToString();
      EXPECT_NE(r.status().message().find("tensor \"w\""), std::string::npos)
          << r.status().ToString();
      EXPECT_NE(r.status().message().find("checksum mismatch"), std::string::npos)
          << r.status().ToString();
    }
    testing::FlipByte(file, at, 0x20);
  }
  for (const LoadResult& r : Load2(/*same=*/false, LoadOptions{})) EXPECT_GT(r.bytes_shared, 0u);
}

TEST_F(SharedLoadTest, WithoutSharedMemorySharedFilesGoThroughThePageCache) {
  LoadOptions no_rings;
  no_rings.shared_memory = false;
  for (const LoadResult& r : Load2(/*same=*/false, no_rings)) {
    EXPECT_GE(r.bytes_shared, 4 * kMiB - kMiB / 4);
  }
  EXPECT_EQ(TakeCounts(), std::make_pair(0, 4)) << "two files, two ranks, all buffered";
}

TEST_F(SharedLoadTest, AFailedRingReadFailsTheRanksThatNeedIt) {
  fs_.FailReads();  // rank 0 cannot read file 0, which both ranks need
  for (const Result<LoadResult>& r : Try2(/*same=*/false, LoadOptions{})) {
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.status().message().find("data-00000-000.safetensors"), std::string::npos)
        << r.status().ToString();
    EXPECT_NE(r.status().message().find("injected I/O error"), std::string::npos)
        << r.status().ToString();
  }
}

TEST_F(SharedLoadTest, RanksThatShareStartOnDifferentFiles) {
  LoadOptions one_thread;  // files are opened in the order groups run
  one_thread.io_threads = 1;
  one_thread.shared_memory = false;  // the page cache: every rank opens every file
  const std::vector<std::string> in_order = {"data-00000-000.safetensors",
                                             "data-00001-000.safetensors"};
  const std::vector<std::string> rotated = {in_order[1], in_order[0]};
  Load2(/*same=*/false, one_thread);
  EXPECT_EQ(TakeOpened(), (std::vector<std::vector<std::string>>{in_order, rotated}));
  one_thread.share_reads = false;
  Load2(/*same=*/false, one_thread);
  EXPECT_EQ(TakeOpened(), (std::vector<std::vector<std::string>>{in_order, in_order}));
}

TEST_F(SharedLoadTest, SameLayoutOrSharingOffReadsWithDirectIo) {
  for (const LoadResult& r : Load2(/*same=*/true, LoadOptions{})) {
    EXPECT_EQ(r.bytes_shared, 0u) << "only b is read by both: below min_bytes";
  }
  EXPECT_EQ(TakeCounts(), std::make_pair(4, 0));
  LoadOptions off;
  off.share_reads = false;
  for (const LoadResult& r : Load2(/*same=*/false, off)) EXPECT_EQ(r.bytes_shared, 0u);
  EXPECT_EQ(TakeCounts(), std::make_pair(4, 0));
  LoadOptions buffered;
  buffered.direct_io = false;  // shares the page cache anyway
  for (const LoadResult& r : Load2(/*same=*/false, buffered)) EXPECT_EQ(r.bytes_shared, 0u);
  EXPECT_EQ(TakeCounts(), std::make_pair(0, 4));
}

}  // namespace
}  // namespace shardsafe
