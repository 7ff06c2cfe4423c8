#include "python/py_comm.h"

#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>

#include <optional>
#include <tuple>

#include "comm/agree.h"
#include "python/bindings.h"
#include "python/status_error.h"

namespace nb = nanobind;
using namespace nb::literals;

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

Status FailureOf(const std::string& code, const std::string& detail, const std::string& message) {
  StatusCode c = StatusCode::kInvalidArgument;
  for (int i = 1; i <= static_cast<int>(StatusCode::kInternal); ++i) {
    if (StatusCodeName(static_cast<StatusCode>(i)) == code) c = static_cast<StatusCode>(i);
  }
  Status s(c, message);
  for (int i = 1; i <= static_cast<int>(kLastErrorDetail); ++i) {
    const auto d = static_cast<ErrorDetail>(i);
    if (ErrorDetailName(d) == detail) s = s.WithDetail(d);
  }
  return s;
}

namespace {

using Failure = std::tuple<std::string, std::string, std::string>;

// AllGatherOrFail of (`failed`, `payload`) over `comm`: every rank's
// payload by rank, or the lowest failing rank's error on every rank.
nb::list Agree(nb::handle comm, nb::bytes payload, std::optional<Failure> failed) {
  std::unique_ptr<Comm> c = MakeComm(comm);
  const Status local = failed ? std::apply(FailureOf, *failed) : Status();
  std::string mine(payload.c_str(), payload.size());
  std::vector<std::string> all =
      Released([&] { return AllGatherOrFail(*c, local, std::move(mine)); });
  nb::list out;
  for (const std::string& p : all) out.append(nb::bytes(p.data(), p.size()));
  return out;
}

}  // namespace

void BindComm(nb::module_& m) {
  m.def("agree", &Agree, "comm"_a.none(), "payload"_a, "failed"_a.none() = nb::none());
}

}  // namespace shardsafe::python
