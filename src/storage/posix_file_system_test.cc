// Tests of DefaultFileSystem()'s directory operations and of the helpers in
// file_util.cc (atomic writes, whole-file reads, path arithmetic).
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>

#include "gtest/gtest.h"
#include "shardsafe/filesystem.h"
#include "testing/status_matchers.h"
#include "testing/storage_test_util.h"

namespace shardsafe {
namespace {

using ::shardsafe::testing::DiskParent;
using ::shardsafe::testing::ScratchDir;

class PosixFileSystemTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_TRUE(dir_.ok()); }
  void Put(const std::string& path, const std::string& data) {
    ASSERT_TRUE(WriteFileAtomically(fs_, path, data).ok());
  }
  std::string Get(const std::string& path) {
    auto r = ReadFileToString(fs_, path, 1 << 20);
    return r.ok() ? *r : "<" + r.status().ToString() + ">";
  }
  std::vector<std::string> Names(const std::string& path) {
    auto entries = fs_.ListDir(path);
    std::vector<std::string> names;
    if (entries.ok()) {
      for (auto& e : *entries) names.push_back(e.name + (e.is_dir ? "/" : ""));
    }
    std::sort(names.begin(), names.end());
    return names;
  }

  FileSystem& fs_ = *DefaultFileSystem();
  ScratchDir dir_{DiskParent()};
};

TEST_F(PosixFileSystemTest, StatReportsSizeKindAndMissing) {
  Put(dir_.File("f"), "12345");
  auto info = fs_.Stat(dir_.File("f"));
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->size, 5u);
  EXPECT_FALSE(info->is_dir);
  EXPECT_GT(info->mtime_seconds, 1600000000);
  auto dir = fs_.Stat(dir_.path());
  ASSERT_TRUE(dir.ok());
  EXPECT_TRUE(dir->is_dir);
  EXPECT_EQ(fs_.Stat(dir_.File("missing")).status().code(), StatusCode::kNotFound);
}

TEST_F(PosixFileSystemTest, ListDirSkipsDotEntriesAndMarksDirectories) {
  ASSERT_TRUE(fs_.CreateDir(dir_.File("sub")).ok());
  Put(dir_.File("a"), "x");
  Put(dir_.File(".hidden"), "y");
  EXPECT_EQ(Names(dir_.path()), (std::vector<std::string>{".hidden", "a", "sub/"}));
  EXPECT_EQ(fs_.ListDir(dir_.File("nope")).status().code(), StatusCode::kNotFound);
}

TEST_F(PosixFileSystemTest, CreateDirTwiceIsAlreadyExists) {
  ASSERT_TRUE(fs_.CreateDir(dir_.File("d")).ok());
  EXPECT_EQ(fs_.CreateDir(dir_.File("d")).code(), StatusCode::kAlreadyExists);
  EXPECT_EQ(fs_.CreateDir(dir_.File("no/such/parent")).code(), StatusCode::kNotFound);
}

TEST_F(PosixFileSystemTest, RemoveFileOfMissingIsNotFound) {
  Put(dir_.File("f"), "x");
  EXPECT_TRUE(fs_.RemoveFile(dir_.File("f")).ok());
  EXPECT_EQ(fs_.RemoveFile(dir_.File("f")).code(), StatusCode::kNotFound);
}

TEST_F(PosixFileSystemTest, RemoveAllRemovesTreesAndToleratesMissing) {
  ASSERT_TRUE(fs_.CreateDir(dir_.File("t")).ok());
  ASSERT_TRUE(fs_.CreateDir(dir_.File("t/u")).ok());
  ASSERT_TRUE(fs_.CreateDir(dir_.File("t/u/v")).ok());
  Put(dir_.File("t/u/v/deep"), "x");
  Put(dir_.File("t/top"), "y");
  EXPECT_TRUE(fs_.RemoveAll(dir_.File("t")).ok());
  EXPECT_EQ(fs_.Stat(dir_.File("t")).status().code(), StatusCode::kNotFound);
  EXPECT_TRUE(fs_.RemoveAll(dir_.File("t")).ok());
  Put(dir_.File("plain"), "z");
  EXPECT_TRUE(fs_.RemoveAll(dir_.File("plain")).ok());
  EXPECT_EQ(fs_.Stat(dir_.File("plain")).status().code(), StatusCode::kNotFound);
}

TEST_F(PosixFileSystemTest, RemoveAllDoesNotFollowSymlinks) {
  ASSERT_TRUE(fs_.CreateDir(dir_.File("keep")).ok());
  Put(dir_.File("keep/precious"), "x");
  ASSERT_TRUE(fs_.CreateDir(dir_.File("t")).ok());
  ASSERT_EQ(symlink(dir_.File("keep").c_str(), dir_.File("t/link").c_str()), 0);
  EXPECT_TRUE(fs_.RemoveAll(dir_.File("t")).ok());
  EXPECT_EQ(Get(dir_.File("keep/precious")), "x");
}

