// Tests of FaultInjectingFileSystem: counting per kind, one-off failures of
// each kind, crash simulation, thread safety, and WriteFileAtomically under
// every fault it can meet.
#include "testing/fault_injection.h"

#include <algorithm>
#include <thread>

#include "gtest/gtest.h"
#include "testing/status_matchers.h"
#include "testing/storage_test_util.h"

namespace shardsafe {
namespace {

using ::shardsafe::testing::DiskParent;
using ::shardsafe::testing::ScratchDir;

Status Injected() { return UnavailableError("injected fault"); }

class FaultInjectionTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_TRUE(dir_.ok()); }

  // One of every counted operation, in a fixed order; returns the first error.
  Status DoEveryKind() {
    SS_RETURN_IF_ERROR(fs_.CreateDir(dir_.File("d")));
    SS_ASSIGN_OR_RETURN(auto file, fs_.NewWritableFile(dir_.File("d/f"), WriteOptions{}));
    SS_RETURN_IF_ERROR(file->Append("abc", 3));
    SS_RETURN_IF_ERROR(file->Sync());
    SS_RETURN_IF_ERROR(file->Close());
    SS_RETURN_IF_ERROR(fs_.Rename(dir_.File("d/f"), dir_.File("d/g")));
    SS_RETURN_IF_ERROR(fs_.SyncDir(dir_.File("d")));
    return fs_.RemoveAll(dir_.File("d"));
  }
  std::string Get(const std::string& path) {
    auto r = ReadFileToString(fs_, path, 1 << 20);
    return r.ok() ? *r : "<" + r.status().ToString() + ">";
  }
  std::vector<std::string> Names() {
    std::vector<std::string> names;
    auto entries = DefaultFileSystem()->ListDir(dir_.path());
    if (entries.ok()) {
      for (auto& e : *entries) names.push_back(e.name);
    }
    std::sort(names.begin(), names.end());
    return names;
  }

  ScratchDir dir_{DiskParent()};
  FaultInjectingFileSystem fs_{DefaultFileSystem()};
};

constexpr OpKind kAllKinds[] = {OpKind::kCreate,  OpKind::kAppend,    OpKind::kSync,
                                OpKind::kClose,   OpKind::kRename,    OpKind::kSyncDir,
                                OpKind::kCreateDir, OpKind::kRemove};

TEST_F(FaultInjectionTest, CountsEveryKindIncludingFileOperations) {
  ASSERT_TRUE(DoEveryKind().ok());
  for (OpKind kind : kAllKinds) EXPECT_EQ(fs_.count(kind), 1) << OpKindName(kind);
  EXPECT_EQ(fs_.total_count(), 8);
  EXPECT_EQ(fs_.injected_failures(), 0);
  ASSERT_TRUE(fs_.Stat(dir_.path()).ok());  // reads are not counted
  EXPECT_EQ(fs_.total_count(), 8);
  fs_.Reset();
  EXPECT_EQ(fs_.total_count(), 0);
}

TEST_F(FaultInjectionTest, FailNthFailsExactlyThatOperationOfEachKind) {
  for (OpKind kind : kAllKinds) {
    SCOPED_TRACE(OpKindName(kind));
    fs_.Reset();
    fs_.FailNth(kind, 0, Injected());
    Status s = DoEveryKind();
    EXPECT_EQ(s.code(), StatusCode::kUnavailable);
    EXPECT_EQ(s.message(), "injected fault");
    EXPECT_EQ(fs_.injected_failures(), 1);
    ASSERT_TRUE(DefaultFileSystem()->RemoveAll(dir_.File("d")).ok());
    fs_.Reset();
    EXPECT_TRUE(DoEveryKind().ok()) << "a one-off fault must not repeat";
  }
}

TEST_F(FaultInjectionTest, FailNthCountsFromArming) {
  ASSERT_TRUE(DoEveryKind().ok());
  fs_.FailNth(OpKind::kAppend, 2, Injected());
  auto file = fs_.NewWritableFile(dir_.File("f"), WriteOptions{});
  ASSERT_TRUE(file.ok());
  EXPECT_TRUE((*file)->Append("a", 1).ok());
  EXPECT_TRUE((*file)->Append("b", 1).ok());
  EXPECT_EQ((*file)->Append("c", 1).code(), StatusCode::kUnavailable);
  EXPECT_EQ((*file)->size(), 2u) << "a failed append writes nothing";
  EXPECT_TRUE((*file)->Append("d", 1).ok());
  ASSERT_TRUE((*file)->Close().ok());
  EXPECT_EQ(Get(dir_.File("f")), "abd");
}

