// shardsafe._C: the engine's API for the Python package (python/shardsafe).
//
// The Python side turns state dicts into flat lists of tensor specs,
// (key, dtype, global shape, box offset, box size, data pointer), and JSON
// text for plain values (the common case of a save or a load is planned
// here instead: whole_targets.h); this file turns those into engine calls
// and runs them with the GIL released. Data is passed by pointer: nothing
// is copied here. Shards on a device (a GPU) come as a separate spec list
// with a copier object that the engine calls back (PyDeviceMemory).
// Collectives go through the Comm object the caller passes (a
// python/shardsafe/_comm.py adapter over torch.distributed, or None for one
// process). A failed Status raises the matching shardsafe.errors class.
#include <unistd.h>

#include <nanobind/nanobind.h>
#include <nanobind/stl/chrono.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/variant.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <variant>
#include <vector>

#include "base/thread_pool.h"
#include "python/opened_source.h"
#include "python/py_comm.h"
#include "python/status_error.h"
#include "python/whole_targets.h"
#include "shardsafe/async_save.h"
#include "shardsafe/checkpoint.h"
#include "shardsafe/hf.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace shardsafe::python {
void BindDownload(nb::module_& m);  // download.cc: PrefixDownload
namespace {

// (key, dtype, global shape, box offset, box size, data address), and the
// same with a flat range (begin, end) of the box last (shardsafe.Sharded's
// flat parts).
using BoxSpec = std::tuple<std::string, std::string, Shape, Shape, Shape, uintptr_t>;
using FlatSpec = std::tuple<std::string, std::string, Shape, Shape, Shape, uintptr_t,
                            std::pair<uint64_t, uint64_t>>;
using Spec = std::variant<BoxSpec, FlatSpec>;

Slice BoxSlice(Shape offset, Shape size) { return Slice{Box{std::move(offset), std::move(size)}, {}}; }

// The engine's tensor (TensorShard for a save, TensorTarget for a load) of
// one spec (moved out of).
template <typename Item>
Item ItemOf(Spec& spec) {
  if (auto* box = std::get_if<BoxSpec>(&spec)) {
    auto& [key, dtype, shape, offset, size, ptr] = *box;
    return {std::move(key), Unwrap(ParseDType(dtype)), std::move(shape),
            BoxSlice(std::move(offset), std::move(size)), reinterpret_cast<void*>(ptr)};
  }
  auto& [key, dtype, shape, offset, size, ptr, flat] = std::get<FlatSpec>(spec);
  Slice slice = BoxSlice(std::move(offset), std::move(size));
  slice.flat = FlatRange{flat.first, flat.second};
  return {std::move(key), Unwrap(ParseDType(dtype)), std::move(shape), std::move(slice),
          reinterpret_cast<void*>(ptr)};
}

// The engine's tensors: the items a fast path planned (whole_targets.h;
// moved out, once), then `specs` (moved out of).
template <typename Item>
std::vector<Item> Items(std::vector<Spec>&& specs, Whole<Item>* whole) {
  std::vector<Item> items;
  if (whole != nullptr) {
    if (whole->handed_over) {
      throw nb::value_error("a fast path's plan goes to one engine call; plan again");
    }
    whole->handed_over = true;
    items = std::exchange(whole->items, {});
  }
  items.reserve(items.size() + specs.size());
  for (Spec& spec : specs) items.push_back(ItemOf<Item>(spec));
  return items;
}

// The state of one save. `blobs` holds (name, bytes, per_rank) tuples; the
// caller keeps that list alive for the call, so the bytes stay valid.
SaveState MakeState(std::vector<Spec>&& tensors, WholeShards* whole, nb::list blobs,
                    const std::string& values_json, const std::string& metadata_json) {
  SaveState state;
  state.tensors = Items(std::move(tensors), whole);
  for (nb::handle item : blobs) {
    auto [name, data, per_rank] = nb::cast<std::tuple<std::string, nb::bytes, bool>>(item);
    state.blobs.push_back({name, data.c_str(), data.size(), per_rank});
  }
  state.values = values_json;  // checked by the save
  state.metadata = metadata_json;
  return state;
}

LoadRequest MakeRequest(std::vector<Spec>&& targets) {
  return LoadRequest{Items<TensorTarget>(std::move(targets), nullptr)};
}

// Whether the tensors `whole` names are the same (key, dtype, shape, by
// number) in `tensors`: planned against another open of the checkpoint.
bool SameTensors(const WholeTargets& whole, const PackedTensors& tensors) {
  const PackedTensors& planned = *whole.tensors;
  for (const WholeTensorTarget& t : whole.items) {
    const size_t n = t.tensor;
    if (n >= tensors.size() || planned.key(n) != tensors.key(n) ||
        planned.dtype(n) != tensors.dtype(n) ||
        !std::ranges::equal(planned.dims(n), tensors.dims(n))) {
      return false;
    }
  }
  return true;
}

// The targets a load's fast path planned against `source` (or another
// open of its checkpoint; moved out, once).
std::vector<WholeTensorTarget> TakeWhole(WholeTargets* whole, const CheckpointSource& source) {
  if (whole == nullptr) return {};
  if (whole->handed_over) {
    throw nb::value_error("a fast path's plan goes to one engine call; plan again");
  }
  if (whole->tensors != source.packed && !SameTensors(*whole, *source.packed)) {
    throw nb::value_error("a fast path's plan goes to a load of the checkpoint it was planned "
                          "for");
  }
  whole->handed_over = true;
  return std::exchange(whole->items, {});
}

// Options come as a dict of keyword arguments; an unknown key is an error so
// a typo does not silently fall back to a default.
template <typename Options>
class OptionReader {
 public:
  explicit OptionReader(nb::dict d) : d_(d) {}
  template <typename T>
  OptionReader& Get(const char* name, T Options::*field) {
    if (d_.contains(name)) {
      options_.*field = nb::cast<T>(d_[name]);
      ++used_;
    }
    return *this;
  }
  Options Done() {
    if (used_ != d_.size()) {
      std::string names;
      for (auto [k, v] : d_) names += " " + nb::cast<std::string>(k);
      throw StatusError(InvalidArgumentError("unknown option among:" + names));
    }
    return options_;
  }

