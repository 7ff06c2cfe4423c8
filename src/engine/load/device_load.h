// Loading into device memory (TensorTarget::on_device) through bounded host
// staging.
//
// The device targets are cut into pieces of at most one staging buffer (a
// flat range of the target's box, whole bytes; a target that fits stays
// whole) and packed, in order, into batches of one buffer each. Two buffers
// of device_staging_bytes / 2 take turns: SourceReader reads a batch into
// one (planned like any load, straight into the buffer, converting dtypes
// on the way) while the other's bytes go to the device
// (DeviceMemory::CopyToDevice, on a thread of its own). Host memory held:
// device_staging_bytes at most, registered with the device for the load,
// or none where the caller lends registered memory that holds both buffers
// (LoadOptions::device_staging_memory).
//
// Checksums: SourceReader checks every chunk whose bytes stream through in
// file order, across batches; the chunks of tensors some device target
// takes whole that were read out of order are read once more and checked
// (SourceReader::VerifyRest). A chunk only partly needed is not checked, as
// in a load into host memory.
#pragma once

#include <string>
#include <vector>

#include "shardsafe/source.h"

namespace shardsafe {

struct DeviceLoadStats {
  uint64_t bytes_read = 0;
  uint64_t chunks_verified = 0;
};

// A target on the device and the key of the checkpoint tensor it takes
// (as the index spells it).
struct DeviceTarget {
  const TensorTarget* target;
  const std::string* key;
};

// Loads `targets` from `src` through options.device (not null). Errors as
// Load's; a failed copy is the DeviceMemory's error.
Result<DeviceLoadStats> LoadIntoDevice(const std::vector<DeviceTarget>& targets,
                                       const CheckpointSource& src, FileSystem& fs,
                                       const LoadOptions& options);

}  // namespace shardsafe
