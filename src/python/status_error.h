// A failed Status on its way to Python: thrown here, translated by the
// module (module.cc RegisterErrors) into the matching shardsafe.errors class.
#ifndef SHARDSAFE_PYTHON_STATUS_ERROR_H_
#define SHARDSAFE_PYTHON_STATUS_ERROR_H_

#include <nanobind/nanobind.h>

#include <exception>
#include <utility>

#include "shardsafe/status.h"

namespace shardsafe::python {

struct StatusError : std::exception {
  explicit StatusError(Status s) : status(std::move(s)) {}
  const char* what() const noexcept override { return status.message().c_str(); }
  Status status;
};

inline void Check(const Status& s) {
  if (!s.ok()) throw StatusError(s);
}

template <typename T>
T Unwrap(Result<T> r) {
  Check(r.status());
  return std::move(r).value();
}

// Runs `fn` (an engine call returning a Result) with the GIL released and
// unwraps its result.
template <typename Fn>
auto Released(Fn&& fn) {
  auto r = [&] {
    nanobind::gil_scoped_release release;
    return fn();
  }();
  return Unwrap(std::move(r));
}

// The same for an engine call that returns a Status.
template <typename Fn>
void CheckReleased(Fn&& fn) {
  Status s;
  {
    nanobind::gil_scoped_release release;
    s = fn();
  }
  Check(s);
}

}  // namespace shardsafe::python

#endif  // SHARDSAFE_PYTHON_STATUS_ERROR_H_
