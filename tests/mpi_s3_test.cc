// A checkpoint in an S3 bucket across real MPI ranks (plain program, not
// GoogleTest):   mpirun -np 4 mpi_s3_test
// Rank 0 starts moto (tests/s3/moto_server.py) on 127.0.0.1 and broadcasts
// its port; every rank points the AWS_* variables at it. Four ranks save a
// row-sharded F32 tensor and a replicated BF16 one to s3://BUCKET/run/step-1
// (several data objects per rank); ranks 0-2, in a communicator of their
// own, load it split by columns and compare every byte with the oracle;
// rank 3 loads nothing. A missing python3 or moto fails the test.
// Prints "N passed, N failed" and exits non-zero on any failure.
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "s3/s3_client.h"
#include "shardsafe/checkpoint.h"
#include "shardsafe/mpi_comm.h"
#include "testing/s3_test_util.h"
#include "testing/test_util.h"

namespace shardsafe {
namespace {

constexpr char kBucket[] = "mpi-ckpts";
const Shape kRows{16, 12};  // F32: rows split 4 ways on save, columns 3 ways on load
const Shape kNorm{12};      // BF16: replicated on every rank

int g_rank = 0;
int g_passed = 0, g_failed = 0;

// A collective check over MPI_COMM_WORLD: passes (true on every rank) only
// if it passed on every rank. Each failing rank prints its reason.
bool Check(bool ok, const std::string& name, const std::string& why = "") {
  if (!ok) std::fprintf(stderr, "[rank %d] FAIL %s: %s\n", g_rank, name.c_str(), why.c_str());
  int local = ok ? 1 : 0, all = 0;
  MPI_Allreduce(&local, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  (all ? g_passed : g_failed) += 1;
  if (g_rank == 0) std::printf("%s %s\n", all ? "ok  " : "FAIL", name.c_str());
  std::fflush(stdout);
  return all != 0;
}

Slice Rows(uint64_t begin, uint64_t n) { return {Box{{begin, 0}, {n, kRows[1]}}, std::nullopt}; }
Slice Columns(uint64_t begin, uint64_t n) {
  return {Box{{0, begin}, {kRows[0], n}}, std::nullopt};
}
Slice Whole(const Shape& s) { return {Box::Whole(s), std::nullopt}; }

// Rank 0: moto's port, or "" (its reason on stderr). `moto` keeps the
// server alive until it is destroyed.
std::string StartMoto(std::unique_ptr<testing::PythonProcess>& moto) {
  moto = std::make_unique<testing::PythonProcess>(testing::S3TestScript("moto_server.py"),
                                                  std::vector<std::string>{});
  Result<std::vector<std::string>> ready = testing::ReadReadyLine(*moto, "moto (moto_server.py)");
  if (!ready.ok()) {
    std::fprintf(stderr, "FAIL %s\n", ready.status().ToString().c_str());
    return "";
  }
  return (*ready)[0];
}

// Every rank: the standard variables, pointing at moto on 127.0.0.1.
void PointAwsAt(const std::string& port) {
  setenv("AWS_ACCESS_KEY_ID", "mpi-test-key", 1);
  setenv("AWS_SECRET_ACCESS_KEY", "mpi-test-secret", 1);
  setenv("AWS_REGION", "us-east-1", 1);
  setenv("AWS_ENDPOINT_URL", ("http://127.0.0.1:" + port).c_str(), 1);
  for (const char* v : {"AWS_ENDPOINT_URL_S3", "AWS_SESSION_TOKEN", "AWS_DEFAULT_REGION"}) {
    unsetenv(v);
  }
}

Status CreateBucket() {
  SS_ASSIGN_OR_RETURN(S3Config config, S3Config::FromEnvironment());
  SS_ASSIGN_OR_RETURN(std::unique_ptr<S3Client> client, S3Client::Create(config));
  return client->CreateBucket(kBucket);
}

void SaveAtWorld4(const std::string& uri) {
  auto comm = MakeMpiComm(MPI_COMM_WORLD);
  const uint64_t r = static_cast<uint64_t>(g_rank);
  std::vector<OwnedShard> shards = {MakeShard("w", DType::kF32, kRows, Rows(4 * r, 4)),
                                    MakeShard("norm", DType::kBF16, kNorm, Whole(kNorm))};
  SaveState state;
  for (const OwnedShard& s : shards) state.tensors.push_back(s.View());
  state.values = nlohmann::json{{"step", 1}}.dump();
  Result<SaveStats> saved = Save(state, uri, *comm, {});
  if (Check(saved.ok(), "4 ranks save to " + uri, saved.status().ToString())) {
    Check(saved->files == 4, "every rank wrote a data object", std::to_string(saved->files));
  }
}

// Ranks 0-2 only, over `comm3`: "" when the load is right, else why not.
std::string LoadByColumns(const std::string& uri, Comm& comm3) {
  const uint64_t r = static_cast<uint64_t>(g_rank);
  std::vector<OwnedTarget> targets;  // moved in, never copied: each points into its own buffer
  targets.push_back(MakeTarget("w", DType::kF32, kRows, Columns(4 * r, 4)));
  targets.push_back(MakeTarget("norm", DType::kBF16, kNorm, Whole(kNorm)));
  LoadRequest req;
  for (OwnedTarget& t : targets) req.tensors.push_back(t.target);
  Result<LoadResult> res = Load(req, uri, comm3, {});
  if (!res.ok()) return res.status().ToString();
  std::string err;
  for (const OwnedTarget& t : targets) {
    if (!MatchesOracle(t)) err += t.target.key + ": bytes differ from the oracle; ";
  }
  if (res->saved_world_size != 4) err += "saved at world " + std::to_string(res->saved_world_size);
  if (nlohmann::json::parse(res->values).value("step", -1) != 1) err += "; values " + res->values;
  if (res->chunks_verified == 0) err += "; no chunk verified";
  return err;
}

void Run(const std::string& port) {
  PointAwsAt(port);
  Status bucket = g_rank == 0 ? CreateBucket() : Status();
  if (!Check(bucket.ok(), std::string("create bucket ") + kBucket, bucket.ToString())) return;
  const std::string uri = std::string("s3://") + kBucket + "/run/step-1";
  SaveAtWorld4(uri);

  MPI_Comm three = MPI_COMM_NULL;
  MPI_Comm_split(MPI_COMM_WORLD, g_rank < 3 ? 0 : MPI_UNDEFINED, g_rank, &three);
  std::string err;
  if (three != MPI_COMM_NULL) {
    auto comm3 = MakeMpiComm(three);
    err = comm3->size() == 3 ? LoadByColumns(uri, *comm3) : "sub-communicator is not 3 ranks";
    comm3.reset();
    MPI_Comm_free(&three);
  }
  Check(err.empty(), "3 ranks load it by columns, every byte", err);
}

}  // namespace
}  // namespace shardsafe

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &shardsafe::g_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (size != 4) {
    if (shardsafe::g_rank == 0) std::fprintf(stderr, "run with mpirun -np 4 (not %d)\n", size);
    MPI_Finalize();
    return 2;
  }
  std::unique_ptr<shardsafe::testing::PythonProcess> moto;  // rank 0's server
  char port[32] = {};
  if (shardsafe::g_rank == 0) {
    std::snprintf(port, sizeof port, "%s", shardsafe::StartMoto(moto).c_str());
  }
  MPI_Bcast(port, sizeof port, MPI_CHAR, 0, MPI_COMM_WORLD);
  if (shardsafe::Check(port[0] != '\0', "moto started (python3 with moto installed)")) {
    shardsafe::Run(port);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  moto.reset();
  if (shardsafe::g_rank == 0) {
    std::printf("%d passed, %d failed\n", shardsafe::g_passed, shardsafe::g_failed);
  }
  const int failed = shardsafe::g_failed;
  MPI_Finalize();
  return failed == 0 ? 0 : 1;
}
