// Tests of SingleProcessComm and ThreadComm: every collective with 1, 2, 4
// and 8 ranks, payloads of different sizes (empty included), long runs of
// back-to-back collectives, and bad roots. Run under TSan as well.
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "comm/agree.h"
#include "gtest/gtest.h"
#include "shardsafe/comm.h"

namespace shardsafe {
namespace {

// Payload of rank r in round k: size varies by rank and round, may be empty.
std::string Payload(int rank, int round) {
  const size_t n = static_cast<size_t>((rank * 37 + round * 11) % 50) * (rank % 3);
  return std::string(n, static_cast<char>('a' + (rank + round) % 26));
}

// Runs body(comm) on one thread per rank; returns the failure count.
int RunRanks(int n, const std::function<int(Comm&)>& body) {
  auto comms = MakeThreadComms(n);
  std::vector<int> failures(n, 0);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] { failures[r] = body(*comms[r]); });
  }
  for (auto& t : threads) t.join();
  int total = 0;
  for (int f : failures) total += f;
  return total;
}

int CheckAllGather(Comm& comm, int round) {
  auto got = comm.AllGather(Payload(comm.rank(), round));
  if (!got.ok() || static_cast<int>(got->size()) != comm.size()) return 1;
  int bad = 0;
  for (int r = 0; r < comm.size(); ++r) bad += (*got)[r] != Payload(r, round);
  return bad;
}

int CheckGather(Comm& comm, int root, int round) {
  auto got = comm.Gather(Payload(comm.rank(), round), root);
  if (!got.ok()) return 1;
  if (comm.rank() != root) return !got->empty();
  if (static_cast<int>(got->size()) != comm.size()) return 1;
  int bad = 0;
  for (int r = 0; r < comm.size(); ++r) bad += (*got)[r] != Payload(r, round);
  return bad;
}

int CheckScatter(Comm& comm, int root, int round) {
  std::vector<std::string> parts;
  for (int r = 0; comm.rank() == root && r < comm.size(); ++r) parts.push_back(Payload(r, round));
  auto got = comm.Scatter(parts, root);
  return !got.ok() || *got != Payload(comm.rank(), round);
}

// What rank `from` sends rank `to` in an AllToAll of round k.
std::string PairPayload(int from, int to, int round) {
  return Payload(from, round + to) + std::to_string(to) + ":" + std::string(to % 3, 'x');
}

int CheckAllToAll(Comm& comm, int round) {
  std::vector<std::string> parts;
  for (int r = 0; r < comm.size(); ++r) parts.push_back(PairPayload(comm.rank(), r, round));
  auto got = comm.AllToAll(parts);
  if (!got.ok() || static_cast<int>(got->size()) != comm.size()) return 1;
  int bad = 0;
  for (int r = 0; r < comm.size(); ++r) bad += (*got)[r] != PairPayload(r, comm.rank(), round);
  return bad;
}

// Every rank fails when one rank passes the wrong number of parts.
int CheckAllToAllOfBadParts(Comm& comm) {
  std::vector<std::string> parts(comm.size() + (comm.rank() == comm.size() - 1 ? 1 : 0));
  return comm.AllToAll(parts).status().code() != StatusCode::kInvalidArgument;
}

// Values that differ by rank, the largest of each from a different rank,
// with the top bit set on some (unsigned comparison).
std::vector<uint64_t> Values(int rank, int n) {
  std::vector<uint64_t> v(n);
  for (int i = 0; i < n; ++i) {
    v[i] = (static_cast<uint64_t>((rank + i) % 5) << 40) + rank * 7 + i;
    if (i % 3 == 2) v[i] |= uint64_t{1} << 63;
  }
  return v;
}

