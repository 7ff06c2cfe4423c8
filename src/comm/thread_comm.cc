// ThreadComm: n ranks as threads of one process, for tests and for
// single-node use without MPI.
//
// The ranks share one Rendezvous. A collective is one "round":
//   1. each rank deposits its contribution (operation, root, bytes) in its
//      slot and waits;
//   2. the last rank to arrive checks that all ranks called the same
//      operation with the same root, publishes the round's outcome as an
//      immutable shared object, clears the slots and bumps `generation`;
//   3. every waiting rank wakes on the new generation and takes a reference
//      to the outcome, then copies what it needs outside the lock.
// A rank that races ahead into the next round only touches the cleared
// slots, never the published outcome, and that round cannot complete (and
// replace the outcome) until every rank, including the slowest reader of the
// previous round, has arrived. So rounds can follow each other without limit.
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

#include "shardsafe/comm.h"
#include "comm/gathered_max.h"

namespace shardsafe {
namespace {

enum class Op { kAllGather, kBroadcast, kBarrier, kGather, kAllReduceMax, kScatter, kAllToAll };

const char* OpName(Op op) {
  switch (op) {
    case Op::kAllGather: return "AllGather";
    case Op::kBroadcast: return "Broadcast";
    case Op::kBarrier: return "Barrier";
    case Op::kGather: return "Gather";
    case Op::kAllReduceMax: return "AllReduceMax";
    case Op::kScatter: return "Scatter";
    case Op::kAllToAll: return "AllToAll";
  }
  return "?";
}

bool HasRoot(Op op) { return op == Op::kBroadcast || op == Op::kGather || op == Op::kScatter; }

struct Contribution {
  Op op = Op::kBarrier;
  int root = 0;
  std::string bytes;
  std::vector<std::string> parts;  // Scatter, on the root; AllToAll
};

// What every rank of a round receives.
struct Outcome {
  Status status;
  std::vector<std::string> values;  // by rank (AllGather, Gather, Scatter); [0] for Broadcast
  std::vector<uint64_t> max;        // AllReduceMax
  std::vector<std::vector<std::string>> sent;  // AllToAll: by sender, then receiver
};

class Rendezvous {
 public:
  explicit Rendezvous(int n) : slots_(n) {}
  int size() const { return static_cast<int>(slots_.size()); }

  // Runs one round for `rank`; returns the shared outcome.
  std::shared_ptr<const Outcome> Exchange(int rank, Contribution mine) {
    std::unique_lock<std::mutex> lock(mu_);
    slots_[rank] = std::move(mine);
    if (++arrived_ < size()) {
      const uint64_t round = generation_;
      cv_.wait(lock, [&] { return generation_ != round; });
      return outcome_;
    }
    outcome_ = Publish();
    arrived_ = 0;
    ++generation_;
    cv_.notify_all();
    return outcome_;
  }

 private:
  // Called by the last arrival, under the lock.
  std::shared_ptr<const Outcome> Publish() {
    auto out = std::make_shared<Outcome>();
    out->status = Validate();
    if (out->status.ok()) {
      const Contribution& first = slots_[0];
      if (first.op == Op::kAllGather || first.op == Op::kGather) {
        for (Contribution& c : slots_) out->values.push_back(std::move(c.bytes));
      } else if (first.op == Op::kBroadcast) {
        out->values.push_back(std::move(slots_[first.root].bytes));
      } else if (first.op == Op::kScatter) {
        out->values = std::move(slots_[first.root].parts);
        out->status = CheckScatterParts(out->values, size());
      } else if (first.op == Op::kAllToAll) {
        for (int r = 0; r < size() && out->status.ok(); ++r) {
          out->status = CheckAllToAllParts(slots_[r].parts, size());
        }
        for (Contribution& c : slots_) out->sent.push_back(std::move(c.parts));
      } else if (first.op == Op::kAllReduceMax) {
        std::vector<std::string> gathered;
        for (Contribution& c : slots_) gathered.push_back(std::move(c.bytes));
        auto max = MaxOfGathered(gathered);
        out->status = max.status();
        if (max.ok()) out->max = std::move(*max);
      }
    }
    for (Contribution& c : slots_) c = Contribution();
    return out;
  }

