#include "python/save_call.h"

#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/variant.h>
#include <nanobind/stl/vector.h>
#include <unistd.h>

#include <string>

#include "base/thread_pool.h"
#include "python/bindings.h"
#include "python/py_comm.h"
#include "python/specs.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace shardsafe::python {
namespace {

SaveCall MakeSaveCall(std::vector<Spec>&& tensors, WholeShards* whole, nb::list blobs,
                      const std::string& values, const std::string& metadata, nb::handle comm,
                      const SaveOptions& options, DeviceArg&& device) {
  SaveCall c{MakeState(std::move(tensors), whole, blobs, values, metadata), options,
             MakeComm(comm), {}, blobs};
  if (device) {
    for (Spec& spec : device->second) {
      c.state.tensors.push_back(ItemOf<TensorShard>(spec));
      c.state.tensors.back().on_device = true;
    }
    c.device.memory = std::make_shared<PyDeviceMemory>(std::move(device->first));
    c.options.device = c.device.memory;
  }
  return c;
}

// The call of a rank that failed preparing its part: it saves nothing and
// fails on every rank through the engine's first collective
// (SaveOptions::local_failure).
SaveCall FailedSaveCall(nb::handle comm, const std::string& message) {
  SaveCall c{{}, {}, MakeComm(comm), {}, nb::list()};
  c.options.local_failure = InvalidArgumentError(message);
  return c;
}

}  // namespace

SaveStats Handle::wait() {
  Result<SaveStats> r = [&] {
    nb::gil_scoped_release release;
    return h_->Wait();
  }();
  return Unwrap(std::move(r));
}

// After the staging copy has streamed the state through the cache, freeing
// 20,000 shards' keys and shapes took 12-17 ms that the caller need not
// wait for. A child forked from this process has the pool but not its
// thread: it makes one of its own (the inherited one is left alone, like
// every pool here, it is never destroyed: it may outlive main).
void FreeLater(std::vector<TensorShard>&& tensors) {
  static ThreadPool* freer = nullptr;
  static pid_t owner = 0;
  if (freer == nullptr || owner != getpid()) {
    freer = new ThreadPool(1);
    owner = getpid();
  }
  auto doomed = std::make_shared<std::vector<TensorShard>>(std::move(tensors));
  freer->Schedule([doomed = std::move(doomed)]() mutable { doomed.reset(); });
}

void BindSave(nb::module_& m) {
  nb::class_<SaveCall>(m, "SaveCall")
      .def("__init__",
           [](SaveCall* self, std::vector<Spec> tensors, nb::list blobs, const std::string& values,
              const std::string& metadata, nb::handle comm, const SaveOptions& options,
              WholeShards* whole, DeviceArg device) {
             new (self) SaveCall(MakeSaveCall(std::move(tensors), whole, blobs, values, metadata,
                                              comm, options, std::move(device)));
           },
           "tensors"_a, "blobs"_a, "values"_a, "metadata"_a, "comm"_a.none(), "options"_a,
           "whole"_a.none() = nb::none(), "device"_a.none() = nb::none())
      .def_static("failed", &FailedSaveCall, "comm"_a.none(), "message"_a);
  m.def(
      "save",
      [](SaveCall& call, const std::string& path) {
        SaveCall& c = call.Use();
        return Released([&] { return Save(c.state, path, *c.comm, c.options); });
      },
      "call"_a, "path"_a);
}

void BindAsync(nb::module_& m) {
  nb::class_<Handle>(m, "AsyncHandle")
      .def("wait", &Handle::wait)
      .def_prop_ro("blocked_seconds", &Handle::blocked_seconds);
  nb::class_<AsyncSaver>(m, "AsyncSaver")
      .def(nb::init<>())
      .def("save",
           [](AsyncSaver& saver, SaveCall& call, const std::string& root, const std::string& tag) {
             SaveCall& c = call.Use();
             return StartAsync(
                 c, [&] { return saver.Save(c.state, root, tag, *c.comm, c.options); });
           },
           "call"_a, "root"_a, "tag"_a)
      .def("reserve",
           [](AsyncSaver& saver, SaveCall& call) {
             SaveCall& c = call.Use();
             CheckReleased([&] { return saver.Reserve(c.state, *c.comm, c.options); });
             return saver.staging_bytes();
           },
           "call"_a)
      .def("wait_pending",
           [](AsyncSaver& saver) { CheckReleased([&] { return saver.WaitForPending(); }); })
      .def_prop_ro("staging_bytes", &AsyncSaver::staging_bytes);
}

}  // namespace shardsafe::python
