#include "engine/testing/plan_simulation.h"

#include <chrono>
#include <memory>

namespace shardsafe {
namespace {

// The non-empty messages to one rank, back to back, and each one's sender
// and end.
struct Mailbox {
  std::string bytes;
  std::vector<std::pair<int, uint64_t>> ends;
};

// Empties `box` into one message per rank.
std::vector<std::string> Open(Mailbox& box, int world, uint64_t* received) {
  std::vector<std::string> out(world);
  uint64_t at = 0;
  for (const auto& [from, end] : box.ends) {
    out[from] = box.bytes.substr(at, end - at);
    at = end;
  }
  *received += box.bytes.size();
  box = Mailbox();
  return out;
}

void Post(const std::vector<std::string>& msgs, int from, std::vector<Mailbox>& boxes,
          uint64_t* sent) {
  for (size_t to = 0; to < msgs.size(); ++to) {
    if (msgs[to].empty()) continue;
    *sent += msgs[to].size();
    boxes[to].bytes += msgs[to];
    boxes[to].ends.emplace_back(from, boxes[to].bytes.size());
  }
}

template <typename F>
auto Timed(double* seconds, F&& f) {
  const auto t0 = std::chrono::steady_clock::now();
  auto out = f();
  *seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return out;
}

}  // namespace

PlanSimulation SimulatePlan(int world, const std::function<RankHoldings(int)>& holdings_of,
                            const SavePlanOptions& options,
                            const std::function<void(int, Result<SavePlan>)>& on_part,
                            const std::function<void()>& before_coordinate,
                            const std::function<void()>& after_coordinate,
                            const std::function<void(int, std::unique_ptr<KeyHome>)>& on_home) {
  const int n = world;
  PlanSimulation sim;
  sim.ranks.resize(n);
  std::vector<RankHoldings> holdings(n);  // blobs only after round 1
  std::vector<std::unique_ptr<RankPlanner>> ranks;
  std::vector<Mailbox> boxes(n), next(n);
  for (int r = 0; r < n; ++r) {
    SimulatedRankCost& c = sim.ranks[r];
    holdings[r] = holdings_of(r);
    ranks.push_back(std::make_unique<RankPlanner>(r, n, holdings[r], options));
    Post(Timed(&c.seconds, [&] { return ranks[r]->ToHomes(); }), r, boxes, &c.sent);
    std::vector<ShardInfo>().swap(holdings[r].shards);
  }
  // What each rank received from the others in round 1.
  const auto from_others = [&](int h) {
    uint64_t own = 0, at = 0;
    for (const auto& [from, end] : boxes[h].ends) {
      if (from == h) own = end - at;
      at = end;
    }
    return boxes[h].bytes.size() - own;
  };
  for (int h = 1; h < n; ++h) {
    if (sim.other < 0 || from_others(h) > from_others(sim.other)) sim.other = h;
  }
  const auto record = [&](int r, const std::vector<std::string>& in) {
    if (r == 0) sim.rank0_inbox.all_to_all.push_back(in);
    if (r == sim.other) sim.other_inbox.all_to_all.push_back(in);
  };
  for (int h = 0; h < n; ++h) {
    SimulatedRankCost& c = sim.ranks[h];
    const std::vector<std::string> in = Open(boxes[h], n, &c.received);
    record(h, in);
    Post(Timed(&c.seconds, [&] { return ranks[h]->PlanHome(in); }), h, next, &c.sent);
  }
  std::vector<std::string> summaries(n);
  for (int r = 0; r < n; ++r) {
    SimulatedRankCost& c = sim.ranks[r];
    const std::vector<std::string> in = Open(next[r], n, &c.received);
    record(r, in);
    summaries[r] = Timed(&c.seconds, [&] { return ranks[r]->Summary(in); });
    c.sent += summaries[r].size();
    sim.ranks[0].received += summaries[r].size();
  }
  sim.rank0_inbox.gathered.push_back(summaries);
  if (before_coordinate) before_coordinate();
  std::vector<std::string> decisions = Timed(
      &sim.coordinate_seconds, [&] { return RankPlanner::Coordinate(summaries, options); });
  if (after_coordinate) after_coordinate();
  sim.ranks[0].seconds += sim.coordinate_seconds;
  std::vector<std::string>().swap(summaries);
  for (int r = 0; r < n; ++r) {
    SimulatedRankCost& c = sim.ranks[r];
    sim.ranks[0].sent += decisions[r].size();
    c.received += decisions[r].size();
    if (r == sim.other) sim.other_inbox.scattered.push_back(decisions[r]);
    Post(Timed(&c.seconds, [&] { return ranks[r]->Assign(decisions[r]); }), r, boxes, &c.sent);
    std::string().swap(decisions[r]);
  }
  std::vector<std::string> packed(n);
  uint64_t all_packed = 0;
  for (int r = 0; r < n; ++r) {
    SimulatedRankCost& c = sim.ranks[r];
    const std::vector<std::string> in = Open(boxes[r], n, &c.received);
    record(r, in);
    packed[r] = Timed(&c.seconds, [&] { return ranks[r]->PackPart(in); });
    all_packed += packed[r].size();
  }
  for (int r = 0; r < n; ++r) {
    SimulatedRankCost& c = sim.ranks[r];
    c.sent += packed[r].size();
    c.received += all_packed;
    Result<SavePlan> part = Timed(&c.seconds, [&] { return ranks[r]->Finish(packed); });
    if (on_home) on_home(r, ranks[r]->TakeHome());
    ranks[r].reset();
    on_part(r, std::move(part));
  }
  if (sim.other > 0) sim.other_inbox.gathered.push_back(packed);
  sim.rank0_inbox.gathered.push_back(std::move(packed));
  return sim;
}

IndexSimulation SimulateIndex(const std::vector<SavePlan>& parts,
                              const std::vector<std::unique_ptr<KeyHome>>& homes, int other,
                              const std::function<void(int, const std::string&)>& on_table_part) {
  const int n = static_cast<int>(parts.size());
  IndexSimulation sim;
  sim.ranks.resize(n);
  std::vector<std::unique_ptr<IndexRounds>> rounds(n);
  std::vector<Mailbox> boxes(n);
  for (int r = 0; r < n; ++r) {
    SimulatedRankCost& c = sim.ranks[r];
    rounds[r] = std::make_unique<IndexRounds>(r, n, parts[r], homes[r].get());
    Post(Timed(&c.seconds, [&] { return rounds[r]->ToHomes(); }), r, boxes, &c.sent);
  }
  std::vector<std::string> summaries(n);
  for (int r = 0; r < n; ++r) {
    SimulatedRankCost& c = sim.ranks[r];
    const std::vector<std::string> in = Open(boxes[r], n, &c.received);
    if (r == 0) sim.rank0_inbox.all_to_all.push_back(in);
    if (r == other) sim.other_inbox.all_to_all.push_back(in);
    summaries[r] = Timed(&c.seconds, [&] { return rounds[r]->Summary(in); });
    c.sent += summaries[r].size();
    sim.ranks[0].received += summaries[r].size();
    if (on_table_part && !rounds[r]->table_part().empty()) on_table_part(r, rounds[r]->table_part());
    rounds[r].reset();
  }
  sim.skeleton = Timed(&sim.ranks[0].seconds, [&] { return IndexRounds::Assemble(summaries); });
  sim.rank0_inbox.gathered.push_back(std::move(summaries));
  return sim;
}

}  // namespace shardsafe
