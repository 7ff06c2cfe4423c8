#include "engine/shared_reads.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <thread>

#include "engine/test_util.h"

namespace shardsafe {
namespace {

using testing::FlipByte;
using testing::MakeShard;
using testing::MakeTarget;
using testing::MatchesOracle;
using testing::OwnedShard;
using testing::OwnedTarget;
using testing::RunRanks;

char PatternByte(uint64_t at) { return static_cast<char>((at * 131 + (at >> 9)) & 0xFF); }

// A plan of one group per range of file 0.
LoadPlan PlanOf(const std::vector<std::pair<uint64_t, uint64_t>>& ranges) {
  LoadPlan plan;
  for (auto [begin, end] : ranges) {
    ReadGroup g;
    g.reads.push_back({0, begin, end - begin, {}});
    plan.groups.push_back(std::move(g));
  }
  return plan;
}

// Forwards to the POSIX file system; the files it opens for O_DIRECT reads
// (those of the shared-read readers) fail or are slow.
class ReaderFaultFs final : public testing::ForwardingFileSystem {
 public:
  enum class Mode { kFailOpen, kSlowRead };
  explicit ReaderFaultFs(Mode mode) : ForwardingFileSystem(DefaultFileSystem()), mode_(mode) {}

  Result<std::unique_ptr<RandomAccessFile>> NewRandomAccessFile(const std::string& path,
                                                                const ReadOptions& o) override {
    if (o.direct && mode_ == Mode::kFailOpen) return UnavailableError(path + ": injected");
    SS_ASSIGN_OR_RETURN(auto file, base_->NewRandomAccessFile(path, o));
    if (!o.direct) return file;
    return std::unique_ptr<RandomAccessFile>(new SlowFile(std::move(file)));
  }

 private:
  class SlowFile final : public RandomAccessFile {
   public:
    explicit SlowFile(std::unique_ptr<RandomAccessFile> f) : f_(std::move(f)) {}
    Status ReadAt(uint64_t offset, void* dst, size_t n) const override {
      std::this_thread::sleep_for(std::chrono::milliseconds(1500));
      return f_->ReadAt(offset, dst, n);
    }
    uint64_t size() const override { return f_->size(); }

   private:
    std::unique_ptr<RandomAccessFile> f_;
  };

  const Mode mode_;
};

class SharedReadsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::MakeTempDir("shared-reads");
    shm_dir_ = dir_ + "/shm";
    std::filesystem::create_directory(shm_dir_);
    path_ = dir_ + "/data";
    std::ofstream out(path_, std::ios::binary);
    for (uint64_t i = 0; i < kFileBytes; ++i) out.put(PatternByte(i));
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  SharedReadsOptions Options() const {
    SharedReadsOptions o;
    o.dir = shm_dir_;
    o.block_bytes = 64 << 10;
    o.min_bytes = 0;
    return o;
  }

