// shardsafe demo: the main job. Simulates a training job of N ranks (threads
// of this process) holding a transformer's weights and AdamW state laid out
// TP x DP with ZeRO-1, saves it as a step checkpoint, loads it back into a
// different layout (other TP degree, other world size, uneven splits),
// checks every byte, verifies the checkpoint on disk, and prints a summary.
#include <chrono>
#include <cstdio>
#include <mutex>
#include <thread>

#include "cli/commands.h"
#include "cli/demo_model.h"
#include "cli/output.h"
#include "shardsafe/tools.h"

namespace shardsafe::cli {
namespace {

struct DemoOptions {
  std::string dir = "demo-out";
  DemoModel model;
  int save_tp = 2, save_dp = 4;
  int load_tp = 3, load_dp = 2;
  bool direct_io = true;
};

// Runs fn(rank, comm) on `n` threads; returns the first failure.
Status RunRanks(int n, const std::function<Status(int, Comm&)>& fn) {
  auto comms = MakeThreadComms(n);
  std::vector<Status> results(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) threads.emplace_back([&, r] { results[r] = fn(r, *comms[r]); });
  for (auto& t : threads) t.join();
  for (const Status& s : results) SS_RETURN_IF_ERROR(s);
  return Status();
}

double Since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

// The save side: buffers per rank (weights shared by the DP replicas of a TP
// rank, as in a real job where each replica holds the same values).
struct SaveSide {
  std::vector<DemoTensor> tensors;
  std::vector<std::vector<std::vector<char>>> buffers;  // [owner][tensor]
  int OwnerOf(const DemoTensor& t, int tp_rank, int dp_rank, const DemoOptions& o) const {
    return t.zero_sharded ? tp_rank * o.save_dp + dp_rank : tp_rank * o.save_dp;
  }
};

Status FillRank(SaveSide& side, const DemoOptions& o, int rank) {
  const int tp_rank = rank / o.save_dp, dp_rank = rank % o.save_dp;
  auto& mine = side.buffers[rank];
  mine.resize(side.tensors.size());
  for (size_t i = 0; i < side.tensors.size(); ++i) {
    const DemoTensor& t = side.tensors[i];
    if (side.OwnerOf(t, tp_rank, dp_rank, o) != rank) continue;
    const Slice s = DemoSlice(t, tp_rank, o.save_tp, dp_rank, o.save_dp);
    mine[i].resize(*NumBytes(t.dtype, s.NumElements()));
    FillSlice(t, s, mine[i].data());
  }
  return Status();
}

SaveState StateOf(const SaveSide& side, const DemoOptions& o, int rank, const std::string& rng) {
  const int tp_rank = rank / o.save_dp, dp_rank = rank % o.save_dp;
  SaveState state;
  for (size_t i = 0; i < side.tensors.size(); ++i) {
    const DemoTensor& t = side.tensors[i];
    const int owner = side.OwnerOf(t, tp_rank, dp_rank, o);
    state.tensors.push_back({t.key, t.dtype, t.shape,
                             DemoSlice(t, tp_rank, o.save_tp, dp_rank, o.save_dp),
                             side.buffers[owner][i].data()});
  }
  const Json config = {{"lr", 3e-4}, {"layers", o.model.layers}};
  state.values = Json{{"step", 100}, {"config", config}}.dump();
  state.layout = Json{{"tp", o.save_tp}, {"dp", o.save_dp}, {"zero", 1}}.dump();
  state.metadata = Json{{"producer", "shardsafe demo"}}.dump();
  state.blobs.push_back({"rng", rng.data(), rng.size(), true});
  return state;
}

struct Totals {
  uint64_t unique = 0, held = 0, max_rank = 0, needed = 0, read = 0, verified = 0, bad = 0;
  int files = 0;
  double save_s = 0, load_s = 0, load_call_s = 0;
};

Status SavePhase(const DemoOptions& o, Totals* totals, ProgressLine* progress) {
  SaveSide side{DemoTensors(o.model), {}};
  const int world = o.save_tp * o.save_dp;
  side.buffers.resize(world);
  std::fprintf(stderr, "  generating the training state on %d ranks...\n", world);
  SS_RETURN_IF_ERROR(RunRanks(world, [&](int r, Comm&) { return FillRank(side, o, r); }));
  CheckpointManager manager(o.dir, {.keep_last = 2});
  std::mutex mu;
  const auto start = std::chrono::steady_clock::now();
  SS_RETURN_IF_ERROR(RunRanks(world, [&](int r, Comm& comm) -> Status {
    const std::string rng = DemoRngState(r);
    SaveOptions opts;
    opts.direct_io = o.direct_io;
    if (r == 0) opts.progress = progress->Callback();
    SS_ASSIGN_OR_RETURN(SaveStats s, manager.Save(100, StateOf(side, o, r, rng), comm, opts));
    std::lock_guard<std::mutex> lock(mu);
    totals->unique = s.unique_bytes;
    totals->held = s.held_bytes;
    totals->max_rank = s.max_rank_bytes;
    totals->files = s.files;
    return Status();
  }));
  totals->save_s = Since(start);
  progress->Finish();
  return Status();
}

// Loads one rank's part of the new layout and checks every element.
Status LoadRank(const DemoOptions& o, int rank, Comm& comm, Totals* totals, std::mutex* mu,
                ProgressLine* progress) {
  const int tp_rank = rank / o.load_dp, dp_rank = rank % o.load_dp;
  const auto tensors = DemoTensors(o.model);
  std::vector<std::vector<char>> buffers(tensors.size());
  std::vector<Slice> slices;
  LoadRequest req;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const DemoTensor& t = tensors[i];
    slices.push_back(DemoSlice(t, tp_rank, o.load_tp, dp_rank, o.load_dp));
    buffers[i].resize(*NumBytes(t.dtype, slices[i].NumElements()));
    req.tensors.push_back({t.key, t.dtype, t.shape, slices[i], buffers[i].data()});
  }
  LoadOptions opts;
  if (rank == 0) opts.progress = progress->Callback();
  CheckpointManager manager(o.dir, {});
  SS_ASSIGN_OR_RETURN(LoadResult res, manager.Load(req, std::nullopt, comm, opts));
  uint64_t bad = 0;
  for (size_t i = 0; i < tensors.size(); ++i) bad += CheckSlice(tensors[i], slices[i], buffers[i].data());
  if (Json::parse(res.values)["step"] != 100) ++bad;
  if (rank < o.save_tp * o.save_dp && res.blobs["rng"] != DemoRngState(rank)) ++bad;
  std::lock_guard<std::mutex> lock(*mu);
  totals->needed += res.bytes_needed;
  totals->read += res.bytes_read;
  totals->verified += res.chunks_verified;
  totals->load_call_s = std::max(totals->load_call_s, res.seconds);
  totals->bad += bad;
  return Status();
}

Status LoadPhase(const DemoOptions& o, Totals* totals, ProgressLine* progress) {
  std::mutex mu;
  const auto start = std::chrono::steady_clock::now();
  SS_RETURN_IF_ERROR(RunRanks(o.load_tp * o.load_dp, [&](int r, Comm& comm) {
    return LoadRank(o, r, comm, totals, &mu, progress);
  }));
  totals->load_s = Since(start);
  progress->Finish();
  return Status();
}

void PrintSummary(const DemoOptions& o, const Totals& t, const VerifyReport& v) {
  const int world = o.save_tp * o.save_dp;
  const double ideal = static_cast<double>(t.unique) / world;
  std::printf("\nshardsafe demo: %d-layer transformer, %s of unique state, %zu tensors\n",
              o.model.layers, FormatBytes(t.unique).c_str(), DemoTensors(o.model).size());
  std::printf("  save  %d ranks (TP=%d x DP=%d, ZeRO-1 optimizer) -> %s/step-00000100\n", world,
              o.save_tp, o.save_dp, o.dir.c_str());
  std::printf("        %s in %.2f s = %s; written %s once (ranks held %s with replicas)\n",
              FormatBytes(t.unique).c_str(), t.save_s, FormatRate(t.unique, t.save_s).c_str(),
              FormatBytes(t.unique).c_str(), FormatBytes(t.held).c_str());
  std::printf("        %d data files; busiest rank wrote %s (%.3fx its ideal share)\n", t.files,
              FormatBytes(t.max_rank).c_str(), t.max_rank / ideal);
  std::printf("  load  %d ranks (TP=%d x DP=%d, uneven splits) from the latest checkpoint\n",
              o.load_tp * o.load_dp, o.load_tp, o.load_dp);
  std::printf("        read %s for %s needed (%.4fx) in %.2f s = %s; %llu checksums verified\n",
              FormatBytes(t.read).c_str(), FormatBytes(t.needed).c_str(),
              t.needed ? static_cast<double>(t.read) / t.needed : 0.0, t.load_call_s,
              FormatRate(t.read, t.load_call_s).c_str(), static_cast<unsigned long long>(t.verified));
  std::printf("  check every loaded byte against the expected values: %s\n",
              t.bad == 0 ? "OK" : ("FAILED (" + std::to_string(t.bad) + " elements differ)").c_str());
  std::printf("  verify on disk: %s (%llu checksums, %s)\n", v.ok() ? "OK" : "FAILED",
              static_cast<unsigned long long>(v.chunks_verified), FormatBytes(v.bytes_checked).c_str());
  for (const auto& f : v.faults) std::printf("    %s\n", f.c_str());
}

int RunDemo(const DemoOptions& o) {
  std::fprintf(stderr, "shardsafe demo in %s\n", o.dir.c_str());
  ProgressLine progress(true);
  Totals totals;
  Status s = SavePhase(o, &totals, &progress);
  if (s.ok()) s = LoadPhase(o, &totals, &progress);
  if (!s.ok()) return Fail(s);
  VerifyReport v = VerifyCheckpoint(o.dir, nullptr, 4, progress.Callback());
  progress.Finish();
  PrintSummary(o, totals, v);
  return totals.bad == 0 && v.ok() ? kExitOk : kExitProblems;
}

}  // namespace

