#include "engine/testing/plan_simulation.h"

#include <chrono>
#include <memory>

#include "engine/save/plan_wire.h"

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

// Every rank's planner after rounds 1-5 and the round-5 messages to each
// rank; the costs and inboxes of those rounds are in the PlanSimulation.
struct ToRoundSix {
  std::vector<RankHoldings> holdings;  // blobs only; the planners read them
  std::vector<std::unique_ptr<RankPlanner>> ranks;
  std::vector<Mailbox> boxes;  // round 5's
};

void RunToRoundSix(int n, const std::function<RankHoldings(int)>& holdings_of,
                   const SavePlanOptions& options, const std::function<void()>& before_coordinate,
                   const std::function<void()>& after_coordinate, PlanSimulation& sim,
                   ToRoundSix& out) {
  sim.ranks.assign(n, SimulatedRankCost{});
  out.holdings.assign(n, RankHoldings{});
  out.ranks.clear();
  std::vector<Mailbox> boxes(n), next(n);
  std::vector<RankHoldings>& holdings = out.holdings;
  std::vector<std::unique_ptr<RankPlanner>>& ranks = out.ranks;
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
  out.boxes = std::move(boxes);
}

// Round 6's message of rank `r` (PackPart over its round-5 messages).
std::string PackOf(ToRoundSix& at, int r, PlanSimulation& sim) {
  const int n = static_cast<int>(at.ranks.size());
  SimulatedRankCost& c = sim.ranks[r];
  const std::vector<std::string> in = Open(at.boxes[r], n, &c.received);
  if (r == 0) sim.rank0_inbox.all_to_all.push_back(in);
  if (r == sim.other) sim.other_inbox.all_to_all.push_back(in);
  return Timed(&c.seconds, [&] { return at.ranks[r]->PackPart(in); });
}

