// A checkpoint opened for a load, as the Python side holds it: its index
// read and validated once (by rank 0, then broadcast to every rank:
// OpenSourceCollectivePacked), its tensors packed, described to Python
// without copying the index, planned against (whole_targets.h) and handed
// to the engine's load.
#ifndef SHARDSAFE_PYTHON_OPENED_SOURCE_H_
#define SHARDSAFE_PYTHON_OPENED_SOURCE_H_

#include <nanobind/nanobind.h>

#include "shardsafe/source.h"

namespace shardsafe::python {

struct OpenedSource {
  CheckpointSource source;
};

// Registers, in `m`:
// - OpenedSource (other_format: OpenSourceCollectivePacked's); open_source(
//   path, comm, other_format=""): the collective open, rank 0's
//   `other_format` sent with it.
// - PendingSource(path): an open of one process's checkpoint started on a
//   new thread, so that the caller can walk its state meanwhile. wait()
//   waits for it with the GIL released and raises what the open failed with
//   (any number of calls); result() then returns the OpenedSource (once: a
//   second call raises ValueError). Dropped unwaited, it joins the thread.
// - describe_source(opened): {path, tag, native, values, metadata, blobs,
//   tensors}, where tensors is a SavedTensors: a read-only view {key:
//   (dtype name, shape tuple)} of the index's packed tensors that builds
//   the entry looked up, and each key as iteration reaches it (keys in
//   sorted order; it keeps the OpenedSource alive), to_dict() all of them
//   as a dict (for many lookups: ~0.2 us each, a dict's ~0.01).
// - describe(path): the same for a path, tensors a dict.
void BindOpenedSource(nanobind::module_& m);

}  // namespace shardsafe::python

#endif  // SHARDSAFE_PYTHON_OPENED_SOURCE_H_
