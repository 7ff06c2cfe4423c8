"""torch.distributed.checkpoint (DCP) storage backed by shardsafe.

    import torch.distributed.checkpoint as dcp
    import shardsafe.dcp
    dcp.save(state_dict, storage_writer=shardsafe.dcp.Writer("/ckpt/step-100"))
    dcp.load(state_dict, storage_reader=shardsafe.dcp.Reader("/ckpt/step-100"))

The contract:

- A checkpoint written by `Writer` is an ordinary shardsafe checkpoint,
  committed atomically by one collective shardsafe save inside `write_data`:
  one tensor per DCP FQN (plain tensors, DTensor and ShardedTensor shards,
  each box written once). Each non-tensor value (a DCP BYTE_IO item) is the
  global blob "dcp/<FQN>" holding DCP's own bytes, so DCP gets back exactly
  what it wrote. The values JSON can hold are also shardsafe values, nested
  back under the keys `shardsafe.save` would use for the same state (DCP
  splits dicts that shardsafe keeps whole, such as optimizer param_groups),
  so `shardsafe.load` of that state reads the checkpoint with strict=True.
  DCP's flattening map is the global blob "dcp.planner_data" (JSON).
- `Reader` reads any checkpoint shardsafe can: a checkpoint directory, a
  root (its latest), a .safetensors file, a Hugging Face directory. Its DCP
  Metadata has one whole-tensor chunk per tensor (shardsafe serves any box,
  so DCP's resharding reads become box loads straight into the targets) and
  a bytes entry per value, split the way DCP splits the target state. Values
  saved by `shardsafe.save` reach DCP as torch.save bytes shaped after the
  target's value (tuples, integer dict keys); pickled ones need
  unsafe_pickle=True.
- The save is collective over the Writer's `process_group` (default: the
  world when torch.distributed is initialised): pass the group given to
  dcp.save. When DCP plans for one process (no_dist=True, or
  use_collectives=False) each process saves alone, so each needs its own
  path. Loads are not collective: each rank reads its own boxes; DCP's
  coordinator checks that all ranks resolved the same checkpoint.
- `finish` (DCP's coordinator, after the commit) checks that the committed
  checkpoint holds every item of DCP's metadata.
- Errors are shardsafe.errors classes. A missing checkpoint raises
  CheckpointNotFoundError as soon as the Reader gets its path (constructor,
  or checkpoint_id= of dcp.load), a bad tag InvalidStateError as soon as the
  Writer gets it. Errors inside DCP's plan / write / read steps reach the
  caller wrapped in DCP's CheckpointException, as for any storage.
"""

from __future__ import annotations

import dataclasses
import io
import json
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.checkpoint._traverse import set_element, traverse_state_dict
from torch.distributed.checkpoint.metadata import (BytesStorageMetadata, ChunkStorageMetadata,
                                                   Metadata, StorageMeta, TensorProperties,
                                                   TensorStorageMetadata)
from torch.distributed.checkpoint.planner import (LoadItemType, LoadPlan, LoadPlanner, ReadItem,
                                                  SavePlan, SavePlanner, WriteItem,
                                                  WriteItemType)
from torch.distributed.checkpoint.storage import StorageReader, StorageWriter, WriteResult
from torch.futures import Future

from . import _C, _device
from ._paths import absolute as _absolute
from ._boxes import dtype_name as _dtype_name
from ._comm import agree as _agree
from ._options import LoadOptions, SaveOptions
from ._comm import TorchComm, resolve
from ._json import from_json, to_json
from ._state import DTYPE_NAMES, PICKLE_PREFIX, TORCH_DTYPES, decode_value, decoded_values
from .errors import InvalidStateError, ShardsafeError

try:
    from torch.distributed.tensor import DTensor
except ImportError:  # torch without distributed support
    DTensor = None

__all__ = ["Writer", "Reader"]

BYTES_PREFIX = "dcp/"  # blob of a DCP BYTE_IO item: "dcp/" + FQN
PLANNER_DATA_BLOB = "dcp.planner_data"  # JSON {FQN: object path}; marks a Writer checkpoint


Path = tuple  # a DCP object path: dict keys (str) and list indices (int)


