// One rank's side of a distributed plan: the rounds as distributed_plan.h
// lists them. The home's work is in plan_home.cc, rank 0's in
// plan_coordinator.cc; this file holds what every rank does for itself.
#include "engine/plan/distributed_plan.h"

#include <algorithm>
#include <numeric>

#include "comm/wire.h"
#include "engine/plan/plan_home.h"

namespace shardsafe {

RankPlanner::RankPlanner(int rank, int world, const RankHoldings& holdings,
                         const SavePlanOptions& options)
    : rank_(rank), world_(world), holdings_(holdings), options_(options),
      home_(std::make_unique<KeyHome>(rank, world)) {}

RankPlanner::~RankPlanner() = default;

void RankPlanner::Fail(Status s) {
  if (error_.ok()) error_ = std::move(s);
}

// A rank's shards of one key must agree on dtype and shape (the home
// checks the ranks against each other, from each rank's first shard).
std::vector<std::string> RankPlanner::ToHomes() {
  // Shards of one key go out together, keys in order of first appearance.
  shards_ = holdings_.shards.size();
  std::vector<std::vector<std::vector<uint32_t>>> by_home(world_);
  std::map<std::string_view, std::pair<int, size_t>> where;  // key -> home, index
  for (uint32_t i = 0; i < holdings_.shards.size(); ++i) {
    const ShardInfo& shard = holdings_.shards[i];
    auto [it, fresh] = where.try_emplace(shard.key, HomeOf(shard.key, world_), 0);
    auto& keys = by_home[it->second.first];
    if (fresh) {
      it->second.second = keys.size();
      keys.emplace_back();
    }
    std::vector<uint32_t>& same = keys[it->second.second];
    const ShardInfo& first = holdings_.shards[same.empty() ? i : same[0]];
    if (first.dtype != shard.dtype || first.shape != shard.shape) {
      Fail(InvalidArgumentError("tensor \"" + shard.key + "\": rank " + std::to_string(rank_) +
                                " holds it as " + std::string(DTypeName(first.dtype)) + " " +
                                ShapeToString(first.shape) + " and as " + std::string(DTypeName(shard.dtype)) +
                                " " + ShapeToString(shard.shape)));
    }
    same.push_back(i);
  }
  std::vector<std::string> out(world_);
  for (int h = 0; h < world_; ++h) {
    if (by_home[h].empty()) continue;
    homes_.push_back(h);
    wire::Writer w;
    w.U64(by_home[h].size());
    for (const std::vector<uint32_t>& shards : by_home[h]) {
      const ShardInfo& first = holdings_.shards[shards[0]];
      w.Str(first.key);
      w.U8(static_cast<uint8_t>(first.dtype));
      w.Shape(first.shape);
      w.U64(shards.size());
      for (uint32_t i : shards) {
        w.U32(i);
        w.Slice(holdings_.shards[i].slice);
      }
    }
    out[h] = w.Take();
  }
  return out;
}

std::vector<std::string> RankPlanner::PlanHome(const std::vector<std::string>& from_ranks) {
  Status s = home_->Plan(from_ranks);
  if (!s.ok()) Fail(std::move(s));
  return home_->OwnBytesMessages();
}

std::string RankPlanner::Summary(const std::vector<std::string>& from_homes) {
  // Every home this rank sent shards answers, if only with 0.
  uint64_t own = 0;
  for (int h : homes_) {
    if (!error_.ok()) break;
    wire::Reader r(from_homes[h]);
    Result<uint64_t> bytes = r.U64();
    if (!bytes.ok() || !r.done()) {
      Fail(InternalError("distributed save plan: no own-chunk bytes from home " +
                         std::to_string(h)));
    } else {
      own += *bytes;
    }
  }
  wire::Writer w;
  w.Status(error_);
  if (!error_.ok()) return w.Take();
  w.U64(own);
  w.U64(holdings_.blobs.size());
  for (const BlobInfo& b : holdings_.blobs) {
    w.Str(b.name);
    w.U64(b.bytes);
    w.U8(b.per_rank);
  }
  home_->PutSummary(w);
  return w.Take();
}

std::vector<std::string> RankPlanner::Assign(std::string_view decision) {
  wire::Reader r(decision);
  Status sent;
  Status s = r.Status(&sent);
  if (s.ok() && !sent.ok()) s = sent;
  if (s.ok()) s = ReadTotals(r);
  if (s.ok()) s = home_->ReadDecision(r);
  if (!s.ok()) {
    Fail(std::move(s));
    return std::vector<std::string>(world_);
  }
  return home_->AssignmentMessages();
}

Status RankPlanner::ReadTotals(wire::Reader& r) {
  PlanPartInfo& info = part_.part.emplace();
  SS_ASSIGN_OR_RETURN(part_.unique_bytes, r.U64());
  SS_ASSIGN_OR_RETURN(info.held_bytes, r.U64());
  SS_ASSIGN_OR_RETURN(info.max_rank_bytes, r.U64());
  SS_ASSIGN_OR_RETURN(info.rank_bytes, r.U64());
  SS_ASSIGN_OR_RETURN(uint64_t n, r.U64());
  if (n != holdings_.blobs.size()) return InternalError("distributed plan: blob count mismatch");
  blob_writes_.resize(n);
  for (uint64_t i = 0; i < n; ++i) {
    SS_ASSIGN_OR_RETURN(blob_writes_[i], r.U8());
  }
  return Status();
}

std::string RankPlanner::PackPart(const std::vector<std::string>& from_homes) {
  if (error_.ok()) {
    Status s = TakeAssignments(from_homes);
    if (!s.ok()) Fail(std::move(s));
  }
  wire::Writer w;
  w.Status(error_);
  if (error_.ok()) w.U64(part_.files.size());
  return w.Take();
}

// The chunks this rank writes and the copies it checks, from every home;
// then its files, numbered as PartOfPlan numbers them.
Status RankPlanner::TakeAssignments(const std::vector<std::string>& from_homes) {
  std::vector<ReceivedChunk> chunks;
  std::map<std::string, PlannedTensor> tensors;  // by key: the whole plan's order
  std::vector<std::pair<HeldCopy, CopyShape>> copies;
  for (int h = 0; h < static_cast<int>(from_homes.size()); ++h) {
    if (from_homes[h].empty()) continue;
    Status s = ReadAssignment(from_homes[h], rank_, &chunks, &tensors, &copies);
    if (!s.ok()) return s.WithContext("assignment from home " + std::to_string(h));
  }
  const auto outside = [this](uint32_t shard) { return shard >= shards_; };
  if (std::any_of(chunks.begin(), chunks.end(),
                  [&](const ReceivedChunk& c) { return outside(c.chunk.writer_shard); }) ||
      std::any_of(copies.begin(), copies.end(),
                  [&](const auto& c) { return outside(c.first.shard); })) {
    return InternalError("distributed save plan: an assignment names a shard this rank lacks");
  }
  std::sort(chunks.begin(), chunks.end(), [](const ReceivedChunk& a, const ReceivedChunk& b) {
    return a.number < b.number;
  });
  std::sort(copies.begin(), copies.end(),
            [](const auto& a, const auto& b) { return a.first.chunk < b.first.chunk; });
  for (auto& [copy, shape] : copies) {
    part_.copies.push_back(copy);
    part_.part->copy_shapes.push_back(shape);
  }
  // Items: chunks in the whole plan's order, then the blobs this rank
  // writes in name order (the whole plan's, (name, rank)).
  std::vector<uint32_t> blobs;
  for (uint32_t b = 0; b < holdings_.blobs.size(); ++b) {
    if (blob_writes_[b]) blobs.push_back(b);
  }
  std::sort(blobs.begin(), blobs.end(), [this](uint32_t a, uint32_t b) {
    return holdings_.blobs[a].name < holdings_.blobs[b].name;
  });
  std::vector<uint64_t> bytes;
  for (const ReceivedChunk& c : chunks) bytes.push_back(c.chunk.bytes);
  for (uint32_t b : blobs) bytes.push_back(holdings_.blobs[b].bytes);
  const auto files = PackIntoFiles(bytes, options_.max_file_bytes);
  for (uint32_t number = 0; number < files.size(); ++number) {
    std::vector<uint32_t> in = files[number];
    std::sort(in.begin(), in.end());  // chunks by number, then blobs by name
    PlannedFile& file = part_.files.emplace_back(PlannedFile{rank_, number, {}, {}, 0});
    for (uint32_t i : in) {
      file.payload_bytes += bytes[i];
      if (i < chunks.size()) {
        file.chunks.push_back(static_cast<uint32_t>(part_.chunks.size()));
        part_.chunks.push_back(chunks[i].chunk);
        part_.part->chunks.push_back(chunks[i].number);
        chunk_keys_.push_back(chunks[i].key);
      } else {
        const uint32_t b = blobs[i - chunks.size()];
        const BlobInfo& blob = holdings_.blobs[b];
        file.blobs.push_back(static_cast<uint32_t>(part_.blobs.size()));
        part_.blobs.push_back(PlannedBlob{blob.name, blob.per_rank, rank_, b, blob.bytes});
      }
    }
  }
  // Tensors: those of the chunks written, in key order.
  std::map<std::string_view, uint32_t> local;
  for (const std::string& key : chunk_keys_) local.emplace(key, 0);
  for (auto& [key, number] : local) {
    number = static_cast<uint32_t>(part_.tensors.size());
    part_.tensors.push_back(std::move(tensors.at(std::string(key))));
  }
  for (uint32_t c = 0; c < part_.chunks.size(); ++c) {
    const uint32_t t = local.at(chunk_keys_[c]);
    part_.chunks[c].tensor = t;
    part_.tensors[t].chunks.push_back(c);
  }
  return Status();
}

Result<SavePlan> RankPlanner::Finish(const std::vector<std::string>& packed) {
  uint64_t before = 0, total = 0;
  for (int r = 0; r < static_cast<int>(packed.size()); ++r) {
    wire::Reader reader(packed[r]);
    Status sent;
    Status s = reader.Status(&sent);
    if (s.ok() && !sent.ok()) return sent;
    Result<uint64_t> files = s.ok() ? reader.U64() : Result<uint64_t>(s);
    if (!files.ok()) {
      return files.status().WithContext("file count of rank " + std::to_string(r));
    }
    if (r < rank_) before += *files;
    total += *files;
  }
  if (!error_.ok()) return error_;  // unreachable: this rank's own message failed
  PlanPartInfo& info = *part_.part;
  info.whole_files = total;
  for (uint64_t f = 0; f < part_.files.size(); ++f) {
    info.files.push_back(static_cast<uint32_t>(before + f));
  }
  return std::move(part_);
}

std::unique_ptr<KeyHome> RankPlanner::TakeHome() { return std::move(home_); }

Result<SavePlan> PlanOverComm(Comm& comm, const RankHoldings& holdings,
                              const SavePlanOptions& options, PlanTraffic* traffic,
                              std::unique_ptr<KeyHome>* home) {
  PlanTraffic counted;
  const auto count_parts = [&](const std::vector<std::string>& parts, uint64_t* into) {
    for (const std::string& p : parts) *into += p.size();
  };
  RankPlanner planner(comm.rank(), comm.size(), holdings, options);
  std::vector<std::string> out = planner.ToHomes();
  count_parts(out, &counted.sent);
  SS_ASSIGN_OR_RETURN(std::vector<std::string> in, comm.AllToAll(out));
  count_parts(in, &counted.received);
  out = planner.PlanHome(in);
  count_parts(out, &counted.sent);
  SS_ASSIGN_OR_RETURN(in, comm.AllToAll(out));
  count_parts(in, &counted.received);
  const std::string summary = planner.Summary(in);
  counted.sent += summary.size();
  SS_ASSIGN_OR_RETURN(in, comm.Gather(summary, 0));
  count_parts(in, &counted.received);
  std::vector<std::string> decisions;
  if (comm.rank() == 0) {
    decisions = RankPlanner::Coordinate(in, options);
    count_parts(decisions, &counted.sent);
  }
  SS_ASSIGN_OR_RETURN(std::string decision, comm.Scatter(decisions, 0));
  counted.received += decision.size();
  out = planner.Assign(decision);
  count_parts(out, &counted.sent);
  SS_ASSIGN_OR_RETURN(in, comm.AllToAll(out));
  count_parts(in, &counted.received);
  const std::string packed = planner.PackPart(in);
  counted.sent += packed.size();
  SS_ASSIGN_OR_RETURN(in, comm.AllGather(packed));
  count_parts(in, &counted.received);
  if (traffic) *traffic = counted;
  Result<SavePlan> part = planner.Finish(in);
  if (home) *home = planner.TakeHome();
  return part;
}

}  // namespace shardsafe