  // Every rank must be in the same collective, with the same valid root.
  Status Validate() const {
    const Contribution& first = slots_[0];
    for (int r = 1; r < size(); ++r) {
      if (slots_[r].op != first.op) {
        return InternalError(std::string("ranks called different collectives: rank 0 ") +
                             OpName(first.op) + ", rank " + std::to_string(r) + " " +
                             OpName(slots_[r].op));
      }
      if (HasRoot(first.op) && slots_[r].root != first.root) {
        return InvalidArgumentError(std::string("ranks disagree on the ") + OpName(first.op) +
                                    " root");
      }
    }
    if (HasRoot(first.op) && (first.root < 0 || first.root >= size())) {
      return InvalidArgumentError(std::string(OpName(first.op)) + " root " +
                                  std::to_string(first.root) + " is not a rank of a group of " +
                                  std::to_string(size()));
    }
    return Status();
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Contribution> slots_;         // guarded by mu_
  int arrived_ = 0;                         // guarded by mu_
  uint64_t generation_ = 0;                 // guarded by mu_
  std::shared_ptr<const Outcome> outcome_;  // guarded by mu_; immutable once published
};

class ThreadComm final : public Comm {
 public:
  ThreadComm(std::shared_ptr<Rendezvous> rendezvous, int rank)
      : rendezvous_(std::move(rendezvous)), rank_(rank) {}

  int rank() const override { return rank_; }
  int size() const override { return rendezvous_->size(); }

  Result<std::vector<std::string>> AllGather(std::string_view mine) override {
    auto out = rendezvous_->Exchange(rank_, {Op::kAllGather, 0, std::string(mine), {}});
    if (!out->status.ok()) return out->status;
    return out->values;  // a copy: other ranks read the same outcome
  }

  Result<std::string> Broadcast(std::string_view data, int root) override {
    std::string bytes = rank_ == root ? std::string(data) : std::string();
    auto out = rendezvous_->Exchange(rank_, {Op::kBroadcast, root, std::move(bytes), {}});
    if (!out->status.ok()) return out->status;
    return out->values[0];
  }

  Status Barrier() override {
    return rendezvous_->Exchange(rank_, {Op::kBarrier, 0, {}, {}})->status;
  }

  Result<std::vector<std::string>> Gather(std::string_view mine, int root) override {
    auto out = rendezvous_->Exchange(rank_, {Op::kGather, root, std::string(mine), {}});
    if (!out->status.ok()) return out->status;
    if (rank_ != root) return std::vector<std::string>();
    return out->values;
  }

  Result<std::string> Scatter(const std::vector<std::string>& parts, int root) override {
    Contribution mine{Op::kScatter, root, {}, {}};
    if (rank_ == root) mine.parts = parts;
    auto out = rendezvous_->Exchange(rank_, std::move(mine));
    if (!out->status.ok()) return out->status;
    return out->values[rank_];
  }

  Result<std::vector<std::string>> AllToAll(const std::vector<std::string>& parts) override {
    auto out = rendezvous_->Exchange(rank_, {Op::kAllToAll, 0, {}, parts});
    if (!out->status.ok()) return out->status;
    std::vector<std::string> mine;
    for (const std::vector<std::string>& from : out->sent) mine.push_back(from[rank_]);
    return mine;
  }

  Result<std::vector<uint64_t>> AllReduceMax(std::span<const uint64_t> values) override {
    auto out = rendezvous_->Exchange(rank_, {Op::kAllReduceMax, 0, PackValues(values), {}});
    if (!out->status.ok()) return out->status;
    return out->max;
  }

 private:
  std::shared_ptr<Rendezvous> rendezvous_;
  const int rank_;
};

}  // namespace

std::vector<std::unique_ptr<Comm>> MakeThreadComms(int n) {
  auto rendezvous = std::make_shared<Rendezvous>(n);
  std::vector<std::unique_ptr<Comm>> comms;
  for (int r = 0; r < n; ++r) comms.push_back(std::make_unique<ThreadComm>(rendezvous, r));
  return comms;
}

}  // namespace shardsafe