def _check_tag(path: str) -> None:
    """docs/format.md §1: the last path component is the checkpoint's tag
    (the engine's rule)."""
    try:
        _C.validate_tag(os.path.basename(os.path.normpath(path)))
    except InvalidStateError as e:
        raise InvalidStateError(f"{path}: {e}", e.code) from None


def _done(value: Any) -> Future:
    fut: Future = Future()
    fut.set_result(value)
    return fut


# ------------------------------------------------------------------ writer --

@dataclass
class _PlanInfo:
    """What the coordinator tells every rank in its plan's storage_data."""

    world: int  # how many ranks DCP planned the save for


@dataclass
class _Layout:
    """The coordinator's view of the whole state, from all ranks' plans."""

    planner_data: dict[str, list] = field(default_factory=dict)  # FQN -> object path
    homes: dict[str, list] = field(default_factory=dict)  # value FQN -> [shardsafe key, rest]


def _paths(plans: list[SavePlan]) -> dict[str, Path] | None:
    """DCP's flattening maps of all ranks, or None when a planner keeps
    something else in planner_data."""
    merged: dict[str, Path] = {}
    for p in plans:
        if p.planner_data is None:
            continue
        if not isinstance(p.planner_data, Mapping):
            return None
        for fqn, path in p.planner_data.items():
            if not isinstance(path, (tuple, list)) or not all(
                    type(x) in (str, int) for x in path):
                return None
            merged[str(fqn)] = tuple(path)
    return merged


def _layout(plans: list[SavePlan]) -> _Layout:
    """Where each value goes among shardsafe's values: under the shortest
    prefix of its object path that holds no tensor (shardsafe's key for
    it), at the rest of the path."""
    paths = _paths(plans) or {}
    items = [item for p in plans for item in p.items]
    holders: set[Path] = set()  # path prefixes with a tensor below
    for item in items:
        if item.type != WriteItemType.BYTE_IO:
            path = paths.get(item.index.fqn, (item.index.fqn,))
            holders.update(path[:i] for i in range(1, len(path) + 1))
    layout = _Layout(planner_data={k: list(v) for k, v in paths.items()})
    for item in items:
        if item.type == WriteItemType.BYTE_IO:
            path = paths.get(item.index.fqn, (item.index.fqn,))
            i = next(i for i in range(1, len(path) + 1) if path[:i] not in holders)
            layout.homes[item.index.fqn] = [".".join(map(str, path[:i])), list(path[i:])]
    return layout


def _nest(values: dict[str, Any], homes: dict[str, list]) -> dict[str, Any]:
    """shardsafe's values from DCP's per-FQN values (JSON data)."""
    out: dict[str, Any] = {}
    for fqn, value in values.items():
        key, rest = homes.get(fqn, [fqn, []])
        set_element(out, (key, *rest), value)
    return out


@dataclass
class _Staged:
    """One rank's part of the save, ready for the engine."""

    specs: list[tuple] = field(default_factory=list)
    blobs: list[tuple] = field(default_factory=list)
    values: dict[str, Any] = field(default_factory=dict)  # FQN -> JSON data
    results: list[WriteResult] = field(default_factory=list)
    keep: list[torch.Tensor] = field(default_factory=list)  # alive until the engine returns
    device_specs: list[tuple] = field(default_factory=list)  # chunks on a device (GPU)

    def device(self) -> tuple[_device.DeviceCopier, list[tuple]] | None:
        """The engine's device argument: the copier of the device chunks."""
        if not self.device_specs:
            return None
        return _device.DeviceCopier([t for t in self.keep if not t.is_cpu]), self.device_specs


def _local(item: WriteItem, data: Any) -> torch.Tensor:
    """The dense tensor holding a tensor item's chunk (on its device: the
    engine copies device chunks as it writes them)."""
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
    return data.detach().resolve_conj().resolve_neg().contiguous()


_NOT_JSON = object()


def _json_copy(key: str, blob: bytes) -> Any:
    """A value as JSON data, or _NOT_JSON when JSON cannot hold it (it is
    then only in its blob, for DCP)."""
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
        staged.results.append(WriteResult(item.index, local.numel() * local.element_size(), key))
        if local.numel() == 0 and math.prod(shape) != 0:
            continue  # an empty shard of a non-empty tensor holds nothing
        staged.keep.append(local)
        (staged.specs if local.is_cpu else staged.device_specs).append(
            (key, DTYPE_NAMES[local.dtype], shape, tuple(chunk.offsets), tuple(chunk.sizes),
             local.data_ptr()))
    return staged


