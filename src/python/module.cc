// shardsafe._C: the engine's API for the Python package (python/shardsafe).
//
// The Python side turns state dicts into flat lists of tensor specs
// (specs.h) and JSON text for plain values (the common case of a save or a
// load is planned here instead: whole_targets.h); the bindings turn those
// into engine calls and run them with the GIL released. Data is passed by
// pointer: nothing is copied. Shards on a device (a GPU) come as a separate
// spec list with a copier object that the engine calls back
// (device_memory.h). Collectives go through the Comm object the caller
// passes (a python/shardsafe/_comm.py adapter over torch.distributed, or
// None for one process). Options and results are the engine's structs,
// bound as classes (types.cc). A failed Status raises the matching
// shardsafe.errors class.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>

#include <exception>
#include <string>

#include "python/bindings.h"
#include "python/opened_source.h"
#include "python/status_error.h"
#include "shardsafe/checkpoint.h"
#include "shardsafe/filesystem.h"
#include "shardsafe/hf.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace shardsafe::python {
namespace {

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

// The rules kept once, in the engine: tag names (docs/format.md §1), local
// paths, byte sizes ("2GB").
void BindRules(nb::module_& m) {
  m.def("validate_tag", [](const std::string& tag) { Check(ValidateTag(tag)); }, "tag"_a);
  m.def("check_local_path", [](const std::string& path) { Check(CheckLocalPath(path)); },
        "path"_a);
  m.def("parse_byte_size", [](const std::string& s) { return Unwrap(ParseByteSize(s)); },
        "text"_a);
}

}  // namespace
}  // namespace shardsafe::python

NB_MODULE(_C, m) {
  using namespace shardsafe::python;
  m.doc() = "shardsafe engine bindings; use the `shardsafe` package, not this module";
  RegisterErrors();
  BindTypes(m);
  BindSave(m);
  BindAsync(m);
  BindComm(m);
  BindOpenedSource(m);
  BindLoad(m);
  BindManager(m);
  BindHf(m);
  BindDownload(m);
  BindRules(m);
}
