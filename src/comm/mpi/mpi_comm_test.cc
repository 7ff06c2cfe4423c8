// mpi_comm_test: MpiComm under a real MPI job. A plain program (MPI owns
// main): run as `mpirun -np 4 mpi_comm_test`. Every rank runs every check;
// failures are summed over ranks and rank 0 prints "N passed, N failed".
// Exits non-zero if any check failed on any rank.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "shardsafe/mpi_comm.h"

namespace shardsafe {
namespace {

int g_passed = 0;
int g_failed = 0;

void Check(bool ok, const std::string& what, int rank) {
  if (ok) {
    ++g_passed;
  } else {
    ++g_failed;
    std::fprintf(stderr, "rank %d: FAILED: %s\n", rank, what.c_str());
  }
}

// Payload of rank r in case k: sizes differ by rank, some are empty.
std::string Payload(int rank, int k, size_t scale) {
  const size_t n = (static_cast<size_t>(rank * 7 + k) % 5) * scale * (rank % 3);
  std::string s(n, '\0');
  for (size_t i = 0; i < n; ++i) s[i] = static_cast<char>(rank * 31 + k * 7 + i);
  return s;
}

void TestAllGather(Comm& comm, int k, size_t scale) {
  const std::string label = "AllGather case " + std::to_string(k) + " scale " + std::to_string(scale);
  auto got = comm.AllGather(Payload(comm.rank(), k, scale));
  Check(got.ok(), label + ": " + got.status().ToString(), comm.rank());
  if (!got.ok()) return;
  Check(static_cast<int>(got->size()) == comm.size(), label + ": count", comm.rank());
  for (int r = 0; r < comm.size() && r < static_cast<int>(got->size()); ++r) {
    Check((*got)[r] == Payload(r, k, scale), label + ": payload of rank " + std::to_string(r),
          comm.rank());
  }
}

void TestGather(Comm& comm, int root, int k, size_t scale) {
  const std::string label = "Gather root " + std::to_string(root) + " case " + std::to_string(k) +
                            " scale " + std::to_string(scale);
  auto got = comm.Gather(Payload(comm.rank(), k, scale), root);
  Check(got.ok(), label + ": " + got.status().ToString(), comm.rank());
  if (!got.ok()) return;
  if (comm.rank() != root) {
    Check(got->empty(), label + ": a non-root rank received", comm.rank());
    return;
  }
  Check(static_cast<int>(got->size()) == comm.size(), label + ": count", comm.rank());
  for (int r = 0; r < comm.size() && r < static_cast<int>(got->size()); ++r) {
    Check((*got)[r] == Payload(r, k, scale), label + ": payload of rank " + std::to_string(r),
          comm.rank());
  }
}

void TestScatter(Comm& comm, int root, int k, size_t scale) {
  std::vector<std::string> parts;
  for (int r = 0; comm.rank() == root && r < comm.size(); ++r) parts.push_back(Payload(r, k, scale));
  auto got = comm.Scatter(parts, root);
  Check(got.ok() && *got == Payload(comm.rank(), k, scale),
        "Scatter root " + std::to_string(root) + " case " + std::to_string(k) + " scale " +
            std::to_string(scale),
        comm.rank());
}

// Rank `from` sends rank `to` a payload of its own size.
void TestAllToAll(Comm& comm, int k, size_t scale) {
  const auto part = [&](int from, int to) { return Payload(from * 31 + to, k, scale); };
  std::vector<std::string> parts;
  for (int r = 0; r < comm.size(); ++r) parts.push_back(part(comm.rank(), r));
  auto got = comm.AllToAll(parts);
  bool same = got.ok() && static_cast<int>(got->size()) == comm.size();
  for (int r = 0; same && r < comm.size(); ++r) same = (*got)[r] == part(r, comm.rank());
  Check(same, "AllToAll case " + std::to_string(k) + " scale " + std::to_string(scale),
        comm.rank());
}

// Each value's maximum comes from a different rank; some have the top bit.
void TestAllReduceMax(Comm& comm, size_t n) {
  const auto values = [n](int rank) {
    std::vector<uint64_t> v(n);
    for (size_t i = 0; i < n; ++i) {
      v[i] = (static_cast<uint64_t>((rank + i) % 5) << 40) + rank * 7 + i;
      if (i % 3 == 2) v[i] |= uint64_t{1} << 63;
    }
    return v;
  };
  std::vector<uint64_t> want(n, 0);
  for (int r = 0; r < comm.size(); ++r) {
    const std::vector<uint64_t> v = values(r);
    for (size_t i = 0; i < n; ++i) want[i] = std::max(want[i], v[i]);
  }
  auto got = comm.AllReduceMax(values(comm.rank()));
  Check(got.ok() && *got == want, "AllReduceMax of " + std::to_string(n), comm.rank());
}

void TestBroadcast(Comm& comm, int root, size_t n) {
  const std::string label = "Broadcast root " + std::to_string(root) + " n " + std::to_string(n);
  const std::string expected(n, static_cast<char>('A' + root));
  auto got = comm.Broadcast(comm.rank() == root ? expected : "ignored", root);
  Check(got.ok() && *got == expected, label, comm.rank());
}

void RunAll(MPI_Comm world) {
  auto comm = MakeMpiComm(world);
  int rank = 0, size = 0;
  MPI_Comm_rank(world, &rank);
  MPI_Comm_size(world, &size);
  Check(comm->rank() == rank && comm->size() == size, "rank and size", rank);

  for (size_t scale : {size_t{0}, size_t{1}, size_t{1000}, size_t{1} << 20}) {
    for (int k = 0; k < 5; ++k) TestAllGather(*comm, k, scale);
  }
  for (int root = 0; root < size; ++root) {
    for (size_t n : {size_t{0}, size_t{1}, size_t{100000}}) TestBroadcast(*comm, root, n);
  }
  Check(comm->Broadcast("x", size).status().code() == StatusCode::kInvalidArgument,
        "invalid root", rank);
  Check(comm->Barrier().ok(), "barrier", rank);
  for (int root = 0; root < size; ++root) {
    for (size_t scale : {size_t{0}, size_t{1}, size_t{1000}}) TestGather(*comm, root, root, scale);
  }
  for (int root = 0; root < size; ++root) {
    for (size_t scale : {size_t{0}, size_t{1}, size_t{1000}}) TestScatter(*comm, root, root, scale);
  }
  Check(comm->Scatter(std::vector<std::string>(size + 1), 0).status().code() ==
            StatusCode::kInvalidArgument,
        "scatter of too many parts", rank);
  Check(comm->Gather("x", size).status().code() == StatusCode::kInvalidArgument,
        "invalid gather root", rank);
  for (size_t scale : {size_t{0}, size_t{1}, size_t{1000}, size_t{1} << 16}) {
    for (int k = 0; k < 3; ++k) TestAllToAll(*comm, k, scale);
  }
  Check(comm->AllToAll(std::vector<std::string>(rank == 1 ? size + 1 : size)).status().code() ==
            StatusCode::kInvalidArgument,
        "AllToAll with one rank passing too many parts", rank);
  for (size_t n : {size_t{0}, size_t{1}, size_t{1000}}) TestAllReduceMax(*comm, n);
  Check(comm->AllReduceMax(std::vector<uint64_t>(rank == 1 ? 2 : 3)).status().code() ==
            StatusCode::kInvalidArgument,
        "AllReduceMax of different counts", rank);

  // Tiny pieces: many rounds per collective, uneven across ranks.
  auto pieces = MakeMpiComm(world, 7);
  for (int k = 0; k < 5; ++k) TestAllGather(*pieces, k, 13);
  for (int root = 0; root < size; ++root) TestBroadcast(*pieces, root, 1000);
  for (int root = 0; root < size; ++root) TestGather(*pieces, root, 3, 13);
  for (int root = 0; root < size; ++root) TestScatter(*pieces, root, 3, 13);
  for (int k = 0; k < 3; ++k) TestAllToAll(*pieces, k, 13);

  for (int i = 0; i < 300; ++i) {  // repeated, mixed
    TestAllGather(*comm, i, 3);
    TestBroadcast(*comm, i % size, static_cast<size_t>(i));
    Check(comm->Barrier().ok(), "repeated barrier", rank);
  }
}

}  // namespace
}  // namespace shardsafe

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  shardsafe::RunAll(MPI_COMM_WORLD);
  int counts[2] = {shardsafe::g_passed, shardsafe::g_failed};
  int totals[2] = {0, 0};
  MPI_Allreduce(counts, totals, 2, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank == 0) std::printf("%d passed, %d failed\n", totals[0], totals[1]);
  MPI_Finalize();
  return totals[1] == 0 ? 0 : 1;
}
