// load_source (a load of an OpenedSource) and the fast paths' plans
// (whole_targets.h).
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/variant.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <tuple>

#include "python/bindings.h"
#include "python/device_memory.h"
#include "python/opened_source.h"
#include "python/py_comm.h"
#include "python/specs.h"
#include "python/status_error.h"
#include "python/whole_targets.h"
#include "shardsafe/source.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace shardsafe::python {
namespace {

// A Python check of every rank's report (LoadOptions::check_reports): the
// exception it raised is kept, to be raised again as it is (a
// KeyMismatchError keeps its fields) once the engine returns.
struct ReportCheck {
  nb::object fn;
  std::optional<nb::python_error> raised;

  Status operator()(const std::vector<std::string>& reports) {
    nb::gil_scoped_acquire gil;
    try {
      nb::list list;
      for (const std::string& r : reports) list.append(nb::bytes(r.data(), r.size()));
      fn(list);
      return Status();
    } catch (nb::python_error& e) {
      raised.emplace(std::move(e));
      return FailedPreconditionError("the check of every rank's report raised");
    }
  }
};

// LoadOpenedSource of `targets` (and `whole`, a fast path's, moved in),
// the tensors of `device` filled through its copier. `check`: (this rank's
// report, a callable given every rank's), run before anything is read;
// `failed`: this rank's failure preparing its part, (code, detail,
// message) as shardsafe.errors names them (LoadOptions::local_failure).
LoadResult LoadSource(std::vector<Spec> targets, const OpenedSource& s, nb::handle comm,
                      const LoadOptions& options, WholeTargets* whole, DeviceArg device,
                      std::optional<std::pair<nb::bytes, nb::object>> check,
                      std::optional<std::tuple<std::string, std::string, std::string>> failed) {
  const std::vector<WholeTensorTarget> whole_targets = TakeWhole(whole, s.source);
  LoadRequest request = MakeRequest(std::move(targets));
  LoadOptions o = options;
  o.allow_partial = true;  // missing keys are reported: the Python layer matches keys itself
  auto checked = std::make_shared<ReportCheck>();
  if (check) {
    o.report = std::string(check->first.c_str(), check->first.size());
    checked->fn = check->second;
    o.check_reports = [checked](const std::vector<std::string>& reports) {
      return (*checked)(reports);
    };
  }
  if (failed) o.local_failure = std::apply(FailureOf, *failed);
  DeviceCall call;
  if (device) {
    for (Spec& spec : device->second) {
      request.tensors.push_back(ItemOf<TensorTarget>(spec));
      request.tensors.back().on_device = true;
    }
    // Page-locked memory the copier lends the load: (address, bytes).
    if (auto lent = nb::cast<std::optional<std::pair<uintptr_t, size_t>>>(
            nb::getattr(device->first, "staging", nb::none()))) {
      o.device_staging_memory = {reinterpret_cast<char*>(lent->first), lent->second};
    }
    call.memory = std::make_shared<PyDeviceMemory>(std::move(device->first));
    o.device = call.memory;
  }
  std::unique_ptr<Comm> c = MakeComm(comm);
  Result<LoadResult> result = [&] {
    nb::gil_scoped_release release;
    return LoadOpenedSource(request, whole_targets, s.source, *c, o);
  }();
  if (checked->raised) {
    checked->raised->restore();
    throw nb::python_error();
  }
  return Unwrap(std::move(result));
}

// A fast path's items as an opaque Python object (len, and specs for tests).
template <typename Whole>
void BindWhole(nb::module_& m, const char* name) {
  nb::class_<Whole>(m, name)
      .def("specs", [](const Whole& w) { return WholeSpecs(w); })
      .def("__len__", [](const Whole& w) { return w.items.size(); });
}

}  // namespace

void BindLoad(nb::module_& m) {
  // `whole` (from plan_whole) is moved into the load: a second use raises.
  m.def("load_source", &LoadSource, "targets"_a, "source"_a, "comm"_a.none(), "options"_a,
        "whole"_a.none() = nb::none(), "device"_a.none() = nb::none(),
        "check"_a.none() = nb::none(), "failed"_a.none() = nb::none());
  m.attr("DEFAULT_DEVICE_STAGING_BYTES") = LoadOptions{}.device_staging_bytes;
  BindWhole<WholeTargets>(m, "WholeTargets");
  BindWhole<WholeShards>(m, "WholeShards");
  nb::class_<AskedTensors>(m, "AskedTensors")
      .def("__len__", [](const AskedTensors& a) { return a.count; });
  m.def("ask_tensors", &AskTensors, "keys"_a, "tensors"_a, "plain_types"_a, "strided"_a,
        "dtype_names"_a);
  m.def(
      "plan_whole",
      [](AskedTensors& asked, const OpenedSource& s) { return PlanWhole(asked, s.source); },
      "asked"_a, "source"_a);
  m.def("plan_save_whole", &PlanSaveWhole, "asked"_a);
}

}  // namespace shardsafe::python