 private:
  nb::dict d_;
  Options options_;
  size_t used_ = 0;
};

SaveOptions ParseSaveOptions(nb::dict d) {
  return OptionReader<SaveOptions>(d)
      .Get("max_file_bytes", &SaveOptions::max_file_bytes)
      .Get("direct_io", &SaveOptions::direct_io)
      .Get("io_threads", &SaveOptions::io_threads)
      .Get("io_buffer_bytes", &SaveOptions::io_buffer_bytes)
      .Get("io_depth", &SaveOptions::io_depth)
      .Get("overwrite", &SaveOptions::overwrite)
      .Get("verify_replicas", &SaveOptions::verify_replicas)
      .Get("update_latest", &SaveOptions::update_latest)
      .Get("peer_timeout", &SaveOptions::peer_timeout)
      .Done();
}

// False once the interpreter is shutting down (no Python may run then).
bool PythonUsable() {
#if PY_VERSION_HEX >= 0x030D0000
  return Py_IsInitialized() && !Py_IsFinalizing();
#else
  return Py_IsInitialized() && !_Py_IsFinalizing();
#endif
}

// The engine's DeviceMemory for one save or load call: copies go to the
// call's copier object (shardsafe._device.DeviceCopier: copy_to_host or
// copy_to_device([(dst, src, bytes), ...]), which knows the call's device
// tensors); registration goes
// to module functions (shardsafe._device.pin_host / unpin_host), since an
// async saver keeps its staging registered, and this object, beyond the
// call. Detach() drops the copier, with the GIL held, when the call ends,
// so that later this object holds nothing of Python's.
class PyDeviceMemory final : public DeviceMemory {
 public:
  explicit PyDeviceMemory(nb::object copier) : copier_(std::move(copier)) {}

