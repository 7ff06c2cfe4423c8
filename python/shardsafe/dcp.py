"""torch.distributed.checkpoint (DCP) storage backed by shardsafe.

    import torch.distributed.checkpoint as dcp
    import shardsafe.dcp
    dcp.save(state_dict, storage_writer=shardsafe.dcp.Writer("/ckpt/step-100"))
    dcp.load(state_dict, storage_reader=shardsafe.dcp.Reader("/ckpt/step-100"))

The contract:

- A checkpoint written by `Writer` is an ordinary shardsafe checkpoint: one
  tensor per DCP FQN (plain tensors, DTensor and ShardedTensor shards, each
  box written once), committed atomically by one collective shardsafe save
  inside `write_data`. Non-tensor values (DCP's BYTE_IO items) are stored
  as global blobs "dcp/<FQN>" holding DCP's own bytes (torch.save), so DCP
  gets back exactly what it wrote; those that JSON can hold are also stored
  as shardsafe values under their FQN, so `shardsafe.load` of the same state
  structure reads the checkpoint too (with strict=True). DCP's flattening
  map (planner_data) is kept in the global blob "dcp.planner_data".
- `Reader` reads any checkpoint shardsafe can (a checkpoint directory, a
  root: its latest, a .safetensors file, a Hugging Face directory). Its DCP
  `Metadata` has one whole-tensor chunk per tensor (shardsafe serves any
  box, so DCP's resharding reads become direct box loads) and a bytes entry
  per value. Values saved by `shardsafe.save` are served to DCP as
  torch.save bytes of the JSON value, shaped after the target's (tuples and
  integer dict keys come back); pickled values need unsafe_pickle=True.
- The save is collective over the Writer's `process_group` (default: the
  world when torch.distributed is initialised): pass the group given to
  dcp.save. When DCP plans for one process (no_dist=True, or
  use_collectives=False), each process saves alone, so each needs its own
  path. Loads need no collective: each rank reads its boxes itself.
- `finish` (on DCP's coordinator) checks that the committed checkpoint holds
  every item of DCP's metadata; the commit itself is already done.
- Errors are shardsafe.errors classes: a missing checkpoint raises
  CheckpointNotFoundError when the Reader is given its path (constructor or
  checkpoint_id), a bad tag InvalidStateError when the Writer is. Errors
  inside DCP's planning or writing steps reach the caller wrapped in DCP's
  CheckpointException, as for any storage.
"""

from __future__ import annotations

import dataclasses
import io
import json
import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.metadata import (BytesStorageMetadata, ChunkStorageMetadata,
                                                   Metadata, StorageMeta,
                                                   TensorProperties, TensorStorageMetadata)
from torch.distributed.checkpoint.planner import (LoadItemType, LoadPlan, LoadPlanner, SavePlan,
                                                  SavePlanner, WriteItem, WriteItemType)
from torch.distributed.checkpoint.storage import StorageReader, StorageWriter, WriteResult
from torch.futures import Future

from . import _C
from ._api import _agree, _dtype_name
from ._comm import TorchComm, resolve
from ._state import DTYPE_NAMES, PICKLE_PREFIX, TORCH_DTYPES, decode_value, to_json
from .errors import InvalidStateError, ShardsafeError

try:
    from torch.distributed.tensor import DTensor
except ImportError:  # torch without distributed support
    DTensor = None

__all__ = ["Writer", "Reader"]

BYTES_PREFIX = "dcp/"  # blob name of a DCP BYTE_IO item: "dcp/" + FQN
PLANNER_DATA_BLOB = "dcp.planner_data"  # JSON {FQN: path}: DCP's flattening map

_TAG = re.compile(r"[A-Za-z0-9._+=-]{1,200}")


def _check_tag(path: str) -> None:
    """docs/format.md §1: the last path component is the checkpoint's tag."""
    tag = os.path.basename(os.path.normpath(path))
    if not _TAG.fullmatch(tag) or tag.startswith(".") or tag == "latest":
        raise InvalidStateError(f"{path}: tag {tag!r} is not 1-200 characters of "
                                f"[A-Za-z0-9._+=-] not starting with '.' (nor 'latest')")


def _no_path(what: str) -> InvalidStateError:
    return InvalidStateError(f"shardsafe.dcp.{what} has no checkpoint path: pass one to it, or "
                             f"checkpoint_id= to dcp.{'save' if what == 'Writer' else 'load'}")


def _done(value: Any) -> Future:
    fut: Future = Future()
    fut.set_result(value)
    return fut


# ------------------------------------------------------------------ writer --

@dataclass
class _PlanInfo:
    """What the coordinator tells every rank in its plan's storage_data."""

    world: int  # how many ranks DCP planned for


