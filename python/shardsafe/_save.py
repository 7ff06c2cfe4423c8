"""save / async_save / reserve_async_save / release_async_save: a state
walked, its tensors and values turned into the engine's save call."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from . import _C, _device, _engine, _paths
from ._boxes import Box, Boxes, ask, dtype_name
from ._comm import TorchComm, resolve
from ._engine import future, saver, without_gc
from ._files import FileRefusedError, read_bytes
from ._options import SaveOptions
from ._json import to_json
from ._parts import encode_per_rank, group_rank, group_tensor_name
from ._result import as_dict
from ._state import FILE_PREFIX, PER_RANK_PREFIX, RESERVED_KEY, encode_values, flatten
from .errors import InvalidStateError, ShardsafeError


@dataclass
class _SaveArgs:
    specs: list[tuple] = field(default_factory=list)
    blobs: list[tuple] = field(default_factory=list)
    values: str = "{}"
    metadata: str = ""
    # Whole tensors planned by the extension (_C.plan_save_whole), saved with `specs`.
    whole: _C.WholeShards | None = None
    # Device (GPU) shards: (their copier, their specs), which the engine
    # copies from the device as it writes or stages them; None if none.
    device: tuple[_device.DeviceCopier, list[tuple]] | None = None
    keep: list = field(default_factory=list)  # alive until the engine returns
    # The engine's view of all the above, for the one engine call that runs it.
    call: _C.SaveCall | None = None
    # What preparing this rank's part raised: `call` then only carries it to
    # the other ranks, through the engine call's first collective.
    error: BaseException | None = None

    def run(self, engine_call: Callable[[_C.SaveCall], Any]) -> Any:
        """engine_call(self.call); on the rank that failed preparing, its own
        exception (every other rank raises the engine's, naming this rank)."""
        try:
            return engine_call(self.call)
        except ShardsafeError:
            if self.error is not None:
                raise self.error from None
            raise


def _file_blobs(files: Mapping[str, Any] | None) -> list[tuple]:
    """Files saved with the checkpoint: blobs `file/NAME` (docs/format.md §6).
    A value is the content (bytes) or a path to read (str, os.PathLike): a
    regular file (a FIFO or directory is an InvalidStateError, never a read
    that waits)."""
    blobs = []
    for name, content in (files or {}).items():
        if (not isinstance(name, str) or not name or len(name.encode()) > 255
                or name in (".", "..") or any(c in name for c in "/\\\0")):
            raise InvalidStateError(f"files: {name!r} is not a plain file name")
        if isinstance(content, (str, os.PathLike)):
            try:
                content = read_bytes(content)
            except FileRefusedError as e:
                raise InvalidStateError(f"files[{name!r}]: {e}", e.code) from None
        if not isinstance(content, (bytes, bytearray)):
            raise InvalidStateError(f"files[{name!r}]: expected bytes or a path, got "
                                    f"{type(content).__name__}")
        blobs.append((FILE_PREFIX + name, bytes(content), False))
    return blobs


def _per_rank_boxes(flat_per_rank: dict, rank: int, args: _SaveArgs) -> list[tuple]:
    """Each PerRank as its blob: without a group, the per-rank blob `rank/KEY`
    (appended to args.blobs); with one, the U8 tensor GROUP/G/KEY of the
    blob's bytes (returned as a box), which ranks with one group rank G save
    as replicas, checked byte for byte (docs/format.md §6)."""
    boxes = []
    for key, value in flat_per_rank.items():
        blob = encode_per_rank(value.value, key)
        g = group_rank(value, key, rank)
        if g is None:
            args.blobs.append((PER_RANK_PREFIX + key, blob, True))
            continue
        t = torch.frombuffer(bytearray(blob), dtype=torch.uint8)
        boxes.append((group_tensor_name(key, g), Box(t, (t.numel(),), (0,), (t.numel(),)),
                      None))
    return boxes


def _prepare_save(state: Any, metadata: Any, unsafe_pickle: bool,
                  files: Mapping[str, Any] | None = None,
                  exclude_frozen_parameters: bool = False, rank: int = 0) -> _SaveArgs:
    args = _SaveArgs()
    flat = flatten(state)
    values, args.blobs = encode_values(flat.values, unsafe_pickle)
    if exclude_frozen_parameters and flat.frozen:
        flat.drop(flat.frozen.__contains__)
        values[RESERVED_KEY] = {"excluded_frozen": sorted(flat.frozen)}
    args.blobs += _file_blobs(files)
    args.values = json.dumps(values, allow_nan=False)
    if metadata is not None:
        args.metadata = json.dumps(to_json(metadata, "metadata"), allow_nan=False)
    # The common case (a plain, contiguous CPU tensor saved whole as it lies)
    # is planned by the extension in a fraction of the general path's ~4 us a
    # tensor; the rest comes back.
    args.whole, rest = _C.plan_save_whole(ask(flat.tensors))
    args.keep.append(flat.tensors)  # the leaves hold the tensors the items point into
    boxes, box = [], Boxes()
    for leaf in (flat.tensors[i] for i in rest):
        boxes.append((leaf.key, box(leaf.key, leaf.tensor), None))
    for key, sharded in flat.sharded.items():
        for p in sharded.parts:
            boxes.append((key, Box(p.local, sharded.shape, p.offset, p.size), p.flat))
    boxes += _per_rank_boxes(flat.per_rank, rank, args)
    device_specs, device_tensors = [], []
    for key, b, flat_range in boxes:
        name = dtype_name(key, b.local)
        if b.local.numel() == 0 and math.prod(b.shape) != 0:
            continue  # an empty shard of a non-empty tensor holds nothing
        local = b.local
        # The engine reads the memory as it lies: lazy conj/neg views and
        # strided tensors are materialised first, where they are (checked
        # first: the calls cost ~1 us per tensor even when they return the
        # tensor itself).
        if not local.is_contiguous() or local.is_conj() or local.is_neg():
            local = local.detach().resolve_conj().resolve_neg().contiguous()
        args.keep.append(local)
        spec = (key, name, b.shape, b.offset, b.size, local.data_ptr())
        if flat_range is not None:
            spec += (flat_range,)
        if local.is_cpu:
            args.specs.append(spec)
        else:
            device_specs.append(spec)
            device_tensors.append(local)
    if device_specs:
        args.device = (_device.DeviceCopier(device_tensors), device_specs)
    return args


def prepared(state: Any, comm: TorchComm | None, metadata: Any, unsafe_pickle: bool,
              files: Mapping[str, Any] | None, options: SaveOptions) -> _SaveArgs:
    """_prepare_save and the engine's SaveCall. A rank that fails here gets a
    call that fails the engine call on every rank (no collective of its own:
    the engine's first one carries the failure); run it with args.run."""
    try:
        args = _prepare_save(state, metadata, unsafe_pickle, files,
                             options.exclude_frozen_parameters,
                             comm.rank if comm is not None else 0)
        args.call = _C.SaveCall(args.specs, args.blobs, args.values, args.metadata, comm,
                                options.engine(), args.whole, args.device)
    except (ShardsafeError, ValueError, TypeError, RuntimeError, OSError) as e:
        if comm is None:
            raise
        args = _SaveArgs(call=_C.SaveCall.failed(
            comm, f"failed preparing its state: {type(e).__name__}: {e}"), error=e)
    return args


@without_gc
def save(state_dict: Any, path: str | os.PathLike, *, process_group: dist.ProcessGroup | None = None,
         metadata: Any = None, unsafe_pickle: bool = False, files: Mapping[str, Any] | None = None,
         options: SaveOptions | None = None, **kwargs: Any) -> dict:
    """Saves `state_dict` as the checkpoint directory `path`; collective over
    `process_group` (default: the world when torch.distributed is initialised).

    Returns when the checkpoint is committed and durable, with statistics
    (bytes_written, unique_bytes, files, seconds, warnings). Options
    (overwrite, verify_replicas, direct_io, ...: shardsafe.SaveOptions) as
    keywords or as `options`.

    Nothing is assumed about ranks: ranks that pass the same key (a plain
    tensor, or equal Sharded parts) must hold identical bytes, and every
    value a rank passes must equal rank 0's; both are checked (CRC-32C of
    each replica, fingerprints of the values) and a difference is an
    InvalidStateError naming the key and two ranks, with nothing committed.
    Say what differs: shardsafe.Sharded for a rank's part of a global
    tensor, shardsafe.PerRank for per-rank state. verify_replicas=False
    skips the byte check for callers that guarantee their replicas.
    exclude_frozen_parameters=True leaves out the parameters of modules in
    the state that do not require gradients (DeepSpeed's option of that
    name); the checkpoint records them, so a strict load reports them in
    missing_keys without failing and leaves them as they are.
    `files` ({name: bytes or path}) are saved with the checkpoint, e.g. a
    model's config.json and tokenizer files (shardsafe.hf.model_files);
    `shardsafe export-hf` writes them next to the weights. A path must name
    a regular file: a FIFO or a directory is an InvalidStateError.
    """
    comm = resolve(process_group)
    options = SaveOptions.of(options, kwargs, save)
    args = prepared(state_dict, comm, metadata, unsafe_pickle, files, options)
    return as_dict(args.run(lambda call: _C.save(call, os.fspath(path))))


@without_gc
def async_save(state_dict: Any, path: str | os.PathLike, *,
               process_group: dist.ProcessGroup | None = None, metadata: Any = None,
               unsafe_pickle: bool = False, files: Mapping[str, Any] | None = None,
               options: SaveOptions | None = None, **kwargs: Any) -> Future:
    """Like save, but returns once this rank's state is staged in host memory:
    the caller may change its tensors right away. Writing, syncing and the
    commit run in the background; the returned Future's result is the path
    once the checkpoint is durable (or the exception). One save is in flight
    per process: a new call first waits for the previous one (whose failure
    is its own Future's, not this call's)."""
    comm = resolve(process_group)
    options = SaveOptions.of(options, kwargs, async_save)
    args = prepared(state_dict, comm, metadata, unsafe_pickle, files, options)
    path = _paths.absolute(path)
    root, tag = os.path.split(path)
    # The engine has its own staged copy once the call returns.
    handle = args.run(lambda call: saver().save(call, root, tag))
    return future(handle, path)


@without_gc
def reserve_async_save(state_dict: Any, *, process_group: dist.ProcessGroup | None = None,
                       metadata: Any = None, unsafe_pickle: bool = False,
                       files: Mapping[str, Any] | None = None,
                       options: SaveOptions | None = None, **kwargs: Any) -> int:
    """Allocates (and pre-faults) async_save's host staging memory for
    `state_dict` now, so that the first async_save blocks only for its copy.
    Collective like async_save, with the same arguments but the path; writes
    nothing. Call it once the state has all its tensors (an optimizer that
    creates its state at the first step: after that step). Waits for the
    save in flight and raises its failure. Returns the staging bytes held."""
    comm = resolve(process_group)
    options = SaveOptions.of(options, kwargs, reserve_async_save)
    args = prepared(state_dict, comm, metadata, unsafe_pickle, files, options)
    return args.run(lambda call: saver().reserve(call))


def release_async_save() -> None:
    """Frees async_save's staging memory and threads (reserve_async_save's,
    or the first async_save's) once the save in flight is durable, and
    raises that save's failure; the next async_save allocates again. Not
    collective. A CheckpointManager's own: mgr.release_async_save(), or
    dropping the manager."""
    _engine.SAVER.release()