  Status CopyToHost(std::span<const Copy> copies) override {
    return Call("copy_to_host", copies);
  }
  Status CopyToDevice(std::span<const Copy> copies) override {
    return Call("copy_to_device", copies);
  }
  void Register(void* host, size_t bytes) override { CallModule("pin_host", host, bytes); }
  void Unregister(void* host, size_t bytes) override { CallModule("unpin_host", host, bytes); }

  void Detach() { copier_.reset(); }

 private:
  Status Call(const char* method, std::span<const Copy> copies) {
    nb::gil_scoped_acquire gil;
    if (!copier_.is_valid()) return FailedPreconditionError("device copy after its call");
    try {
      nb::list list;
      for (const Copy& c : copies) {
        list.append(nb::make_tuple(reinterpret_cast<uintptr_t>(c.dst),
                                   reinterpret_cast<uintptr_t>(c.src), c.bytes));
      }
      copier_.attr(method)(list);
      return Status();
    } catch (const nb::python_error& e) {  // one line: the exception, not its traceback
      return UnavailableError("device copy failed: " +
                              nb::cast<std::string>(e.type().attr("__name__")) + ": " +
                              nb::cast<std::string>(nb::str(e.value())));
    } catch (const std::exception& e) {
      return UnavailableError(std::string("device copy failed: ") + e.what());
    }
  }

  // Best effort, like registration itself.
  static void CallModule(const char* name, void* host, size_t bytes) {
    if (!PythonUsable()) return;
    nb::gil_scoped_acquire gil;
    try {
      nb::module_::import_("shardsafe._device")
          .attr(name)(reinterpret_cast<uintptr_t>(host), bytes);
    } catch (const std::exception&) {
    }
  }

  nb::object copier_;
};

// (copier, the specs of the shards on the device), or None.
using DeviceArg = std::optional<std::pair<nb::object, std::vector<Spec>>>;

// Detaches the call's PyDeviceMemory when its SaveCall goes (Python drops
// it, with the GIL held).
struct DeviceCall {
  std::shared_ptr<PyDeviceMemory> memory;
  DeviceCall() = default;
  DeviceCall(DeviceCall&&) = default;  // the moved-from one holds nothing
  DeviceCall& operator=(DeviceCall&&) = delete;
  ~DeviceCall() {
    if (memory) memory->Detach();
  }
};

// One save's arguments as the engine takes them: _C.SaveCall(...), built
// once by the Python side and handed to whichever save runs it (save, an
// async save, a reservation; plain or a manager's). It keeps the blobs'
// bytes alive, and detaches its device copier when Python drops it.
struct SaveCall {
  SaveState state;
  SaveOptions options;
  std::unique_ptr<Comm> comm;
  DeviceCall device;
  nb::list blobs;  // the Python bytes state.blobs point into
  bool used = false;