class Writer(StorageWriter):
    """A DCP StorageWriter that saves one shardsafe checkpoint at `path` (or
    at the checkpoint_id given to dcp.save). The save is collective over
    `process_group` (give it the group given to dcp.save). `metadata`
    (JSON-able) is saved as the checkpoint's metadata; engine save options
    (overwrite, max_file_bytes, io_threads, direct_io, ...) pass through."""

    def __init__(self, path: str | os.PathLike | None = None, *,
                 process_group: dist.ProcessGroup | None = None, metadata: Any = None,
                 **options: Any):
        super().__init__()
        self.path: str | None = None
        self.process_group = process_group
        self.metadata = metadata
        self.options = SaveOptions.of(None, options).engine()
        self._is_coordinator = False
        self._layout: _Layout | None = None  # on the coordinator
        self.reset(path)

    @property
    def checkpoint_id(self) -> str | None:
        return self.path

    def reset(self, checkpoint_id: str | os.PathLike | None = None) -> None:
        if checkpoint_id is not None:
            path = _absolute(checkpoint_id)
            _check_tag(path)
            self.path = path

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
            raise InvalidStateError("shardsafe.dcp.Writer has no checkpoint path: pass one to "
                                    "it, or checkpoint_id= to dcp.save")
        self._is_coordinator = is_coordinator

    def prepare_local_plan(self, plan: SavePlan) -> SavePlan:
        return plan

    def prepare_global_plan(self, plans: list[SavePlan]) -> list[SavePlan]:
        # With DCP's plan caching, unchanged plans arrive empty: keep the last layout.
        if all(p.usable for p in plans) or self._layout is None:
            self._layout = _layout(plans)
        info = _PlanInfo(world=len(plans))
        return [dataclasses.replace(p, storage_data=info) for p in plans]

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future[list[WriteResult]]:
        comm = staged = metadata = homes = error = None
        try:
            comm = self._comm(plan)
            staged = _stage(plan.items, planner)
            if self._is_coordinator:
                layout = self._layout or _Layout()
                homes = layout.homes
                staged.blobs.append((PLANNER_DATA_BLOB, json.dumps(layout.planner_data).encode(),
                                     False))
            if self.metadata is not None:
                metadata = json.dumps(to_json(self.metadata, "metadata"), allow_nan=False)
        except Exception as e:  # noqa: BLE001 - every rank must learn of it before the save
            error = e
        # Values reach the engine from rank 0: gather them, with the
        # coordinator's map of where they go.
        reports = _agree(comm, error, {"path": self.path, "homes": homes,
                                       "values": None if staged is None else staged.values})
        if any(r["path"] != self.path for r in reports):
            raise ShardsafeError(f"ranks save to different paths: "
                                 f"{sorted({r['path'] for r in reports})}")
        homes = next((r["homes"] for r in reports if r["homes"] is not None), {})
        values = _nest({k: v for r in reports for k, v in r["values"].items()}, homes)
        _C.save(_C.SaveCall(staged.specs, staged.blobs, json.dumps(values, allow_nan=False),
                            metadata or "", comm, self.options, device=staged.device()),
                self.path)
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
            raise ShardsafeError(f"{desc['path']}: committed without (or with a wrong shape "
                                 f"for) {sorted(wrong)[:8]}")


# ------------------------------------------------------------------ reader --

@dataclass
class _Value:
    """Where a DCP value comes from: a Writer's blob, or part of a shardsafe
    value (JSON, or pickled: then all of it)."""

    blob: str | None = None
    key: str = ""
    rest: Path = ()


