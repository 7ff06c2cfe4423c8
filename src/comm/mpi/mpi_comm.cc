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
//
// Gather: as AllGather, with MPI_Gather and MPI_Gatherv to the root; the
// number of rounds comes from an MPI_Allreduce of the largest size.
//
// Scatter: MPI_Scatter of the sizes from the root, then the bytes with
// MPI_Scatterv in rounds (the largest size broadcast first).
//
// AllToAll: MPI_Alltoall of the sizes (a rank with the wrong number of
// parts sends all ones, so every rank fails), an MPI_Allreduce of the
// largest, then the bytes with MPI_Alltoallv in rounds.
//
// AllReduceMax: MPI_Allreduce (MPI_MAX) of the count and its complement
// (equal counts everywhere), then of the values.
#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "shardsafe/mpi_comm.h"
#include "comm/gathered_max.h"

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
  Result<std::vector<std::string>> Gather(std::string_view mine, int root) override;
  Result<std::vector<uint64_t>> AllReduceMax(std::span<const uint64_t> values) override;
  Result<std::string> Scatter(const std::vector<std::string>& parts, int root) override;
  Result<std::vector<std::string>> AllToAll(const std::vector<std::string>& parts) override;

 private:
  // One round of AllGather (root < 0) or Gather: bytes [offset, offset +
  // piece) of every payload.
  Status GatherRound(std::string_view mine, uint64_t offset, uint64_t piece,
                     const std::vector<uint64_t>& sizes, std::vector<std::string>& out,
                     int root = -1);
  Status CheckRoot(int root, const char* op) const;

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

Status MpiComm::GatherRound(std::string_view mine, uint64_t offset, uint64_t piece,
                            const std::vector<uint64_t>& sizes, std::vector<std::string>& out,
                            int root) {
  const uint64_t my_size = mine.size();
  const int my_count =
      static_cast<int>(my_size > offset ? std::min(my_size - offset, piece) : 0);
  const char* send = mine.data() + std::min<uint64_t>(offset, mine.size());
  const bool receives = root < 0 || root == rank_;
  std::vector<int> counts(receives ? size_ : 0), displs(receives ? size_ : 0);
  int total = 0;
  for (int r = 0; r < static_cast<int>(counts.size()); ++r) {
    counts[r] = static_cast<int>(sizes[r] > offset ? std::min(sizes[r] - offset, piece) : 0);
    displs[r] = total;
    total += counts[r];  // <= size_ * piece <= INT_MAX
  }
  std::string buffer(static_cast<size_t>(total), '\0');
  if (root < 0) {
    SS_RETURN_IF_ERROR(CheckMpi(MPI_Allgatherv(send, my_count, MPI_BYTE, buffer.data(),
                                               counts.data(), displs.data(), MPI_BYTE, comm_),
                                "MPI_Allgatherv"));
  } else {
    SS_RETURN_IF_ERROR(CheckMpi(MPI_Gatherv(send, my_count, MPI_BYTE, buffer.data(),
                                            counts.data(), displs.data(), MPI_BYTE, root, comm_),
                                "MPI_Gatherv"));
  }
  for (int r = 0; r < static_cast<int>(counts.size()); ++r) {
    if (counts[r] > 0) std::memcpy(out[r].data() + offset, buffer.data() + displs[r], counts[r]);
  }
  return Status();
}

Status MpiComm::CheckRoot(int root, const char* op) const {
  if (root >= 0 && root < size_) return Status();
  return InvalidArgumentError(std::string(op) + " root " + std::to_string(root) +
                              " is not a rank of a group of " + std::to_string(size_));
}

Result<std::vector<std::string>> MpiComm::Gather(std::string_view mine, int root) {
  SS_RETURN_IF_ERROR(CheckRoot(root, "gather"));
  uint64_t my_size = mine.size(), largest = 0;
  std::vector<uint64_t> sizes(rank_ == root ? size_ : 0);
  SS_RETURN_IF_ERROR(CheckMpi(
      MPI_Gather(&my_size, 1, MPI_UINT64_T, sizes.data(), 1, MPI_UINT64_T, root, comm_),
      "MPI_Gather"));
  SS_RETURN_IF_ERROR(CheckMpi(
      MPI_Allreduce(&my_size, &largest, 1, MPI_UINT64_T, MPI_MAX, comm_), "MPI_Allreduce"));
  std::vector<std::string> out(sizes.size());
  for (size_t r = 0; r < sizes.size(); ++r) out[r].resize(sizes[r]);
  const uint64_t piece = std::min<uint64_t>(max_piece_, INT_MAX / size_);
  for (uint64_t offset = 0; offset < largest; offset += piece) {
    SS_RETURN_IF_ERROR(GatherRound(mine, offset, piece, sizes, out, root));
  }
  return out;
}