  // The call, for the one engine call that runs it (an async save moves
  // its tensor list out: a second run would save nothing).
  SaveCall& Use() {
    if (used) throw nb::value_error("a SaveCall runs one save; build another");
    used = true;
    return *this;
  }
};

SaveCall MakeSaveCall(std::vector<Spec>&& tensors, WholeShards* whole, nb::list blobs,
                      const std::string& values, const std::string& metadata, nb::handle comm,
                      nb::dict options, DeviceArg&& device) {
  SaveCall c{MakeState(std::move(tensors), whole, blobs, values, metadata),
             ParseSaveOptions(options), MakeComm(comm), {}, blobs};
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

// Frees an async save's tensor list on a thread of its own once the call is
// done with it: after the staging copy has streamed the state through the
// cache, freeing 20,000 shards' keys and shapes took 12-17 ms that the
// caller need not wait for. Called with the GIL held (so one at a time). A
// child forked from this process has the pool but not its thread: it makes
// one of its own (the inherited one is left alone, like every pool here, it
// is never destroyed: it may outlive main).
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

LoadOptions ParseLoadOptions(nb::dict d) {
  LoadOptions o = OptionReader<LoadOptions>(d)
                      .Get("verify_checksums", &LoadOptions::verify_checksums)
                      .Get("convert_dtypes", &LoadOptions::convert_dtypes)
                      .Get("io_threads", &LoadOptions::io_threads)
                      .Get("scratch_bytes", &LoadOptions::scratch_bytes)
                      .Get("direct_io", &LoadOptions::direct_io)
                      .Get("share_reads", &LoadOptions::share_reads)
                      .Get("shared_memory", &LoadOptions::shared_memory)
                      .Get("device_staging_bytes", &LoadOptions::device_staging_bytes)
                      .Done();
  o.allow_partial = true;  // the Python layer reports missing keys itself
  return o;
}

nb::dict ToDict(const SaveStats& s) {
  nb::dict d;
  d["bytes_written"] = s.bytes_written;
  d["unique_bytes"] = s.unique_bytes;
  d["held_bytes"] = s.held_bytes;
  d["max_rank_bytes"] = s.max_rank_bytes;
  d["files"] = s.files;
  d["seconds"] = s.seconds;
  d["warnings"] = s.warnings;
  return d;
}

nb::dict ToDict(const LoadResult& r) {
  nb::dict d;
  d["path"] = r.path;
  d["tag"] = r.tag;
  // values and metadata come with the source's description (describe_source).
  d["saved_world_size"] = r.saved_world_size;
  nb::dict blobs;
  for (const auto& [name, data] : r.blobs) {
    blobs[nb::str(name.data(), name.size())] = nb::bytes(data.data(), data.size());
  }
  d["blobs"] = blobs;
  d["missing"] = r.missing;
  d["unexpected"] = r.unexpected;
  d["bytes_needed"] = r.bytes_needed;
  d["bytes_read"] = r.bytes_read;
  d["chunks_verified"] = r.chunks_verified;
  d["bytes_shared"] = r.bytes_shared;
  d["seconds"] = r.seconds;
  return d;
}

nb::dict ToDict(const CheckpointInfo& c) {
  nb::dict d;
  d["tag"] = c.tag;
  d["path"] = c.path;
  d["step"] = c.step;
  d["bytes"] = c.bytes;
  d["mtime_unix"] = c.mtime_unix;
  d["sequence"] = c.sequence;
  d["committed_ns"] = c.committed_ns;
  d["moved_latest"] = c.moved_latest;
  d["is_latest"] = c.is_latest;
  d["order_fault"] = c.order_fault.empty() ? nb::none() : nb::cast(c.order_fault);
  return d;
}

// (sources, target, dim) of shardsafe.hf.ExpertGroup
using ExpertSpec = std::tuple<std::vector<std::string>, std::string, int>;

ExportHfOptions ParseExportOptions(nb::dict d, std::optional<std::string> dtype,
                                   nb::object rename, const std::vector<ExpertSpec>& experts) {
  ExportHfOptions o = OptionReader<ExportHfOptions>(d)
                          .Get("max_shard_bytes", &ExportHfOptions::max_shard_bytes)
                          .Get("prefix", &ExportHfOptions::prefix)
                          .Get("include", &ExportHfOptions::include)
                          .Get("exclude", &ExportHfOptions::exclude)
                          .Get("weights_name", &ExportHfOptions::weights_name)
                          .Get("overwrite", &ExportHfOptions::overwrite)
                          .Get("verify_checksums", &ExportHfOptions::verify_checksums)
                          .Get("io_threads", &ExportHfOptions::io_threads)
                          .Done();
  if (dtype) o.dtype = Unwrap(ParseDType(*dtype));
  for (const auto& [sources, target, dim] : experts) o.experts.push_back({sources, target, dim});
  if (nb::isinstance<RenameRules>(rename)) {
    o.rename = nb::cast<const RenameRules&>(rename).rules();
  } else if (!rename.is_none()) {
    // Called from ExportHf's planning, on this thread, with the GIL released.
    // Copies of the function (inside the engine, GIL released) copy only the
    // shared_ptr; the last owner is `o`, destroyed with the GIL held.
    auto fn = std::make_shared<nb::object>(rename);
    o.rename_fn = [fn](const std::string& name) -> Result<std::string> {
      nb::gil_scoped_acquire gil;
      try {
        return nb::cast<std::string>((*fn)(name));
      } catch (const std::exception& e) {
        return InvalidArgumentError(std::string("rename raised: ") + e.what());
      }
    };
  }
  return o;
}

nb::dict ToDict(const ExportHfStats& s) {
  nb::dict d;
  d["source"] = s.source;
  d["files"] = s.files;
  d["copied"] = s.copied;
  d["tensors"] = s.tensors;
  d["bytes"] = s.bytes;
  d["total_parameters"] = s.total_parameters;
  d["bytes_read"] = s.bytes_read;
  d["chunks_verified"] = s.chunks_verified;
  d["seconds"] = s.seconds;
  d["warnings"] = s.warnings;
  return d;
}

// ExportHfStaging for Python: abort() removes the temporary directory now
// (dropping the object does too, later); finish() publishes it.
class ExportStaging {
 public:
  ExportStaging(const std::string& source, const std::string& out, nb::dict options,
                std::optional<std::string> dtype, nb::object rename,
                const std::vector<ExpertSpec>& experts) {
    ExportHfOptions o = ParseExportOptions(options, dtype, rename, experts);
    s_ = Released([&] { return ExportHfStaging::Create(source, out, o); });
  }
  std::string source() const { return Get().source(); }
  std::string dir() const { return Get().dir(); }
  nb::dict Finish() { return ToDict(Released([&] { return Get().Finish(); })); }
  void Abort() {
    nb::gil_scoped_release release;
    s_.reset();
  }

 private:
  ExportHfStaging& Get() const {
    if (!s_) Check(FailedPreconditionError("the export was aborted"));
    return *s_;
  }
  std::unique_ptr<ExportHfStaging> s_;
};

class Handle {
 public:
  explicit Handle(std::shared_ptr<AsyncSaveHandle> h) : h_(std::move(h)) {}
  double blocked_seconds() const { return h_->blocked_seconds(); }
  nb::dict wait() {
    Result<SaveStats> r = [&] {
      nb::gil_scoped_release release;
      return h_->Wait();
    }();
    return ToDict(Unwrap(std::move(r)));
  }

 private:
  std::shared_ptr<AsyncSaveHandle> h_;
};

// Starts an async save of `c` (`start` runs with the GIL released) and
// returns its handle; the call's tensor list is freed later (FreeLater).
template <typename Start>
Handle StartAsync(SaveCall& c, Start start) {
  Handle h(Released(start));
  FreeLater(std::move(c.state.tensors));
  return h;
}

void RegisterErrors() {
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const StatusError& e) {
      nb::object make = nb::module_::import_("shardsafe.errors").attr("from_status");
      nb::object exc = make(std::string(StatusCodeName(e.status.code())), e.status.message(),
                            std::string(ErrorDetailName(e.status.detail())));
      PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(exc.ptr())), exc.ptr());
    }
  });
}

