// Save and load across 4 real MPI ranks (plain program, not GoogleTest):
//   mpirun -np 4 mpi_save_load_test
// Saves a TP=2 x DP=2 layout (ZeRO flat optimizer shards, per-rank and
// global blobs, JSON values), loads it back in another layout (TP=4 column
// split, flat ranges, whole replicas) checked element by element against the
// oracle, checks that overlapping shards fail on every rank with nothing
// committed, runs a CheckpointManager with keep_last=2 over 3 steps, saves
// with a chunk table, and plans a save on all ranks together
// (engine/plan/distributed_plan.h), each rank's part checked against the
// one cut from the whole plan.
// Prints "N passed, N failed" and exits non-zero on any failure.
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/plan/distributed_plan.h"
#include "engine/save/plan_wire.h"
#include "layout/plan_part.h"
#include "shardsafe/async_save.h"
#include "shardsafe/checkpoint.h"
#include "shardsafe/mpi_comm.h"
#include "testing/layout/simulated_layouts.h"
#include "testing/test_util.h"

namespace shardsafe {
namespace {

using Json = nlohmann::json;

int g_rank = 0;
int g_passed = 0, g_failed = 0;

// A collective check: passes only if it passed on every rank. Each rank
// prints its own reason for failing.
void Check(bool ok, const std::string& name, const std::string& why = "") {
  if (!ok) std::fprintf(stderr, "[rank %d] FAIL %s: %s\n", g_rank, name.c_str(), why.c_str());
  int local = ok ? 1 : 0, all = 0;
  MPI_Allreduce(&local, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  if (all) {
    ++g_passed;
    if (g_rank == 0) std::printf("ok   %s\n", name.c_str());
  } else {
    ++g_failed;
    if (g_rank == 0) std::printf("FAIL %s\n", name.c_str());
  }
  std::fflush(stdout);
}

Slice BoxSlice(std::vector<uint64_t> offset, std::vector<uint64_t> size) {
  return {Box{std::move(offset), std::move(size)}, std::nullopt};
}
Slice FlatSlice(const Shape& s, uint64_t b, uint64_t e) { return {Box::Whole(s), FlatRange{b, e}}; }
Slice WholeSlice(const Shape& s) { return {Box::Whole(s), std::nullopt}; }

std::string StepKey(const std::string& key, int64_t step) {
  return step == 0 ? key : key + "@" + std::to_string(step);
}

OwnedShard Shard(const std::string& key, DType dtype, const Shape& shape, const Slice& slice,
                 int64_t step) {
  return {key, dtype, shape, slice, OracleShard(StepKey(key, step), dtype, shape, slice)};
}

struct Target {
  std::string key;
  DType dtype;
  Shape shape;
  Slice slice;
  std::vector<std::byte> buf;
};

Target EmptyTarget(const std::string& key, DType dtype, const Shape& shape, const Slice& slice) {
  Target t{key, dtype, shape, slice, {}};
  t.buf.assign(*NumBytes(dtype, slice.NumElements()) + 1, std::byte{0xEE});
  return t;
}

// "" if `t` holds step `step`'s bytes (and its guard byte is untouched).
std::string Mismatch(const Target& t, int64_t step) {
  auto want = OracleShard(StepKey(t.key, step), t.dtype, t.shape, t.slice);
  if (want.size() + 1 != t.buf.size()) return t.key + ": wrong size";
  if (!std::equal(want.begin(), want.end(), t.buf.begin())) return t.key + ": bytes differ";
  if (t.buf.back() != std::byte{0xEE}) return t.key + ": wrote past the end";
  return "";
}

const Shape kWq{16, 12};   // F32: TP rows on save, TP=4 columns on load
const Shape kMlp{8, 20};   // BF16: TP columns on save, flat ranges on load
const Shape kNorm{12};     // F32: replicated everywhere
const Shape kStep{};       // I64 scalar, replicated
const Shape kFlat{100};    // F64: ZeRO flat over all 4 ranks, uneven

std::string RngBlob(int rank, int64_t step) {
  return "rng of rank " + std::to_string(rank) + " at step " + std::to_string(step) +
         std::string(static_cast<size_t>(rank) * 13, 'x');
}
const std::string kSampler = "global sampler position 123456";

// This rank's part of the TP=2 x DP=2 training state (rank = dp * 2 + tp).
struct RankState {
  std::vector<OwnedShard> shards;
  std::string rng;
  SaveState state;
};

std::unique_ptr<RankState> TrainingState(int rank, int64_t step) {
  auto rs = std::make_unique<RankState>();
  const uint64_t tp = rank % 2, dp = rank / 2;
  const uint64_t flat_cuts[] = {0, 30, 55, 80, 100};
  auto& sh = rs->shards;
  sh.push_back(Shard("attn.wq", DType::kF32, kWq, BoxSlice({tp * 8, 0}, {8, 12}), step));
  sh.push_back(Shard("mlp.w", DType::kBF16, kMlp, BoxSlice({0, tp * 10}, {8, 10}), step));
  sh.push_back(Shard("norm", DType::kF32, kNorm, WholeSlice(kNorm), step));
  sh.push_back(Shard("step", DType::kI64, kStep, WholeSlice(kStep), step));
  // ZeRO: each DP rank holds half of its TP shard's optimizer state, as a
  // flat range of the TP box.
  sh.push_back(Shard("opt.exp_avg.attn.wq", DType::kF32, kWq,
                     {Box{{tp * 8, 0}, {8, 12}}, FlatRange{dp * 48, dp * 48 + 48}}, step));
  sh.push_back(Shard("opt.exp_avg.mlp.w", DType::kF32, kMlp,
                     {Box{{0, tp * 10}, {8, 10}}, FlatRange{dp * 40, dp * 40 + 40}}, step));
  sh.push_back(Shard("opt.flat", DType::kF64, kFlat,
                     FlatSlice(kFlat, flat_cuts[rank], flat_cuts[rank + 1]), step));
  rs->rng = RngBlob(rank, step);
  for (const auto& s : sh) rs->state.tensors.push_back(s.View());
  rs->state.blobs.push_back({"rng", rs->rng.data(), rs->rng.size(), /*per_rank=*/true});
  rs->state.blobs.push_back({"sampler", kSampler.data(), kSampler.size(), false});
  const Json config = {{"lr", 0.0003}, {"tp", 2}, {"dp", 2}};
  rs->state.values = Json{{"step", step}, {"config", config}}.dump();
  rs->state.metadata = Json{{"run", "mpi-test"}}.dump();
  rs->state.layout = Json{{"tp", 2}, {"dp", 2}}.dump();
  return rs;
}

// The same tensors in a TP=4 layout with flat ranges and replicas.
std::vector<Target> OtherLayout(int rank) {
  const uint64_t r = static_cast<uint64_t>(rank);
  std::vector<Target> t;
  t.push_back(EmptyTarget("attn.wq", DType::kF32, kWq, BoxSlice({0, 3 * r}, {16, 3})));
  t.push_back(EmptyTarget("mlp.w", DType::kBF16, kMlp, FlatSlice(kMlp, 40 * r, 40 * r + 40)));
  t.push_back(EmptyTarget("norm", DType::kF32, kNorm, WholeSlice(kNorm)));
  t.push_back(EmptyTarget("step", DType::kI64, kStep, WholeSlice(kStep)));
  t.push_back(EmptyTarget("opt.exp_avg.attn.wq", DType::kF32, kWq, BoxSlice({4 * r, 0}, {4, 12})));
  t.push_back(EmptyTarget("opt.exp_avg.mlp.w", DType::kF32, kMlp, BoxSlice({0, 5 * r}, {8, 5})));
  t.push_back(EmptyTarget("opt.flat", DType::kF64, kFlat, WholeSlice(kFlat)));
  // An odd piece too: a box crossing every saved shard boundary.
  t.push_back(EmptyTarget("attn.wq", DType::kF32, kWq, BoxSlice({5, 1 + r}, {7, 6})));
  return t;
}

LoadRequest RequestFor(std::vector<Target>& targets) {
  LoadRequest req;
  for (auto& t : targets) req.tensors.push_back({t.key, t.dtype, t.shape, t.slice, t.buf.data()});
  return req;
}

// Checks a load result against step `step`; returns "" when all is well.
std::string CheckLoaded(const Result<LoadResult>& res, const std::vector<Target>& targets,
                        int64_t step) {
  if (!res.ok()) return res.status().ToString();
  std::string err;
  for (const auto& t : targets) {
    std::string m = Mismatch(t, step);
    if (!m.empty()) err += m + "; ";
  }
  const Json values = Json::parse(res->values);
  if (values.value("step", int64_t{-1}) != step) err += "values " + res->values + "; ";
  if (values["config"]["tp"] != 2) err += "config lost; ";
  if (res->saved_world_size != 4) err += "saved_world_size " + std::to_string(res->saved_world_size) + "; ";
  auto rng = res->blobs.find("rng");
  if (rng == res->blobs.end() || rng->second != RngBlob(g_rank, step)) err += "per-rank blob; ";
  auto sampler = res->blobs.find("sampler");
  if (sampler == res->blobs.end() || sampler->second != kSampler) err += "global blob; ";
  if (res->chunks_verified == 0) err += "no chunk verified; ";
  return err;
}

bool Exists(const std::string& path) { return std::filesystem::exists(path); }

void Run(const std::string& root) {
  auto comm = MakeMpiComm(MPI_COMM_WORLD);
  Check(comm->size() == 4 && comm->rank() == g_rank, "comm has 4 ranks");

  // 1. Save TP=2 x DP=2 and load as TP=4 / flat / replicas.
  const std::string ckpt = root + "/tp2dp2";
  {
    auto rs = TrainingState(g_rank, 0);
    SaveOptions opts;
    opts.max_file_bytes = 256;  // several files per rank
    auto saved = Save(rs->state, ckpt, *comm, opts);
    Check(saved.ok(), "save TP=2 x DP=2", saved.status().ToString());
    if (saved.ok()) {
      Check(saved->files > 4, "save wrote several files",
            std::to_string(saved->files) + " files");
      Check(saved->held_bytes > saved->unique_bytes, "replicas counted once",
            std::to_string(saved->held_bytes) + " held vs " + std::to_string(saved->unique_bytes));
    }
  }
  {
    auto targets = OtherLayout(g_rank);
    auto res = Load(RequestFor(targets), ckpt, *comm, {});
    const std::string err = CheckLoaded(res, targets, 0);
    Check(err.empty(), "load in TP=4 / flat / replica layout", err);
    if (res.ok()) {
      Check(Json::parse(res->layout) == Json({{"tp", 2}, {"dp", 2}}) &&
                Json::parse(res->metadata)["run"] == "mpi-test",
            "layout and metadata round-trip", res->layout);
    }
  }
  {
    // The same checkpoint through a comm that sends in tiny pieces.
    auto small = MakeMpiComm(MPI_COMM_WORLD, 64);
    auto targets = OtherLayout(g_rank);
    auto res = Load(RequestFor(targets), ckpt, *small, {});
    const std::string err = CheckLoaded(res, targets, 0);
    Check(err.empty(), "load through 64-byte MPI pieces", err);
  }

  // 2. Overlapping shards: InvalidArgument everywhere, nothing committed.
  {
    const Shape s{8, 4};
    const uint64_t r = static_cast<uint64_t>(g_rank);
    // Rows [2r, 2r+3), cut at 8: rank r overlaps rank r+1 in one row.
    const uint64_t end = std::min<uint64_t>(2 * r + 3, 8);
    OwnedShard sh = Shard("x", DType::kF32, s, BoxSlice({2 * r, 0}, {end - 2 * r, 4}), 0);
    SaveState state;
    state.tensors.push_back(sh.View());
    const std::string bad = root + "/overlap";
    auto saved = Save(state, bad, *comm, {});
    Check(!saved.ok() && saved.status().code() == StatusCode::kInvalidArgument,
          "overlapping shards are InvalidArgument on every rank", saved.status().ToString());
    Check(!saved.ok() && saved.status().message().find("overlap") != std::string::npos,
          "the error says overlap", saved.status().message());
    MPI_Barrier(MPI_COMM_WORLD);
    bool clean = !Exists(bad);
    for (auto& e : std::filesystem::directory_iterator(root)) {
      if (e.path().filename().string().starts_with(".")) clean = false;
    }
    Check(clean, "nothing committed after overlap", "root has leftovers");
  }

  // 3. CheckpointManager, keep_last=2, over 3 steps.
  {
    const std::string mroot = root + "/managed";
    CheckpointManager m(mroot, {.keep_last = 2});
    for (int64_t step : {10, 20, 30}) {
      auto rs = TrainingState(g_rank, step);
      SaveOptions opts;
      opts.max_file_bytes = 512;
      auto saved = m.Save(step, rs->state, *comm, opts);
      Check(saved.ok(), "manager save step " + std::to_string(step), saved.status().ToString());
    }
    MPI_Barrier(MPI_COMM_WORLD);
    auto list = m.List();
    std::string tags;
    if (list.ok()) {
      for (const auto& c : *list) tags += c.tag + (c.is_latest ? "* " : " ");
    }
    Check(list.ok() && tags == "step-00000020 step-00000030* ", "keep_last=2 keeps 20 and 30",
          list.ok() ? tags : list.status().ToString());
    auto latest = m.LatestStep();
    Check(latest.ok() && *latest == std::optional<int64_t>(30), "latest is 30");
    Check(!Exists(mroot + "/step-00000010"), "step 10 removed");
    for (std::optional<int64_t> step : {std::optional<int64_t>(), std::optional<int64_t>(20)}) {
      auto targets = OtherLayout(g_rank);
      auto res = m.Load(RequestFor(targets), step, *comm, {});
      const int64_t want = step.value_or(30);
      const std::string err = CheckLoaded(res, targets, want);
      Check(err.empty(), "manager load " + (step ? "step 20" : std::string("latest")), err);
    }
    auto targets = OtherLayout(g_rank);
    auto gone = m.Load(RequestFor(targets), 10, *comm, {});
    Check(!gone.ok() && gone.status().code() == StatusCode::kNotFound,
          "pruned step 10 is NotFound", gone.status().ToString());
  }

  // 4. Saves with a chunk table (each rank's checksums in its own file),
  // planned on rank 0 and then by all ranks together (format version 4:
  // each home writes its part of the table): the layout, the same layout
  // again (its plan reused), a layout change (ranks of one TP shard swap
  // their ZeRO and flat pieces; each keeps its own per-rank blob), and
  // back; each loads bit-exact in the TP=4 / flat / replica layout. Then
  // the same four asynchronous saves planned together (the first reuses
  // the plan of the last synchronous one: the same layout).
  for (const std::string kind : {"table", "together", "async"}) {
    const bool together = kind != "table";
    AsyncSaver saver;
    for (int save = 0; save < 4; ++save) {
      const bool swapped = save == 2;
      auto rs = TrainingState(swapped ? g_rank ^ 2 : g_rank, 40);
      rs->rng = RngBlob(g_rank, 40);
      rs->state.blobs[0] = {"rng", rs->rng.data(), rs->rng.size(), /*per_rank=*/true};
      SaveOptions opts;
      opts.chunk_table_min_chunks = 1;
      opts.distributed_plan_min_ranks = together ? 1 : uint64_t{1} << 40;
      const std::string tag = kind + std::to_string(save);
      const std::string path = root + "/" + tag;
      Result<SaveStats> saved = InternalError("not saved");
      if (kind == "async") {
        auto handle = saver.Save(rs->state, root, tag, *comm, opts);
        saved = handle.ok() ? (*handle)->Wait() : Result<SaveStats>(handle.status());
      } else {
        saved = Save(rs->state, path, *comm, opts);
      }
      const std::string name = kind + " save " + std::to_string(save);
      Check(saved.ok(), name, saved.status().ToString());
      if (saved.ok()) {
        const bool same_layout = save == 1 || (kind == "async" && save == 0);
        Check(saved->plan_reused == same_layout, name + ": plan reused only for the same layout");
      }
      Check(Exists(path + "/checksums-0000" + std::to_string(g_rank) + ".crc32c"),
            name + ": every rank wrote its checksum file");
      auto targets = OtherLayout(g_rank);
      auto res = Load(RequestFor(targets), path, *comm, {});
      const std::string err = CheckLoaded(res, targets, 40);
      Check(err.empty(), name + ": loads in the TP=4 / flat / replica layout", err);
    }
  }

  // 5. A plan made by all ranks over MPI_Alltoallv: each rank's part is
  // the one PartOfPlan cuts from PlanSave's whole plan (every rank can make
  // that here: the layout is simulated), replicas cut into pieces or not.
  simulated::TransformerLayout mesh;  // TP 2 x DP 2, ZeRO-1
  mesh.tp = 2;
  mesh.pp = 1;
  mesh.dp = 2;
  mesh.layers = 2;
  const std::vector<RankHoldings> holdings = simulated::MakeHoldings(mesh);
  for (const uint64_t min_split : {uint64_t{1} << 20, uint64_t{1}}) {
    const SavePlanOptions options{uint64_t{1} << 30, min_split};
    PlanTraffic traffic;
    auto part = PlanOverComm(*comm, holdings[g_rank], options, &traffic);
    auto whole = PlanSave(holdings, options);
    const std::string name = "distributed plan, min split " + std::to_string(min_split);
    Check(part.ok() && whole.ok(), name, part.ok() ? "" : part.status().ToString());
    if (part.ok() && whole.ok()) {
      const SavePlan expected = PartOfPlan(*whole, g_rank, PlanTotals(*whole));
      Check(EncodePlanMessage(*part, Digest{}) == EncodePlanMessage(expected, Digest{}),
            name + ": the part PlanSave gives");
      Check(traffic.sent > 0 && traffic.received > 0, name + ": traffic counted");
    }
  }
}

}  // namespace
}  // namespace shardsafe

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &shardsafe::g_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (size != 4) {
    if (shardsafe::g_rank == 0) std::fprintf(stderr, "run with mpirun -np 4 (got %d ranks)\n", size);
    MPI_Finalize();
    return 2;
  }
  // Rank 0 makes the shared temporary root and tells the others.
  char root[4096] = {};
  if (shardsafe::g_rank == 0) {
    const char* base = std::getenv("TMPDIR");
    std::snprintf(root, sizeof root, "%s/shardsafe-mpi-save-load-XXXXXX", base ? base : "/tmp");
    if (mkdtemp(root) == nullptr) {
      std::perror("mkdtemp");
      root[0] = '\0';
    }
  }
  MPI_Bcast(root, sizeof root, MPI_CHAR, 0, MPI_COMM_WORLD);
  if (root[0] == '\0') {
    MPI_Finalize();
    return 2;
  }
  shardsafe::Run(root);  // destroys its comms before returning
  MPI_Barrier(MPI_COMM_WORLD);
  if (shardsafe::g_rank == 0) {
    std::filesystem::remove_all(root);
    std::printf("%d passed, %d failed\n", shardsafe::g_passed, shardsafe::g_failed);
  }
  const int failed = shardsafe::g_failed;
  MPI_Finalize();
  return failed == 0 ? 0 : 1;
}
