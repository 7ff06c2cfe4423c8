"""Checkpoints written by other tools (torch DCP, Megatron torch_dist,
DeepSpeed, nanotron): one interface over their readers, so that loading one
into any layout and importing one (`shardsafe import SRC DST`) are written
once, whatever the format.

A format module (shardsafe._deepspeed, ...) exports a Format as `FORMAT`:
`detect` says whether a directory is one of its checkpoints (cheaply: file
names and small metadata files, never tensor data), `open` returns a
ForeignCheckpoint. The modules are imported on the first `detect` (none of
them needs its peer's own package to read its checkpoints), in the order of
FORMAT_MODULES; the first format that claims a path reads it (Megatron
torch_dist, a DCP directory with more, before plain DCP). A path no format
claims is left to the shardsafe engine (its own checkpoints, safetensors,
Hugging Face models).

Contract of ForeignCheckpoint:
- `tensors()` lists every tensor of the checkpoint as a global tensor:
  key -> (torch dtype, global shape), without reading tensor data. Keys are
  the names the peer's own consolidation gives them (DeepSpeed's
  zero_to_fp32, nanotron's parameter names, DCP's flattened keys).
- `read(key)` returns that whole global tensor, contiguous, on the CPU,
  bit-exact as the peer's own tools reconstruct it. It may read only the
  files that hold the key. Memory: the tensor plus a bounded overhead
  (never the whole checkpoint).
- optional `read_box(key, offset, size)`: only that box of the global
  tensor, read from the files that hold it; shardsafe.load uses it where a
  rank's targets of a key are boxes smaller than the tensor.
- `values()` returns the checkpoint's non-tensor state (step, config, RNG
  states, ...) as a nested dict of the values as saved (attribute holders
  such as argparse.Namespace as dicts: as_dicts) and small tensors. Readers
  do not clean values for JSON: the importer (shardsafe._import) is the one
  place that drops, and reports, what JSON cannot hold.
- optional `not_imported()`: what the reader could not carry over (state it
  cannot place with certainty, files it does not read), one line each;
  `shardsafe import` prints every line.
- Errors are shardsafe.errors exceptions whose one-line message names the
  file, the key and the problem (CorruptCheckpointError for a damaged or
  inconsistent checkpoint, CheckpointNotFoundError for a missing part).
- Pickles (`.pt` files) are unpickled with torch.load(weights_only=True)
  unless the caller passed unsafe_pickle=True; never with a raw pickle.load.
  torch_load does it for every reader, with one mapping of its failures:
  a missing file is CheckpointNotFoundError, another OSError StorageError,
  a type weights_only refuses PickleRefusedError (an InvalidStateError
  naming the way out), anything else CorruptCheckpointError.
- Every file a reader reads is opened by shardsafe._files.open_read (never
  a plain open(), nor a path handed to another reader unchecked): a FIFO,
  device or directory where a file should be is an InvalidStateError
  naming it, never a read that blocks for ever; files of a checkpoint are
  opened with `within` its directory (a symbolic link leading outside it
  is refused).

Shared helpers: torch_load, one_line (an exception in one line), read_latest
(the pointer files naming a root's newest checkpoint), as_dicts.
"""

from __future__ import annotations

import argparse
import importlib
import os
import pickle
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from ._files import fd_path, open_read
from .errors import (CheckpointNotFoundError, CorruptCheckpointError, InvalidStateError,
                     StorageError)


class ForeignCheckpoint(Protocol):
    format: str  # e.g. "DeepSpeed ZeRO-2", shown in messages
    path: str

    def tensors(self) -> dict[str, tuple[torch.dtype, tuple[int, ...]]]: ...

    def read(self, key: str) -> torch.Tensor: ...

    def values(self) -> dict[str, Any]: ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class Format:
    name: str
    detect: Callable[[str], bool]
    # open(path, unsafe_pickle=...) -> ForeignCheckpoint
    open: Callable[..., ForeignCheckpoint]


# The format modules, in detection order.
FORMAT_MODULES = ("_megatron", "peers", "_deepspeed", "_nanotron")
# Named in messages about a path no format claims.
KNOWN = "torch DCP, Megatron torch_dist, DeepSpeed or nanotron"

_FORMATS: list[Format] = []
_loaded = False


