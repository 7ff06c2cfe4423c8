"""Other tools' checkpoints imported as shardsafe checkpoints (`shardsafe
import SRC DST`, shardsafe.peers.import_checkpoint).

import_checkpoint(src, dst): a foreign checkpoint converted into a one-rank
shardsafe checkpoint, in one commit, in bounded memory. Its tensors are
handed to the engine's synchronous save as tensors "on a device" whose
addresses are a synthetic address space (_LazyCopier): the engine asks for
their bytes a write buffer at a time (shardsafe._device.DeviceCopier's
contract), and the copier reads each tensor through `read(key)` when first
asked and drops it once all its bytes are copied. With one file written at
a time (io_threads=1) memory is the tensor being written (two at most,
one a re-read) plus the engine's write buffers. Values JSON can hold are
carried over under the keys shardsafe.save would give them; tensors among
the values are saved as tensors; what JSON cannot hold is dropped and
reported (a warning and the result's "dropped" keys): _plain_values is the
one place that cleans foreign values for JSON (readers return them as
saved). What the reader itself could not carry over (its optional
not_imported()) is reported the same way (a warning and the result's
"not_imported" lines, one warning for all). Both warnings are
NotImportedWarning, which the CLI (shardsafe.__main__) prints from the
result instead.
"""

from __future__ import annotations

import bisect
import contextlib
import json
import math
import os
import sys
import threading
import time
import warnings
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch

from .. import _C
from .._device import _host_view
from .._json import join, to_json
from .._options import SaveOptions
from .._paths import is_s3, staged
from .._state import DTYPE_NAMES, encode_values, flatten
from ..errors import (CheckpointExistsError, CheckpointNotFoundError, CorruptCheckpointError,
                      InvalidStateError, ShardsafeError)
from .formats import KNOWN, detect
from .reader import ForeignCheckpoint, checked

TQDM_PIN = "tqdm==4.70.1"


class NotImportedWarning(UserWarning):
    """Part of a foreign checkpoint an import leaves out (also listed in its
    result: "dropped", "not_imported")."""


