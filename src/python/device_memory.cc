#include "python/device_memory.h"

#include <nanobind/stl/string.h>

#include <cstdint>
#include <string>

namespace nb = nanobind;

namespace shardsafe::python {
namespace {

// False once the interpreter is shutting down (no Python may run then).
bool PythonUsable() {
#if PY_VERSION_HEX >= 0x030D0000
  return Py_IsInitialized() && !Py_IsFinalizing();
#else
  return Py_IsInitialized() && !_Py_IsFinalizing();
#endif
}

// shardsafe._device.NAME(host, bytes), best effort, like registration itself.
void CallModule(const char* name, void* host, size_t bytes) {
  if (!PythonUsable()) return;
  nb::gil_scoped_acquire gil;
  try {
    nb::module_::import_("shardsafe._device").attr(name)(reinterpret_cast<uintptr_t>(host), bytes);
  } catch (const std::exception&) {
  }
}

}  // namespace

Status PyDeviceMemory::CopyToHost(std::span<const Copy> copies) {
  return Call("copy_to_host", copies);
}

Status PyDeviceMemory::CopyToDevice(std::span<const Copy> copies) {
  return Call("copy_to_device", copies);
}

void PyDeviceMemory::Register(void* host, size_t bytes) { CallModule("pin_host", host, bytes); }

void PyDeviceMemory::Unregister(void* host, size_t bytes) {
  CallModule("unpin_host", host, bytes);
}

Status PyDeviceMemory::Call(const char* method, std::span<const Copy> copies) {
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

}  // namespace shardsafe::python