int CheckAllReduceMax(Comm& comm, int n) {
  auto got = comm.AllReduceMax(Values(comm.rank(), n));
  if (!got.ok()) return 1;
  std::vector<uint64_t> want(n, 0);
  for (int r = 0; r < comm.size(); ++r) {
    const std::vector<uint64_t> v = Values(r, n);
    for (int i = 0; i < n; ++i) want[i] = std::max(want[i], v[i]);
  }
  return *got != want;
}

// A backend that provides only the required collectives, so that Comm's
// defaults (Gather, Scatter, AllReduceMax, AllToAll) run.
class MinimalComm : public Comm {
 public:
  explicit MinimalComm(Comm& inner) : inner_(inner) {}
  int rank() const override { return inner_.rank(); }
  int size() const override { return inner_.size(); }
  Result<std::vector<std::string>> AllGather(std::string_view mine) override {
    return inner_.AllGather(mine);
  }
  Result<std::string> Broadcast(std::string_view data, int root) override {
    return inner_.Broadcast(data, root);
  }
  Status Barrier() override { return inner_.Barrier(); }

 private:
  Comm& inner_;
};

int CheckBroadcast(Comm& comm, int root, int round) {
  const std::string mine = comm.rank() == root ? Payload(root, round) : "ignored";
  auto got = comm.Broadcast(mine, root);
  return !got.ok() || *got != Payload(root, round);
}

