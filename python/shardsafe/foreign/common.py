"""Helpers every reader of another tool's checkpoint shares (shardsafe.foreign):
torch_load (a pickle read as the reader contract says: weights_only unless
unsafe_pickle, one mapping of its failures, the file opened checked),
one_line (an exception in one line), read_latest (the pointer files naming
a root's newest checkpoint), as_dicts, and PickleRefusedError /
refused_global (what weights_only refused)."""

from __future__ import annotations

import argparse
import os
import pickle
import re
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from .._files import fd_path, open_read
from ..errors import (CheckpointNotFoundError, CorruptCheckpointError, InvalidStateError,
                      StorageError)


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
