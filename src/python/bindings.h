// The parts of shardsafe._C, one function per area, each registering its
// classes and functions in `m`; module.cc calls them in this order (a class
// is bound before a function that takes or returns it).
#ifndef SHARDSAFE_PYTHON_BINDINGS_H_
#define SHARDSAFE_PYTHON_BINDINGS_H_

#include <nanobind/nanobind.h>

namespace shardsafe::python {

// types.cc: SaveOptions, LoadOptions, ExportHfOptions (the fields Python
// sets; the engine's defaults), and the results SaveStats, LoadResult,
// CheckpointInfo, ExportHfStats (read-only fields).
void BindTypes(nanobind::module_& m);
// save_call.cc: SaveCall, save; AsyncHandle, AsyncSaver.
void BindSave(nanobind::module_& m);
void BindAsync(nanobind::module_& m);
// bind_load.cc: load_source, the fast paths' plans (WholeTargets,
// WholeShards, AskedTensors, ask_tensors, plan_whole, plan_save_whole).
void BindLoad(nanobind::module_& m);
// py_comm.cc: agree (every rank's payload and failure, in one engine
// collective: AllGatherOrFail).
void BindComm(nanobind::module_& m);
// opened_source.h: OpenedSource, open_source, PendingSource, describe.
void BindOpenedSource(nanobind::module_& m);
// bind_manager.cc: CheckpointManager.
void BindManager(nanobind::module_& m);
// bind_hf.cc: RenameRules, export_hf, ExportHfStaging, export_hf_part,
// expert_presets.
void BindHf(nanobind::module_& m);
// download.cc: PrefixDownload.
void BindDownload(nanobind::module_& m);

}  // namespace shardsafe::python

#endif  // SHARDSAFE_PYTHON_BINDINGS_H_
