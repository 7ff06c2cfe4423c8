#include "python/opened_source.h"

#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <array>
#include <exception>
#include <mutex>
#include <new>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include "python/py_comm.h"
#include "python/status_error.h"
#include "python/whole_targets.h"
#include "format/index_packed.h"
#include "shardsafe/source.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace shardsafe::python {
namespace {

// One str object per dtype name, made on first use.
class DTypeNames {
 public:
  nb::handle Of(DType dtype) {
    nb::object& name = names_[static_cast<size_t>(dtype)];
    if (!name.is_valid()) name = nb::str(DTypeName(dtype).data(), DTypeName(dtype).size());
    return name;
  }

 private:
  std::array<nb::object, kNumDTypes> names_;
};

// (dtype name, shape tuple) of saved tensor t.
nb::tuple Entry(DTypeNames& names, const PackedTensors& tensors, size_t t) {
  return nb::make_tuple(names.Of(tensors.dtype(t)), ShapeTuple(tensors.shape(t)));
}

nb::str KeyStr(const PackedTensors& tensors, size_t t) {
  const std::string_view key = tensors.key(t);
  return nb::str(key.data(), key.size());
}

// {key: (dtype name, shape tuple)} of every tensor.
nb::dict TensorsDict(const PackedTensors& tensors) {
  nb::dict d;
  DTypeNames names;
  for (size_t t = 0; t < tensors.size(); ++t) d[KeyStr(tensors, t)] = Entry(names, tensors, t);
  return d;
}

// The tensors of an OpenedSource as a read-only mapping, each entry built
// when looked up: a load in its common case looks up none (20,000 tensors:
// 5-8 ms for a dict of all of them).
class SavedTensors {
 public:
  explicit SavedTensors(nb::object opened)
      : opened_(std::move(opened)),
        tensors_(*nb::cast<const OpenedSource&>(opened_).source.packed) {}

  size_t size() const { return tensors_.size(); }
  bool contains(nb::handle key) const { return Find(key).has_value(); }
  nb::tuple at(nb::handle key) {
    const std::optional<size_t> t = Find(key);
    if (!t) {
      PyErr_SetObject(PyExc_KeyError, key.ptr());
      throw nb::python_error();
    }
    return Entry(names_, tensors_, *t);
  }
  nb::dict to_dict() const { return TensorsDict(tensors_); }
  // The keys, each made as it is reached (no list of them all).
  nb::object iter(nb::handle self) const;
  const PackedTensors& tensors() const { return tensors_; }

 private:
  std::optional<size_t> Find(nb::handle key) const {
    const std::optional<std::string_view> utf8 = Utf8Of(key);  // not a str: no such key
    return utf8 ? tensors_.Find(*utf8) : std::nullopt;
  }

  nb::object opened_;  // keeps tensors_ alive
  const PackedTensors& tensors_;
  DTypeNames names_;
};

// An iterator over a SavedTensors' keys (which it keeps alive).
class SavedKeys {
 public:
  explicit SavedKeys(nb::object saved)
      : saved_(std::move(saved)), tensors_(nb::cast<const SavedTensors&>(saved_).tensors()) {}
  nb::str next() {
    if (next_ >= tensors_.size()) throw nb::stop_iteration();
    return KeyStr(tensors_, next_++);
  }

 private:
  nb::object saved_;
  const PackedTensors& tensors_;
  size_t next_ = 0;
};

nb::object SavedTensors::iter(nb::handle self) const {
  return nb::cast(SavedKeys(nb::borrow(self)));
}

// An open on a thread of its own; see the header.
class PendingSource {
 public:
  explicit PendingSource(std::string path) : path_(std::move(path)) {
    try {
      thread_ = std::thread([this] { opened_ = Open(path_); });
    } catch (const std::system_error&) {  // no thread to be had: wait() opens it
    }
  }
  ~PendingSource() {
    if (thread_.joinable()) {
      nb::gil_scoped_release release;
      thread_.join();
    }
  }
  PendingSource(const PendingSource&) = delete;
  PendingSource& operator=(const PendingSource&) = delete;