TEST_F(PosixFileSystemTest, RenameReplacesAFileTarget) {
  Put(dir_.File("a"), "new");
  Put(dir_.File("b"), "old");
  ASSERT_TRUE(fs_.Rename(dir_.File("a"), dir_.File("b")).ok());
  EXPECT_EQ(Get(dir_.File("b")), "new");
  EXPECT_EQ(fs_.Stat(dir_.File("a")).status().code(), StatusCode::kNotFound);
}

TEST_F(PosixFileSystemTest, RenameNeverReplacesADirectoryTarget) {
  ASSERT_TRUE(fs_.CreateDir(dir_.File("src")).ok());
  Put(dir_.File("src/x"), "1");
  ASSERT_TRUE(fs_.CreateDir(dir_.File("empty")).ok());
  ASSERT_TRUE(fs_.CreateDir(dir_.File("full")).ok());
  Put(dir_.File("full/y"), "2");
  Put(dir_.File("file"), "3");
  EXPECT_EQ(fs_.Rename(dir_.File("src"), dir_.File("empty")).code(), StatusCode::kAlreadyExists);
  EXPECT_EQ(fs_.Rename(dir_.File("src"), dir_.File("full")).code(), StatusCode::kAlreadyExists);
  EXPECT_EQ(fs_.Rename(dir_.File("file"), dir_.File("empty")).code(), StatusCode::kAlreadyExists);
  EXPECT_EQ(Names(dir_.File("empty")), std::vector<std::string>{});
  EXPECT_EQ(Get(dir_.File("src/x")), "1");
  EXPECT_EQ(Get(dir_.File("full/y")), "2");
}

TEST_F(PosixFileSystemTest, RenameMovesADirectoryToANewName) {
  ASSERT_TRUE(fs_.CreateDir(dir_.File("src")).ok());
  Put(dir_.File("src/x"), "1");
  ASSERT_TRUE(fs_.Rename(dir_.File("src"), dir_.File("dst")).ok());
  EXPECT_EQ(Get(dir_.File("dst/x")), "1");
  EXPECT_EQ(fs_.Rename(dir_.File("src"), dir_.File("again")).code(), StatusCode::kNotFound);
}

TEST_F(PosixFileSystemTest, RenameExchangeSwapsTwoDirectories) {
  ASSERT_TRUE(fs_.CreateDir(dir_.File("a")).ok());
  ASSERT_TRUE(fs_.CreateDir(dir_.File("b")).ok());
  Put(dir_.File("a/f"), "from a");
  Put(dir_.File("b/f"), "from b");
  ASSERT_TRUE(fs_.RenameExchange(dir_.File("a"), dir_.File("b")).ok());
  EXPECT_EQ(Get(dir_.File("a/f")), "from b");
  EXPECT_EQ(Get(dir_.File("b/f")), "from a");
  EXPECT_EQ(fs_.RenameExchange(dir_.File("a"), dir_.File("missing")).code(),
            StatusCode::kNotFound);
}

TEST_F(PosixFileSystemTest, SyncDirOfMissingIsNotFound) {
  EXPECT_TRUE(fs_.SyncDir(dir_.path()).ok());
  EXPECT_EQ(fs_.SyncDir(dir_.File("missing")).code(), StatusCode::kNotFound);
}

TEST_F(PosixFileSystemTest, WriteFileAtomicallyReplacesAndLeavesNoTemp) {
  Put(dir_.File("f"), "first");
  Put(dir_.File("f"), "second, longer");
  EXPECT_EQ(Get(dir_.File("f")), "second, longer");
  EXPECT_EQ(Names(dir_.path()), std::vector<std::string>{"f"});
}

TEST_F(PosixFileSystemTest, ReadFileToStringEnforcesTheLimit) {
  Put(dir_.File("f"), std::string(100, 'x'));
  EXPECT_TRUE(ReadFileToString(fs_, dir_.File("f"), 100).ok());
  EXPECT_EQ(ReadFileToString(fs_, dir_.File("f"), 99).status().code(),
            StatusCode::kResourceExhausted);
  EXPECT_EQ(ReadFileToString(fs_, dir_.File("nope"), 99).status().code(), StatusCode::kNotFound);
}