def register(fmt: Format) -> None:
    """Adds a format (once per name), detected after those registered before."""
    if all(f.name != fmt.name for f in _FORMATS):
        _FORMATS.append(fmt)


def formats() -> list[Format]:
    """Every registered format, in detection order (the modules imported)."""
    global _loaded
    if not _loaded:
        for name in FORMAT_MODULES:
            register(importlib.import_module(f"{__package__}.{name}").FORMAT)
        _loaded = True
    return list(_FORMATS)


def _is_shardsafe(path: str) -> bool:
    """A shardsafe checkpoint, or a root whose `latest` names one (a
    DeepSpeed root has a `latest` file too)."""
    if os.path.exists(os.path.join(path, "shardsafe.json")):
        return True
    tag = read_latest(os.path.join(path, "latest"))
    return bool(tag) and os.path.exists(os.path.join(path, tag, "shardsafe.json"))


def detect(path: str | os.PathLike) -> Format | None:
    """The format that claims `path`, or None (also for shardsafe's own
    checkpoints and roots)."""
    path = os.fspath(path)
    if not os.path.isdir(path) or _is_shardsafe(path):
        return None
    for fmt in formats():
        if fmt.detect(path):
            return fmt
    return None


def open_checkpoint(path: str | os.PathLike, *, unsafe_pickle: bool = False
                    ) -> ForeignCheckpoint | None:
    """The checkpoint at `path` opened by the format that claims it, or None."""
    fmt = detect(path)
    return None if fmt is None else fmt.open(os.fspath(path), unsafe_pickle=unsafe_pickle)


# ------------------------------------------------------------ helpers --

def one_line(e: BaseException) -> str:
    """An exception in one line: its type and the first line of its message
    (of torch's weights_only text, the unpickler's own message)."""
    text = str(e)
    if _WO_CAUSE in text:
        text = text.split(_WO_CAUSE, 1)[1]
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    useful = [ln for ln in lines if not ln.startswith(_TORCH_NOISE)]
    first = (useful or lines or [""])[0]
    return f"{type(e).__name__}: {first}" if first else type(e).__name__


def read_latest(path: str) -> str | None:
    """The stripped text of a pointer file naming a root's newest checkpoint
    (DeepSpeed's and shardsafe's `latest`, nanotron's latest.txt, Megatron's
    tracker): "" if it is empty, None if it is missing, unreadable, not
    UTF-8, not a regular file (a FIFO would block a plain open for ever) or
    a symbolic link leading out of its directory (_files.open_read). At
    most LATEST_LIMIT characters are read (a pointer is short)."""
    try:
        with open_read(path, within=os.path.dirname(path) or ".", encoding="utf-8") as f:
            return f.read(LATEST_LIMIT).strip()
    except (OSError, UnicodeDecodeError, InvalidStateError):
        return None


LATEST_LIMIT = 4096


def as_dicts(value: Any, records: tuple[type, ...] = (argparse.Namespace,)) -> Any:
    """`value` in fresh containers: objects of `records` (attribute holders
    such as argparse.Namespace) as dicts of their attributes, mappings as
    dicts, lists and tuples rebuilt (NamedTuples and other tuple types as
    they are), every other value as it is (the importer cleans for JSON)."""
    if isinstance(value, records):
        value = vars(value)
    if isinstance(value, Mapping):
        return {k: as_dicts(v, records) for k, v in value.items()}
    if isinstance(value, list):
        return [as_dicts(v, records) for v in value]
    if type(value) is tuple:
        return tuple(as_dicts(v, records) for v in value)
    return value


class PickleRefusedError(InvalidStateError):
    """torch.load(weights_only=True) refused a type in a pickle. A reader
    that can go on without the file catches it (and lists `reason` in
    not_imported()); `path` is the file."""

    def __init__(self, path: str, refused: str, what: str = "") -> None:
        self.path = path
        self.reason = (f"torch.load(weights_only=True) refuses {refused}; pass unsafe_pickle=True "
                       f"only if you trust this checkpoint")
        super().__init__(f"{path}{what}: {self.reason}", "INVALID_ARGUMENT")


