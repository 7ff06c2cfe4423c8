// The engine's option and result structs as Python classes: each field
// Python sets or reads is named here once, and documented once, in the
// Python package (shardsafe.SaveOptions and LoadOptions are checked against
// these classes; shardsafe._result.as_dict turns a result into the dict the
// public functions return).
#include <nanobind/nanobind.h>
#include <nanobind/stl/chrono.h>
#include <nanobind/stl/map.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "python/bindings.h"
#include "shardsafe/checkpoint.h"
#include "shardsafe/hf.h"

namespace nb = nanobind;

namespace shardsafe::python {
namespace {

void BindOptions(nb::module_& m) {
  nb::class_<SaveOptions>(m, "SaveOptions")
      .def(nb::init<>())
      .def_rw("max_file_bytes", &SaveOptions::max_file_bytes)
      .def_rw("direct_io", &SaveOptions::direct_io)
      .def_rw("io_threads", &SaveOptions::io_threads)
      .def_rw("io_buffer_bytes", &SaveOptions::io_buffer_bytes)
      .def_rw("io_depth", &SaveOptions::io_depth)
      .def_rw("overwrite", &SaveOptions::overwrite)
      .def_rw("verify_replicas", &SaveOptions::verify_replicas)
      .def_rw("update_latest", &SaveOptions::update_latest)
      .def_rw("peer_timeout", &SaveOptions::peer_timeout);
  nb::class_<LoadOptions>(m, "LoadOptions")
      .def(nb::init<>())
      .def_rw("verify_checksums", &LoadOptions::verify_checksums)
      .def_rw("convert_dtypes", &LoadOptions::convert_dtypes)
      .def_rw("io_threads", &LoadOptions::io_threads)
      .def_rw("scratch_bytes", &LoadOptions::scratch_bytes)
      .def_rw("direct_io", &LoadOptions::direct_io)
      .def_rw("share_reads", &LoadOptions::share_reads)
      .def_rw("shared_memory", &LoadOptions::shared_memory)
      .def_rw("device_staging_bytes", &LoadOptions::device_staging_bytes);
  nb::class_<ExportHfOptions>(m, "ExportHfOptions")
      .def(nb::init<>())
      .def_rw("max_shard_bytes", &ExportHfOptions::max_shard_bytes)
      .def_rw("prefix", &ExportHfOptions::prefix)
      .def_rw("include", &ExportHfOptions::include)
      .def_rw("exclude", &ExportHfOptions::exclude)
      .def_rw("weights_name", &ExportHfOptions::weights_name)
      .def_rw("overwrite", &ExportHfOptions::overwrite)
      .def_rw("verify_checksums", &ExportHfOptions::verify_checksums)
      .def_rw("io_threads", &ExportHfOptions::io_threads);
}

void BindSaveAndLoadResults(nb::module_& m) {
  nb::class_<SaveStats>(m, "SaveStats")
      .def_ro("bytes_written", &SaveStats::bytes_written)
      .def_ro("unique_bytes", &SaveStats::unique_bytes)
      .def_ro("held_bytes", &SaveStats::held_bytes)
      .def_ro("max_rank_bytes", &SaveStats::max_rank_bytes)
      .def_ro("files", &SaveStats::files)
      .def_ro("seconds", &SaveStats::seconds)
      .def_ro("plan_reused", &SaveStats::plan_reused)
      .def_ro("warnings", &SaveStats::warnings);
  // values and metadata come with the source's description (describe_source).
  nb::class_<LoadResult>(m, "LoadResult")
      .def_ro("path", &LoadResult::path)
      .def_ro("tag", &LoadResult::tag)
      .def_ro("saved_world_size", &LoadResult::saved_world_size)
      .def_prop_ro("blobs",
                   [](const LoadResult& r) {
                     nb::dict blobs;
                     for (const auto& [name, data] : r.blobs) {
                       blobs[nb::str(name.data(), name.size())] =
                           nb::bytes(data.data(), data.size());
                     }
                     return blobs;
                   })
      .def_ro("missing", &LoadResult::missing)
      .def_ro("unexpected", &LoadResult::unexpected)
      .def_ro("bytes_needed", &LoadResult::bytes_needed)
      .def_ro("bytes_read", &LoadResult::bytes_read)
      .def_ro("chunks_verified", &LoadResult::chunks_verified)
      .def_ro("bytes_shared", &LoadResult::bytes_shared)
      .def_ro("seconds", &LoadResult::seconds);
}

void BindOtherResults(nb::module_& m) {
  nb::class_<CheckpointInfo>(m, "CheckpointInfo")
      .def_ro("tag", &CheckpointInfo::tag)
      .def_ro("path", &CheckpointInfo::path)
      .def_ro("step", &CheckpointInfo::step)
      .def_ro("bytes", &CheckpointInfo::bytes)
      .def_ro("mtime_unix", &CheckpointInfo::mtime_unix)
      .def_ro("sequence", &CheckpointInfo::sequence)
      .def_ro("committed_ns", &CheckpointInfo::committed_ns)
      .def_ro("moved_latest", &CheckpointInfo::moved_latest)
      .def_ro("is_latest", &CheckpointInfo::is_latest)
      .def_ro("tiers", &CheckpointInfo::tiers)
      .def_prop_ro("order_fault", [](const CheckpointInfo& c) {
        return c.order_fault.empty() ? nb::none() : nb::cast(c.order_fault);
      });
  nb::class_<ExportHfStats>(m, "ExportHfStats")
      .def_ro("source", &ExportHfStats::source)
      .def_ro("files", &ExportHfStats::files)
      .def_ro("copied", &ExportHfStats::copied)
      .def_ro("tensors", &ExportHfStats::tensors)
      .def_ro("bytes", &ExportHfStats::bytes)
      .def_ro("total_parameters", &ExportHfStats::total_parameters)
      .def_ro("bytes_read", &ExportHfStats::bytes_read)
      .def_ro("chunks_verified", &ExportHfStats::chunks_verified)
      .def_ro("seconds", &ExportHfStats::seconds)
      .def_ro("warnings", &ExportHfStats::warnings);
}

}  // namespace

void BindTypes(nb::module_& m) {
  BindOptions(m);
  BindSaveAndLoadResults(m);
  BindOtherResults(m);
}

}  // namespace shardsafe::python