TEST_F(PosixFileSystemTest, ReadsWithinADirectoryNeverFollowALinkOutOfIt) {
  ASSERT_TRUE(fs_.CreateDir(dir_.File("ckpt")).ok());
  ASSERT_TRUE(fs_.CreateDir(dir_.File("ckpt/sub")).ok());
  Put(dir_.File("secret"), "outside");
  Put(dir_.File("ckpt/sub/inner"), "inside");
  ASSERT_EQ(symlink("../secret", dir_.File("ckpt/out").c_str()), 0);
  ASSERT_EQ(symlink("sub/inner", dir_.File("ckpt/in").c_str()), 0);
  ASSERT_EQ(symlink(dir_.File("ckpt").c_str(), dir_.File("alias").c_str()), 0);
  const ReadOptions within{.direct = false, .within = dir_.File("ckpt")};
  auto out = ReadFileToString(fs_, dir_.File("ckpt/out"), 100, within);
  EXPECT_EQ(out.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(out.status().message().find("a symbolic link leading outside"), std::string::npos)
      << out.status().message();
  EXPECT_NE(out.status().message().find("ckpt/out"), std::string::npos);
  // A link that stays inside is followed; so is a link in the directory's own path.
  EXPECT_EQ(*ReadFileToString(fs_, dir_.File("ckpt/in"), 100, within), "inside");
  const ReadOptions via_alias{.direct = false, .within = dir_.File("alias")};
  EXPECT_EQ(*ReadFileToString(fs_, dir_.File("alias/sub/inner"), 100, via_alias), "inside");
  EXPECT_TRUE(IsError(ReadFileToString(fs_, dir_.File("alias/out"), 100, via_alias),
                      StatusCode::kInvalidArgument, "a symbolic link leading outside"));
  // A prefix of the name is not the directory: ckpt2 is outside ckpt.
  ASSERT_TRUE(fs_.CreateDir(dir_.File("ckpt2")).ok());
  Put(dir_.File("ckpt2/f"), "x");
  ASSERT_EQ(symlink("../ckpt2/f", dir_.File("ckpt/sibling").c_str()), 0);
  EXPECT_TRUE(IsError(ReadFileToString(fs_, dir_.File("ckpt/sibling"), 100, within),
                      StatusCode::kInvalidArgument, "a symbolic link leading outside"));
  // Unconfined reads follow links as before.
  EXPECT_EQ(Get(dir_.File("ckpt/out")), "outside");
}

TEST_F(PosixFileSystemTest, URIsAreRefusedNotTakenForLocalPaths) {
  // In the scratch directory: "s3://b" taken for a path would create "s3:" here.
  const std::string cwd = std::filesystem::current_path();
  std::filesystem::current_path(dir_.path());
  for (const std::string uri : {"s3://bucket/run/step-1", "gs://b/x", "file:///tmp/x"}) {
    SCOPED_TRACE(uri);
    EXPECT_EQ(fs_.CreateDir(uri).code(), StatusCode::kUnimplemented);
    EXPECT_EQ(CreateDirs(fs_, uri).code(), StatusCode::kUnimplemented);
    // Nor a prefix of it: "s3:" would be a local directory.
    const std::string scheme = uri.substr(0, uri.find(':') + 1);
    EXPECT_EQ(fs_.Stat(scheme).status().code(), StatusCode::kNotFound) << scheme << " was created";
    auto info = fs_.Stat(uri);
    EXPECT_EQ(info.status().code(), StatusCode::kUnimplemented);
    const char* says = uri.starts_with("s3:") ? "does not take object storage URIs" : ":// URIs";
    EXPECT_NE(info.status().message().find(says), std::string::npos) << info.status().message();
  }
  // A local name with a colon is still a path.
  EXPECT_TRUE(fs_.CreateDir(dir_.File("a:b")).ok());
  EXPECT_TRUE(fs_.Stat(dir_.File("a:b")).ok());
  std::filesystem::current_path(cwd);
}

TEST_F(PosixFileSystemTest, AChildForkedWhileALockIsHeldDoesNotKeepIt) {
  auto lock = fs_.TryLock(dir_.path(), LockMode::kExclusive);
  ASSERT_TRUE(lock.ok());
  int to_child[2], from_child[2];
  ASSERT_EQ(pipe(to_child), 0);
  ASSERT_EQ(pipe(from_child), 0);
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {  // lives until the parent is done: a data loader's worker
    char c = 'r';
    (void)!write(from_child[1], &c, 1);
    (void)!read(to_child[0], &c, 1);
    _exit(0);
  }
  char c;
  ASSERT_EQ(read(from_child[0], &c, 1), 1);
  lock->reset();  // the parent releases it while the child lives
  auto again = fs_.TryLock(dir_.path(), LockMode::kExclusive);
  EXPECT_TRUE(again.ok()) << again.status().ToString();
  (void)!write(to_child[1], &c, 1);
  int status = 0;
  waitpid(pid, &status, 0);
  for (int fd : {to_child[0], to_child[1], from_child[0], from_child[1]}) close(fd);
}

TEST(PathTest, JoinPath) {
  EXPECT_EQ(JoinPath("a/b", "c"), "a/b/c");
  EXPECT_EQ(JoinPath("a/b/", "c"), "a/b/c");
  EXPECT_EQ(JoinPath("", "c"), "c");
  EXPECT_EQ(JoinPath("/", "c"), "/c");
}

TEST(PathTest, ParentDir) {
  EXPECT_EQ(ParentDir("a/b/c"), "a/b");
  EXPECT_EQ(ParentDir("c"), ".");
  EXPECT_EQ(ParentDir("/c"), "/");
  EXPECT_EQ(ParentDir("/"), "/");
  EXPECT_EQ(ParentDir("a/b/"), "a");
  EXPECT_EQ(ParentDir("a//b"), "a");
  EXPECT_EQ(ParentDir("/x/y"), "/x");
}

}  // namespace
}  // namespace shardsafe