Result<std::string> MpiComm::Scatter(const std::vector<std::string>& parts, int root) {
  SS_RETURN_IF_ERROR(CheckRoot(root, "scatter"));
  // The root's check travels with the sizes: a size of all ones is "bad parts".
  const bool root_here = rank_ == root;
  const bool bad = root_here && static_cast<int>(parts.size()) != size_;
  std::vector<uint64_t> sizes(root_here ? size_ : 0, bad ? ~uint64_t{0} : 0);
  for (int r = 0; root_here && !bad && r < size_; ++r) sizes[r] = parts[r].size();
  uint64_t my_size = 0, largest = 0;
  SS_RETURN_IF_ERROR(CheckMpi(
      MPI_Scatter(sizes.data(), 1, MPI_UINT64_T, &my_size, 1, MPI_UINT64_T, root, comm_),
      "MPI_Scatter"));
  if (my_size == ~uint64_t{0}) {
    return InvalidArgumentError("scatter: the root did not pass one part per rank of " +
                                std::to_string(size_));
  }
  if (root_here) largest = *std::max_element(sizes.begin(), sizes.end());
  SS_RETURN_IF_ERROR(
      CheckMpi(MPI_Bcast(&largest, 1, MPI_UINT64_T, root, comm_), "MPI_Bcast (size)"));
  std::string out(my_size, '\0');
  const uint64_t piece = std::min<uint64_t>(max_piece_, INT_MAX / size_);
  for (uint64_t offset = 0; offset < largest; offset += piece) {
    const auto count = [&](uint64_t n) {
      return static_cast<int>(n > offset ? std::min(n - offset, piece) : 0);
    };
    std::vector<int> counts(sizes.size()), displs(sizes.size());
    std::string buffer;
    for (size_t r = 0; r < sizes.size(); ++r) {
      counts[r] = count(sizes[r]);
      displs[r] = static_cast<int>(buffer.size());
      if (counts[r] > 0) buffer.append(parts[r], offset, counts[r]);
    }
    SS_RETURN_IF_ERROR(CheckMpi(MPI_Scatterv(buffer.data(), counts.data(), displs.data(), MPI_BYTE,
                                             out.data() + std::min(offset, my_size),
                                             count(my_size), MPI_BYTE, root, comm_),
                                "MPI_Scatterv"));
  }
  return out;
}

Result<std::vector<std::string>> MpiComm::AllToAll(const std::vector<std::string>& parts) {
  constexpr uint64_t kBad = ~uint64_t{0};
  const bool bad = static_cast<int>(parts.size()) != size_;
  std::vector<uint64_t> sizes(size_, kBad), got(size_);
  for (int r = 0; !bad && r < size_; ++r) sizes[r] = parts[r].size();
  SS_RETURN_IF_ERROR(CheckMpi(
      MPI_Alltoall(sizes.data(), 1, MPI_UINT64_T, got.data(), 1, MPI_UINT64_T, comm_),
      "MPI_Alltoall"));
  uint64_t largest = 0, mine = bad ? kBad : 0;
  for (int r = 0; r < size_; ++r) {
    if (got[r] == kBad) {
      return InvalidArgumentError("AllToAll: rank " + std::to_string(r) +
                                  " did not pass one part per rank of " + std::to_string(size_));
    }
    if (!bad) mine = std::max(mine, sizes[r]);
  }
  if (bad) return CheckAllToAllParts(parts, size_);
  SS_RETURN_IF_ERROR(
      CheckMpi(MPI_Allreduce(&mine, &largest, 1, MPI_UINT64_T, MPI_MAX, comm_), "MPI_Allreduce"));
  std::vector<std::string> out(size_);
  for (int r = 0; r < size_; ++r) out[r].resize(got[r]);
  const uint64_t piece = std::min<uint64_t>(max_piece_, INT_MAX / size_);
  for (uint64_t offset = 0; offset < largest; offset += piece) {
    const auto count = [&](uint64_t n) {
      return static_cast<int>(n > offset ? std::min(n - offset, piece) : 0);
    };
    std::vector<int> send_counts(size_), send_displs(size_), recv_counts(size_), recv_displs(size_);
    std::string send;
    int received = 0;
    for (int r = 0; r < size_; ++r) {
      send_counts[r] = count(sizes[r]);
      send_displs[r] = static_cast<int>(send.size());
      if (send_counts[r] > 0) send.append(parts[r], offset, send_counts[r]);
      recv_counts[r] = count(got[r]);
      recv_displs[r] = received;
      received += recv_counts[r];
    }
    std::string buffer(received, '\0');
    SS_RETURN_IF_ERROR(CheckMpi(
        MPI_Alltoallv(send.data(), send_counts.data(), send_displs.data(), MPI_BYTE, buffer.data(),
                      recv_counts.data(), recv_displs.data(), MPI_BYTE, comm_),
        "MPI_Alltoallv"));
    for (int r = 0; r < size_; ++r) {
      if (recv_counts[r] > 0) {
        std::memcpy(out[r].data() + offset, buffer.data() + recv_displs[r], recv_counts[r]);
      }
    }
  }
  return out;
}

Result<std::vector<uint64_t>> MpiComm::AllReduceMax(std::span<const uint64_t> values) {
  const uint64_t count[2] = {values.size(), ~uint64_t{values.size()}};
  uint64_t most[2];
  SS_RETURN_IF_ERROR(
      CheckMpi(MPI_Allreduce(count, most, 2, MPI_UINT64_T, MPI_MAX, comm_), "MPI_Allreduce"));
  if (most[0] != ~most[1]) {
    return InvalidArgumentError("AllReduceMax: ranks passed between " + std::to_string(~most[1]) +
                                " and " + std::to_string(most[0]) + " values");
  }
  std::vector<uint64_t> out(values.size());
  for (size_t at = 0; at < values.size();) {  // counts are ints
    const int n = static_cast<int>(std::min<size_t>(values.size() - at, INT_MAX));
    SS_RETURN_IF_ERROR(CheckMpi(MPI_Allreduce(values.data() + at, out.data() + at, n,
                                              MPI_UINT64_T, MPI_MAX, comm_),
                                "MPI_Allreduce"));
    at += n;
  }
  return out;
}

Result<std::string> MpiComm::Broadcast(std::string_view data, int root) {
  SS_RETURN_IF_ERROR(CheckRoot(root, "broadcast"));
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
