"""save / async_save / load / CheckpointManager over the C++ engine."""

from __future__ import annotations

import atexit
import contextlib
import functools
import gc
import json
import math
import os
import re
import threading
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from . import _C, _device, hf
from ._comm import TorchComm, resolve
from ._parts import PerRank, decode_per_rank, encode_per_rank
from ._state import (DTYPE_NAMES, FILE_PREFIX, PER_RANK_PREFIX, PICKLE_PREFIX, RESERVED_KEY,
                     TORCH_DTYPES, Flat,
                     TensorLeaf, decode_value, encode_values, flatten, from_json, rebuild,
                     to_json)
from .errors import (CheckpointNotFoundError, DTypeMismatchError, InvalidStateError,
                     KeyMismatchError, ShapeMismatchError, ShardsafeError)

try:
    from torch.distributed.tensor import DTensor, Replicate, Shard
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset
except ImportError:  # torch without distributed support
    DTensor = None


# ------------------------------------------------------------ tensor boxes --

@dataclass
class _Box:
    local: torch.Tensor  # the tensor holding this rank's part
    shape: tuple[int, ...]  # global
    offset: tuple[int, ...]
    size: tuple[int, ...]


class _Boxes:
    """The part of the global tensor that each tensor holds on this rank, for
    the tensors of one call. A DTensor's box is a function of its global
    shape, mesh and placements, computed once per combination (torch's
    compute_local_shape_and_global_offset costs ~30 us a call, most of a
    DTensor's planning; a model repeats a few shapes)."""

    def __init__(self) -> None:
        self._seen: dict[tuple, tuple[tuple, tuple]] = {}

    def __call__(self, key: str, t: torch.Tensor) -> _Box:
        if DTensor is None or not isinstance(t, DTensor):
            shape = tuple(t.shape)
            return _Box(t, shape, (0,) * len(shape), shape)
        mesh, placements = t.device_mesh, t.placements
        spec = (t.shape, id(mesh), placements)  # the tensors keep their mesh alive
        box = self._seen.get(spec)
        if box is None:
            for p in placements:
                # _StridedShard subclasses Shard but its local part is not one box.
                if not (type(p) is Shard or isinstance(p, Replicate)):
                    raise InvalidStateError(
                        f"tensor {key!r}: placement {p} is not supported (only Shard and "
                        f"Replicate); redistribute it first")
            size, offset = compute_local_shape_and_global_offset(t.shape, mesh, placements)
            box = self._seen[spec] = (tuple(size), tuple(offset))
        size, offset = box
        local = t._local_tensor
        if tuple(local.shape) != size:
            raise InvalidStateError(f"tensor {key!r}: local shard has shape {tuple(local.shape)}, "
                                    f"its placements imply {size}")
        return _Box(local, tuple(t.shape), offset, size)


# What the per-tensor fast paths (_C.ask_tensors, then _C.plan_whole or
# _C.plan_save_whole) take:
# tensors of these types (subclasses, DTensor among them, take the general
# paths), of this layout, of these dtypes.
_PLAIN = ((torch.Tensor, torch.nn.Parameter), torch.strided, DTYPE_NAMES)


def _in_place(t: torch.Tensor) -> bool:
    """The engine can read or write `t`'s bytes where they lie."""
    return t.is_cpu and t.is_contiguous() and not t.is_neg() and not t.is_conj()


def _dtype_name(key: str, t: torch.Tensor) -> str:
    name = DTYPE_NAMES.get(t.dtype)
    if name is None:
        raise InvalidStateError(f"tensor {key!r}: dtype {t.dtype} cannot be stored in safetensors")
    if t.is_sparse or t.layout != torch.strided:
        raise InvalidStateError(f"tensor {key!r}: layout {t.layout} is not supported; "
                                f"convert it to a dense tensor")
    return name


