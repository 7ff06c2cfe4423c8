#include "engine/save/plan_simulation.h"

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
  for (int h = 1; h < n; ++h) {
    if (boxes[h].bytes.size() > boxes[sim.busiest_home].bytes.size()) sim.busiest_home = h;
  }
  Mailbox copy = boxes[sim.busiest_home];
  uint64_t ignored = 0;
  sim.busiest_home_received = Open(copy, n, &ignored);
  for (int h = 0; h < n; ++h) {
    SimulatedRankCost& c = sim.ranks[h];
    const std::vector<std::string> in = Open(boxes[h], n, &c.received);
    Post(Timed(&c.seconds, [&] { return ranks[h]->PlanHome(in); }), h, next, &c.sent);
  }
  std::vector<std::string> summaries(n);
  for (int r = 0; r < n; ++r) {
    SimulatedRankCost& c = sim.ranks[r];
    const std::vector<std::string> in = Open(next[r], n, &c.received);
    summaries[r] = Timed(&c.seconds, [&] { return ranks[r]->Summary(in); });
    c.sent += summaries[r].size();
    sim.ranks[0].received += summaries[r].size();
  }
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
    Post(Timed(&c.seconds, [&] { return ranks[r]->Assign(decisions[r]); }), r, boxes, &c.sent);
    std::string().swap(decisions[r]);
  }
  std::vector<std::string> packed(n);
  uint64_t all_packed = 0;
  for (int r = 0; r < n; ++r) {
    SimulatedRankCost& c = sim.ranks[r];
    const std::vector<std::string> in = Open(boxes[r], n, &c.received);
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
  return sim;
}

}  // namespace shardsafe