TEST_F(FaultInjectionTest, FailAfterFailsEverythingFromTheNthOperation) {
  fs_.FailAfter(3, Injected());
  auto file = fs_.NewWritableFile(dir_.File("f"), WriteOptions{});  // op 0
  ASSERT_TRUE(file.ok());
  EXPECT_TRUE((*file)->Append("a", 1).ok());                          // op 1
  EXPECT_TRUE((*file)->Append("b", 1).ok());                          // op 2
  // op 3: the crash, and every operation after it.
  EXPECT_TRUE(IsError((*file)->Sync(), StatusCode::kUnavailable, "injected fault"));
  EXPECT_TRUE(IsError((*file)->Close(), StatusCode::kUnavailable, "injected fault"));
  EXPECT_TRUE(IsError(fs_.CreateDir(dir_.File("x")), StatusCode::kUnavailable, "injected fault"));
  EXPECT_EQ(fs_.injected_failures(), 3);
  fs_.ClearFaults();
  EXPECT_TRUE(fs_.CreateDir(dir_.File("x")).ok());
}

TEST_F(FaultInjectionTest, CountsAreExactUnderConcurrentUse) {
  constexpr int kThreads = 4, kAppends = 500;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      auto file = fs_.NewWritableFile(dir_.File("f" + std::to_string(t)), WriteOptions{});
      if (!file.ok()) return;
      for (int i = 0; i < kAppends; ++i) (*file)->Append("x", 1).IgnoreError();
      (*file)->Close().IgnoreError();
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(fs_.count(OpKind::kCreate), kThreads);
  EXPECT_EQ(fs_.count(OpKind::kAppend), kThreads * kAppends);
  EXPECT_EQ(fs_.count(OpKind::kClose), kThreads);
  EXPECT_EQ(fs_.total_count(), kThreads * (kAppends + 2));
}

TEST_F(FaultInjectionTest, AtomicWriteKeepsOldContentWhenSyncFails) {
  ASSERT_TRUE(WriteFileAtomically(fs_, dir_.File("f"), "old").ok());
  fs_.FailNth(OpKind::kSync, 0, Injected());
  Status s = WriteFileAtomically(fs_, dir_.File("f"), "new");
  EXPECT_EQ(s.code(), StatusCode::kUnavailable);
  EXPECT_NE(s.message().find(dir_.File("f")), std::string::npos) << s.message();
  EXPECT_EQ(Get(dir_.File("f")), "old");
  EXPECT_EQ(Names(), std::vector<std::string>{"f"}) << "temporary file left behind";
}

TEST_F(FaultInjectionTest, AtomicWriteKeepsOldContentWhenRenameFails) {
  ASSERT_TRUE(WriteFileAtomically(fs_, dir_.File("f"), "old").ok());
  fs_.FailNth(OpKind::kRename, 0, Injected());
  EXPECT_EQ(WriteFileAtomically(fs_, dir_.File("f"), "new").code(), StatusCode::kUnavailable);
  EXPECT_EQ(Get(dir_.File("f")), "old");
  EXPECT_EQ(Names(), std::vector<std::string>{"f"}) << "temporary file left behind";
}

TEST_F(FaultInjectionTest, AtomicWriteReportsEveryOneOffFault) {
  for (OpKind kind : kAllKinds) {
    SCOPED_TRACE(OpKindName(kind));
    ASSERT_TRUE(WriteFileAtomically(fs_, dir_.File("f"), "old").ok());
    fs_.FailNth(kind, 0, Injected());
    Status s = WriteFileAtomically(fs_, dir_.File("f"), "new");
    const bool used = kind != OpKind::kCreateDir && kind != OpKind::kRemove;
    EXPECT_EQ(s.ok(), !used) << s.ToString();
    EXPECT_EQ(Get(dir_.File("f")), s.ok() || kind == OpKind::kSyncDir ? "new" : "old");
    EXPECT_EQ(Names(), std::vector<std::string>{"f"});
    fs_.ClearFaults();
  }
}

TEST_F(FaultInjectionTest, AtomicWriteCrashAtEveryStepLeavesOldOrNew) {
  ASSERT_TRUE(WriteFileAtomically(fs_, dir_.File("f"), "old").ok());
  fs_.Reset();
  ASSERT_TRUE(WriteFileAtomically(fs_, dir_.File("f"), "new").ok());
  const int64_t steps = fs_.total_count();
  EXPECT_EQ(steps, 6);  // create, append, sync, close, rename, syncdir
  for (int64_t k = 0; k <= steps; ++k) {
    SCOPED_TRACE(k);
    ASSERT_TRUE(DefaultFileSystem()->RemoveAll(dir_.File("f")).ok());
    ASSERT_TRUE(WriteFileAtomically(*DefaultFileSystem(), dir_.File("f"), "old").ok());
    fs_.FailAfter(k, Injected());
    Status s = WriteFileAtomically(fs_, dir_.File("f"), "new");
    fs_.ClearFaults();
    EXPECT_EQ(s.ok(), k == steps);
    const std::string seen = Get(dir_.File("f"));
    EXPECT_TRUE(seen == "old" || seen == "new") << seen;
    EXPECT_EQ(seen, k >= 5 ? "new" : "old");
    for (const std::string& name : Names()) {  // a crash may strand the temp
      if (name != "f") {
        ASSERT_TRUE(DefaultFileSystem()->RemoveFile(dir_.File(name)).ok());
      }
    }
  }
}

}  // namespace
}  // namespace shardsafe
