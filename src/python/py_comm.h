// PyComm: a Comm backed by a Python object, so the engine coordinates over
// the caller's torch.distributed process group (python/shardsafe/_comm.py).
//
// The object provides `rank`, `size`, `all_gather(bytes) -> list[bytes]`,
// `broadcast(bytes, root) -> bytes`, `barrier()`, `gather(bytes, root) ->
// list[bytes]` (empty on other ranks than the root) and
// `all_reduce_max(list[int]) -> list[int]` (unsigned 64-bit values) and
// `scatter(list[bytes] | None, root) -> bytes` and `all_to_all(list[bytes])
// -> list[bytes]`. Each call takes the GIL
// for its duration, so engine calls that use a PyComm run with the GIL
// released. A Python exception becomes Unavailable naming the operation.
#pragma once

#include <nanobind/nanobind.h>

#include <string>

#include "shardsafe/comm.h"
#include "shardsafe/status.h"

namespace shardsafe::python {

class PyComm : public Comm {
 public:
  explicit PyComm(nanobind::object impl);  // call with the GIL held
  ~PyComm() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  Result<std::vector<std::string>> AllGather(std::string_view mine) override;
  Result<std::string> Broadcast(std::string_view data, int root) override;
  Status Barrier() override;
  Result<std::vector<std::string>> Gather(std::string_view mine, int root) override;
  Result<std::vector<uint64_t>> AllReduceMax(std::span<const uint64_t> values) override;
  Result<std::string> Scatter(const std::vector<std::string>& parts, int root) override;
  Result<std::vector<std::string>> AllToAll(const std::vector<std::string>& parts) override;

 private:
  nanobind::object impl_;
  int rank_;
  int size_;
};

// A PyComm over `impl`, or a single-process Comm when `impl` is None.
std::unique_ptr<Comm> MakeComm(nanobind::handle impl);

// A failure the Python side met (its class's code and detail, as
// shardsafe.errors names them, and its message) as a Status of that code
// and detail, so that every rank raises that class (an unknown code is
// INVALID_ARGUMENT, an unknown detail none).
Status FailureOf(const std::string& code, const std::string& detail, const std::string& message);

}  // namespace shardsafe::python
