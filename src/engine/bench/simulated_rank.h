// One rank of a simulated job, for the planner benchmark: the Comm a real
// rank's save calls, whose collectives return what the job's other ranks
// would have sent (queued by the benchmark) and which counts the bytes this
// rank sends and receives through it, with no network algorithm modelled:
//   AllGather            its own message once, every other rank's once
//   AllToAll             its messages to the others once, theirs to it once
//   Gather               rooted here: its own message once, every other
//                        rank's once; not rooted here: its own message once
//   Scatter              rooted here: every other rank's part once; not
//                        rooted here: its own part once
//   Broadcast            the message once (sent, or received)
//   AllReduceMax         the values twice (sent and received)
// Nothing is transported and nothing waits, so the engine code that runs
// between the collectives (encoding, decoding, planning) is what a timer
// around it measures.
//
// A collective that needs a queued round finds none: InternalError.
// Collectives not overridden here run Comm's defaults over these, and are
// counted as those. Not thread-safe.
#pragma once

#include <cstdint>
#include <deque>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "engine/testing/plan_simulation.h"
#include "shardsafe/comm.h"

namespace shardsafe::bench {

class SimulatedRank final : public Comm {
 public:
  SimulatedRank(int rank, int size) : rank_(rank), size_(size) {}

  // Queues what every rank sends to the next AllGather, or to the next
  // Gather rooted here, as the collective's caller frames it, by rank (slot
  // rank() is replaced by what this rank sends).
  void QueueGather(std::vector<std::string> all) {
    uint64_t others = 0;
    for (size_t r = 0; r < all.size(); ++r) others += r == size_t(rank_) ? 0 : all[r].size();
    gathers_.push_back({std::move(all), others});
  }

  // Queues what every rank sends this one in the next AllToAll, by rank
  // (slot rank() is replaced by what this rank sends itself).
  void QueueAllToAll(std::vector<std::string> to_me) {
    uint64_t others = 0;
    for (size_t r = 0; r < to_me.size(); ++r) others += r == size_t(rank_) ? 0 : to_me[r].size();
    all_to_all_.push_back({std::move(to_me), others});
  }

  // Queues what a simulation recorded that the others sent this rank
  // (plan_simulation.h), after what is queued.
  void Queue(RankInbox inbox) {
    for (auto& to_me : inbox.all_to_all) QueueAllToAll(std::move(to_me));
    for (auto& all : inbox.gathered) QueueGather(std::move(all));
    for (auto& part : inbox.scattered) QueueScattered(std::move(part));
  }

  // Queues what the root of the next Broadcast not rooted here sends.
  void QueueBroadcast(std::string from_root) { broadcasts_.push_back(std::move(from_root)); }

  // Queues this rank's part of the next Scatter not rooted here, as the
  // root sends it.
  void QueueScattered(std::string part) { scattered_.push_back(std::move(part)); }

  // The largest part that the last Scatter rooted here sent to another
  // rank (the lowest such rank of equal ones), and that rank; rank 0 and
  // nothing before such a Scatter.
  struct SentPart {
    int rank = 0;
    std::string part;
  };
  SentPart TakeLargestSentPart() { return std::exchange(largest_sent_, SentPart{}); }

  // Bytes sent plus bytes received since the last call.
  uint64_t TakeBytes() { return std::exchange(bytes_, 0); }

  int rank() const override { return rank_; }
  int size() const override { return size_; }

  Result<std::vector<std::string>> AllGather(std::string_view mine) override {
    if (gathers_.empty()) return InternalError("simulated rank: no all-gather queued");
    Gathered round = std::move(gathers_.front());
    gathers_.pop_front();
    round.all[rank_] = std::string(mine);
    bytes_ += mine.size() + round.others_bytes;
    return std::move(round.all);
  }

  Result<std::vector<std::string>> AllToAll(const std::vector<std::string>& parts) override {
    if (all_to_all_.empty()) return InternalError("simulated rank: no all-to-all queued");
    if (parts.size() != size_t(size_)) {
      return InvalidArgumentError("simulated rank: all-to-all of " + std::to_string(parts.size()) +
                                  " messages over " + std::to_string(size_) + " ranks");
    }
    Gathered round = std::move(all_to_all_.front());
    all_to_all_.pop_front();
    for (size_t r = 0; r < parts.size(); ++r) bytes_ += r == size_t(rank_) ? 0 : parts[r].size();
    round.all[rank_] = parts[rank_];
    bytes_ += round.others_bytes;
    return std::move(round.all);
  }

  Result<std::vector<std::string>> Gather(std::string_view mine, int root) override {
    if (root == rank_) return AllGather(mine);
    bytes_ += mine.size();
    return std::vector<std::string>();
  }

  Result<std::string> Scatter(const std::vector<std::string>& parts, int root) override {
    if (root != rank_) {
      if (scattered_.empty()) return InternalError("simulated rank: no scatter queued");
      std::string mine = std::move(scattered_.front());
      scattered_.pop_front();
      bytes_ += mine.size();
      return mine;
    }
    if (parts.size() != size_t(size_)) {
      return InvalidArgumentError("simulated rank: scatter of " + std::to_string(parts.size()) +
                                  " parts over " + std::to_string(size_) + " ranks");
    }
    size_t largest = rank_ == 0 ? 1 : 0;
    for (size_t r = 0; r < parts.size(); ++r) {
      if (r == size_t(rank_)) continue;
      bytes_ += parts[r].size();
      if (parts[r].size() > parts[largest].size()) largest = r;
    }
    if (largest < parts.size()) largest_sent_ = {static_cast<int>(largest), parts[largest]};
    return parts[rank_];
  }

  // Every rank passes the values this rank passes (as in a save's quick
  // check when no rank has a cached plan, or every rank's is current), so
  // their maximum is these values.
  Result<std::vector<uint64_t>> AllReduceMax(std::span<const uint64_t> values) override {
    bytes_ += 2 * values.size_bytes();
    return std::vector<uint64_t>(values.begin(), values.end());
  }

  Result<std::string> Broadcast(std::string_view data, int root) override {
    if (root == rank_) {
      bytes_ += data.size();
      return std::string(data);
    }
    if (broadcasts_.empty()) return InternalError("simulated rank: no broadcast queued");
    std::string from_root = std::move(broadcasts_.front());
    broadcasts_.pop_front();
    bytes_ += from_root.size();
    return from_root;
  }

  Status Barrier() override { return Status(); }

 private:
  struct Gathered {
    std::vector<std::string> all;
    uint64_t others_bytes = 0;
  };
  int rank_;
  int size_;
  std::deque<Gathered> gathers_;
  std::deque<Gathered> all_to_all_;
  std::deque<std::string> broadcasts_;
  std::deque<std::string> scattered_;
  SentPart largest_sent_;
  uint64_t bytes_ = 0;
};

}  // namespace shardsafe::bench