  void wait() {
    {
      nb::gil_scoped_release release;
      std::call_once(finished_, [this] {
        if (thread_.joinable()) {
          thread_.join();
        } else {
          opened_ = Open(path_);
        }
      });
    }
    Check(opened_.status());
  }

  OpenedSource result() {
    if (taken_) throw nb::value_error("PendingSource.result() called twice");
    wait();
    taken_ = true;
    return OpenedSource{std::move(opened_).value()};
  }

 private:
  // OpenSourcePacked, with what it throws (no memory for a large index) as
  // a Status: an exception must not leave the thread.
  static Result<CheckpointSource> Open(const std::string& path) {
    try {
      return OpenSourcePacked(path);
    } catch (const std::bad_alloc&) {
      return ResourceExhaustedError("no memory to open " + path);
    } catch (const std::exception& e) {
      return InternalError("opening " + path + ": " + e.what());
    }
  }

  const std::string path_;
  Result<CheckpointSource> opened_ = CheckpointSource();
  std::once_flag finished_;  // the open joined (or run here)
  bool taken_ = false;
  std::thread thread_;  // writes opened_; joined before any member is destroyed
};

// Every field of describe_source but "tensors".
nb::dict Fields(const CheckpointSource& source) {
  nb::dict d;
  d["path"] = source.path;
  d["tag"] = source.index.tag;
  d["native"] = source.native;
  d["values"] = source.index.values;
  d["metadata"] = source.index.metadata;
  std::vector<std::string> blobs;
  nb::dict per_rank;  // per-rank blob name -> the ranks that saved one
  for (const auto& [name, blob] : source.index.blobs) {
    blobs.push_back(name);
    if (!blob.per_rank) continue;
    std::vector<int> ranks;
    for (const IndexBlobChunk& c : blob.chunks) ranks.push_back(c.rank);
    per_rank[nb::str(name.data(), name.size())] = ranks;
  }
  d["blobs"] = blobs;
  d["per_rank_blobs"] = per_rank;
  d["saved_world_size"] = source.index.world_size;
  return d;
}

nb::dict Describe(const std::string& path) {
  const CheckpointSource source = Released([&] { return OpenSourcePacked(path); });
  nb::dict d = Fields(source);
  d["tensors"] = TensorsDict(*source.packed);
  return d;
}

}  // namespace

void BindOpenedSource(nb::module_& m) {
  nb::class_<OpenedSource>(m, "OpenedSource")
      .def_prop_ro("other_format",
                   [](const OpenedSource& s) { return s.source.other_format; });
  m.def("open_source",
        [](const std::string& path, nb::handle comm, const std::string& other_format) {
          std::unique_ptr<Comm> c = MakeComm(comm);
          return OpenedSource{Released(
              [&] { return OpenSourceCollectivePacked(path, *c, other_format); })};
        },
        "path"_a, "comm"_a.none(), "other_format"_a = "");
  nb::class_<PendingSource>(m, "PendingSource")
      .def(nb::init<std::string>(), "path"_a)
      .def("wait", &PendingSource::wait)
      .def("result", &PendingSource::result);
  nb::class_<SavedKeys>(m, "SavedKeys")
      .def("__iter__", [](nb::handle self) { return nb::borrow(self); })
      .def("__next__", &SavedKeys::next);
  nb::class_<SavedTensors>(m, "SavedTensors")
      .def("__len__", &SavedTensors::size)
      .def("__contains__", &SavedTensors::contains)
      .def("__getitem__", &SavedTensors::at)
      .def("__iter__",
           [](nb::handle self) { return nb::cast<const SavedTensors&>(self).iter(self); })
      .def("to_dict", &SavedTensors::to_dict);
  m.def("describe_source",
        [](nb::object opened) {
          nb::dict d = Fields(nb::cast<const OpenedSource&>(opened).source);
          d["tensors"] = SavedTensors(std::move(opened));
          return d;
        },
        "source"_a);
  m.def("describe", &Describe, "path"_a);
}

}  // namespace shardsafe::python
