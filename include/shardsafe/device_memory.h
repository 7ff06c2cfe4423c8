// DeviceMemory: how the engine reads shards that live in memory the CPU
// cannot read directly (a GPU's), and loads into such memory. The engine
// stays free of any device API: the caller supplies the copies
// (cudaMemcpyAsync, a framework's copy) and marks such shards
// TensorShard::on_device, such targets TensorTarget::on_device.
//
//   A synchronous Save streams each device shard through the data file's
//   own O_DIRECT buffers (WritableFile::AppendFilled): nothing of the state
//   is staged whole, so the save's extra host memory keeps its bound.
//   An AsyncSaver copies device shards straight into its staging arena,
//   which it offers to Register once (page-locked memory copies at the
//   device's full rate); their checksums are computed in the background,
//   after the call has returned, from the staged bytes.
//   A Load reads device targets' bytes into two host buffers in turn
//   (LoadOptions::device_staging_bytes in all, registered for the load)
//   and copies each to the device while it reads into the other.
#pragma once

#include <cstddef>
#include <span>

#include "shardsafe/status.h"

namespace shardsafe {

class DeviceMemory {
 public:
  // One copy of `bytes` bytes from `src` to `dst`: for CopyToHost from a
  // device address (a shard's `data` plus an offset) into host memory, for
  // CopyToDevice from host memory to a device address (a target's `data`
  // plus an offset).
  struct Copy {
    void* dst;
    const void* src;
    size_t bytes;
  };

  virtual ~DeviceMemory() = default;

  // Copies every request and returns once all their bytes have landed in
  // host memory (the caller reads them right after), or the first error.
  // Called on the engine's threads, possibly from several at once.
  virtual Status CopyToHost(std::span<const Copy> copies) = 0;

  // Copies every request and returns once all their bytes have landed on
  // the device (the caller reuses the host memory right after), or the
  // first error. Called on an engine thread, one call at a time per load.
  virtual Status CopyToDevice(std::span<const Copy> copies) {
    return UnimplementedError("this DeviceMemory cannot copy to the device");
  }

  // Host memory that will receive copies again and again (an async saver's
  // staging arena): an implementation may page-lock it so copies run at the
  // device's full rate. The engine calls Unregister for the same range
  // before it frees the memory; a region may be registered through one
  // object and then copied into through another (a later save's). Best
  // effort: copies into memory that could not be registered still work.
  virtual void Register(void* host, size_t bytes) { (void)host, (void)bytes; }
  virtual void Unregister(void* host, size_t bytes) { (void)host, (void)bytes; }
};

}  // namespace shardsafe
