// Tests of a root's naming and bookkeeping on their own: tags and tag
// formats, the names a save writes, commit records and their sequence, what
// counts as committed, and claiming a directory for deletion. Listing,
// `latest` and retention over whole saves are tested in src/engine/.
#include "engine/catalog/checkpoint_dir.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

#include "shardsafe/filesystem.h"
#include "shardsafe/index.h"
#include "testing/status_matchers.h"
#include "testing/storage_test_util.h"

namespace shardsafe {
namespace {

using ::testing::HasSubstr;
using ::testing::Optional;

TEST(StepOfTagTest, ReadsTheStepOfStepTagsOnly) {
  EXPECT_THAT(StepOfTag("step-12"), Optional(int64_t{12}));
  EXPECT_THAT(StepOfTag("step-00000007"), Optional(int64_t{7}));
  EXPECT_THAT(StepOfTag("step-0"), Optional(int64_t{0}));
  for (const char* tag : {"step-", "step-1x", "step--1", "step-+1", "global_step3", "best", ""}) {
    EXPECT_EQ(StepOfTag(tag), std::nullopt) << tag;
  }
}

TEST(TagFormatTest, FormatsTheStepWithItsWidth) {
  auto padded = TagFormat::Parse("step-{step:08d}");
  ASSERT_TRUE(padded.ok()) << padded.status().ToString();
  EXPECT_EQ(padded->Format(42), "step-00000042");
  EXPECT_EQ(padded->Format(123456789), "step-123456789") << "a wider step is never cut";
  auto plain = TagFormat::Parse("global_step{step}.ckpt");
  ASSERT_TRUE(plain.ok()) << plain.status().ToString();
  EXPECT_EQ(plain->Format(7), "global_step7.ckpt");
}

TEST(TagFormatTest, RefusesFormatsWithoutOneValidPlaceholder) {
  const struct {
    const char* format;
    const char* why;
  } cases[] = {
      {"step", "needs one {step} or {step:0Nd}"},
      {"step-{step", "needs one {step} or {step:0Nd}"},
      {"step-{step:8d}", "must be {step} or {step:0Nd}"},
      {"step-{step:08x}", "must be {step} or {step:0Nd}"},
      {"step-{step:021d}", "width must be a number up to 20"},
      {"{step}-{step}", "needs exactly one {step}"},
      {".hidden{step}", "starts with '.'"},
      {"a/b{step}", "outside [A-Za-z0-9._+=-]"},
  };
  for (const auto& c : cases) {
    EXPECT_TRUE(IsError(TagFormat::Parse(c.format), StatusCode::kInvalidArgument,
                        "tag format \"" + std::string(c.format) + "\""));
    EXPECT_TRUE(IsError(TagFormat::Parse(c.format), StatusCode::kInvalidArgument, c.why));
  }
}

TEST(SavedFilesTest, TellsASaveFilesAndWhichSaveWroteThem) {
  for (const char* name : {"data-00000-000.safetensors", "shardsafe.chunks",
                           "chunks-00003.chunks", "checksums-00001.crc32c"}) {
    EXPECT_TRUE(IsSavedFile(name)) << name;
  }
  for (const char* name : {"shardsafe.json", "commit.json", "latest", "x.safetensors.tmp"}) {
    EXPECT_FALSE(IsSavedFile(name)) << name;
  }
  EXPECT_TRUE(WrittenBySave("data-00000-000.ab12.safetensors", ".ab12"));
  EXPECT_TRUE(WrittenBySave("checksums-00001.ab12.crc32c", ".ab12"));
  EXPECT_TRUE(WrittenBySave("shardsafe.ab12.chunks", ".ab12"));
  EXPECT_FALSE(WrittenBySave("data-00000-000.cd34.safetensors", ".ab12"));
  EXPECT_FALSE(WrittenBySave("data-00000-000.safetensors", ".ab12"));
  EXPECT_FALSE(WrittenBySave("shardsafe.json", ".ab12"));
}

class CatalogDirTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_TRUE(dir_.ok()); }

  // Makes directory `name` under the scratch root, with `record` as its
  // commit.json when given.
  std::string MakeDir(const std::string& name, std::optional<CommitRecord> record = {}) {
    const std::string dir = dir_.File(name);
    EXPECT_TRUE(fs_.CreateDir(dir).ok());
    if (record) {
      EXPECT_TRUE(WriteFileAtomically(fs_, JoinPath(dir, std::string(kCommitFileName)),
                                          SerializeCommitRecord(*record))
                      .ok());
    }
    return dir;
  }

  FileSystem& fs_ = *DefaultFileSystem();
  testing::ScratchDir dir_{testing::DiskParent()};
};

