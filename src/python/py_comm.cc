#include "python/py_comm.h"

#include <nanobind/stl/string.h>

namespace nb = nanobind;

namespace shardsafe::python {
namespace {

// One line: the exception's message up to its first newline (what() would
// add the traceback). TorchComm's own errors already name the collective.
Status PythonFailure(std::string_view op, const nb::python_error& e) {
  std::string message = nb::str(e.value()).c_str();
  message = message.substr(0, message.find('\n'));
  const std::string prefix = "torch.distributed " + std::string(op);
  if (message.rfind(prefix, 0) == 0) return UnavailableError(message);
  return UnavailableError(prefix + " failed: " + message);
}

std::string ToString(nb::handle bytes) {
  nb::bytes b = nb::borrow<nb::bytes>(bytes);
  return std::string(b.c_str(), b.size());
}

}  // namespace

PyComm::PyComm(nb::object impl)
    : impl_(std::move(impl)),
      rank_(nb::cast<int>(impl_.attr("rank"))),
      size_(nb::cast<int>(impl_.attr("size"))) {}

PyComm::~PyComm() {
  nb::gil_scoped_acquire gil;
  impl_.reset();
}

Result<std::vector<std::string>> PyComm::AllGather(std::string_view mine) {
  nb::gil_scoped_acquire gil;
  try {
    nb::object parts = impl_.attr("all_gather")(nb::bytes(mine.data(), mine.size()));
    std::vector<std::string> out;
    for (nb::handle part : parts) out.push_back(ToString(part));
    if (static_cast<int>(out.size()) != size_) {
      return InternalError("all_gather returned " + std::to_string(out.size()) +
                           " parts for a group of " + std::to_string(size_));
    }
    return out;
  } catch (const nb::python_error& e) {
    return PythonFailure("all_gather", e);
  }
}

Result<std::string> PyComm::Broadcast(std::string_view data, int root) {
  if (root < 0 || root >= size_) {
    return InvalidArgumentError("broadcast root " + std::to_string(root) + " outside group");
  }
  nb::gil_scoped_acquire gil;
  try {
    return ToString(impl_.attr("broadcast")(nb::bytes(data.data(), data.size()), root));
  } catch (const nb::python_error& e) {
    return PythonFailure("broadcast", e);
  }
}

Result<std::vector<std::string>> PyComm::Gather(std::string_view mine, int root) {
  if (root < 0 || root >= size_) {
    return InvalidArgumentError("gather root " + std::to_string(root) + " outside group");
  }
  nb::gil_scoped_acquire gil;
  try {
    nb::object parts = impl_.attr("gather")(nb::bytes(mine.data(), mine.size()), root);
    std::vector<std::string> out;
    for (nb::handle part : parts) out.push_back(ToString(part));
    if (static_cast<int>(out.size()) != (rank_ == root ? size_ : 0)) {
      return InternalError("gather returned " + std::to_string(out.size()) + " parts on rank " +
                           std::to_string(rank_) + " of " + std::to_string(size_));
    }
    return out;
  } catch (const nb::python_error& e) {
    return PythonFailure("gather", e);
  }
}

Result<std::string> PyComm::Scatter(const std::vector<std::string>& parts, int root) {
  if (root < 0 || root >= size_) {
    return InvalidArgumentError("scatter root " + std::to_string(root) + " outside group");
  }
  nb::gil_scoped_acquire gil;
  try {
    nb::object mine = nb::none();
    if (rank_ == root) {
      nb::list all;
      for (const std::string& p : parts) all.append(nb::bytes(p.data(), p.size()));
      mine = all;
    }
    return ToString(impl_.attr("scatter")(mine, root));
  } catch (const nb::python_error& e) {
    return PythonFailure("scatter", e);
  }
}

Result<std::vector<std::string>> PyComm::AllToAll(const std::vector<std::string>& parts) {
  nb::gil_scoped_acquire gil;
  try {
    nb::list mine;
    for (const std::string& p : parts) mine.append(nb::bytes(p.data(), p.size()));
    nb::object got = impl_.attr("all_to_all")(mine);
    std::vector<std::string> out;
    for (nb::handle part : got) out.push_back(ToString(part));
    if (static_cast<int>(out.size()) != size_) {
      return InternalError("all_to_all returned " + std::to_string(out.size()) +
                           " parts for a group of " + std::to_string(size_));
    }
    return out;
  } catch (const nb::python_error& e) {
    return PythonFailure("all_to_all", e);
  }
}

Result<std::vector<uint64_t>> PyComm::AllReduceMax(std::span<const uint64_t> values) {
  nb::gil_scoped_acquire gil;
  try {
    nb::list mine;
    for (uint64_t v : values) mine.append(nb::int_(v));
    nb::object max = impl_.attr("all_reduce_max")(mine);
    std::vector<uint64_t> out;
    for (nb::handle v : max) out.push_back(nb::cast<uint64_t>(v));
    if (out.size() != values.size()) {
      return InternalError("all_reduce_max returned " + std::to_string(out.size()) +
                           " values for " + std::to_string(values.size()));
    }
    return out;
  } catch (const nb::python_error& e) {
    return PythonFailure("all_reduce_max", e);
  } catch (const nb::cast_error&) {
    return InternalError("all_reduce_max returned a value that is not a uint64");
  }
}

Status PyComm::Barrier() {
  nb::gil_scoped_acquire gil;
  try {
    impl_.attr("barrier")();
    return Status::Ok();
  } catch (const nb::python_error& e) {
    return PythonFailure("barrier", e);
  }
}

std::unique_ptr<Comm> MakeComm(nb::handle impl) {
  if (impl.is_none()) return MakeSingleProcessComm();
  return std::make_unique<PyComm>(nb::borrow(impl));
}

}  // namespace shardsafe::python