class _LazyCopier:
    """The engine's DeviceCopier (shardsafe._device) for an import: each
    foreign tensor has a range of a synthetic address space, and its bytes
    are read (ForeignCheckpoint.read) when the engine first asks for any of
    them. A tensor is dropped once every byte of it was copied; at most
    MAX_HELD tensors are held (the oldest dropped first, read again if asked
    again), so memory stays bounded whatever order the engine asks in."""

    BASE = 1 << 46  # no real host or device memory is handed out here
    ALIGN = 4096
    MAX_HELD = 2

    def __init__(self, fc: ForeignCheckpoint, progress: Callable[[int], None]) -> None:
        self._fc = fc
        self._progress = progress
        self._starts: list[int] = []
        self._items: list[tuple[str, torch.dtype, tuple[int, ...], int]] = []
        self._held: OrderedDict[int, list] = OrderedDict()  # item -> [bytes, left to copy]
        self._lock = threading.Lock()
        self._end = self.BASE
        self.error: BaseException | None = None  # the first failure, raised by the caller
        self.reads = 0

    def add(self, key: str, dtype: torch.dtype, shape: tuple[int, ...], nbytes: int) -> int:
        """The synthetic address of a tensor's bytes."""
        address = self._end
        self._starts.append(address)
        self._items.append((key, dtype, shape, nbytes))
        self._end += -(-max(nbytes, 1) // self.ALIGN) * self.ALIGN
        return address

    def copy_to_host(self, copies: list[tuple[int, int, int]]) -> None:
        try:
            with self._lock:
                for dst, src, n in copies:
                    self._copy(dst, src, n)
        except BaseException as e:
            if self.error is None:
                self.error = e
            raise

    def copy_to_device(self, copies: list[tuple[int, int, int]]) -> None:
        raise InvalidStateError("an import copies to the host only (engine bug)")

    def _copy(self, dst: int, src: int, n: int) -> None:
        i = bisect.bisect_right(self._starts, src) - 1
        if n == 0:
            return
        if i < 0 or src + n > self._starts[i] + self._items[i][3]:
            raise InvalidStateError(f"no imported tensor holds [{src:#x}, +{n}) (engine bug)")
        held = self._take(i)
        off = src - self._starts[i]
        _host_view(dst, n).copy_(held[0][off:off + n])
        held[1] -= n
        if held[1] <= 0:
            del self._held[i]
        self._progress(n)

    def _take(self, i: int) -> list:
        held = self._held.get(i)
        if held is not None:
            self._held.move_to_end(i)
            return held
        key, dtype, shape, nbytes = self._items[i]
        t = checked(self._fc, key, self._fc.read(key), shape, dtype)
        self.reads += 1
        held = [t.contiguous().reshape(-1).view(torch.uint8), nbytes]
        self._held[i] = held
        while len(self._held) > self.MAX_HELD:
            self._held.popitem(last=False)
        return held


def _plain_values(values: Any, key: str, dropped: list[str]) -> Any:
    """The nested values with what JSON cannot hold (and is no tensor) left
    out (_DROPPED), its keys added to `dropped`. A list or tuple with such
    an item is dropped whole: a hole would shift the items after it."""
    if isinstance(values, torch.Tensor):
        return values.detach().cpu()
    if isinstance(values, Mapping):
        out = {}
        for k, v in values.items():
            if isinstance(k, bool) or not isinstance(k, (str, int)):
                dropped.append(join(key, repr(k)))
                continue
            v = _plain_values(v, join(key, k), dropped)
            if v is not _DROPPED:
                out[k] = v
        return out
    if isinstance(values, (list, tuple)) and not hasattr(values, "_fields"):
        below: list[str] = []
        items = [_plain_values(v, join(key, i), below) for i, v in enumerate(values)]
        if any(v is _DROPPED for v in items):
            dropped.append(key)
            return _DROPPED
        dropped += below
        return items
    if type(values).__module__ == "numpy" and not getattr(values, "shape", None):
        values = values.item()  # a NumPy scalar: its exact Python value
    try:
        to_json(values, key)
    except InvalidStateError:
        dropped.append(key)
        return _DROPPED
    return values


_DROPPED = object()


def _progress_bar(show: bool | None, total: int, desc: str) -> Any:
    """A tqdm bar on stderr, shown when asked (True) or on a terminal (None)."""
    if show is None:
        show = sys.stderr.isatty()
    if not show:
        return None
    try:
        from tqdm import tqdm
    except ImportError:
        raise InvalidStateError(f"a progress bar needs tqdm (pip install {TQDM_PIN}), or pass "
                                f"progress=False") from None
    return tqdm(total=total, unit="B", unit_scale=True, unit_divisor=1024, desc=desc,
                file=sys.stderr, mininterval=0.5 if sys.stderr.isatty() else 5.0,
                dynamic_ncols=True, leave=True)


def import_checkpoint(src: str | os.PathLike, dst: str | os.PathLike, *,
                      unsafe_pickle: bool = False, overwrite: bool = False,
                      progress: bool | None = None) -> dict:
    """Converts the foreign checkpoint at `src` (any registered format) into
    a one-rank shardsafe checkpoint at `dst`, in one commit: every tensor
    whole under its key, the values JSON can hold as values. Memory: about
    the largest tensor plus the engine's write buffers (module doc).
    progress: a tqdm bar on stderr (None: on a terminal only). Returns
    {"source", "format", "path", "tensors", "values", "bytes", "dropped",
    "not_imported", "files", "seconds"}: "dropped" the value keys JSON
    cannot hold, "not_imported" the reader's lines about what it could not
    carry over (both also told by a NotImportedWarning). `src` may be an
    s3:// prefix: its objects are copied into a temporary local directory
    first (shardsafe._paths.staged: $SHARDSAFE_STAGING_DIR, checked for
    space; removed afterwards), where the format is detected and read;
    `dst` may be one too."""
    src, dst = os.fspath(src), os.fspath(dst)
    start = time.monotonic()
    if os.path.exists(dst) and not overwrite:  # an s3:// one: the engine's save refuses it
        raise CheckpointExistsError(f"checkpoint {dst} already exists (overwrite=True, or "
                                    f"--overwrite, replaces it)")
    with _local(src, progress) as local:
        fmt = detect(local)
        if fmt is None:
            raise CheckpointNotFoundError(f"no {KNOWN} checkpoint in {src}")
        fc = fmt.open(local, unsafe_pickle=unsafe_pickle)
        try:
            source = os.fspath(fc.path)  # a root's reader names the checkpoint it reads
            if source.startswith(local) and local != src:  # staged: name it in the bucket
                source = src.rstrip("/") + source[len(local):]
            done = _import(fc, source, dst, overwrite, progress)
        finally:
            fc.close()
    done["seconds"] = time.monotonic() - start
    return done


@contextlib.contextmanager
def _local(src: str, progress: bool | None) -> Iterator[str]:
    """`src`, or for an s3:// prefix its objects staged on a local disk for
    the readers (shardsafe._paths.staged; removed afterwards), with a
    progress bar of the download when `progress` asks for one."""
    if not is_s3(src):
        yield src
        return
    with staged(src, lambda total: _progress_bar(progress, total, "download")) as local:
        yield local


def _not_imported(fc: ForeignCheckpoint) -> list[str]:
    """The reader's lines about what it could not carry over (its optional
    not_imported()); asked after tensors() and values(), which may find more."""
    lines = getattr(fc, "not_imported", None)
    return list(lines()) if lines is not None else []


def _some(items: list[str], limit: int = 16, sep: str = ", ") -> str:
    return sep.join(items[:limit]) + (" ..." if len(items) > limit else "")


def _import(fc: ForeignCheckpoint, source: str, dst: str, overwrite: bool,
            progress: bool | None) -> dict:
    """import_checkpoint of the opened `fc`; `source` names it in messages
    and the result (an s3:// URI where `fc` reads a staged copy)."""
    tensors = fc.tensors()
    dropped: list[str] = []
    values = _plain_values(fc.values(), "", dropped)
    not_imported = _not_imported(fc)
    if dropped:
        warnings.warn(f"{source}: {len(dropped)} value(s) that JSON cannot hold were not "
                      f"imported: {_some(dropped)}", NotImportedWarning, stacklevel=3)
    if not_imported:
        warnings.warn(f"{source}: {len(not_imported)} part(s) not imported (the result's "
                      f"\"not_imported\"): {_some(not_imported, 4, '; ')}", NotImportedWarning,
                      stacklevel=3)
    flat = flatten(values)  # tensors among the values stay tensors, as save keeps them
    clash = sorted(({leaf.key for leaf in flat.tensors} | set(flat.values)) & set(tensors))
    if clash:
        raise CorruptCheckpointError(f"{fc.path}: {clash[0]!r} is both a tensor and a value",
                                     "DATA_LOSS")
    json_values, _ = encode_values(flat.values, unsafe_pickle=False)
    total = sum(math.prod(s) * torch.empty((), dtype=d).element_size()
                for d, s in tensors.values())
    bar = _progress_bar(progress, total, f"import {fc.format}")
    copier = _LazyCopier(fc, bar.update if bar is not None else lambda n: None)
    specs = []
    for key, (dtype, shape) in tensors.items():
        name = _dtype_name(fc, key, dtype)
        shape = tuple(shape)
        nbytes = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
        specs.append((key, name, shape, (0,) * len(shape), shape,
                      copier.add(key, dtype, shape, nbytes)))
    host = [(leaf.key, leaf.tensor.contiguous()) for leaf in flat.tensors]
    host_specs = [(k, _dtype_name(fc, k, t.dtype), tuple(t.shape), (0,) * t.dim(),
                   tuple(t.shape), t.data_ptr()) for k, t in host]
    metadata = json.dumps({"imported_from": {"format": fc.format, "path": source}})
    # One file at a time, through small write buffers: the bound of the module doc.
    options = SaveOptions(overwrite=overwrite, io_threads=1, io_buffer_bytes=8 << 20).engine()
    call = _C.SaveCall(host_specs, [], json.dumps(json_values, allow_nan=False), metadata, None,
                       options, None, (copier, specs) if specs else None)
    try:
        stats = _C.save(call, dst)
    except ShardsafeError:
        if copier.error is not None:  # the foreign reader's own error, not the engine's wrap
            raise copier.error from None
        raise
    finally:
        if bar is not None:
            bar.close()
    return {"source": source, "format": fc.format, "path": dst, "tensors": len(specs) + len(host),
            "values": len(flat.values), "bytes": total + sum(t.numel() * t.element_size()
                                                              for _, t in host),
            "dropped": dropped, "not_imported": not_imported, "files": stats.files,
            "reads": copier.reads}


def _dtype_name(fc: ForeignCheckpoint, key: str, dtype: torch.dtype) -> str:
    """The stored name of a tensor's dtype, or a one-line error naming it."""
    name = DTYPE_NAMES.get(dtype)
    if name is None:
        raise InvalidStateError(f"{fc.path}: tensor {key!r}: dtype {dtype} cannot be stored in "
                                f"safetensors")
    return name
