"""The formats shardsafe reads, in detection order: the first one that
claims a path reads it (Megatron torch_dist, a DCP directory with more,
before plain DCP). A path no format claims is left to the shardsafe engine
(its own checkpoints and roots, safetensors, Hugging Face models)."""

from __future__ import annotations

import os

from . import dcp, deepspeed, megatron, nanotron
from .common import read_latest
from .reader import ForeignCheckpoint, Format

FORMATS: tuple[Format, ...] = (megatron.FORMAT, dcp.FORMAT, deepspeed.FORMAT, nanotron.FORMAT)
# Named in messages about a path no format claims.
KNOWN = "torch DCP, Megatron torch_dist, DeepSpeed or nanotron"


def formats() -> list[Format]:
    """Every format, in detection order."""
    return list(FORMATS)


def by_name(name: str) -> Format:
    """The format called `name` (Format.name)."""
    for fmt in FORMATS:
        if fmt.name == name:
            return fmt
    raise KeyError(name)


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
    for fmt in FORMATS:
        if fmt.detect(path):
            return fmt
    return None


def open_checkpoint(path: str | os.PathLike, *, unsafe_pickle: bool = False
                    ) -> ForeignCheckpoint | None:
    """The checkpoint at `path` opened by the format that claims it, or None."""
    fmt = detect(path)
    return None if fmt is None else fmt.open(os.fspath(path), unsafe_pickle=unsafe_pickle)