def _value_sources(desc: dict, values: dict) -> dict[str, _Value]:
    """FQN -> source of each value, split as DCP splits the target state."""
    if PLANNER_DATA_BLOB in desc["blobs"]:  # written by Writer: DCP's own items
        return {b[len(BYTES_PREFIX):]: _Value(blob=b) for b in desc["blobs"]
                if b.startswith(BYTES_PREFIX)}
    out = {b[len(PICKLE_PREFIX):]: _Value(key=b[len(PICKLE_PREFIX):]) for b in desc["blobs"]
           if b.startswith(PICKLE_PREFIX)}

    def visit(path: Path, _: Any) -> None:
        out[".".join(map(str, path))] = _Value(key=path[0], rest=path[1:])

    # DCP always splits dicts, and lists holding dicts: split the saved value alike.
    traverse_state_dict(decoded_values(values, desc["path"]), visit)
    return out


def _metadata(desc: dict, sources: dict[str, _Value], planner_data: dict) -> Metadata:
    """DCP metadata: one whole-tensor chunk per tensor, bytes per value."""
    entries: dict[str, Any] = {}
    for key, (dtype_name, shape) in desc["tensors"].items():
        dtype = TORCH_DTYPES.get(dtype_name)
        if dtype is None:
            continue  # a dtype torch lacks (F4, F6): not loadable through DCP
        size = torch.Size(shape)
        chunk = ChunkStorageMetadata(offsets=torch.Size([0] * len(shape)), sizes=size)
        entries[key] = TensorStorageMetadata(TensorProperties(dtype=dtype), size, [chunk])
    for fqn, src in sources.items():
        entries[fqn] = BytesStorageMetadata()
        if src.blob is None:
            planner_data.setdefault(fqn, [src.key, *src.rest])
    mapping = {k: tuple(planner_data.get(k, (k,))) for k in entries}
    return Metadata(state_dict_metadata=entries, planner_data=mapping,
                    storage_meta=StorageMeta(checkpoint_id=desc["path"]))


@dataclass
class _Read:
    """One tensor read: where the engine writes it, where DCP wants it."""

    item: ReadItem
    target: torch.Tensor
    dest: torch.Tensor