// A fast path's items as an opaque Python object (len, and specs for tests).
template <typename Item>
void BindWhole(nb::module_& m, const char* name) {
  nb::class_<Whole<Item>>(m, name)
      .def("specs", [](const Whole<Item>& w) { return WholeSpecs(w); })
      .def("__len__", [](const Whole<Item>& w) { return w.items.size(); });
}

}  // namespace
}  // namespace shardsafe::python

NB_MODULE(_C, m) {
  using namespace shardsafe;
  using namespace shardsafe::python;
  m.doc() = "shardsafe engine bindings; use the `shardsafe` package, not this module";
  RegisterErrors();

  nb::class_<SaveCall>(m, "SaveCall")
      .def("__init__",
           [](SaveCall* self, std::vector<Spec> tensors, nb::list blobs, const std::string& values,
              const std::string& metadata, nb::handle comm, nb::dict options, WholeShards* whole,
              DeviceArg device) {
             new (self) SaveCall(MakeSaveCall(std::move(tensors), whole, blobs, values, metadata,
                                              comm, options, std::move(device)));
           },
           "tensors"_a, "blobs"_a, "values"_a, "metadata"_a, "comm"_a.none(), "options"_a,
           "whole"_a.none() = nb::none(), "device"_a.none() = nb::none())
      // The call of a rank that failed preparing its part: it saves nothing
      // and fails on every rank through the engine's first collective
      // (SaveOptions::local_failure).
      .def_static(
          "failed",
          [](nb::handle comm, const std::string& message) {
            SaveCall c{{}, {}, MakeComm(comm), {}, nb::list()};
            c.options.local_failure = InvalidArgumentError(message);
            return c;
          },
          "comm"_a.none(), "message"_a);

  m.def(
      "save",
      [](SaveCall& call, const std::string& path) {
        SaveCall& c = call.Use();
        return ToDict(Released([&] { return Save(c.state, path, *c.comm, c.options); }));
      },
      "call"_a, "path"_a);

  m.def("load",
        [](std::vector<Spec> targets, const std::string& path, nb::handle comm,
           nb::dict options) {
          LoadRequest request = MakeRequest(std::move(targets));
          LoadOptions o = ParseLoadOptions(options);
          std::unique_ptr<Comm> c = MakeComm(comm);
          return ToDict(Released([&] { return Load(request, path, *c, o); }));
        },
        "targets"_a, "path"_a, "comm"_a.none(), "options"_a);

  m.attr("DEFAULT_DEVICE_STAGING_BYTES") = LoadOptions{}.device_staging_bytes;
  BindOpenedSource(m);
  BindDownload(m);
  nb::class_<WholeTargets>(m, "WholeTargets")
      .def("specs", [](const WholeTargets& w) { return WholeSpecs(w); })
      .def("__len__", [](const WholeTargets& w) { return w.items.size(); });
  BindWhole<TensorShard>(m, "WholeShards");
  nb::class_<AskedTensors>(m, "AskedTensors")
      .def("__len__", [](const AskedTensors& a) { return a.count; });
  m.def("ask_tensors", &AskTensors, "keys"_a, "tensors"_a, "plain_types"_a, "strided"_a,
        "dtype_names"_a);
  m.def(
      "plan_whole",
      [](AskedTensors& asked, const OpenedSource& s) { return PlanWhole(asked, s.source); },
      "asked"_a, "source"_a);
  m.def("plan_save_whole", &PlanSaveWhole, "asked"_a);
  // `whole` (from plan_whole) is moved into the load: a second use raises.
  m.def("load_source",
        [](std::vector<Spec> targets, const OpenedSource& s, nb::handle comm,
           nb::dict options, WholeTargets* whole, DeviceArg device) {
          const std::vector<WholeTensorTarget> whole_targets = TakeWhole(whole, s.source);
          LoadRequest request = MakeRequest(std::move(targets));
          LoadOptions o = ParseLoadOptions(options);
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
          return ToDict(Released(
              [&] { return LoadOpenedSource(request, whole_targets, s.source, *c, o); }));
        },
        "targets"_a, "source"_a, "comm"_a.none(), "options"_a, "whole"_a.none() = nb::none(),
        "device"_a.none() = nb::none());

  // Rename rules in the engine's one dialect (shardsafe/hf.h RenameRule),
  // for loads as for exports.
  nb::class_<RenameRules>(m, "RenameRules")
      .def("__init__",
           [](RenameRules* self, const std::vector<std::pair<std::string, std::string>>& rules) {
             std::vector<RenameRule> r;
             for (const auto& [pattern, replacement] : rules) r.push_back({pattern, replacement});
             new (self) RenameRules(Unwrap(RenameRules::Create(r)));
           },
           "rules"_a)
      .def("__call__", &RenameRules::Apply, "name"_a)
      .def_prop_ro("rules", [](const RenameRules& r) {
        std::vector<std::pair<std::string, std::string>> out;
        for (const RenameRule& rule : r.rules()) out.emplace_back(rule.pattern, rule.replacement);
        return out;
      });

  m.def("export_hf",
        [](const std::string& source, const std::string& out, nb::dict options,
           std::optional<std::string> dtype, nb::object rename,
           const std::vector<ExpertSpec>& experts) {
          ExportHfOptions o = ParseExportOptions(options, dtype, rename, experts);
          return ToDict(Released([&] { return ExportHf(source, out, o); }));
        },
        "source"_a, "out"_a, "options"_a, "dtype"_a.none(), "rename"_a.none(), "experts"_a);
  // A collective export (shardsafe.hf.export with a process group): the
  // publishing rank holds the staging; every rank writes its part.
  nb::class_<ExportStaging>(m, "ExportHfStaging")
      .def(nb::init<const std::string&, const std::string&, nb::dict, std::optional<std::string>,
                    nb::object, const std::vector<ExpertSpec>&>(),
           "source"_a, "out"_a, "options"_a, "dtype"_a.none(), "rename"_a.none(), "experts"_a)
      .def_prop_ro("source", &ExportStaging::source)
      .def_prop_ro("dir", &ExportStaging::dir)
      .def("finish", &ExportStaging::Finish)
      .def("abort", &ExportStaging::Abort);
  m.def("export_hf_part",
        [](const std::string& source, const std::string& dir, nb::dict options,
           std::optional<std::string> dtype, nb::object rename,
           const std::vector<ExpertSpec>& experts, int index, int count) {
          ExportHfOptions o = ParseExportOptions(options, dtype, rename, experts);
          return ToDict(Released([&] { return ExportHfPart(source, dir, o, index, count); }));
        },
        "source"_a, "dir"_a, "options"_a, "dtype"_a.none(), "rename"_a.none(), "experts"_a,
        "index"_a, "count"_a);
  // The rules kept once, in the engine: tag names (docs/format.md §1) and
  // transformers' expert layouts (shardsafe/hf.h).
  m.def("validate_tag", [](const std::string& tag) { Check(ValidateTag(tag)); }, "tag"_a);
  m.def("check_local_path", [](const std::string& path) { Check(CheckLocalPath(path)); },
        "path"_a);
  m.def("expert_presets", [] {
    auto specs = [](const std::vector<ExpertRule>& rules) {
      std::vector<ExpertSpec> out;
      for (const ExpertRule& r : rules) out.emplace_back(r.sources, r.target, r.dim);
      return out;
    };
    return std::make_pair(specs(Qwen2MoeExperts()), specs(MixtralExperts()));
  });
  m.def("parse_byte_size", [](const std::string& s) { return Unwrap(ParseByteSize(s)); }, "text"_a);

  nb::class_<Handle>(m, "AsyncHandle")
      .def("wait", &Handle::wait)
      .def_prop_ro("blocked_seconds", &Handle::blocked_seconds);

  nb::class_<AsyncSaver>(m, "AsyncSaver")
      .def(nb::init<>())
      .def("save",
           [](AsyncSaver& saver, SaveCall& call, const std::string& root,
              const std::string& tag) {
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

  nb::class_<CheckpointManager>(m, "CheckpointManager")
      .def("__init__",
           [](CheckpointManager* self, const std::string& root, int keep_last,
              const std::string& tag_format) {
             const CheckpointManager::Options o{.keep_last = keep_last, .tag_format = tag_format};
             Unwrap(CheckpointManager(root, o).TagOf(0));  // a bad format fails here
             new (self) CheckpointManager(root, o);
           },
           "root"_a, "keep_last"_a, "tag_format"_a)
      .def("tag_of", [](const CheckpointManager& m, int64_t step) { return Unwrap(m.TagOf(step)); },
           "step"_a)
      .def("save",
           [](CheckpointManager& m, int64_t step, SaveCall& call) {
             SaveCall& c = call.Use();
             return ToDict(Released([&] { return m.Save(step, c.state, *c.comm, c.options); }));
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
      .def("list",
           [](CheckpointManager& m) {
             std::vector<nb::dict> out;
             for (const CheckpointInfo& c : Released([&] { return m.List(); })) {
               out.push_back(ToDict(c));
             }
             return out;
           })
      .def("prune", [](CheckpointManager& m, int keep) {
        std::vector<std::string> warnings;
        auto removed = Released([&] { return m.Prune(keep, &warnings); });
        for (const std::string& w : warnings) {  // checkpoints kept for an unknown order
          if (PyErr_WarnEx(PyExc_UserWarning, w.c_str(), 1) != 0) throw nb::python_error();
        }
        return removed;
      });

}
