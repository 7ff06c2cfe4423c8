"""Megatron-Core `torch_dist` checkpoints (``--ckpt-format torch_dist``),
read without Megatron installed.

Layout, as megatron.core.dist_checkpointing.save writes it (checked against
megatron-core 0.16.1, whose save the tests run):

    ROOT/latest_checkpointed_iteration.txt   "<iteration>" or "release"
    ROOT/iter_0000100/                        f"iter_{iteration:07d}" ("release" for release)
        .metadata, __R_N.distcp               a torch DCP checkpoint: every ShardedTensor
                                              under its global key, ShardedObjects as DCP
                                              bytes items "KEY/shard_<offsets>_<shape>"
        common.pt                             torch.save of the non-sharded ("common")
                                              state by rank 0: iteration, args, scheduler...
        metadata.json                         {"sharded_backend": "torch_dist",
                                               "sharded_backend_version": 1,
                                               "common_backend": "torch", ...}, written last

Newer Megatron keeps the common state as a DCP bytes item "common_state"
instead of common.pt (Megatron's notes in shared/reference/peers.md); both
are read. A checkpoint directory or its root (the tracker names the
iteration) opens. Tensors are the DCP checkpoint's (shardsafe.foreign.dcp);
values() are the common state, argparse.Namespace objects (Megatron's
`args`) as dicts, and the ShardedObjects under their DCP keys, as saved
(the importer drops and reports what JSON cannot hold). Everything is read:
not_imported() is empty. common.pt is unpickled with
torch.load(weights_only=True) allowing argparse.Namespace (attributes only,
no code) unless unsafe_pickle=True (shardsafe.foreign.common.torch_load).
"""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

from .._files import read_bytes
from ..errors import (CheckpointNotFoundError, CorruptCheckpointError, InvalidStateError,
                      StorageError)
from .common import as_dicts, one_line, read_latest, torch_load
from .dcp import DcpCheckpoint, is_dcp
from .reader import Format

TRACKER = "latest_checkpointed_iteration.txt"
CONFIG = "metadata.json"
COMMON = "common.pt"
COMMON_ITEM = "common_state"  # newer Megatron: the common state as a DCP bytes item


def _iteration_dir(root: str) -> str | None:
    """The checkpoint directory the root's tracker names (None: no tracker,
    or not a name of Megatron's)."""
    text = read_latest(os.path.join(root, TRACKER))
    if text == "release":
        return os.path.join(root, "release")
    if not text or not (text.isascii() and text.isdigit()):
        return None
    return os.path.join(root, f"iter_{int(text):07d}")


def _resolve(path: str) -> str:
    """The checkpoint directory of `path` (itself, or the tracker's)."""
    if os.path.isfile(os.path.join(path, CONFIG)):
        return path
    found = _iteration_dir(path)
    return found if found is not None else path


def _detect(path: str) -> bool:
    """A DCP directory with Megatron's metadata.json, or a root whose tracker
    names one."""
    path = _resolve(path)
    return is_dcp(path) and os.path.isfile(os.path.join(path, CONFIG))


def _config(path: str) -> dict:
    file = os.path.join(path, CONFIG)
    try:
        text = read_bytes(file, within=path)
    except FileNotFoundError:
        raise CheckpointNotFoundError(f"{file}: missing (not a Megatron torch_dist checkpoint)",
                                      "NOT_FOUND") from None
    except OSError as e:
        raise StorageError(f"{file}: cannot be read: {one_line(e)}", "UNAVAILABLE") from None
    try:
        config = json.loads(text.decode("utf-8"))
    except ValueError as e:  # UnicodeDecodeError included
        raise CorruptCheckpointError(f"{file}: unreadable Megatron checkpoint config: "
                                     f"{one_line(e)}", "DATA_LOSS") from None
    if not isinstance(config, dict) or config.get("sharded_backend") != "torch_dist":
        backend = config.get("sharded_backend") if isinstance(config, dict) else None
        raise InvalidStateError(f"{file}: Megatron sharded_backend {backend!r} is not supported "
                                f"(only 'torch_dist')")
    return config


class MegatronCheckpoint(DcpCheckpoint):
    """A Megatron torch_dist checkpoint as a ForeignCheckpoint."""

    format = "Megatron torch_dist"

    def __init__(self, path: str | os.PathLike, *, unsafe_pickle: bool = False) -> None:
        root = os.fspath(path)
        path = _resolve(root)
        if not os.path.isdir(path):
            raise CheckpointNotFoundError(f"{root}: its {TRACKER} names {path}, which does not "
                                          f"exist", "NOT_FOUND")
        self.config = _config(path)
        super().__init__(path, unsafe_pickle=unsafe_pickle)

    def values(self, keys: list[str] | None = None) -> dict[str, Any]:
        objects = [k for k in self.value_keys() if not _is_common(k)]
        out = super().values(objects if keys is None else keys)
        if keys is None:
            common = self._common()
            clash = sorted(set(common) & set(out))
            if clash:
                raise CorruptCheckpointError(f"{self.path}: common state and sharded objects "
                                             f"both hold {clash[:4]}", "DATA_LOSS")
            out.update(common)
        return out

    def _common(self) -> dict[str, Any]:
        file = os.path.join(self.path, COMMON)
        if os.path.isfile(file):
            common = self._load_common(file)
        else:
            items = [k for k in self.value_keys() if _is_common(k)]
            if not items:
                raise CheckpointNotFoundError(f"{file}: missing (the Megatron checkpoint's common "
                                              f"state: iteration, args, ...)", "NOT_FOUND")
            found = super().values(items)
            common = found.get(COMMON_ITEM, found)
        if not isinstance(common, dict):
            raise CorruptCheckpointError(f"{file}: the common state is a "
                                         f"{type(common).__name__}, not a dict", "DATA_LOSS")
        return as_dicts(common)

    def _load_common(self, file: str) -> Any:
        return torch_load(file, unsafe_pickle=self._unsafe_pickle, within=self.path,
                          safe_globals=[argparse.Namespace])

    def not_imported(self) -> list[str]:
        """Nothing: every tensor, the common state and every object is read."""
        return []


def _is_common(key: str) -> bool:
    return key == COMMON_ITEM or key.startswith(COMMON_ITEM + "/")


FORMAT = Format("Megatron torch_dist", _detect, MegatronCheckpoint)