void AddDemo(CLI::App& app, int* exit_code) {
  auto* cmd = app.add_subcommand("demo", "Save a simulated 8-rank training state, reload it resharded, check every byte");
  auto o = std::make_shared<DemoOptions>();
  cmd->add_option("--dir", o->dir, "checkpoint root to write (default: ./demo-out)");
  cmd->add_option("--layers", o->model.layers, "transformer layers")->check(CLI::Range(1, 1000));
  cmd->add_option("--hidden", o->model.hidden, "hidden size")->check(CLI::Range(8, 65536));
  cmd->add_option("--ffn", o->model.ffn, "MLP size")->check(CLI::Range(8, 262144));
  cmd->add_option("--vocab", o->model.vocab, "vocabulary size")->check(CLI::Range(8, 1 << 20));
  cmd->add_option("--save-tp", o->save_tp, "tensor-parallel degree of the save")->check(CLI::Range(1, 64));
  cmd->add_option("--save-dp", o->save_dp, "data-parallel degree of the save")->check(CLI::Range(1, 64));
  cmd->add_option("--load-tp", o->load_tp, "tensor-parallel degree of the load")->check(CLI::Range(1, 64));
  cmd->add_option("--load-dp", o->load_dp, "data-parallel degree of the load")->check(CLI::Range(1, 64));
  cmd->add_flag("!--buffered", o->direct_io, "write with buffered I/O instead of O_DIRECT");
  cmd->callback([=] { *exit_code = RunDemo(*o); });
}

}  // namespace shardsafe::cli