TEST_F(CatalogDirTest, ACommitRecordReadsBackAsWritten) {
  const CommitRecord written{.sequence = 17, .time_ns = 1234567890123, .step = 40,
                             .moved_latest = true};
  auto read = ReadCommitRecord(fs_, MakeDir("step-40", written));
  ASSERT_TRUE(read.ok()) << read.status().ToString();
  ASSERT_TRUE(read->has_value());
  EXPECT_EQ((*read)->sequence, 17u);
  EXPECT_EQ((*read)->time_ns, 1234567890123);
  EXPECT_EQ((*read)->step, std::optional<int64_t>(40));
  EXPECT_TRUE((*read)->moved_latest);

  auto stepless =
      ReadCommitRecord(fs_, MakeDir("best", CommitRecord{.sequence = 1, .step = std::nullopt}));
  ASSERT_TRUE(stepless.ok()) << stepless.status().ToString();
  ASSERT_TRUE(stepless->has_value());
  EXPECT_EQ((*stepless)->step, std::nullopt);
  EXPECT_FALSE((*stepless)->moved_latest);

  auto none = ReadCommitRecord(fs_, MakeDir("old"));
  ASSERT_TRUE(none.ok()) << none.status().ToString();
  EXPECT_FALSE(none->has_value()) << "a checkpoint from before commit records";
}

TEST_F(CatalogDirTest, TheNextSequenceFollowsTheLargestOfTheRootsTags) {
  auto first = NextCommitRecord(fs_, dir_.path(), 1, true);
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  EXPECT_EQ(first->sequence, 1u) << "an empty root starts at 1";
  EXPECT_EQ(first->step, std::optional<int64_t>(1));
  EXPECT_TRUE(first->moved_latest);
  EXPECT_GT(first->time_ns, 0);

  MakeDir("step-1", CommitRecord{.sequence = 9, .step = std::nullopt});
  MakeDir("step-2", CommitRecord{.sequence = 5, .step = std::nullopt});
  MakeDir("step-3");  // no record: takes no part
  // Not tags, so not checkpoints of the root: their records take no part.
  MakeDir(".tmp-step-4", CommitRecord{.sequence = 100, .step = std::nullopt});
  ASSERT_TRUE(WriteFileAtomically(fs_, dir_.File("latest"), "step-1\n").ok());
  auto next = NextCommitRecord(fs_, dir_.path(), std::nullopt, false);
  ASSERT_TRUE(next.ok()) << next.status().ToString();
  EXPECT_EQ(next->sequence, 10u);
  EXPECT_EQ(next->step, std::nullopt);
  EXPECT_FALSE(next->moved_latest);

  EXPECT_TRUE(IsError(NextCommitRecord(fs_, dir_.File("missing"), 1, true),
                      StatusCode::kNotFound));
}

TEST_F(CatalogDirTest, CommittedMeansAnIndexFileInside) {
  const std::string bare = MakeDir("bare");
  EXPECT_FALSE(IsCommitted(fs_, bare));
  const std::string with_index = MakeDir("indexed");
  ASSERT_TRUE(
      WriteFileAtomically(fs_, JoinPath(with_index, std::string(kIndexFileName)), "{}").ok());
  EXPECT_TRUE(IsCommitted(fs_, with_index));
  const std::string dir_index = MakeDir("dir-index");
  ASSERT_TRUE(fs_.CreateDir(JoinPath(dir_index, std::string(kIndexFileName))).ok());
  EXPECT_FALSE(IsCommitted(fs_, dir_index)) << "an index that is a directory";
  EXPECT_FALSE(IsCommitted(fs_, dir_.File("missing")));
}

TEST_F(CatalogDirTest, ADirectoryInUseIsNotClaimed) {
  const std::string dir = MakeDir("step-1");
  ASSERT_TRUE(WriteFileAtomically(fs_, JoinPath(dir, std::string(kIndexFileName)), "{}").ok());
  {
    auto saving = fs_.TryLock(dir, LockMode::kExclusive);  // a save writing it
    ASSERT_TRUE(saving.ok()) << saving.status().ToString();
    EXPECT_FALSE(ClaimDir(fs_, dir).has_value());
  }
  {
    auto loading = fs_.TryLock(JoinPath(dir, std::string(kIndexFileName)), LockMode::kShared);
    ASSERT_TRUE(loading.ok()) << loading.status().ToString();
    EXPECT_FALSE(ClaimDir(fs_, dir).has_value()) << "a load reading its index";
  }
  auto claimed = ClaimDir(fs_, dir);
  ASSERT_TRUE(claimed.has_value());
  EXPECT_EQ(claimed->path, dir);
  EXPECT_NE(claimed->lock, nullptr);
  EXPECT_NE(claimed->index_lock, nullptr);
  // Claimed, it is no one else's: a second claim fails while the first holds it.
  EXPECT_FALSE(ClaimDir(fs_, dir).has_value());
  std::vector<ClaimedDir> dirs;
  dirs.push_back(std::move(*claimed));
  ASSERT_TRUE(RemoveClaimed(fs_, std::move(dirs)).ok());
  EXPECT_TRUE(IsError(fs_.Stat(dir), StatusCode::kNotFound));
}

}  // namespace
}  // namespace shardsafe