// Round 6's all-gather, counted, and recorded for rank 0 and the other.
void AllGathered(std::vector<std::string> packed, PlanSimulation& sim) {
  uint64_t all_packed = 0;
  for (const std::string& p : packed) all_packed += p.size();
  for (size_t r = 0; r < packed.size(); ++r) {
    sim.ranks[r].sent += packed[r].size();
    sim.ranks[r].received += all_packed;
  }
  if (sim.other > 0) sim.other_inbox.gathered.push_back(packed);
  sim.rank0_inbox.gathered.push_back(std::move(packed));
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
  ToRoundSix at;
  RunToRoundSix(n, holdings_of, options, before_coordinate, after_coordinate, sim, at);
  std::vector<std::string> packed(n);
  for (int r = 0; r < n; ++r) packed[r] = PackOf(at, r, sim);
  for (int r = 0; r < n; ++r) {
    Result<SavePlan> part = Timed(&sim.ranks[r].seconds, [&] { return at.ranks[r]->Finish(packed); });
    if (on_home) on_home(r, at.ranks[r]->TakeHome());
    at.ranks[r].reset();
    on_part(r, std::move(part));
  }
  AllGathered(std::move(packed), sim);
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

namespace {

Result<SavePlan> Decoded(const std::string& part) {
  SS_ASSIGN_OR_RETURN(PlanMessage message, DecodePlanMessage(part));
  return std::move(message.plan);
}

// SimulateIndex over encoded parts: a rank's part is decoded, and its
// IndexRounds made, once per round (round 8's makes its ToHomes again,
// uncounted, for the layouts its Summary reads). Each home is dropped once
// its summary is made.
IndexSimulation IndexOfEncoded(const std::vector<std::string>& parts,
                               std::vector<std::unique_ptr<KeyHome>>& homes, int other,
                               const std::function<void(int, const std::string&)>& on_table_part) {
  const int n = static_cast<int>(parts.size());
  IndexSimulation sim;
  sim.ranks.resize(n);
  std::vector<Mailbox> boxes(n);
  for (int r = 0; r < n; ++r) {
    Result<SavePlan> part = Decoded(parts[r]);
    if (!part.ok()) {
      sim.skeleton = part.status().WithContext("the part of rank " + std::to_string(r));
      return sim;
    }
    IndexRounds rounds(r, n, *part, homes[r].get());
    SimulatedRankCost& c = sim.ranks[r];
    Post(Timed(&c.seconds, [&] { return rounds.ToHomes(); }), r, boxes, &c.sent);
  }
  std::vector<std::string> summaries(n);
  for (int r = 0; r < n; ++r) {
    SimulatedRankCost& c = sim.ranks[r];
    const std::vector<std::string> in = Open(boxes[r], n, &c.received);
    if (r == 0) sim.rank0_inbox.all_to_all.push_back(in);
    if (r == other) sim.other_inbox.all_to_all.push_back(in);
    Result<SavePlan> part = Decoded(parts[r]);
    if (!part.ok()) {
      sim.skeleton = part.status().WithContext("the part of rank " + std::to_string(r));
      return sim;
    }
    IndexRounds rounds(r, n, *part, homes[r].get());
    rounds.ToHomes();
    summaries[r] = Timed(&c.seconds, [&] { return rounds.Summary(in); });
    c.sent += summaries[r].size();
    sim.ranks[0].received += summaries[r].size();
    if (on_table_part && !rounds.table_part().empty()) on_table_part(r, rounds.table_part());
    homes[r].reset();
  }
  sim.skeleton = Timed(&sim.ranks[0].seconds, [&] { return IndexRounds::Assemble(summaries); });
  sim.rank0_inbox.gathered.push_back(std::move(summaries));
  return sim;
}

}  // namespace

SaveSimulation SimulateSave(int world, const std::function<RankHoldings(int)>& holdings_of,
                            const SavePlanOptions& options,
                            const std::function<void(int, const Result<SavePlan>&)>& on_part,
                            const std::function<void(int, const std::string&)>& on_table_part) {
  const int n = world;
  SaveSimulation out;
  std::vector<std::string> packed(n);
  {  // the first run: every rank's round-6 message
    PlanSimulation first;
    ToRoundSix at;
    RunToRoundSix(n, holdings_of, options, {}, {}, first, at);
    for (int r = 0; r < n; ++r) {
      packed[r] = PackOf(at, r, first);
      at.ranks[r].reset();
    }
  }
  ToRoundSix at;
  RunToRoundSix(n, holdings_of, options, {}, {}, out.plan, at);
  std::vector<std::string> parts(n);  // encoded (EncodePlanMessage)
  std::vector<std::unique_ptr<KeyHome>> homes(n);
  Status failed;
  for (int r = 0; r < n; ++r) {
    if (PackOf(at, r, out.plan) != packed[r] && failed.ok()) {
      failed = InternalError("plan simulation: rank " + std::to_string(r) +
                             " packed another part in the second run");
    }
    Result<SavePlan> part =
        Timed(&out.plan.ranks[r].seconds, [&] { return at.ranks[r]->Finish(packed); });
    homes[r] = at.ranks[r]->TakeHome();
    at.ranks[r].reset();
    if (part.ok()) {
      parts[r] = EncodePlanMessage(*part, Digest{});
    } else if (failed.ok()) {
      failed = part.status();
    }
    on_part(r, part);
  }
  AllGathered(std::move(packed), out.plan);
  at = ToRoundSix();
  out.rank0_part = parts[0];
  if (out.plan.other > 0) out.other_part = parts[out.plan.other];
  if (!failed.ok()) {
    out.index.skeleton = failed;
    return out;
  }
  const int other = out.plan.other;
  out.index = IndexOfEncoded(parts, homes, other, [&](int r, const std::string& bytes) {
    if (r == 0) out.rank0_table_part = bytes;
    if (r == other) out.other_table_part = bytes;
    if (on_table_part) on_table_part(r, bytes);
  });
  return out;
}

namespace {

std::string EncodedOrError(const Result<SavePlan>& part) {
  return part.ok() ? EncodePlanMessage(*part, Digest{}) : "error: " + part.status().ToString();
}

bool SameInbox(const RankInbox& a, const RankInbox& b) {
  return a.all_to_all == b.all_to_all && a.gathered == b.gathered && a.scattered == b.scattered;
}

bool SameTraffic(const std::vector<SimulatedRankCost>& a, const std::vector<SimulatedRankCost>& b) {
  if (a.size() != b.size()) return false;
  for (size_t r = 0; r < a.size(); ++r) {
    if (a[r].sent != b[r].sent || a[r].received != b[r].received) return false;
  }
  return true;
}

// The first rank whose entry differs, or -1.
int FirstDifference(const std::vector<std::string>& a, const std::vector<std::string>& b) {
  for (size_t r = 0; r < a.size(); ++r) {
    if (a[r] != b[r]) return static_cast<int>(r);
  }
  return -1;
}

Status Differs(const std::string& what) {
  return InternalError("SimulateSave differs from SimulatePlan and SimulateIndex: " + what);
}

}  // namespace

Status CheckSimulateSave(int world, const std::function<RankHoldings(int)>& holdings_of,
                         const SavePlanOptions& options) {
  const int n = world;
  std::vector<std::string> full_parts(n), lean_parts(n), full_tables(n), lean_tables(n);
  PlanSimulation plan;
  IndexSimulation index;
  {
    std::vector<SavePlan> parts(n);
    std::vector<std::unique_ptr<KeyHome>> homes(n);
    bool all_ok = true;
    plan = SimulatePlan(
        n, holdings_of, options,
        [&](int r, Result<SavePlan> part) {
          full_parts[r] = EncodedOrError(part);
          all_ok = all_ok && part.ok();
          if (part.ok()) parts[r] = std::move(*part);
        },
        {}, {}, [&](int r, std::unique_ptr<KeyHome> home) { homes[r] = std::move(home); });
    if (all_ok) {
      index = SimulateIndex(parts, homes, plan.other,
                            [&](int r, const std::string& bytes) { full_tables[r] = bytes; });
    }
  }
  SaveSimulation lean = SimulateSave(
      n, holdings_of, options,
      [&](int r, const Result<SavePlan>& part) { lean_parts[r] = EncodedOrError(part); },
      [&](int r, const std::string& bytes) { lean_tables[r] = bytes; });
  if (lean.plan.other != plan.other) return Differs("another busiest home");
  if (const int r = FirstDifference(full_parts, lean_parts); r >= 0) {
    return Differs("the part of rank " + std::to_string(r));
  }
  if (!SameInbox(plan.rank0_inbox, lean.plan.rank0_inbox) ||
      !SameInbox(plan.other_inbox, lean.plan.other_inbox)) {
    return Differs("what rank 0 or the busiest home received in rounds 1-6");
  }
  if (!SameTraffic(plan.ranks, lean.plan.ranks)) return Differs("a rank's bytes in rounds 1-6");
  const bool failed = full_parts[0].rfind("error: ", 0) == 0;  // every rank's is
  if (!failed && (lean.rank0_part != full_parts[0] ||
                  (plan.other > 0 && lean.other_part != full_parts[plan.other]))) {
    return Differs("the parts kept for rank 0 and the busiest home");
  }
  if (failed) {
    return lean.index.skeleton.ok() ? Differs("an index of a failed plan") : Status();
  }
  if (const int r = FirstDifference(full_tables, lean_tables); r >= 0) {
    return Differs("the table part of rank " + std::to_string(r));
  }
  if (lean.rank0_table_part != full_tables[0] ||
      (plan.other > 0 && lean.other_table_part != full_tables[plan.other])) {
    return Differs("the table parts kept for rank 0 and the busiest home");
  }
  if (!SameInbox(index.rank0_inbox, lean.index.rank0_inbox) ||
      !SameInbox(index.other_inbox, lean.index.other_inbox)) {
    return Differs("what rank 0 or the busiest home received in rounds 7-8");
  }
  if (!SameTraffic(index.ranks, lean.index.ranks)) return Differs("a rank's bytes in rounds 7-8");
  if (index.skeleton.ok() != lean.index.skeleton.ok() ||
      (!index.skeleton.ok() &&
       index.skeleton.status().ToString() != lean.index.skeleton.status().ToString())) {
    return Differs("the skeleton's outcome");
  }
  return Status();
}

}  // namespace shardsafe