  // Rank r plans ranges[r], starts shared reads and reads each of its
  // ranges through the wrapped file in uneven pieces, checking every byte.
  // Returns whether each rank shared and its bytes from peers.
  std::vector<std::pair<bool, uint64_t>> ReadAll(
      const std::vector<std::vector<std::pair<uint64_t, uint64_t>>>& ranges,
      const std::vector<FileSystem*>& fs, const SharedReadsOptions& options) {
    const int n = static_cast<int>(ranges.size());
    std::vector<std::pair<bool, uint64_t>> out(n);
    RunRanks(n, [&](int r, Comm& comm) {
      const LoadPlan plan = PlanOf(ranges[r]);
      auto shared = SharedReads::Start(comm, &plan, {path_}, *fs[r], options);
      ASSERT_TRUE(shared.ok()) << shared.status().ToString();
      auto base = DefaultFileSystem()->NewRandomAccessFile(path_, ReadOptions{});
      ASSERT_TRUE(base.ok());
      std::unique_ptr<RandomAccessFile> file = std::move(*base);
      if (*shared) file = (*shared)->WrapFile(0, std::move(file));
      for (auto [begin, end] : ranges[r]) {
        for (uint64_t at = begin; at < end;) {
          const uint64_t len = std::min<uint64_t>(end - at, 50'000 + at % 7919);
          std::vector<char> buf(len);
          ASSERT_TRUE(file->ReadAt(at, buf.data(), len).ok()) << "rank " << r << " at " << at;
          for (uint64_t i = 0; i < len; ++i) {
            ASSERT_EQ(buf[i], PatternByte(at + i)) << "rank " << r << " byte " << at + i;
          }
          at += len;
        }
      }
      if (*shared) (*shared)->Finish();
      out[r] = {*shared != nullptr, *shared ? (*shared)->bytes_from_peers() : 0};
    });
    return out;
  }

  bool ShmDirEmpty() const { return std::filesystem::is_empty(shm_dir_); }

  static constexpr uint64_t kFileBytes = (1 << 20) + 1234;  // ends mid-page
  std::string dir_, shm_dir_, path_;
};

TEST_F(SharedReadsTest, OverlappingRangesAreReadOnceAndHandedOver) {
  // Ranks 0 and 1 both read most of the file (to its unaligned end); rank 2
  // reads a range nobody else does and still reads some shared blocks for
  // them.
  const std::vector<std::vector<std::pair<uint64_t, uint64_t>>> ranges = {
      {{100, 700'000}, {800'000, kFileBytes}},
      {{5'000, 705'000}, {795'000, kFileBytes}},
      {{710'000, 790'000}}};
  std::vector<FileSystem*> fs(3, DefaultFileSystem());
  auto got = ReadAll(ranges, fs, Options());
  for (int r = 0; r < 3; ++r) EXPECT_TRUE(got[r].first) << "rank " << r;
  // Blocks are dealt round-robin, so ranks 0 and 1 each took about 2/3 of
  // their bytes from the others.
  EXPECT_GT(got[0].second, 300'000u);
  EXPECT_GT(got[1].second, 300'000u);
  EXPECT_EQ(got[2].second, 0u);  // nothing it reads is shared
  EXPECT_TRUE(ShmDirEmpty());    // the name is gone once everyone has it mapped
}

TEST_F(SharedReadsTest, DisjointRangesShareNothing) {
  const std::vector<std::vector<std::pair<uint64_t, uint64_t>>> ranges = {
      {{0, 500'000}}, {{500'000, kFileBytes}}};
  std::vector<FileSystem*> fs(2, DefaultFileSystem());
  auto got = ReadAll(ranges, fs, Options());
  EXPECT_FALSE(got[0].first);
  EXPECT_FALSE(got[1].first);
  EXPECT_TRUE(ShmDirEmpty());
}

TEST_F(SharedReadsTest, NoSharedMemoryMeansEachRankReadsAlone) {
  const std::vector<std::vector<std::pair<uint64_t, uint64_t>>> ranges = {
      {{0, kFileBytes}}, {{0, kFileBytes}}};
  SharedReadsOptions o = Options();
  o.dir = dir_ + "/missing";
  std::vector<FileSystem*> fs(2, DefaultFileSystem());
  auto got = ReadAll(ranges, fs, o);
  EXPECT_FALSE(got[0].first);
  EXPECT_FALSE(got[1].first);
  o.dir = shm_dir_;
  o.max_bytes = 0;  // no budget: nothing to share
  got = ReadAll(ranges, fs, o);
  EXPECT_FALSE(got[0].first);
  o.enabled = false;
  got = ReadAll(ranges, fs, Options());  // rank 1 alone is willing
  EXPECT_TRUE(got[0].first);
  got = ReadAll(ranges, fs, o);
  EXPECT_FALSE(got[1].first);
}

TEST_F(SharedReadsTest, BlocksAPeerCannotReadAreReadDirectly) {
  const std::vector<std::vector<std::pair<uint64_t, uint64_t>>> ranges = {
      {{0, kFileBytes}}, {{0, kFileBytes}}};
  ReaderFaultFs failing(ReaderFaultFs::Mode::kFailOpen);
  std::vector<FileSystem*> fs = {&failing, DefaultFileSystem()};
  auto got = ReadAll(ranges, fs, Options());
  ASSERT_TRUE(got[0].first && got[1].first);
  EXPECT_EQ(got[1].second, 0u);  // rank 0's blocks were all unavailable
  EXPECT_GT(got[0].second, 0u);  // rank 1's were fine
}

TEST_F(SharedReadsTest, AStalledPeerIsGivenUpOn) {
  const std::vector<std::vector<std::pair<uint64_t, uint64_t>>> ranges = {
      {{0, kFileBytes}}, {{0, kFileBytes}}};
  ReaderFaultFs slow(ReaderFaultFs::Mode::kSlowRead);
  std::vector<FileSystem*> fs = {&slow, DefaultFileSystem()};
  SharedReadsOptions o = Options();
  o.block_bytes = 512 << 10;  // 3 blocks: rank 0 reads 2 of them, 1.5 s each
  o.stall_timeout = std::chrono::milliseconds(200);
  auto got = ReadAll(ranges, fs, o);
  ASSERT_TRUE(got[0].first && got[1].first);
  EXPECT_EQ(got[1].second, 0u);  // gave up on rank 0's blocks, read them itself
}

// End to end: w saved as row halves, loaded as column halves by two ranks.
class SharedLoadTest : public ::testing::Test {
 protected:
  void SetUp() override { root_ = testing::MakeTempDir("shared-load") + "/ckpt"; }
  void TearDown() override { std::filesystem::remove_all(std::filesystem::path(root_).parent_path()); }

  void SaveRows(const Shape& shape) {
    shape_ = shape;
    const uint64_t half = shape_[0] / 2;
    RunRanks(2, [&](int r, Comm& comm) {
      std::vector<OwnedShard> shards = {
          MakeShard("w", DType::kF32, shape_, {Box{{r * half, 0}, {half, shape_[1]}}, std::nullopt}),
          MakeShard("b", DType::kBF16, {1024}, {Box{{r * 512ull}, {512}}, std::nullopt})};
      SaveState state;
      for (const auto& s : shards) state.tensors.push_back(s.View());
      ASSERT_TRUE(Save(state, root_, comm, SaveOptions{}).ok());
    });
  }

  // Rank r loads column half r of w (or row half r, `same`), and all of b.
  // Returns each rank's result.
  std::vector<Result<LoadResult>> Load2(bool same, LoadOptions options) {
    std::vector<Result<LoadResult>> out(2, InternalError("not run"));
    RunRanks(2, [&](int r, Comm& comm) {
      const uint64_t rows = shape_[0], cols = shape_[1];
      const Box box = same ? Box{{r * rows / 2, 0}, {rows / 2, cols}}
                           : Box{{0, r * cols / 2}, {rows, cols / 2}};
      // push_back moves: a copy's target.data would point at the original.
      std::vector<OwnedTarget> targets;
      targets.push_back(MakeTarget("w", DType::kF32, shape_, {box, std::nullopt}));
      targets.push_back(MakeTarget("b", DType::kBF16, {1024}, {Box{{0}, {1024}}, std::nullopt}));
      LoadRequest req;
      for (auto& t : targets) req.tensors.push_back(t.target);
      out[r] = Load(req, root_, comm, options);
      if (!out[r].ok()) return;
      for (const auto& t : targets) EXPECT_TRUE(MatchesOracle(t)) << "rank " << r << " " << t.target.key;
    });
    return out;
  }

  static LoadOptions Sharing() {
    LoadOptions o;
    o.share_reads = true;
    return o;
  }

  Shape shape_;
  std::string root_;
};

TEST_F(SharedLoadTest, ReshardedLoadTakesPeersBytesAndVerifiesThem) {
  // Rows of 4 KiB: each rank reads the other's half of every row too (into
  // scratch) and checksums it. Rows of 128 KiB: each reads only its half
  // and takes the checksums of the rest from the block readers.
  for (const Shape& shape : {Shape{1024, 1024}, Shape{64, 32768}}) {
    SaveRows(shape);
    for (const Result<LoadResult>& r : Load2(/*same=*/false, Sharing())) {
      ASSERT_TRUE(r.ok()) << r.status().ToString();
      EXPECT_GT(r->bytes_from_peers, 0u) << shape[1];
      EXPECT_LE(r->bytes_from_peers, r->bytes_read) << shape[1];
      EXPECT_GT(r->chunks_verified, 0u) << shape[1];
      // Each rank reads one of the two files (one block each) for both and
      // takes the other's: all of it with narrow rows, its half with wide.
      if (shape[1] == 1024) {
        EXPECT_GT(r->bytes_from_peers * 3, r->bytes_read);
      } else {
        EXPECT_LT(r->bytes_from_peers * 3, r->bytes_read);
      }
    }
    std::filesystem::remove_all(root_);
  }
}

TEST_F(SharedLoadTest, CorruptBytesARankSkipsAreStillCaught) {
  SaveRows({64, 32768});  // 8 MiB; rank 0's file holds rows 0-31
  // A byte of row 16 of w, in rank 1's column half: rank 0 does not read it.
  const std::string file = root_ + "/data-00000-000.safetensors";
  std::ifstream in(file, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::vector<std::byte> needle =
      testing::OracleShard("w", DType::kF32, shape_, {Box{{16, 20000}, {1, 16}}, std::nullopt});
  const size_t at = bytes.find(std::string(reinterpret_cast<const char*>(needle.data()), needle.size()));
  ASSERT_NE(at, std::string::npos);
  FlipByte(file, at + 5, 0x01);
  for (const Result<LoadResult>& r : Load2(/*same=*/false, Sharing())) {
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), StatusCode::kDataLoss) << r.status().ToString();
    EXPECT_NE(r.status().ToString().find("checksum mismatch"), std::string::npos)
        << r.status().ToString();
  }
}

TEST_F(SharedLoadTest, SameLayoutOrSharingOffReadsAlone) {
  SaveRows({1024, 1024});
  for (const Result<LoadResult>& r : Load2(/*same=*/true, Sharing())) {
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(r->bytes_from_peers, 0u) << "only b overlaps: below min_bytes";
  }
  for (const Result<LoadResult>& r : Load2(/*same=*/false, LoadOptions{})) {
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(r->bytes_from_peers, 0u) << "off by default";
  }
  LoadOptions buffered = Sharing();
  buffered.direct_io = false;
  for (const Result<LoadResult>& r : Load2(/*same=*/false, buffered)) {
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(r->bytes_from_peers, 0u);
  }
}

}  // namespace
}  // namespace shardsafe