@dataclass
class _Staged:
    """One rank's part of the save, ready for the engine."""

    specs: list[tuple] = dataclasses.field(default_factory=list)
    blobs: list[tuple] = dataclasses.field(default_factory=list)
    values: dict[str, Any] = dataclasses.field(default_factory=dict)  # FQN -> JSON data
    results: list[WriteResult] = dataclasses.field(default_factory=list)
    keep: list[torch.Tensor] = dataclasses.field(default_factory=list)  # alive for the engine


def _local(item: WriteItem, data: Any) -> torch.Tensor:
    """The dense CPU tensor holding a tensor item's chunk."""
    key = item.index.fqn
    if not isinstance(data, torch.Tensor):
        raise InvalidStateError(f"tensor {key!r}: the planner resolved it to "
                                f"{type(data).__name__}, not a tensor")
    if DTensor is not None and isinstance(data, DTensor):
        data = data.to_local()
    sizes = tuple(item.tensor_data.chunk.sizes)
    if tuple(data.shape) != sizes:
        raise InvalidStateError(f"tensor {key!r}: the planner resolved a {tuple(data.shape)} "
                                f"tensor for a chunk of size {sizes}")
    _dtype_name(key, data)
    return data.detach().cpu().resolve_conj().resolve_neg().contiguous()


_NOT_JSON = object()


def _json_copy(key: str, blob: bytes) -> Any:
    """The value as JSON data for plain shardsafe.load, or _NOT_JSON when
    JSON cannot hold it (it is then only in its blob)."""
    try:
        return to_json(torch.load(io.BytesIO(blob), weights_only=True), key)
    except Exception:  # noqa: BLE001 - any value weights_only or JSON refuses
        return _NOT_JSON


def _stage(items: list[WriteItem], planner: SavePlanner) -> _Staged:
    staged = _Staged()
    for item in items:
        key = item.index.fqn
        data = planner.resolve_data(item)
        if item.type == WriteItemType.BYTE_IO:
            blob = data.getvalue() if isinstance(data, io.BytesIO) else bytes(data)
            staged.blobs.append((BYTES_PREFIX + key, blob, False))
            value = _json_copy(key, blob)
            if value is not _NOT_JSON:
                staged.values[key] = value
            staged.results.append(WriteResult(item.index, len(blob), BYTES_PREFIX + key))
            continue
        local = _local(item, data)
        chunk, shape = item.tensor_data.chunk, tuple(item.tensor_data.size)
        nbytes = local.numel() * local.element_size()
        staged.results.append(WriteResult(item.index, nbytes, key))
        if local.numel() == 0 and math.prod(shape) != 0:
            continue  # an empty shard of a non-empty tensor holds nothing
        staged.keep.append(local)
        staged.specs.append((key, DTYPE_NAMES[local.dtype], shape, tuple(chunk.offsets),
                             tuple(chunk.sizes), local.data_ptr()))
    return staged


