// MpiComm: Comm over an MPI communicator.
//
// AllGather: MPI_Allgather of every rank's size (uint64), then the bytes with
// MPI_Allgatherv. MPI counts and displacements are ints, so the bytes go in
// rounds: in round k each rank sends bytes [k * piece, (k + 1) * piece) of its
// payload (possibly none), where piece <= max_piece_bytes and
// piece * size <= INT_MAX. Every rank knows every size after the first step,
// so all ranks agree on the number of rounds and the counts of each. A round
// lands in one contiguous buffer and is copied out to the per-rank strings.
//
// Broadcast: MPI_Bcast of the size from the root, then the bytes in pieces.
#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "shardsafe/mpi_comm.h"

namespace shardsafe {
namespace {

Status CheckMpi(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return Status();
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(rc, text, &len) != MPI_SUCCESS) len = 0;
  return UnavailableError(std::string(what) + " failed: " +
                          (len > 0 ? std::string(text, len) : "MPI error " + std::to_string(rc)));
}

class MpiComm final : public Comm {
 public:
  MpiComm(MPI_Comm comm, size_t max_piece_bytes);
  ~MpiComm() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  Result<std::vector<std::string>> AllGather(std::string_view mine) override;
  Result<std::string> Broadcast(std::string_view data, int root) override;
  Status Barrier() override { return CheckMpi(MPI_Barrier(comm_), "MPI_Barrier"); }

 private:
  Status GatherRound(std::string_view mine, uint64_t offset, uint64_t piece,
                     const std::vector<uint64_t>& sizes, std::vector<std::string>& out);

  MPI_Comm comm_ = MPI_COMM_NULL;
  bool owned_ = false;  // comm_ is our duplicate
  int rank_ = 0;
  int size_ = 1;
  size_t max_piece_;
};

MpiComm::MpiComm(MPI_Comm comm, size_t max_piece_bytes)
    : max_piece_(std::max<size_t>(max_piece_bytes, 1)) {
  if (MPI_Comm_dup(comm, &comm_) == MPI_SUCCESS) {
    owned_ = true;
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
  } else {
    comm_ = comm;  // keep the caller's error handler
  }
  MPI_Comm_rank(comm_, &rank_);
  MPI_Comm_size(comm_, &size_);
}

MpiComm::~MpiComm() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (owned_ && !finalized) MPI_Comm_free(&comm_);
}

Result<std::vector<std::string>> MpiComm::AllGather(std::string_view mine) {
  uint64_t my_size = mine.size();
  std::vector<uint64_t> sizes(size_);
  SS_RETURN_IF_ERROR(CheckMpi(
      MPI_Allgather(&my_size, 1, MPI_UINT64_T, sizes.data(), 1, MPI_UINT64_T, comm_),
      "MPI_Allgather"));
  std::vector<std::string> out(size_);
  for (int r = 0; r < size_; ++r) out[r].resize(sizes[r]);
  const uint64_t piece = std::min<uint64_t>(max_piece_, INT_MAX / size_);
  const uint64_t largest = *std::max_element(sizes.begin(), sizes.end());
  for (uint64_t offset = 0; offset < largest; offset += piece) {
    SS_RETURN_IF_ERROR(GatherRound(mine, offset, piece, sizes, out));
  }
  return out;
}

// One MPI_Allgatherv of bytes [offset, offset + piece) of every payload.
Status MpiComm::GatherRound(std::string_view mine, uint64_t offset, uint64_t piece,
                            const std::vector<uint64_t>& sizes, std::vector<std::string>& out) {
  std::vector<int> counts(size_), displs(size_);
  int total = 0;
  for (int r = 0; r < size_; ++r) {
    counts[r] = static_cast<int>(sizes[r] > offset ? std::min(sizes[r] - offset, piece) : 0);
    displs[r] = total;
    total += counts[r];  // <= size_ * piece <= INT_MAX
  }
  std::string buffer(static_cast<size_t>(total), '\0');
  const char* send = mine.data() + std::min<uint64_t>(offset, mine.size());
  SS_RETURN_IF_ERROR(CheckMpi(MPI_Allgatherv(send, counts[rank_], MPI_BYTE, buffer.data(),
                                             counts.data(), displs.data(), MPI_BYTE, comm_),
                              "MPI_Allgatherv"));
  for (int r = 0; r < size_; ++r) {
    if (counts[r] > 0) std::memcpy(out[r].data() + offset, buffer.data() + displs[r], counts[r]);
  }
  return Status();
}

Result<std::string> MpiComm::Broadcast(std::string_view data, int root) {
  if (root < 0 || root >= size_) {
    return InvalidArgumentError("broadcast root " + std::to_string(root) +
                                " is not a rank of a group of " + std::to_string(size_));
  }
  uint64_t bytes = rank_ == root ? data.size() : 0;
  SS_RETURN_IF_ERROR(
      CheckMpi(MPI_Bcast(&bytes, 1, MPI_UINT64_T, root, comm_), "MPI_Bcast (size)"));
  std::string out = rank_ == root ? std::string(data) : std::string(bytes, '\0');
  const uint64_t piece = std::min<uint64_t>(max_piece_, INT_MAX);
  for (uint64_t offset = 0; offset < bytes; offset += piece) {
    const int count = static_cast<int>(std::min(bytes - offset, piece));
    SS_RETURN_IF_ERROR(
        CheckMpi(MPI_Bcast(out.data() + offset, count, MPI_BYTE, root, comm_), "MPI_Bcast"));
  }
  return out;
}

}  // namespace

std::unique_ptr<Comm> MakeMpiComm(MPI_Comm comm, size_t max_piece_bytes) {
  return std::make_unique<MpiComm>(comm, max_piece_bytes);
}

}  // namespace shardsafe
