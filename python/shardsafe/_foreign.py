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
  states, ...) as a nested dict of plain values and small tensors.
- Errors are shardsafe.errors exceptions whose one-line message names the
  file, the key and the problem (CorruptCheckpointError for a damaged or
  inconsistent checkpoint, CheckpointNotFoundError for a missing part).
- Pickles (`.pt` files) are unpickled with torch.load(weights_only=True)
  unless the caller passed unsafe_pickle=True; never with a raw pickle.load.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import torch


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
    try:
        with open(os.path.join(path, "latest")) as f:
            tag = f.read(256).strip()
    except (OSError, UnicodeDecodeError):
        return False
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