def refused_global(e: BaseException) -> str | None:
    """What torch's weights_only unpickler refused ("the global X"), or None
    if `e` is no refusal: torch prefixes every unpickling failure under
    weights_only, a truncated or garbage stream's included, with "Weights
    only load failed"; only its messages for a global it does not allow
    (torch/_weights_only_unpickler.py) are refusals."""
    if not isinstance(e, pickle.UnpicklingError):
        return None
    m = _REFUSED.search(str(e))
    if m is None:
        return None
    return f"the global {m['name']}" if m["name"] else f"the global {m['blocked']} (its module " \
                                                       f"is blocked)"


def torch_load(path: str, *, unsafe_pickle: bool, within: str | None = None, mmap: bool = True,
               safe_globals: Sequence[Any] = (), what: str = "") -> Any:
    """torch.load of one file onto the CPU: weights_only=True (also allowing
    `safe_globals`, torch.serialization.safe_globals entries) unless
    unsafe_pickle; memory-mapped when `mmap` (a file of torch's legacy,
    non-zip format is read whole). The file is opened by _files.open_read
    (a regular file, inside `within` when given) and torch reads that
    descriptor (through _files.fd_path: torch's mmap takes a path only).
    `what` follows the path in messages (e.g. " (needed for KEY)"). Raises
    CheckpointNotFoundError (no such file), StorageError (any other
    OSError), InvalidStateError (not a regular file, or a link leading
    outside `within`; with unsafe_pickle, a module the pickle needs is
    missing), PickleRefusedError (a type weights_only refuses) or
    CorruptCheckpointError (anything else: a truncated or garbage file)."""
    try:
        f = open_read(path, within=within)
    except FileNotFoundError:
        raise CheckpointNotFoundError(f"{path}{what}: missing", "NOT_FOUND") from None
    except OSError as e:
        raise StorageError(f"{path}{what}: cannot be read: {one_line(e)}", "UNAVAILABLE") from None
    except InvalidStateError as e:
        raise InvalidStateError(f"{e}{what}", e.code) from None
    with f:
        return _torch_load_checked(f, path, unsafe_pickle, mmap, safe_globals, what)


def _torch_load_checked(f: Any, path: str, unsafe_pickle: bool, mmap: bool,
                        safe_globals: Sequence[Any], what: str) -> Any:
    """torch_load of the file `f` opened (at `path`, for messages)."""
    opened = fd_path(f)

    def cause(e: BaseException) -> str:  # naming the path, not /proc/self/fd/N
        return one_line(e).replace(opened, path)

    try:
        try:
            return _torch_load(opened, unsafe_pickle, mmap, safe_globals)
        except RuntimeError as e:
            if not mmap or _NOT_MMAPPABLE not in str(e):
                raise
            return _torch_load(opened, unsafe_pickle, False, safe_globals)
    except OSError as e:
        raise StorageError(f"{path}{what}: cannot be read: {cause(e)}", "UNAVAILABLE") from None
    except ImportError as e:
        if not unsafe_pickle:
            raise
        raise InvalidStateError(f"{path}{what}: unpickling it needs a module that is not "
                                f"installed: {cause(e)}", "FAILED_PRECONDITION") from None
    except Exception as e:  # torch, pickle and zip errors have no common base
        refused = None if unsafe_pickle else refused_global(e)
        if refused is not None:
            raise PickleRefusedError(path, refused, what) from None
        raise CorruptCheckpointError(f"{path}{what}: unreadable pickle: {cause(e)}",
                                     "DATA_LOSS") from None


def _torch_load(path: str, unsafe_pickle: bool, mmap: bool, safe_globals: Sequence[Any]) -> Any:
    if unsafe_pickle:
        return torch.load(path, map_location="cpu", weights_only=False, mmap=mmap)
    with torch.serialization.safe_globals(list(safe_globals)):
        return torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)


# torch 2.13 (torch/_weights_only_unpickler.py): a global not allowed, or one
# of a blocked module (os, sys, ...).
_REFUSED = re.compile(r"Unsupported global: GLOBAL (?P<name>\S+) was not an allowed global"
                      r"|Trying to load unsupported GLOBAL (?P<blocked>\S+) whose module \S+ is "
                      r"blocked")
_NOT_MMAPPABLE = "mmap can only be used with files saved with"
_WO_CAUSE = "WeightsUnpickler error:"
_TORCH_NOISE = ("Weights only load failed", "In PyTorch 2.6", "(1) In PyTorch", "(2) Alternatively",
                "Check the documentation of torch.load")