class Writer(StorageWriter):
    """A DCP StorageWriter that saves one shardsafe checkpoint at `path` (or
    at the checkpoint_id given to dcp.save). `metadata` (JSON-able) is saved
    as the checkpoint's metadata; engine save options (overwrite,
    max_file_bytes, io_threads, direct_io, ...) pass through."""

    def __init__(self, path: str | os.PathLike | None = None, *,
                 process_group: dist.ProcessGroup | None = None, metadata: Any = None,
                 **options: Any):
        super().__init__()
        self.path: str | None = None
        self.process_group = process_group
        self.metadata = metadata
        self.options = options
        self._planner_data: dict | None = None
        self.reset(path)

    @property
    def checkpoint_id(self) -> str | None:
        return self.path

    def reset(self, checkpoint_id: str | os.PathLike | None = None) -> None:
        if checkpoint_id is not None:
            path = os.path.abspath(os.fspath(checkpoint_id))
            _check_tag(path)
            self.path = path
        self._is_coordinator = False

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike) -> bool:
        try:
            _check_tag(os.fspath(checkpoint_id))
        except (InvalidStateError, TypeError):
            return False
        return True

    def storage_meta(self) -> StorageMeta | None:
        return None if self.path is None else StorageMeta(checkpoint_id=self.path)

    def set_up_storage_writer(self, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        if self.path is None:
            raise _no_path("Writer")
        self._is_coordinator = is_coordinator

    def prepare_local_plan(self, plan: SavePlan) -> SavePlan:
        return plan

    def prepare_global_plan(self, plans: list[SavePlan]) -> list[SavePlan]:
        if all(p.usable for p in plans):  # with plan caching, unchanged plans come empty
            self._planner_data = _merged_planner_data(plans)
        info = _PlanInfo(world=len(plans))
        return [dataclasses.replace(p, storage_data=info) for p in plans]

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future[list[WriteResult]]:
        comm, staged, error = None, None, None
        try:
            comm = self._comm(plan)
            staged = _stage(plan.items, planner)
            if self._is_coordinator and self._planner_data:
                staged.blobs.append((PLANNER_DATA_BLOB, json.dumps(self._planner_data).encode(),
                                     False))
            metadata = "" if self.metadata is None else json.dumps(
                to_json(self.metadata, "metadata"), allow_nan=False)
        except Exception as e:  # noqa: BLE001 - every rank must learn of it before the save
            error = e
        reports = _agree(comm, error, {"path": self.path,
                                       "values": None if staged is None else staged.values})
        if any(r["path"] != self.path for r in reports):
            raise ShardsafeError(f"ranks save to different paths: "
                                 f"{sorted({r['path'] for r in reports})}")
        values = {k: v for r in reports for k, v in r["values"].items()}
        _C.save(staged.specs, staged.blobs, json.dumps(values, allow_nan=False), metadata,
                self.path, comm, self.options)
        return _done(staged.results)

    def _comm(self, plan: SavePlan) -> TorchComm | None:
        """The engine's Comm for the ranks DCP planned for."""
        info = plan.storage_data
        if isinstance(info, _PlanInfo) and info.world == 1:
            return None
        comm = resolve(self.process_group)
        size = 1 if comm is None else comm.size
        if isinstance(info, _PlanInfo) and size != info.world:
            raise InvalidStateError(f"DCP plans the save for {info.world} ranks but the Writer's "
                                    f"process group has {size}: pass Writer(process_group=) the "
                                    f"group given to dcp.save")
        return comm

    def finish(self, metadata: Metadata, results: list[list[WriteResult]]) -> None:
        desc = _C.describe(self.path)
        tensors, blobs = desc["tensors"], set(desc["blobs"])
        wrong = []
        for fqn, md in metadata.state_dict_metadata.items():
            if isinstance(md, TensorStorageMetadata):
                saved = tensors.get(fqn)
                if saved is None or tuple(saved[1]) != tuple(md.size):
                    wrong.append(fqn)
            elif BYTES_PREFIX + fqn not in blobs:
                wrong.append(fqn)
        if wrong:
            raise ShardsafeError(f"{desc['path']}: committed without (or with a wrong shape for) "
                                 f"{wrong[:8]}")


def _merged_planner_data(plans: list[SavePlan]) -> dict | None:
    """DCP's flattening maps of all ranks as JSON data, or None when a
    planner keeps something else there."""
    merged: dict[str, list] = {}
    for p in plans:
        if p.planner_data is None:
            continue
        if not isinstance(p.planner_data, Mapping):
            return None
        for fqn, path in p.planner_data.items():
            if not isinstance(path, (tuple, list)) or not all(
                    isinstance(x, (str, int)) and not isinstance(x, bool) for x in path):
                return None
            merged[str(fqn)] = list(path)
    return merged or None


# ------------------------------------------------------------------ reader --

def _describe(path: str) -> dict:
    desc = _C.describe(path)
    desc["values"] = json.loads(desc["values"] or "{}") or {}
    return desc


def _metadata(desc: dict, planner_data: dict) -> tuple[Metadata, dict[str, str]]:
    """DCP metadata for a described checkpoint, and where each value is:
    FQN -> its "dcp/" blob name, or "" for a shardsafe value."""
    entries: dict[str, Any] = {}
    for key, (dtype_name, shape) in desc["tensors"].items():
        dtype = TORCH_DTYPES.get(dtype_name)
        if dtype is None:
            continue  # a dtype torch does not have (F4, F6): not loadable through DCP
        size = torch.Size(shape)
        chunk = ChunkStorageMetadata(offsets=torch.Size([0] * len(shape)), sizes=size)
        entries[key] = TensorStorageMetadata(TensorProperties(dtype=dtype), size, [chunk])
    sources = {k: "" for k in desc["values"]}
    sources.update({b[len(PICKLE_PREFIX):]: "" for b in desc["blobs"]
                    if b.startswith(PICKLE_PREFIX)})
    sources.update({b[len(BYTES_PREFIX):]: b for b in desc["blobs"] if b.startswith(BYTES_PREFIX)})
    for fqn in sources:
        entries[fqn] = BytesStorageMetadata()
    mapping = {k: tuple(planner_data.get(k, (k,))) for k in entries}
    meta = Metadata(state_dict_metadata=entries, planner_data=mapping,
                    storage_meta=StorageMeta(checkpoint_id=desc["path"]))
    return meta, sources


@dataclass
class _Read:
    """One tensor read item: where the engine writes, where DCP wants it."""

    item: Any  # ReadItem
    target: torch.Tensor
    dest: torch.Tensor


class Reader(StorageReader):
    """A DCP StorageReader over any checkpoint shardsafe reads, at `path` (or
    at the checkpoint_id given to dcp.load). Opening it checks that the
    checkpoint exists. Engine load options (verify_checksums, io_threads,
    scratch_bytes, direct_io) pass through; unsafe_pickle=True serves values
    that shardsafe.save pickled."""

    def __init__(self, path: str | os.PathLike | None = None, *, unsafe_pickle: bool = False,
                 **options: Any):
        super().__init__()
        self.path: str | None = None
        self.unsafe_pickle = unsafe_pickle
        self.options = options
        self._opened: dict | None = None  # described at reset, not yet read
        self._desc: dict | None = None  # the checkpoint of the load in progress
        self._sources: dict[str, str] = {}
        self.reset(path)

    @property
    def checkpoint_id(self) -> str | None:
        return self.path

    def reset(self, checkpoint_id: str | os.PathLike | None = None) -> None:
        if checkpoint_id is not None:
            self.path = os.fspath(checkpoint_id)
        self._opened = None if self.path is None else _describe(self.path)

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike) -> bool:
        try:
            _C.describe(os.fspath(checkpoint_id))
        except (ShardsafeError, TypeError):
            return False
        return True

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        if self.path is None:
            raise _no_path("Reader")
        # A root's latest may move between loads: describe again unless the
        # description from reset is still unused.
        desc, self._opened = self._opened or _describe(self.path), None
        planner_data = {}
        if PLANNER_DATA_BLOB in desc["blobs"]:
            blobs = _C.load([], desc["path"], None, self.options)["blobs"]
            planner_data = json.loads(blobs[PLANNER_DATA_BLOB])
        meta, self._sources = _metadata(desc, planner_data)
        self._desc = desc
        return meta

    def set_up_storage_reader(self, metadata: Metadata, is_coordinator: bool, *args: Any,
                              **kwargs: Any) -> None:
        if self._desc is None:
            raise InvalidStateError("shardsafe.dcp.Reader: read_metadata was not called")

    def prepare_local_plan(self, plan: LoadPlan) -> LoadPlan:
        plan.storage_data = self._desc["path"]  # so the coordinator can check ranks agree
        return plan

    def prepare_global_plan(self, plans: list[LoadPlan]) -> list[LoadPlan]:
        paths = {p.storage_data for p in plans}
        if len(paths) > 1:
            raise ShardsafeError(f"ranks resolved {self.path} to different checkpoints: "
                                 f"{sorted(map(str, paths))}")
        return plans

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        reads = [self._tensor_read(item, planner) for item in plan.items
                 if item.type != LoadItemType.BYTE_IO]
        specs = []
        for r in reads:
            key = r.item.storage_index.fqn
            shape = self._desc["tensors"][key][1]
            if r.dest.numel() == 0 and math.prod(shape) != 0:
                continue
            base = r.item.storage_index.offset or [0] * len(shape)
            offset = tuple(b + o for b, o in zip(base, r.item.storage_offsets))
            specs.append((key, DTYPE_NAMES[r.dest.dtype], tuple(shape), offset,
                          tuple(r.item.lengths), r.dest.data_ptr()))
        result = _C.load(specs, self._desc["path"], None, self.options)
        with torch.no_grad():
            for r in reads:
                if r.dest is not r.target:
                    r.target.copy_(r.dest)
                planner.commit_tensor(r.item, r.target)
        values = json.loads(result["values"]) or {}
        for item in plan.items:
            if item.type == LoadItemType.BYTE_IO:
                data = self._value_bytes(item.storage_index.fqn, planner, values, result["blobs"])
                planner.load_bytes(item, io.BytesIO(data))
        return _done(None)

    def _tensor_read(self, item: Any, planner: LoadPlanner) -> _Read:
        key = item.storage_index.fqn
        dtype = TORCH_DTYPES[self._desc["tensors"][key][0]]
        target = planner.resolve_tensor(item).detach()
        if tuple(target.shape) != tuple(item.lengths):
            raise InvalidStateError(f"tensor {key!r}: the planner resolved a "
                                    f"{tuple(target.shape)} target for a read of "
                                    f"{tuple(item.lengths)}")
        direct = (target.device.type == "cpu" and target.dtype == dtype
                  and target.is_contiguous())
        dest = target if direct else torch.empty(tuple(item.lengths), dtype=dtype)
        return _Read(item, target, dest)

    def _value_bytes(self, fqn: str, planner: LoadPlanner, values: dict, blobs: dict) -> bytes:
        """DCP's bytes for a value: its blob as written by the Writer, or a
        shardsafe value shaped after the target's and torch.save'd."""
        blob = self._sources.get(fqn)
        if blob:
            return blobs[blob]
        state = getattr(planner, "state_dict", None)
        like = state.get(fqn) if isinstance(state, Mapping) else None
        value = decode_value(fqn, like, values, blobs, self.unsafe_pickle)
        buf = io.BytesIO()
        torch.save(value, buf)
        return buf.getvalue()
