// CheckpointManager: steps under one root (and a memory tier), each save
// through a SaveCall.
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <string>
#include <tuple>
#include <vector>

#include "python/bindings.h"
#include "python/py_comm.h"
#include "python/save_call.h"
#include "shardsafe/checkpoint.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace shardsafe::python {
namespace {

// `memory`: the memory tier's (dir, replicas, keep_last), "" for the
// default folder.
void InitManager(CheckpointManager* self, const std::string& root, int keep_last,
                 const std::string& tag_format,
                 std::optional<std::tuple<std::string, int, int>> memory, int persist_every) {
  CheckpointManager::Options o{.keep_last = keep_last, .tag_format = tag_format};
  if (memory) {
    const auto& [dir, replicas, kept] = *memory;
    o.memory = MemoryTierOptions{dir, replicas, kept};
    o.persist_every = persist_every;
  }
  Check(CheckpointManager::CheckOptions(root, o));
  Unwrap(CheckpointManager(root, o).TagOf(0));  // a bad format fails here
  new (self) CheckpointManager(root, o);
}

// LoadOrder as (tier, path, step) tuples.
std::vector<std::tuple<std::string, std::string, int64_t>> LoadOrder(
    CheckpointManager& m, std::optional<int64_t> step, nb::handle comm) {
  std::unique_ptr<Comm> c = MakeComm(comm);
  std::vector<TierCopy> copies = Released([&] { return m.LoadOrder(step, *c); });
  std::vector<std::tuple<std::string, std::string, int64_t>> out;
  for (const TierCopy& t : copies) out.emplace_back(t.tier, t.path, t.step);
  return out;
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
      .def("__init__", &InitManager, "root"_a, "keep_last"_a, "tag_format"_a,
           "memory"_a.none() = nb::none(), "persist_every"_a = 1)
      .def_prop_ro("memory_dir", &CheckpointManager::memory_dir)
      .def("load_order", &LoadOrder, "step"_a.none(), "comm"_a.none())
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