class Reader(StorageReader):
    """A DCP StorageReader over any checkpoint shardsafe reads, at `path` (or
    at the checkpoint_id given to dcp.load); getting a path checks that a
    checkpoint is there. Engine load options (verify_checksums, io_threads,
    scratch_bytes, direct_io) pass through; unsafe_pickle=True serves values
    that shardsafe.save pickled. A load opens the checkpoint once (the open
    of the constructor or of reset serves the next load); a shardsafe
    checkpoint stays pinned against retention from that open until the
    load has read its data."""

    def __init__(self, path: str | os.PathLike | None = None, *, unsafe_pickle: bool = False,
                 **options: Any):
        super().__init__()
        self.path: str | None = None
        self.unsafe_pickle = unsafe_pickle
        self.options = LoadOptions.of(None, options).engine()
        # The checkpoint opened (once per load: its description and every
        # read use it) and described; `_fresh` until a load has used it.
        self._source: _C.OpenedSource | None = None
        self._desc: dict | None = None
        self._fresh = False
        self._values: dict = {}  # its saved values (read_metadata)
        self._sources: dict[str, _Value] = {}
        self.reset(path)

    @property
    def checkpoint_id(self) -> str | None:
        return self.path

    def reset(self, checkpoint_id: str | os.PathLike | None = None) -> None:
        """Opens the checkpoint at `checkpoint_id` (default: this reader's
        path), keeping an open that no load has used yet for the same path
        (dcp.load resets a reader constructed with its path)."""
        path = self.path if checkpoint_id is None else os.fspath(checkpoint_id)
        if self._fresh and path == self.path:
            return
        self.path = path
        self._source = self._desc = None
        self._fresh = False
        if path is not None:
            self._open()

    def _open(self) -> None:
        self._source = _C.PendingSource(self.path).result()
        desc = _C.describe_source(self._source)
        desc["tensors"] = desc["tensors"].to_dict()
        self._desc, self._fresh = desc, True

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike) -> bool:
        try:
            _C.describe(os.fspath(checkpoint_id))
        except (ShardsafeError, TypeError):
            return False
        return True

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        if self.path is None:
            raise InvalidStateError("shardsafe.dcp.Reader has no checkpoint path: pass one to "
                                    "it, or checkpoint_id= to dcp.load")
        # A root's latest may move between loads: opened again unless the
        # open from reset is still unused.
        if not self._fresh:
            self._open()
        self._fresh = False
        desc = self._desc
        values = self._values = json.loads(desc["values"]) or {}
        planner_data = {}
        if PLANNER_DATA_BLOB in desc["blobs"]:
            blobs = _C.load_source([], self._source, None, self.options).blobs
            planner_data = json.loads(blobs[PLANNER_DATA_BLOB])
        self._sources = _value_sources(desc, values)
        return _metadata(desc, self._sources, planner_data)

    def set_up_storage_reader(self, metadata: Metadata, is_coordinator: bool, *args: Any,
                              **kwargs: Any) -> None:
        if self._desc is None or self._fresh:
            raise InvalidStateError("shardsafe.dcp.Reader: read_metadata was not called")

    def prepare_local_plan(self, plan: LoadPlan) -> LoadPlan:
        # The checkpoint this rank resolved, for the coordinator to compare.
        return dataclasses.replace(plan, storage_data=self._desc["path"])

    def prepare_global_plan(self, plans: list[LoadPlan]) -> list[LoadPlan]:
        paths = {p.storage_data for p in plans}
        if len(paths) > 1:
            raise ShardsafeError(f"ranks resolved {self.path} to different checkpoints: "
                                 f"{sorted(map(str, paths))}")
        return plans

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        reads = [self._tensor_read(item, planner) for item in plan.items
                 if item.type != LoadItemType.BYTE_IO]
        result = _C.load_source([s for r in reads if (s := self._spec(r))], self._source, None,
                                self.options)
        self._source = None  # unpinned (retention may remove it): this load has read
        with torch.no_grad():
            for r in reads:
                if r.dest is not r.target:
                    r.target.copy_(r.dest)
                planner.commit_tensor(r.item, r.target)
        for item in plan.items:
            if item.type == LoadItemType.BYTE_IO:
                data = self._value_bytes(item.storage_index.fqn, planner, self._values,
                                         result.blobs)
                planner.load_bytes(item, io.BytesIO(data))
        return _done(None)

    def _tensor_read(self, item: ReadItem, planner: LoadPlanner) -> _Read:
        """The target of a read, and where the engine writes it: the target
        itself when it is a dense CPU tensor of the saved dtype."""
        key = item.storage_index.fqn
        dtype = TORCH_DTYPES[self._desc["tensors"][key][0]]
        target = planner.resolve_tensor(item).detach()
        if tuple(target.shape) != tuple(item.lengths):
            raise InvalidStateError(f"tensor {key!r}: the planner resolved a "
                                    f"{tuple(target.shape)} target for a read of "
                                    f"{tuple(item.lengths)}")
        direct = target.device.type == "cpu" and target.dtype == dtype and target.is_contiguous()
        dest = target if direct else torch.empty(tuple(item.lengths), dtype=dtype)
        return _Read(item, target, dest)

    def _spec(self, r: _Read) -> tuple | None:
        """The engine's load spec of a read: its box of the saved tensor."""
        key = r.item.storage_index.fqn
        shape = tuple(self._desc["tensors"][key][1])
        if r.dest.numel() == 0 and math.prod(shape) != 0:
            return None  # nothing to read
        base = r.item.storage_index.offset or (0,) * len(shape)  # our chunk's offset: zeros
        offset = tuple(b + o for b, o in zip(base, r.item.storage_offsets))
        return (key, DTYPE_NAMES[r.dest.dtype], shape, offset, tuple(r.item.lengths),
                r.dest.data_ptr())

    def _value_bytes(self, fqn: str, planner: LoadPlanner, values: dict, blobs: dict) -> bytes:
        """DCP's bytes for a value: the Writer's blob, or (part of) a
        shardsafe value shaped after the target's, torch.save'd."""
        src = self._sources[fqn]
        if src.blob is not None:
            return blobs[src.blob]
        state = getattr(planner, "state_dict", None)  # DefaultLoadPlanner: flat, by FQN
        like = state.get(fqn) if isinstance(state, Mapping) else None
        if src.rest:
            stored = values[src.key]
            for part in src.rest:
                stored = stored[part]
            value = from_json(stored, like)
        else:
            value = decode_value(src.key, like, values, blobs, self.unsafe_pickle)
        buf = io.BytesIO()
        torch.save(value, buf)
        return buf.getvalue()
