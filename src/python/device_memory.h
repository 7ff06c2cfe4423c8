// The engine's DeviceMemory for one save or load call of the Python
// package: copies go to the call's copier object
// (shardsafe._device.DeviceCopier: copy_to_host or copy_to_device([(dst,
// src, bytes), ...]), which knows the call's device tensors); registration
// goes to module functions (shardsafe._device.pin_host / unpin_host), since
// an async saver keeps its staging registered, and this object, beyond the
// call. Detach() drops the copier, with the GIL held, when the call ends, so
// that later this object holds nothing of Python's.
#ifndef SHARDSAFE_PYTHON_DEVICE_MEMORY_H_
#define SHARDSAFE_PYTHON_DEVICE_MEMORY_H_

#include <nanobind/nanobind.h>

#include <memory>
#include <optional>
#include <span>
#include <utility>
#include <vector>

#include "python/specs.h"
#include "shardsafe/device_memory.h"

namespace shardsafe::python {

class PyDeviceMemory final : public DeviceMemory {
 public:
  explicit PyDeviceMemory(nanobind::object copier) : copier_(std::move(copier)) {}

  Status CopyToHost(std::span<const Copy> copies) override;
  Status CopyToDevice(std::span<const Copy> copies) override;
  void Register(void* host, size_t bytes) override;    // best effort
  void Unregister(void* host, size_t bytes) override;  // best effort

  void Detach() { copier_.reset(); }

 private:
  Status Call(const char* method, std::span<const Copy> copies);

  nanobind::object copier_;
};

// (copier, the specs of the tensors on the device), or None.
using DeviceArg = std::optional<std::pair<nanobind::object, std::vector<Spec>>>;

// Detaches the call's PyDeviceMemory when the call goes (Python drops it,
// with the GIL held).
struct DeviceCall {
  std::shared_ptr<PyDeviceMemory> memory;
  DeviceCall() = default;
  DeviceCall(DeviceCall&&) = default;  // the moved-from one holds nothing
  DeviceCall& operator=(DeviceCall&&) = delete;
  ~DeviceCall() {
    if (memory) memory->Detach();
  }
};

}  // namespace shardsafe::python

#endif  // SHARDSAFE_PYTHON_DEVICE_MEMORY_H_
