// One save's arguments as the engine takes them, and an async save's handle
// (shardsafe._C.SaveCall, AsyncHandle).
#ifndef SHARDSAFE_PYTHON_SAVE_CALL_H_
#define SHARDSAFE_PYTHON_SAVE_CALL_H_

#include <nanobind/nanobind.h>

#include <memory>
#include <utility>
#include <vector>

#include "python/device_memory.h"
#include "python/status_error.h"
#include "shardsafe/async_save.h"
#include "shardsafe/checkpoint.h"
#include "shardsafe/comm.h"

namespace shardsafe::python {

// _C.SaveCall(...), built once by the Python side and handed to whichever
// save runs it (save, an async save, a reservation; plain or a manager's).
// It keeps the blobs' bytes alive, and detaches its device copier when
// Python drops it.
struct SaveCall {
  SaveState state;
  SaveOptions options;
  std::unique_ptr<Comm> comm;
  DeviceCall device;
  nanobind::list blobs;  // the Python bytes state.blobs point into
  bool used = false;

  // The call, for the one engine call that runs it (an async save moves
  // its tensor list out: a second run would save nothing).
  SaveCall& Use() {
    if (used) throw nanobind::value_error("a SaveCall runs one save; build another");
    used = true;
    return *this;
  }
};

// An async save in flight: wait() returns its SaveStats (GIL released).
class Handle {
 public:
  explicit Handle(std::shared_ptr<AsyncSaveHandle> h) : h_(std::move(h)) {}
  double blocked_seconds() const { return h_->blocked_seconds(); }
  SaveStats wait();

 private:
  std::shared_ptr<AsyncSaveHandle> h_;
};

// Frees an async save's tensor list on a thread of its own (with the GIL
// held: one at a time); see save_call.cc.
void FreeLater(std::vector<TensorShard>&& tensors);

// Starts an async save of `c` (`start` runs with the GIL released) and
// returns its handle; the call's tensor list is freed later (FreeLater).
template <typename Start>
Handle StartAsync(SaveCall& c, Start start) {
  Handle h(Released(start));
  FreeLater(std::move(c.state.tensors));
  return h;
}

}  // namespace shardsafe::python

#endif  // SHARDSAFE_PYTHON_SAVE_CALL_H_
