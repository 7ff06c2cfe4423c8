// Tests of FillChecksums on a checkpoint with a chunk table (version 3),
// whose chunks' checksums are in one checksum file per writing rank: it
// fills every chunk's checksum from the file of the rank that wrote it,
// counts the bytes it read, and fails naming the file when one is damaged
// (DataLoss) or missing (NotFound).
#include "engine/load/checksum_files.h"

#include <gtest/gtest.h>

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "engine/load/source.h"
#include "shardsafe/checkpoint.h"
#include "shardsafe/comm.h"
#include "testing/status_matchers.h"
#include "testing/test_util.h"

namespace shardsafe {
namespace {

// Each chunk's checksum by (tensor, file, offset).
using Checksums = std::map<std::pair<std::string, std::pair<uint32_t, uint64_t>>, uint32_t>;

Checksums ChecksumsOf(const CheckpointIndex& index) {
  Checksums out;
  for (const auto& [key, t] : index.tensors) {
    for (const IndexChunk& c : t.chunks) {
      if (c.crc32c) out[{key, {c.file, c.at}}] = *c.crc32c;
    }
  }
  return out;
}

class ChecksumFilesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = MakeTempDir("checksum-files");
    path_ = dir_ + "/step-1";
    // Two ranks' rows of "w", and "b" whole from rank 1: both write chunks.
    RunRanks(2, [&](int r, Comm& comm) {
      std::vector<OwnedShard> shards = {
          MakeShard("w", DType::kF32, {4, 6}, {Box{{2u * r, 0}, {2, 6}}, std::nullopt})};
      if (r == 1) {
        shards.push_back(MakeShard("b", DType::kBF16, {6}, {Box::Whole({6}), std::nullopt}));
      }
      SaveState state;
      for (const OwnedShard& s : shards) state.tensors.push_back(s.View());
      SaveOptions options;
      options.chunk_table_min_chunks = 1;  // a chunk table, and checksum files
      auto saved = Save(state, path_, comm, options);
      EXPECT_TRUE(saved.ok()) << saved.status().ToString();
    });
  }
  void TearDown() override { DefaultFileSystem()->RemoveAll(dir_).IgnoreError(); }

  // The index with every chunk read from the table (and its checksum).
  CheckpointIndex Opened() {
    auto opened = OpenSource(fs_, path_, OpenHow{.packed = false});
    EXPECT_TRUE(opened.ok()) << opened.status().ToString();
    return opened.ok() ? opened->index : CheckpointIndex{};
  }

  std::string dir_, path_;
  FileSystem& fs_ = *DefaultFileSystem();
};

TEST_F(ChecksumFilesTest, FillsEveryChunksChecksumFromItsWritersFile) {
  CheckpointIndex index = Opened();
  ASSERT_EQ(index.checksum_files.size(), 2u) << "one per rank that wrote chunks";
  const Checksums want = ChecksumsOf(index);
  ASSERT_EQ(want.size(), 3u) << "w's two boxes and b";
  for (auto& [key, t] : index.tensors) {
    for (IndexChunk& c : t.chunks) c.crc32c.reset();
  }
  uint64_t read = 0;
  ASSERT_TRUE(FillChecksums(fs_, path_, {}, &index, &read).ok());
  EXPECT_EQ(ChecksumsOf(index), want);
  uint64_t file_bytes = 0;
  for (uint32_t f : index.checksum_files) file_bytes += index.files[f].bytes;
  EXPECT_EQ(read, file_bytes) << "each checksum file read whole, once";
}

TEST_F(ChecksumFilesTest, ADamagedOrMissingFileFailsTheFillNamingIt) {
  CheckpointIndex index = Opened();
  ASSERT_FALSE(index.checksum_files.empty());
  const std::string file = JoinPath(path_, index.files[index.checksum_files[0]].name);
  for (auto& [key, t] : index.tensors) {
    for (IndexChunk& c : t.chunks) c.crc32c.reset();
  }
  FlipByte(file, 20, 0x01);
  CheckpointIndex damaged = index;
  EXPECT_TRUE(IsError(FillChecksums(fs_, path_, {}, &damaged), StatusCode::kDataLoss,
                      file + ": checksum file checksum mismatch"));
  ASSERT_TRUE(fs_.RemoveFile(file).ok());
  CheckpointIndex missing = index;
  EXPECT_TRUE(IsError(FillChecksums(fs_, path_, {}, &missing), StatusCode::kNotFound, file));
}

}  // namespace
}  // namespace shardsafe