class _HostStaging:
    """Pinned host memory that a load of device tensors reads into, allocated
    once and grown when a call needs more, reused across calls (CUDA copies
    run from it at full speed, and it is never re-faulted)."""

    ALIGN = 64

    def __init__(self) -> None:
        self._buf: torch.Tensor | None = None
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def borrow(self, tensors: list[torch.Tensor]) -> Iterator[list[torch.Tensor]]:
        """A host view per tensor (same shape and dtype), contiguous, backed
        by the pinned buffer, which no other thread gets until the block
        ends: keep it open until the engine is done with the views."""
        if not tensors:
            yield []
            return
        with self._lock:
            yield self._views(tensors)

    def _views(self, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
        offsets, total = [], 0
        for t in tensors:
            offsets.append(total)
            total += -(-t.numel() * t.element_size() // self.ALIGN) * self.ALIGN
        if self._buf is None or self._buf.numel() < total:
            self._buf = torch.empty(total, dtype=torch.uint8, pin_memory=torch.cuda.is_available())
        out = []
        for t, off in zip(tensors, offsets):
            n = t.numel() * t.element_size()
            out.append(self._buf[off:off + n].view(t.dtype).view(t.shape))
        return out


_STAGING = _HostStaging()


def _without_gc(fn: Callable) -> Callable:
    """Runs the whole call with Python's cyclic garbage collector paused. A
    call over a large state creates a few small objects per tensor, none in
    reference cycles (reference counting frees them): with 20,000 tensors
    the collector's repeated scans of them took a fifth of the call, and
    pausing only the walks was not enough: the objects alive until the call
    returns (the plan's entries, the engine's targets) made the first
    allocation after re-enabling start a collection that scanned them all,
    20-50 ms per call. They are freed when the call returns, so the
    re-enabled collector has nothing to scan. Other threads' cycles wait for
    the call to end; a collector the caller had disabled stays disabled."""

    @functools.wraps(fn)
    def paused(*args: Any, **kwargs: Any) -> Any:
        was_enabled = gc.isenabled()
        gc.disable()
        try:
            return fn(*args, **kwargs)
        finally:
            if was_enabled:
                gc.enable()

    return paused


# ---------------------------------------------------------- agreement -----

def _agree(comm: TorchComm | None, error: BaseException | None, extra: Any = None) -> list[Any]:
    """Every rank learns whether any rank failed before a collective engine
    call (so no rank is left waiting in it), and what each rank reported in
    `extra`. Re-raises this rank's own error, or names the failed rank."""
    if comm is None:
        if error is not None:
            raise error
        return [extra]
    mine = json.dumps({"error": None if error is None else str(error), "extra": extra})
    reports = [json.loads(r) for r in comm.all_gather(mine.encode())]
    if error is not None:
        raise error
    for rank, r in enumerate(reports):
        if r["error"] is not None:
            raise ShardsafeError(f"rank {rank} failed: {r['error']}")
    return [r["extra"] for r in reports]


# ------------------------------------------------------------------- save --

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


def _file_blobs(files: Mapping[str, Any] | None) -> list[tuple]:
    """Files saved with the checkpoint: blobs `file/NAME` (docs/format.md §6).
    A value is the content (bytes) or a path to read (str, os.PathLike)."""
    blobs = []
    for name, content in (files or {}).items():
        if (not isinstance(name, str) or not name or len(name.encode()) > 255
                or name in (".", "..") or any(c in name for c in "/\\\0")):
            raise InvalidStateError(f"files: {name!r} is not a plain file name")
        if isinstance(content, (str, os.PathLike)):
            with open(content, "rb") as f:
                content = f.read()
        if not isinstance(content, (bytes, bytearray)):
            raise InvalidStateError(f"files[{name!r}]: expected bytes or a path, got "
                                    f"{type(content).__name__}")
        blobs.append((FILE_PREFIX + name, bytes(content), False))
    return blobs


def _prepare_save(state: Any, metadata: Any, unsafe_pickle: bool,
                  files: Mapping[str, Any] | None = None,
                  exclude_frozen_parameters: bool = False) -> _SaveArgs:
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
    args.whole, rest = _C.plan_save_whole(_ask(flat.tensors))
    args.keep.append(flat.tensors)  # the leaves hold the tensors the items point into
    boxes, box = [], _Boxes()
    for leaf in (flat.tensors[i] for i in rest):
        boxes.append((leaf.key, box(leaf.key, leaf.tensor), None))
    for key, sharded in flat.sharded.items():
        for p in sharded.parts:
            boxes.append((key, _Box(p.local, sharded.shape, p.offset, p.size), p.flat))
    for key, value in flat.per_rank.items():
        args.blobs.append((PER_RANK_PREFIX + key, encode_per_rank(value.value, key), True))
    device_specs, device_tensors = [], []
    for key, b, flat_range in boxes:
        name = _dtype_name(key, b.local)
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


def _prepared(state: Any, comm: TorchComm | None, metadata: Any, unsafe_pickle: bool,
              files: Mapping[str, Any] | None, options: dict) -> _SaveArgs:
    """_prepare_save on every rank, then an agreement: a rank that failed
    fails the call on every rank. Takes the Python-level options out of
    `options` (the rest go to the engine)."""
    args, error = None, None
    try:
        args = _prepare_save(state, metadata, unsafe_pickle, files,
                             bool(options.pop("exclude_frozen_parameters", False)))
    except (ShardsafeError, ValueError, TypeError, RuntimeError, OSError) as e:
        error = e
    _agree(comm, error)
    return args


@_without_gc
def save(state_dict: Any, path: str | os.PathLike, *, process_group: dist.ProcessGroup | None = None,
         metadata: Any = None, unsafe_pickle: bool = False, files: Mapping[str, Any] | None = None,
         **options: Any) -> dict:
    """Saves `state_dict` as the checkpoint directory `path`; collective over
    `process_group` (default: the world when torch.distributed is initialised).

    Returns when the checkpoint is committed and durable, with statistics
    (bytes_written, unique_bytes, files, seconds, warnings). Engine options
    (max_file_bytes, direct_io, io_threads, overwrite, ...) pass through.

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
    `shardsafe export-hf` writes them next to the weights.
    """
    comm = resolve(process_group)
    args = _prepared(state_dict, comm, metadata, unsafe_pickle, files, options)
    return _C.save(args.specs, args.blobs, args.values, args.metadata, os.fspath(path), comm,
                   options, args.whole, args.device)


class _PerProcess:
    """An engine object made on first use in each process. The engine's
    objects own threads (the staging copy's, a save's background writer); a
    child forked from the process that made one has its memory but not its
    threads, so a save would wait on them forever, and so would destroying
    it. The child makes a new one; the inherited one is parked in
    _INHERITED, never used nor destroyed there. The object is destroyed with
    its holder (a dropped CheckpointManager frees its threads and staging
    memory, once any save in flight is durable); at exit, each live one made
    in this process finishes its save in flight."""

    def __init__(self, make: Callable[[], Any], wait: Callable[[Any], None]):
        self._make, self._wait = make, wait
        self._lock = threading.Lock()
        self._obj: Any = None
        _LIVE.add(self)

    def get(self) -> Any:
        with self._lock:
            if self._obj is None:
                self._obj = self._make()
            return self._obj

    def release(self) -> None:
        """Drops this process's object once its save in flight is over
        (raising that save's failure); the next get() makes a new one."""
        with self._lock:
            obj, self._obj = self._obj, None
        if obj is not None:
            self._wait(obj)

    def _forked(self) -> None:
        self._lock = threading.Lock()  # another thread of the parent may have held it
        if self._obj is not None:
            _INHERITED.append(self._obj)
            self._obj = None

    def _wait_at_exit(self) -> None:
        if self._obj is not None:
            self._wait(self._obj)


# Hooks for every _PerProcess alive (a hook per object would keep each alive).
_LIVE: weakref.WeakSet[_PerProcess] = weakref.WeakSet()
_INHERITED: list[Any] = []  # engine objects of the parent, in a forked child
os.register_at_fork(after_in_child=lambda: [p._forked() for p in list(_LIVE)])
atexit.register(lambda: [p._wait_at_exit() for p in list(_LIVE)])


_SAVER = _PerProcess(_C.AsyncSaver, _C.AsyncSaver.wait_pending)


def _saver() -> _C.AsyncSaver:
    return _SAVER.get()


def _future(handle: _C.AsyncHandle, result: Any, owner: _PerProcess | None = None) -> Future:
    """A Future completed (from a helper thread) when `handle` is durable.
    `owner` (a CheckpointManager's engine holder) is kept alive until then,
    so a manager dropped mid-save neither blocks nor is skipped at exit."""
    fut: Future = Future()
    fut.set_running_or_notify_cancel()
    fut.blocked_seconds = handle.blocked_seconds  # type: ignore[attr-defined]

    def wait(owner: Any) -> None:  # holds `owner` until the save is over
        try:
            handle.wait()
            fut.set_result(result)
        except BaseException as e:  # noqa: BLE001 - handed to the caller
            fut.set_exception(e)

    threading.Thread(target=wait, args=(owner,), name="shardsafe-async-wait", daemon=True).start()
    return fut


@_without_gc
def async_save(state_dict: Any, path: str | os.PathLike, *,
               process_group: dist.ProcessGroup | None = None, metadata: Any = None,
               unsafe_pickle: bool = False, files: Mapping[str, Any] | None = None,
               **options: Any) -> Future:
    """Like save, but returns once this rank's state is staged in host memory:
    the caller may change its tensors right away. Writing, syncing and the
    commit run in the background; the returned Future's result is the path
    once the checkpoint is durable (or the exception). One save is in flight
    per process: a new call first waits for the previous one, and a previous
    background failure is raised here."""
    comm = resolve(process_group)
    args = _prepared(state_dict, comm, metadata, unsafe_pickle, files, options)
    path = os.path.abspath(os.fspath(path))
    root, tag = os.path.split(path)
    # The engine has its own staged copy once the call returns.
    handle = _saver().save(args.specs, args.blobs, args.values, args.metadata, root, tag, comm,
                           options, args.whole, args.device)
    return _future(handle, path)


@_without_gc
def reserve_async_save(state_dict: Any, *, process_group: dist.ProcessGroup | None = None,
                       metadata: Any = None, unsafe_pickle: bool = False,
                       files: Mapping[str, Any] | None = None, **options: Any) -> int:
    """Allocates (and pre-faults) async_save's host staging memory for
    `state_dict` now, so that the first async_save blocks only for its copy.
    Collective like async_save, with the same arguments but the path; writes
    nothing. Call it once the state has all its tensors (an optimizer that
    creates its state at the first step: after that step). Waits for the
    save in flight and raises its failure. Returns the staging bytes held."""
    comm = resolve(process_group)
    args = _prepared(state_dict, comm, metadata, unsafe_pickle, files, options)
    return _saver().reserve(args.specs, args.blobs, args.values, args.metadata, comm, options,
                            args.whole, args.device)


def release_async_save() -> None:
    """Frees async_save's staging memory and threads (reserve_async_save's,
    or the first async_save's) once the save in flight is durable, and
    raises that save's failure; the next async_save allocates again. Not
    collective. A CheckpointManager's own: mgr.release_async_save(), or
    dropping the manager."""
    _SAVER.release()


# ------------------------------------------------------------------- load --

@dataclass
class LoadResult:
    """What load did: the checkpoint it read and the keys that did not match."""

    path: str
    tag: str
    missing_keys: list[str]
    unexpected_keys: list[str]
    metadata: Any
    bytes_read: int
    seconds: float
    # of bytes_read, read from a shared-memory ring or the page cache because
    # another rank on this machine read them too (share_reads)
    bytes_shared: int = 0
    # Every global value the checkpoint holds, by key (DeepSpeed's
    # client_state), whether or not the state asked for it.
    values: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class _Read:
    """One box of one checkpoint tensor and where it lands."""

    key: str  # checkpoint key
    shape: tuple[int, ...]  # its global shape
    offset: tuple[int, ...]
    size: tuple[int, ...]
    dest: torch.Tensor  # view of the target's local tensor, shaped `size` (1-D for `flat`)
    flat: tuple[int, int] | None = None  # the box's row-major elements [begin, end) only
    buf: torch.Tensor | None = None  # where the engine writes: dest itself when it can
    scale: tuple | None = None  # FP8 dequantisation: (key, shape, offset, size, dtype name)
    scale_buf: torch.Tensor | None = None


@dataclass
class _Plan:
    reads: list[_Read]
    # The engine's targets of whole tensors read straight into themselves,
    # planned by _plan_whole without a _Read each (None: none planned).
    whole: _C.WholeTargets | None
    missing: list[str]  # state keys
    used: set[str]  # checkpoint tensor keys some target reads
    notes: list[str]  # for the KeyMismatchError message


def _plan(flat: Flat, asked: _C.AskedTensors | None, keys: hf.KeyMap, source: _C.OpenedSource,
          dequantize_fp8: bool, convert: bool) -> _Plan:
    """This rank's reads for the state's tensors, and what did not match;
    `asked` (_ask(flat.tensors)) or None turns the fast path on or off."""
    plan = _Plan([], None, [], set(), [])
    whole = asked is not None and not keys.renamed
    rest = _plan_whole(flat.tensors, asked, source, plan) if whole else flat.tensors
    if rest or flat.sharded:
        keys.materialize()
    box = _Boxes()
    targets = [(leaf.key, box(leaf.key, leaf.tensor), None) for leaf in rest]
    for key, sharded in flat.sharded.items():
        targets += [(key, _Box(p.local, sharded.shape, p.offset, p.size), p.flat)
                    for p in sharded.parts]
    for key, b, flat_range in targets:
        if b.local.is_meta:
            raise InvalidStateError(f"tensor {key!r} is on the meta device: it has no memory "
                                    f"to load into (materialize the model first, e.g. "
                                    f"module.to_empty(device=...))")
        src, note = keys.resolve(key, b.shape)
        if src is None:
            if key not in plan.missing:
                plan.missing.append(key)
                if note:
                    plan.notes.append(note)
            continue
        _plan_target(plan, keys, src, key, b, flat_range, dequantize_fp8, convert)
    return plan


def _plan_target(plan: _Plan, keys: hf.KeyMap, src: hf.Source, key: str, b: _Box,
                 flat_range: tuple[int, int] | None, dequantize_fp8: bool,
                 convert: bool) -> None:
    """The reads of one target box (or flat range of a box) from `src`."""
    name = _dtype_name(key, b.local)
    scales = {}
    for k in src.keys:
        plan.used.add(k)
        scale = hf.fp8_scale(keys.saved, k, b.local.dtype) if dequantize_fp8 else None
        if scale is not None:
            plan.used.add(scale)
            scales[k] = scale
        elif k != key and keys.saved[k][0] != name and not convert:
            raise DTypeMismatchError(
                f"{src.label}: dtype mismatch: checkpoint has {keys.saved[k][0]}, target has "
                f"{name} (allow conversion with convert_dtypes)", "INVALID_ARGUMENT")
    if isinstance(src, hf.Direct) and scales and keys.saved[src.keys[0]][1] != b.shape:
        raise ShapeMismatchError(
            f"{src.label}: shape mismatch: checkpoint has {list(keys.saved[src.keys[0]][1])}, "
            f"target has {list(b.shape)}", "INVALID_ARGUMENT")
    if flat_range is not None:
        if not isinstance(src, hf.Direct) or scales:
            raise InvalidStateError(f"tensor {key!r}: a flat range loads only from a saved "
                                    f"tensor of its own shape (no expert merge or FP8 scales)")
        if flat_range[0] == flat_range[1] and math.prod(b.shape) != 0:
            return  # an empty range of a non-empty tensor reads nothing
        try:
            dest = b.local.view(-1)
        except RuntimeError:
            raise InvalidStateError(f"tensor {key!r}: a flat range loads into a tensor that "
                                    f"can be viewed as 1-D (a contiguous one)") from None
        plan.reads.append(_Read(src.keys[0], b.shape, b.offset, b.size, dest, flat_range))
        return
    for p in src.pieces(b.offset, b.size):
        # A direct target keeps its own shape: the engine checks it against the saved one.
        shape = b.shape if isinstance(src, hf.Direct) else keys.saved[p.key][1]
        if math.prod(p.size) == 0 and math.prod(shape) != 0:
            continue  # an empty box of a non-empty tensor reads nothing
        r = _Read(p.key, shape, p.offset, p.size, b.local[p.index] if p.index else b.local)
        scale = scales.get(p.key)
        if scale is not None:
            so, ss = hf.scale_box(p.offset, p.size)
            sdtype, sshape = keys.saved[scale]
            r.scale = (scale, sshape, so, ss, sdtype)
        plan.reads.append(r)


def _ask(leaves: list[TensorLeaf]) -> _C.AskedTensors:
    """What the fast paths need of each tensor, asked by the extension
    (~1 us a tensor, most of it the first touch of its objects)."""
    return _C.ask_tensors([leaf.key for leaf in leaves], [leaf.tensor for leaf in leaves],
                          *_PLAIN)


def _plan_whole(leaves: list[TensorLeaf], asked: _C.AskedTensors, source: _C.OpenedSource,
                plan: _Plan) -> list:
    """The common case, planned by the extension (_C.plan_whole) in a
    fraction of the general path's ~3 us a tensor: a plain dense CPU tensor
    loaded whole and in place from the checkpoint tensor of its own key,
    dtype and shape. Plans the read the general path would; returns the
    leaves it leaves to the general path."""
    whole, taken, rest = _C.plan_whole(asked, source)
    plan.whole = whole
    plan.used.update(taken)
    return [leaves[i] for i in rest]


def _open_and_flatten(path: str, comm: TorchComm | None, state: Any, ask: bool,
                      skip: Callable[[str], bool] | None = None
                      ) -> tuple[_C.OpenedSource, Flat, _C.AskedTensors | None]:
    """The checkpoint opened (collective), the state walked and, if `ask`,
    its tensors asked what the fast path needs (_ask). With one process the
    index is read and checked on a thread of its own while this one walks
    and asks (20,000 tensors: ~22 against ~9 + ~20 ms), waiting for it
    before the walk changes anything (an optimizer's state created), so a
    checkpoint that cannot be opened leaves the state as it was; with
    several, every rank opens first, in step. Keys `skip` accepts are
    left out of the walk's record (not loaded)."""
    if comm is not None:
        source, flat = _C.open_source(path, comm), flatten(state, for_load=True)
        if skip is not None:
            flat.drop(skip)
        return source, flat, _ask(flat.tensors) if ask else None
    pending = _C.PendingSource(path)
    flat = flatten(state, for_load=True, before_init=pending.wait)
    if skip is not None:
        flat.drop(skip)
    asked = _ask(flat.tensors) if ask else None
    return pending.result(), flat, asked


@dataclass
class _Report:
    """One rank's view of a load's key matching, before the agreement."""

    missing: list[str]  # state keys the checkpoint lacks (fatal under strict)
    unexpected: list[str]  # saved keys no target wants (fatal under strict when every rank agrees)
    notes: list[str]  # for the KeyMismatchError message
    # Reported, never fatal: optimizer state of parameters that had none when saved.
    absent_state: list[str]
    # Per-rank values this rank has no saved value for, and saved ranks'
    # values no rank loads: fatal unless per_rank_strict=False.
    per_rank_missing: list[str]
    per_rank_unused: list[str]


def _prepare_load(flat: Flat, asked: _C.AskedTensors | None, source: _C.OpenedSource,
                  desc: dict, rename: hf.Rename, experts: Sequence[hf.ExpertGroup],
                  dequantize_fp8: bool, options: dict, skip: Callable[[str], bool] | None,
                  rank: int, world: int) -> tuple[hf.KeyMap, _Plan, dict]:
    """This rank's side of a load, before any collective: the checkpoint's
    keys mapped, this rank's reads planned, and its report (a _Report as a
    dict) of missing and unexpected keys."""
    keys = hf.KeyMap(desc["tensors"], rename, experts)
    values = keys.rename_values(json.loads(desc["values"] or "{}") or {})
    excluded = set(values.pop(RESERVED_KEY, {}).get("excluded_frozen", ()))
    pickled = {keys.name(b[len(PICKLE_PREFIX):]) for b in desc["blobs"]
               if b.startswith(PICKLE_PREFIX)}
    per_rank = {b[len(PER_RANK_PREFIX):]: ranks for b, ranks in desc["per_rank_blobs"].items()
                if b.startswith(PER_RANK_PREFIX)}
    plan = _plan(flat, asked, keys, source, dequantize_fp8,
                 bool(options.get("convert_dtypes", False)))
    missing = plan.missing + [k for k in flat.values if k not in values and k not in pickled]
    # plan.used holds saved keys only: as many as saved means every one was used.
    unused = ([k for k in keys.saved if k not in plan.used]
              if len(plan.used) < len(keys.saved) else [])
    unexpected = []
    if unused or values or pickled or per_rank:
        wanted = ({leaf.key for leaf in flat.tensors} | set(flat.values) | set(flat.sharded)
                  | set(flat.per_rank))
        unexpected = sorted({keys.name(k) for k in unused if keys.name(k) not in wanted}
                            | {k for k in [*values, *pickled, *per_rank] if k not in wanted})
    if skip is not None:
        unexpected = [k for k in unexpected if not skip(k)]
    absent = _absent_param_state(flat, missing, [*map(keys.name, keys.saved), *values])
    absent |= excluded.intersection(missing)
    report = _Report([k for k in missing if k not in absent], unexpected, plan.notes,
                     sorted(absent),
                     [f"{k}[rank {rank}]" for k in flat.per_rank if rank not in per_rank.get(k, ())],
                     [f"{k}[rank {r}]" for k in flat.per_rank for r in per_rank.get(k, ())
                      if r >= world])
    return keys, plan, report.__dict__


def _absent_param_state(flat: Flat, missing: list[str], saved: list[str]) -> set[str]:
    """The missing keys that are an optimizer's state for a parameter with
    no saved state at all (ids under OPTIM.state. that no saved key has): an
    optimizer saved before every parameter had state (unrouted MoE experts
    got no gradient), which torch's own load_state_dict accepts."""
    if not flat.optimizers or not missing:
        return set()
    absent = set()
    for prefix in flat.optimizers:
        head = f"{prefix}.state." if prefix else "state."
        have = {k[len(head):].split(".", 1)[0] for k in saved if k.startswith(head)}
        absent |= {k for k in missing
                   if k.startswith(head) and k[len(head):].split(".", 1)[0] not in have}
    return absent


def _key_error(missing: list[str], unexpected: list[str], path: str, notes: list[str],
               keys: hf.KeyMap) -> KeyMismatchError:
    """KeyMismatchError (state-side names), its message naming checkpoint keys
    where they differ."""
    err = KeyMismatchError(missing, unexpected, path)
    renamed = [f"{k!r} is {keys.to_ckpt[k]!r}" for k in unexpected[:8]
               if k in keys.to_ckpt and keys.to_ckpt[k] != k]
    extra = notes[:4] + ([f"renamed checkpoint keys: {', '.join(renamed)}"] if renamed else [])
    if extra:
        err.args = (err.args[0] + "; " + "; ".join(extra),)
    return err


@_without_gc
def load(state_dict: Any, path: str | os.PathLike, *, strict: bool = True,
         process_group: dist.ProcessGroup | None = None, unsafe_pickle: bool = False,
         rename: hf.Rename = None, experts: Sequence[hf.ExpertGroup] = (),
         dequantize_fp8: bool = True, skip_keys: Sequence[str | re.Pattern] = (),
         per_rank_strict: bool = True, **options: Any) -> LoadResult:
    """Loads a checkpoint into `state_dict` in place, resharding as needed:
    each tensor (or DTensor shard) gets its part of the saved tensor, values
    are replaced by the saved ones, stateful objects get load_state_dict.
    `path`: a checkpoint directory, a root of step checkpoints (its latest),
    a .safetensors file or a Hugging Face model directory. Collective.

    strict=True raises KeyMismatchError (before changing anything) when a
    key is missing from the checkpoint or a saved key is wanted by no rank;
    strict=False loads what matches and reports both lists. An optimizer's
    state for a parameter that had none when saved (an unrouted MoE expert)
    is reported in missing_keys but is no error, as with torch's
    load_state_dict: that parameter is left without state.
    skip_keys: state keys left as they are and saved keys ignored, strict
      or not: a str skips the keys it prefixes, an re.Pattern the keys it
      matches (re.search), e.g. ["lm_head."] (NeMo's skip_task_head_prefixes).
    per_rank_strict: shardsafe.PerRank values: rank r loads saved rank r's.
      A rank the checkpoint has none for (a larger world), or saved ranks
      no rank loads (a smaller one), raise KeyMismatchError naming
      "KEY[rank R]"; with False those keep their value, and are reported in
      missing_keys / unexpected_keys.
    Options:
    verify_checksums, convert_dtypes, io_threads, direct_io, scratch_bytes,
    share_reads (default True, the same on every rank: when other ranks on
    its machine read at least half of the bytes a rank reads of a file, as
    in a resharded load, the disk reads them once: one rank reads the file
    with O_DIRECT into a small shared-memory ring the others copy from, or,
    with shared_memory=False or when /dev/shm cannot hold the ring, all of
    them read it through the page cache).

    Hugging Face checkpoints (details in shardsafe.hf):
    rename: ordered (pattern, replacement) regex rules (re.sub semantics,
      \\1 backrefs, each applied to the result of the previous one) or a
      callable, mapping each checkpoint key to its state key; e.g.
      [(r"^model\\.", ""), (r"\\.self_attn\\.q_proj\\.weight$", ".attn.wq")].
      Two checkpoint keys mapping to one name are an error. missing_keys and
      unexpected_keys are state-side names.
    experts: shardsafe.hf.ExpertGroup rules filling grouped [E, ...] state
      tensors from per-expert checkpoint tensors (or per-expert state
      tensors from a grouped one), e.g. shardsafe.hf.QWEN2_MOE_EXPERTS;
      each rank reads only the experts and rows of its box.
    dequantize_fp8: an F8_E4M3 checkpoint tensor with `<key>_scale_inv`
      128x128 block scales, loaded into a BF16/F16/F32/F64 target, is
      dequantised (this rank's box only); the scales count as loaded.
    """
    comm = resolve(process_group)
    skip = _skipper(skip_keys)
    flat = plan = desc = keys = source = None
    error, report = None, None
    try:
        # Collective: rank 0 reads the index once; the engine load reuses it.
        # The fast path's questions are asked while the index is read (no use with a rename).
        source, flat, asked = _open_and_flatten(os.fspath(path), comm, state_dict,
                                                ask=rename is None, skip=skip)
        desc = _C.describe_source(source)
        keys, plan, report = _prepare_load(
            flat, asked, source, desc, rename, experts, dequantize_fp8, options, skip,
            comm.rank if comm is not None else 0, comm.size if comm is not None else 1)
    except (ShardsafeError, ValueError, TypeError, RuntimeError) as e:
        error = e
    reports = _agree(comm, error, report)
    missing = sorted({k for r in reports for k in r["missing"]})
    unexpected = sorted(set.intersection(*(set(r["unexpected"]) for r in reports)))
    pr_missing = sorted({k for r in reports for k in r["per_rank_missing"]})
    pr_unused = reports[0]["per_rank_unused"]  # the same on every rank
    if strict and (missing or unexpected) or per_rank_strict and (pr_missing or pr_unused):
        notes = sorted({n for r in reports for n in r["notes"]})
        if pr_missing or pr_unused:
            notes.append("per-rank values load by rank; per_rank_strict=False keeps the "
                         "values of ranks the checkpoint has none for")
        raise _key_error(missing + pr_missing, unexpected + pr_unused, desc["path"], notes, keys)

    result = _read(plan, source, comm, options)
    blobs = result["blobs"]
    if keys.renamed:
        blobs = {(PICKLE_PREFIX + keys.name(b[len(PICKLE_PREFIX):])
                  if b.startswith(PICKLE_PREFIX) else b): v for b, v in blobs.items()}
    values = keys.rename_values(json.loads(result["values"]) or {})
    values.pop(RESERVED_KEY, None)
    saved_values = {k: from_json(v, None) for k, v in values.items()}
    if skip is not None:
        values = {k: v for k, v in values.items() if not skip(k)}
    absent = sorted({k for r in reports for k in r["absent_state"]})
    _finish(state_dict, flat, values, blobs, unsafe_pickle, absent)
    return LoadResult(desc["path"], desc["tag"], sorted(missing + absent + pr_missing),
                      sorted(unexpected + pr_unused), json.loads(result["metadata"]),
                      result["bytes_read"], result["seconds"], result["bytes_shared"],
                      saved_values)


def _skipper(skip_keys: Sequence[str | re.Pattern]) -> Callable[[str], bool] | None:
    """load's skip_keys as a predicate on keys (None: skip nothing)."""
    if isinstance(skip_keys, (str, re.Pattern)):
        skip_keys = [skip_keys]
    prefixes = tuple(s for s in skip_keys if isinstance(s, str))
    patterns = [s for s in skip_keys if isinstance(s, re.Pattern)]
    if len(prefixes) + len(patterns) != len(skip_keys):
        raise InvalidStateError("skip_keys: expected key prefixes (str) or re.Pattern objects")
    if not skip_keys:
        return None
    return lambda key: key.startswith(prefixes) or any(p.search(key) for p in patterns)


def _read(plan: _Plan, source: _C.OpenedSource, comm: TorchComm | None,
          options: dict) -> dict:
    """Runs the engine load into the plan's direct targets and each read's
    buffer: the target itself when it can take the data in place, else
    staging (then copied in), or FP8 temporaries (then dequantised in)."""
    fp8 = [r for r in plan.reads if r.scale is not None]
    staged = []
    for r in plan.reads:
        if r.scale is None:
            if _in_place(r.dest):
                r.buf = r.dest
            else:
                staged.append(r)  # device, strided, or lazily conjugated/negated
    with _STAGING.borrow([r.dest for r in staged]) as hosts:
        return _read_into(plan, staged, fp8, hosts, source, comm, options)


def _load_specs(reads: list[_Read]) -> list[tuple]:
    """The engine's targets: each read's buffer, and FP8 reads' scale buffers."""
    specs = []
    for r in reads:
        if r.scale is not None:
            key, sshape, so, ss, sdtype = r.scale
            r.buf = torch.empty(r.size, dtype=TORCH_DTYPES["F8_E4M3"])
            r.scale_buf = torch.empty(ss, dtype=TORCH_DTYPES[sdtype])
            specs.append((key, sdtype, sshape, so, ss, r.scale_buf.data_ptr()))
        spec = (r.key, DTYPE_NAMES[r.buf.dtype], r.shape, r.offset, r.size, r.buf.data_ptr())
        specs.append(spec if r.flat is None else spec + (r.flat,))
    return specs


def _read_into(plan: _Plan, staged: list[_Read], fp8: list[_Read],
               hosts: list[torch.Tensor], source: _C.OpenedSource, comm: TorchComm | None,
               options: dict) -> dict:
    for r, h in zip(staged, hosts):
        r.buf = h
    result = _C.load_source(_load_specs(plan.reads), source, comm, options, plan.whole)
    with torch.no_grad():
        for r in staged:
            r.dest.copy_(r.buf, non_blocking=r.dest.device.type != "cpu")
        for r in fp8:
            r.dest.copy_(hf.dequantize(r.buf, r.scale_buf, r.offset).to(r.dest.dtype))
            r.buf = r.scale_buf = None
    if any(r.dest.device.type == "cuda" for r in staged):
        torch.cuda.synchronize()
    return result


def _finish(state: Any, flat: Flat, values: dict, blobs: dict, unsafe_pickle: bool,
            absent_state: list[str]) -> None:
    """Puts the saved values (and per-rank values) into the state, drops the
    optimizer state of parameters that had none when saved (`absent_state`,
    keys under OPTIM.state.ID.) and hands state dicts back."""
    if not flat.values and not flat.state_dicts and not flat.per_rank:
        return  # tensors only, all filled in place: nothing to hand back
    for prefix, optim in flat.optimizers.items():
        head = f"{prefix}.state." if prefix else "state."
        ids = {k[len(head):].split(".", 1)[0] for k in absent_state if k.startswith(head)}
        param_state = flat.state_dicts[optim].get("state", {})
        for pid in [p for p in param_state if str(p) in ids]:
            del param_state[pid]

    def value(key: str, old: Any) -> Any:
        if isinstance(old, PerRank):
            blob = blobs.get(PER_RANK_PREFIX + key) if key in flat.per_rank else None
            if blob is not None:  # absent (per_rank_strict=False) or skipped: kept
                old.value = decode_per_rank(blob, old.value, key)
            return old
        try:
            return decode_value(key, old, values, blobs, unsafe_pickle)
        except KeyError:
            return old  # missing (strict=False) or skipped: left as it was

    rebuild(state, flat, lambda key, t: None, value)


# ------------------------------------------------------ step-tagged roots --

class CheckpointManager:
    """Checkpoints under ROOT/TAG, one per step, with a `latest` pointer and
    retention of the newest `keep_last` (0 keeps all). `tag_format` names a
    step's checkpoint: one "{step}" or "{step:0Nd}" in a tag, e.g.
    "global_step{step}" (DeepSpeed); the step is also recorded at commit,
    so latest_step() works for any format. Which checkpoint is newest is the
    order of commits, never file times or names (docs/format.md §1).

        mgr = shardsafe.CheckpointManager("/ckpt", keep_last=3)
        mgr.async_save(step, {"model": model, "optim": optim, "step": step})
        ...
        step = mgr.latest_step()  # None for an empty root
        mgr.load({"model": model, "optim": optim, "step": 0})

    A manager owns its async saves' staging memory and threads; dropping it
    (or release_async_save) frees them once its save in flight is durable.
    """

    def __init__(self, root: str | os.PathLike, keep_last: int = 0, *,
                 process_group: dist.ProcessGroup | None = None,
                 tag_format: str = "step-{step:08d}"):
        self.root = root = os.path.abspath(os.fspath(root))
        # (the factory holds the root, not self: a pending Future holds the
        # engine holder, and must not hold the manager too)
        self._engine = _PerProcess(lambda: _C.CheckpointManager(root, keep_last, tag_format),
                                   _C.CheckpointManager.wait_async)
        self._engine.get()  # a bad root fails here
        self._group = process_group

    @property
    def _m(self) -> _C.CheckpointManager:
        return self._engine.get()

    def path(self, step: int) -> str:
        return os.path.join(self.root, self._m.tag_of(step))

    def save(self, step: int, state: Any, *, metadata: Any = None, unsafe_pickle: bool = False,
             files: Mapping[str, Any] | None = None, **options: Any) -> dict:
        """Saves as step `step`, moves `latest`, applies retention (which
        never removes the newest commit nor the one `latest` names).
        update_latest=False commits without moving `latest` (DeepSpeed's
        save_latest=False): that checkpoint is not taken as the latest while
        `latest` names another. Other options as shardsafe.save."""
        comm = resolve(self._group)
        args = _prepared(state, comm, metadata, unsafe_pickle, files, options)
        return self._m.save(step, args.specs, args.blobs, args.values, args.metadata, comm,
                            options, args.whole, args.device)

    def async_save(self, step: int, state: Any, *, metadata: Any = None,
                   unsafe_pickle: bool = False, files: Mapping[str, Any] | None = None,
                   **options: Any) -> Future:
        """save in the background; the Future's result is the checkpoint path."""
        comm = resolve(self._group)
        args = _prepared(state, comm, metadata, unsafe_pickle, files, options)
        handle = self._m.async_save(step, args.specs, args.blobs, args.values, args.metadata,
                                    comm, options, args.whole, args.device)
        return _future(handle, self.path(step), self._engine)

    def reserve_async_save(self, state: Any, *, metadata: Any = None,
                           unsafe_pickle: bool = False,
                           files: Mapping[str, Any] | None = None, **options: Any) -> int:
        """Allocates the staging memory of this manager's async saves of
        `state` now (see shardsafe.reserve_async_save); the bytes held."""
        comm = resolve(self._group)
        args = _prepared(state, comm, metadata, unsafe_pickle, files, options)
        return self._m.reserve_async(args.specs, args.blobs, args.values, args.metadata,
                                     comm, options, args.whole, args.device)

    def release_async_save(self) -> None:
        """Frees this manager's staging memory and threads once its save in
        flight is durable, raising that save's failure (as
        shardsafe.release_async_save); the next async_save allocates again."""
        self._engine.release()

    def wait(self) -> None:
        """Waits for the async save in flight; raises its failure."""
        self._m.wait_async()

    def latest_step(self) -> int | None:
        return self._m.latest_step()

    def load(self, state: Any, step: int | None = None, **kwargs: Any) -> LoadResult:
        """Loads step `step`, or the latest; keyword arguments as load()."""
        if step is None:
            step = self.latest_step()
            if step is None:
                raise CheckpointNotFoundError(f"{self.root}: no committed checkpoint", "NOT_FOUND")
        return load(state, self.path(step), process_group=self._group, **kwargs)

    def list(self) -> list[dict]:
        return self._m.list()

    def prune(self, keep: int) -> list[str]:
        return self._m.prune(keep)
