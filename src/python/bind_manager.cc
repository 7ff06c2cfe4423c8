// CheckpointManager: steps under one root, each save through a SaveCall.
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <string>
#include <vector>

#include "python/bindings.h"
#include "python/save_call.h"
#include "shardsafe/checkpoint.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace shardsafe::python {
namespace {

void InitManager(CheckpointManager* self, const std::string& root, int keep_last,
                 const std::string& tag_format) {
  const CheckpointManager::Options o{.keep_last = keep_last, .tag_format = tag_format};
  Unwrap(CheckpointManager(root, o).TagOf(0));  // a bad format fails here
  new (self) CheckpointManager(root, o);
}

// Prune's removed tags; the checkpoints it kept for an unknown order are
// UserWarnings.
std::vector<std::string> Prune(CheckpointManager& m, int keep) {
  std::vector<std::string> warnings;
  auto removed = Released([&] { return m.Prune(keep, &warnings); });
  for (const std::string& w : warnings) {
    if (PyErr_WarnEx(PyExc_UserWarning, w.c_str(), 1) != 0) throw nb::python_error();
  }
  return removed;
}

}  // namespace

void BindManager(nb::module_& m) {
  nb::class_<CheckpointManager>(m, "CheckpointManager")
      .def("__init__", &InitManager, "root"_a, "keep_last"_a, "tag_format"_a)
      .def("tag_of", [](const CheckpointManager& m, int64_t step) { return Unwrap(m.TagOf(step)); },
           "step"_a)
      .def("save",
           [](CheckpointManager& m, int64_t step, SaveCall& call) {
             SaveCall& c = call.Use();
             return Released([&] { return m.Save(step, c.state, *c.comm, c.options); });
           },
           "step"_a, "call"_a)
      .def("async_save",
           [](CheckpointManager& m, int64_t step, SaveCall& call) {
             SaveCall& c = call.Use();
             return StartAsync(c, [&] { return m.AsyncSave(step, c.state, *c.comm, c.options); });
           },
           "step"_a, "call"_a)
      .def("reserve_async",
           [](CheckpointManager& m, SaveCall& call) {
             SaveCall& c = call.Use();
             CheckReleased([&] { return m.ReserveAsyncSave(c.state, *c.comm, c.options); });
             return m.async_staging_bytes();
           },
           "call"_a)
      .def("wait_async",
           [](CheckpointManager& m) { CheckReleased([&] { return m.WaitForAsyncSave(); }); })
      .def("latest_step",
           [](CheckpointManager& m) { return Released([&] { return m.LatestStep(); }); })
      .def("list", [](CheckpointManager& m) { return Released([&] { return m.List(); }); })
      .def("prune", &Prune, "keep"_a);
}

}  // namespace shardsafe::python