TEST(SingleProcessCommTest, CollectivesAreTheIdentity) {
  auto comm = MakeSingleProcessComm();
  EXPECT_EQ(comm->rank(), 0);
  EXPECT_EQ(comm->size(), 1);
  auto all = comm->AllGather("x");
  ASSERT_TRUE(all.ok());
  EXPECT_EQ(*all, std::vector<std::string>{"x"});
  auto b = comm->Broadcast("y", 0);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(*b, "y");
  EXPECT_TRUE(comm->Barrier().ok());
  EXPECT_EQ(comm->Broadcast("y", 1).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(CheckGather(*comm, 0, 1) + CheckAllReduceMax(*comm, 3) + CheckScatter(*comm, 0, 2) +
                CheckAllToAll(*comm, 5) + CheckAllToAllOfBadParts(*comm),
            0);
  EXPECT_EQ(comm->Gather("z", 1).status().code(), StatusCode::kInvalidArgument);
}

class ThreadCommTest : public ::testing::TestWithParam<int> {};

TEST_P(ThreadCommTest, RanksAndSizes) {
  EXPECT_EQ(RunRanks(GetParam(), [](Comm& c) { return c.size() != GetParam(); }), 0);
  auto comms = MakeThreadComms(GetParam());
  for (int r = 0; r < GetParam(); ++r) EXPECT_EQ(comms[r]->rank(), r);
}

TEST_P(ThreadCommTest, AllGatherOfDifferentSizesIncludingEmpty) {
  EXPECT_EQ(RunRanks(GetParam(), [](Comm& c) { return CheckAllGather(c, 0) + CheckAllGather(c, 1); }),
            0);
}

TEST_P(ThreadCommTest, AllGatherOfAllEmpty) {
  EXPECT_EQ(RunRanks(GetParam(),
                     [](Comm& c) {
                       auto got = c.AllGather("");
                       return !got.ok() || *got != std::vector<std::string>(c.size());
                     }),
            0);
}

TEST_P(ThreadCommTest, BroadcastFromEveryRoot) {
  EXPECT_EQ(RunRanks(GetParam(),
                     [](Comm& c) {
                       int bad = 0;
                       for (int root = 0; root < c.size(); ++root) bad += CheckBroadcast(c, root, root);
                       return bad;
                     }),
            0);
}

TEST_P(ThreadCommTest, BroadcastWithInvalidRootFailsOnEveryRank) {
  EXPECT_EQ(RunRanks(GetParam(),
                     [](Comm& c) {
                       int bad = c.Broadcast("x", c.size()).status().code() !=
                                 StatusCode::kInvalidArgument;
                       bad += c.Broadcast("x", -1).status().code() != StatusCode::kInvalidArgument;
                       return bad + CheckBroadcast(c, 0, 3);  // still usable afterwards
                     }),
            0);
}

TEST_P(ThreadCommTest, GatherToEveryRoot) {
  EXPECT_EQ(RunRanks(GetParam(),
                     [](Comm& c) {
                       int bad = 0;
                       for (int root = 0; root < c.size(); ++root) bad += CheckGather(c, root, root);
                       bad += c.Gather("x", c.size()).status().code() !=
                              StatusCode::kInvalidArgument;
                       return bad + CheckGather(c, 0, 5);  // still usable afterwards
                     }),
            0);
}

TEST_P(ThreadCommTest, ScatterFromEveryRoot) {
  EXPECT_EQ(RunRanks(GetParam(),
                     [](Comm& c) {
                       int bad = 0;
                       for (int root = 0; root < c.size(); ++root) bad += CheckScatter(c, root, root);
                       const std::vector<std::string> one_short(c.size() - 1);
                       bad += c.Scatter(one_short, 0).status().code() !=
                              StatusCode::kInvalidArgument;
                       bad += c.Scatter({}, c.size()).status().code() != StatusCode::kInvalidArgument;
                       return bad + CheckScatter(c, 0, 4);  // still usable afterwards
                     }),
            0);
}

TEST_P(ThreadCommTest, AllToAllOfDifferentSizesIncludingEmpty) {
  EXPECT_EQ(RunRanks(GetParam(),
                     [](Comm& c) {
                       int bad = 0;
                       for (int round = 0; round < 5; ++round) bad += CheckAllToAll(c, round);
                       bad += CheckAllToAllOfBadParts(c);
                       return bad + CheckAllToAll(c, 9);  // still usable afterwards
                     }),
            0);
}

TEST_P(ThreadCommTest, AllReduceMaxOfNoneOneAndManyValues) {
  EXPECT_EQ(RunRanks(GetParam(),
                     [](Comm& c) {
                       return CheckAllReduceMax(c, 0) + CheckAllReduceMax(c, 1) +
                              CheckAllReduceMax(c, 100);
                     }),
            0);
}

TEST_P(ThreadCommTest, TheDefaultGatherScatterAllReduceMaxAndAllToAllGiveTheSame) {
  EXPECT_EQ(RunRanks(GetParam(),
                     [](Comm& c) {
                       MinimalComm minimal(c);
                       const std::vector<std::string> one_short(c.size() - 1);
                       return CheckGather(minimal, c.size() - 1, 2) +
                              CheckAllReduceMax(minimal, 7) + CheckScatter(minimal, 0, 6) +
                              (minimal.Scatter(one_short, 0).status().code() !=
                               StatusCode::kInvalidArgument) +
                              CheckAllToAll(minimal, 3) + CheckAllToAllOfBadParts(minimal);
                     }),
            0);
}

TEST(ThreadCommMismatchTest, AllReduceMaxOfDifferentCountsFailsOnEveryRank) {
  for (int ranks : {2, 4}) {
    EXPECT_EQ(RunRanks(ranks,
                       [](Comm& c) {
                         MinimalComm minimal(c);
                         const int n = c.rank() == 1 ? 2 : 3;
                         return (c.AllReduceMax(Values(c.rank(), n)).status().code() !=
                                 StatusCode::kInvalidArgument) +
                                (minimal.AllReduceMax(Values(c.rank(), n)).status().code() !=
                                 StatusCode::kInvalidArgument);
                       }),
              0)
        << ranks << " ranks";
  }
}

TEST_P(ThreadCommTest, BarrierHoldsEveryRankUntilAllArrive) {
  const int n = GetParam();
  std::atomic<int> before{0};
  EXPECT_EQ(RunRanks(n,
                     [&](Comm& c) {
                       int bad = 0;
                       for (int i = 0; i < 20; ++i) {
                         before.fetch_add(1);
                         bad += !c.Barrier().ok();
                         bad += before.load() < (i + 1) * n;  // all arrived at barrier i
                         bad += !c.Barrier().ok();            // nobody starts i+1 early
                       }
                       return bad;
                     }),
            0);
}

TEST_P(ThreadCommTest, ThousandsOfMixedCollectivesBackToBack) {
  EXPECT_EQ(RunRanks(GetParam(),
                     [](Comm& c) {
                       int bad = 0;
                       for (int k = 0; k < 1000; ++k) {
                         switch (k % 6) {
                           case 0: bad += CheckAllGather(c, k); break;
                           case 1: bad += CheckBroadcast(c, k % c.size(), k); break;
                           case 2: bad += !c.Barrier().ok(); break;
                           case 3: bad += CheckGather(c, k % c.size(), k); break;
                           case 4: bad += CheckAllReduceMax(c, k % 4); break;
                           case 5: bad += CheckScatter(c, k % c.size(), k); break;
                         }
                       }
                       return bad;
                     }),
            0);
}

// Needs at least two ranks, so it runs over its own rank counts.
TEST(ThreadCommMismatchTest, MismatchedCollectivesAreReportedNotHung) {
  for (int ranks : {2, 4, 8}) {
    EXPECT_EQ(RunRanks(ranks,
                       [](Comm& c) {
                         Status s = c.rank() == 0 ? c.Barrier() : c.AllGather("x").status();
                         return s.code() != StatusCode::kInternal;
                       }),
              0)
        << ranks << " ranks";
  }
}

// A failure's code, message and detail reach every rank.
TEST(AgreeTest, EveryRankGetsTheFailingRanksDetail) {
  EXPECT_EQ(RunRanks(3,
                     [](Comm& c) {
                       Status local = c.rank() != 1 ? Status()
                                                    : InvalidArgumentError("shape mismatch")
                                                          .WithDetail(ErrorDetail::kShapeMismatch);
                       Status s = AgreeOnStatus(c, local);
                       return s.code() != StatusCode::kInvalidArgument ||
                              s.detail() != ErrorDetail::kShapeMismatch ||
                              s.message() != "rank 1: shape mismatch";
                     }),
            0);
}

// The lowest failing rank's error, whichever ranks fail; the maximum when
// none does; a payload on the root only.
TEST(AgreeTest, ReduceMaxAndGatherToRootNameTheLowestFailingRank) {
  EXPECT_EQ(RunRanks(4,
                     [](Comm& c) {
                       const Status local = c.rank() == 2 || c.rank() == 3
                                                ? DataLossError("disk " + std::to_string(c.rank()))
                                                : Status();
                       int bad = 0;
                       Result<std::vector<uint64_t>> max = ReduceMaxOrFail(c, local, {1, 2});
                       bad += max.status().message() != "rank 2: disk 2";
                       max = ReduceMaxOrFail(c, Status(), {uint64_t(c.rank()), 9});
                       bad += !max.ok() || *max != std::vector<uint64_t>{3, 9};
                       auto gathered = GatherToRootOrFail(c, 1, local, "p" + std::to_string(c.rank()));
                       if (c.rank() == 1) {
                         bad += gathered.status().message() != "rank 2: disk 2";
                       } else {
                         bad += gathered.ok() != local.ok();
                       }
                       gathered = GatherToRootOrFail(c, 1, Status(), "p" + std::to_string(c.rank()));
                       const std::vector<std::string> want =
                           c.rank() == 1 ? std::vector<std::string>{"p0", "p1", "p2", "p3"}
                                         : std::vector<std::string>{};
                       bad += !gathered.ok() || *gathered != want;
                       return bad;
                     }),
            0);
}

INSTANTIATE_TEST_SUITE_P(Ranks, ThreadCommTest, ::testing::Values(1, 2, 4, 8));

}  // namespace
}  // namespace shardsafe
