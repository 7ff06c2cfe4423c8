// SharedRing across real processes: a peer that dies, a /dev/shm too small
// for the ring asked for. (Rings inside loads: shared_reads_test.cc.)
#include "engine/shared_reads/shared_ring.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>

namespace shardsafe {
namespace {

// Long enough that a test passing by the stall timeout, not by noticing the
// exit, fails on the message (and shows in the test's time).
constexpr auto kStall = std::chrono::seconds(60);
constexpr uint64_t kSlot = 4096;

std::string RingName(const char* what) {
  return "/shardsafe-test-" + std::string(what) + "-" + std::to_string(getpid());
}

// A forked child: it runs `ready`, tells the parent (WaitReady), waits for
// Go, runs `exit` and leaves with _exit (no atexit handlers of the parent),
// its code ready's when nonzero (exit then does not run), else exit's.
class Child {
 public:
  template <typename Ready, typename Exit>
  Child(Ready ready, Exit exit) {
    if (pipe(to_child_) != 0 || pipe(to_parent_) != 0) std::abort();
    pid_ = fork();
    if (pid_ == 0) {
      const int code = ready();
      char c = 1;
      if (write(to_parent_[1], &c, 1) != 1) _exit(99);
      if (read(to_child_[0], &c, 1) != 1) _exit(98);
      _exit(code != 0 ? code : exit());
    }
  }
  pid_t pid() const { return pid_; }
  bool WaitReady() {
    char c;
    return read(to_parent_[0], &c, 1) == 1;
  }
  void Go() {
    char c = 1;
    if (write(to_child_[1], &c, 1) != 1) std::abort();
  }
  // Lets it exit and reaps it; its exit code.
  int Reap() {
    int status = 0;
    waitpid(pid_, &status, 0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128;
  }
  ~Child() {
    for (int fd : {to_child_[0], to_child_[1], to_parent_[0], to_parent_[1]}) close(fd);
  }

 private:
  int to_child_[2];
  int to_parent_[2];
  pid_t pid_;
};

TEST(SharedRingTest, AProducerWaitingOnAConsumerThatDiedFailsNamingIt) {
  const std::string name = RingName("consumer-died");
  auto ring = SharedRing::Create(name, 2, kSlot, 2, /*self=*/0, /*rank=*/0, kStall);
  ASSERT_TRUE(ring.ok()) << ring.status().ToString();
  Child child(
      [&] {
        auto mine = SharedRing::Open(name, kStall);
        if (!mine.ok()) return 1;
        (*mine)->Join(1, 7);
        mine->release();  // the mapping stays until exit
        return 0;
      },
      [] { return 0; });  // exits holding block 0
  ASSERT_TRUE(child.WaitReady());
  SharedRing::Unlink(name);
  (*ring)->Watch();
  (*ring)->Release(0, SharedRing::kDetached);
  ASSERT_TRUE((*ring)->AcquireSlot(0).ok());
  ASSERT_TRUE((*ring)->AcquireSlot(1).ok());
  child.Go();  // not reaped: a zombie still counts as exited
  auto slot = (*ring)->AcquireSlot(2);  // fails as the peer exited, not at the stall timeout
  ASSERT_FALSE(slot.ok());
  EXPECT_EQ(slot.status().code(), StatusCode::kUnavailable);
  const std::string pid = std::to_string(child.pid());
  EXPECT_NE(slot.status().message().find("rank 7 (pid " + pid + ")"), std::string::npos)
      << slot.status().ToString();
  EXPECT_NE(slot.status().message().find("exited"), std::string::npos);
  EXPECT_EQ(child.Reap(), 0);
}

TEST(SharedRingTest, AConsumerWaitingOnAProducerThatDiedFailsNamingIt) {
  const std::string name = RingName("producer-died");
  Child child(
      [&] {
        auto mine = SharedRing::Create(name, 2, kSlot, 2, /*self=*/0, /*rank=*/3, kStall);
        if (!mine.ok()) return 1;
        mine->release();
        return 0;
      },
      [] { return 0; });  // exits before publishing anything
  ASSERT_TRUE(child.WaitReady());
  auto ring = SharedRing::Open(name, kStall);
  SharedRing::Unlink(name);
  ASSERT_TRUE(ring.ok()) << ring.status().ToString();
  (*ring)->Join(1, 5);
  (*ring)->Watch();
  child.Go();
  EXPECT_EQ(child.Reap(), 0);  // reaped: gone entirely
  auto block = (*ring)->WaitBlock(0);
  ASSERT_FALSE(block.ok());
  EXPECT_EQ(block.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(block.status().message().find("rank 3 (pid " + std::to_string(child.pid()) +
                                          "), which reads the blocks of this ring, exited"),
            std::string::npos)
      << block.status().ToString();
}

TEST(SharedRingTest, ALiveButSilentPeerFailsAfterTheStallTimeout) {
  const std::string name = RingName("stall");
  auto ring = SharedRing::Create(name, 2, kSlot, 1, 0, 0, std::chrono::milliseconds(200));
  SharedRing::Unlink(name);
  ASSERT_TRUE(ring.ok());
  (*ring)->Watch();
  auto block = (*ring)->WaitBlock(0);  // this process produces nothing
  ASSERT_FALSE(block.ok());
  EXPECT_NE(block.status().message().find("did not come for 200 ms"), std::string::npos)
      << block.status().ToString();
}

// /dev/shm without room for 8 slots (here: a file size limit, which tmpfs
// enforces like a full disk) gets a ring of fewer; the ring still works.
TEST(SharedRingTest, TooLittleSharedMemoryGivesFewerSlots) {
  const std::string name = RingName("small");
  constexpr uint64_t kBigSlot = 1 << 20;
  Child child(
      [&] {
        signal(SIGXFSZ, SIG_IGN);
        const rlimit limit{5 * kBigSlot, 5 * kBigSlot};  // header + 4 slots fit, not 8
        if (setrlimit(RLIMIT_FSIZE, &limit) != 0) return 2;
        auto ring = SharedRing::Create(name, 8, kBigSlot, 1, 0, 0, kStall);
        SharedRing::Unlink(name);
        if (!ring.ok()) return 3;
        if ((*ring)->slots() != 4) return 10 + static_cast<int>((*ring)->slots());
        for (uint32_t k = 0; k < 12; ++k) {
          auto slot = (*ring)->AcquireSlot(k);
          if (!slot.ok()) return 4;
          std::memset(*slot, static_cast<int>(k), kBigSlot);
          (*ring)->Publish(k);
          auto got = (*ring)->WaitBlock(k);
          if (!got.ok() || (*got)[kBigSlot - 1] != static_cast<char>(k)) return 5;
          (*ring)->Release(0, k + 1);
        }
        const rlimit tiny{kBigSlot, kBigSlot};  // not even 2 slots
        if (setrlimit(RLIMIT_FSIZE, &tiny) != 0) return 2;
        auto none = SharedRing::Create(name, 8, kBigSlot, 1, 0, 0, kStall);
        return none.status().code() == StatusCode::kResourceExhausted ? 0 : 6;
      },
      [] { return 0; });
  ASSERT_TRUE(child.WaitReady());
  child.Go();
  EXPECT_EQ(child.Reap(), 0) << "10 + n: n slots; else the step that failed";
}

// A producer killed between creating its ring and removing the name leaves
// the segment in /dev/shm; RemoveAbandoned removes it (a load's producers
// call it: shared_reads_test.cc, ManyBlocksThroughFewSlotsArriveIntact).
TEST(SharedRingTest, RingsOfExitedProducersAreRemoved) {
  const std::string abandoned = RingName("abandoned");
  const std::string live = RingName("live");
  const std::string other = "/dev/shm/shardsafe-test-not-a-ring-" + std::to_string(getpid());
  Child child([&] { return SharedRing::Create(abandoned, 2, kSlot, 1, 0, 0, kStall).ok() ? 0 : 1; },
              [] { return 0; });  // exits without Unlink
  ASSERT_TRUE(child.WaitReady());
  child.Go();
  ASSERT_EQ(child.Reap(), 0);
  auto mine = SharedRing::Create(live, 2, kSlot, 1, 0, 0, kStall);
  ASSERT_TRUE(mine.ok());
  { std::ofstream(other) << "not a ring"; }
  ASSERT_TRUE(std::filesystem::exists("/dev/shm" + abandoned));

  EXPECT_GE(SharedRing::RemoveAbandoned(), 1);
  EXPECT_FALSE(std::filesystem::exists("/dev/shm" + abandoned));
  EXPECT_TRUE(std::filesystem::exists("/dev/shm" + live)) << "its producer lives";
  EXPECT_TRUE(std::filesystem::exists(other)) << "not a ring";
  SharedRing::Unlink(live);
  std::filesystem::remove(other);
}

}  // namespace
}  // namespace shardsafe
