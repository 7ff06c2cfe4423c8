"""A torch DCP checkpoint's `.metadata`, read without running its pickle.

torch's own FileSystemReader.read_metadata unpickles `.metadata` with a
plain pickle.load, which runs whatever a crafted file names. torch's
weights_only unpickler cannot read it either (DCP pickles with protocol 4
framing, which that unpickler refuses). So the file is unpickled here with
globals restricted to what DCP's metadata is made of: its dataclasses
(Metadata, TensorStorageMetadata, ..., and the save plans Megatron keeps
there), torch.Size, torch dtypes, layouts and memory formats, and paths; any other global (a Megatron class, a
function) is refused with a one-line error, unless the caller passed
unsafe_pickle=True for a checkpoint it trusts.

Each tensor's chunks are then checked to lie within the tensor and to tile
it exactly (volumes add up to the tensor, no two overlap), so that a
damaged file cannot leave part of a loaded tensor unwritten.
"""

from __future__ import annotations

import io
import itertools
import math
import os
import pickle
from typing import Any

import torch
from torch.distributed.checkpoint.metadata import Metadata, TensorStorageMetadata

from .._files import read_bytes
from ..errors import (CheckpointNotFoundError, CorruptCheckpointError, InvalidStateError,
                      StorageError)
from .common import one_line

DCP_METADATA = ".metadata"

_ALLOWED: dict[str, set[str]] = {
    "torch.distributed.checkpoint.metadata": {
        "Metadata", "TensorStorageMetadata", "BytesStorageMetadata", "ChunkStorageMetadata",
        "TensorProperties", "MetadataIndex", "StorageMeta", "_MEM_FORMAT_ENCODING"},
    "torch.distributed.checkpoint.filesystem": {"_StorageInfo"},
    # Megatron's torch_dist keeps its save plans in the metadata.
    "torch.distributed.checkpoint.planner": {
        "SavePlan", "WriteItem", "WriteItemType", "TensorWriteData", "BytesIOWriteData",
        "LoadPlan", "ReadItem", "LoadItemType"},
    "torch.serialization": {"_get_layout"},
    "torch": {"Size"},
    "pathlib": {"PosixPath", "PurePosixPath", "Path"},
    "collections": {"OrderedDict"},
}

# Chunk lists up to this long are checked pairwise for overlaps; longer
# ones that are not a grid are checked by volume only.
_PAIRWISE_LIMIT = 2048


class _Refused(Exception):
    pass


class _Unpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if name in _ALLOWED.get(module, ()):
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        raise _Refused(f"{module}.{name}")


def read(path: str, *, unsafe_pickle: bool = False) -> Metadata:
    """The metadata of the DCP checkpoint directory `path`, checked.
    CorruptCheckpointError for an unreadable or inconsistent file,
    InvalidStateError for a global outside DCP's metadata classes (the way
    out: unsafe_pickle=True) or a `.metadata` that is no regular file inside
    `path` (shardsafe._files.open_read), CheckpointNotFoundError for none,
    StorageError for another failed read."""
    file = os.path.join(path, DCP_METADATA)
    try:
        data = read_bytes(file, within=path)
    except FileNotFoundError:
        raise CheckpointNotFoundError(f"{file}: missing", "NOT_FOUND") from None
    except OSError as e:
        raise StorageError(f"{file}: cannot be read: {one_line(e)}", "UNAVAILABLE") from None
    try:
        if unsafe_pickle:
            metadata = pickle.loads(data)
        else:
            metadata = _Unpickler(io.BytesIO(data)).load()
    except _Refused as e:
        raise InvalidStateError(f"{file}: the DCP metadata names {e}, which is not part of "
                                f"DCP's metadata (unsafe_pickle=True unpickles any object: only "
                                f"for checkpoints you trust)") from None
    except ModuleNotFoundError as e:
        raise InvalidStateError(f"{file}: the DCP metadata refers to module {e.name!r}, which is "
                                f"not installed (install the package that wrote it)") from None
    except Exception as e:  # a truncated or foreign pickle
        lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
        raise CorruptCheckpointError(f"{file}: unreadable DCP metadata: {type(e).__name__}: "
                                     f"{lines[0] if lines else ''}", "DATA_LOSS") from None
    if not isinstance(metadata, Metadata):
        raise CorruptCheckpointError(f"{file}: not DCP metadata (a {type(metadata).__name__})",
                                     "DATA_LOSS")
    for key, m in metadata.state_dict_metadata.items():
        if isinstance(m, TensorStorageMetadata):
            _check_tiling(file, key, tuple(m.size), m.chunks)
    return metadata


def _check_tiling(file: str, key: str, shape: tuple[int, ...], chunks: list) -> None:
    boxes = [(tuple(c.offsets), tuple(c.sizes)) for c in chunks]
    for offset, size in boxes:
        if (len(offset) != len(shape) or len(size) != len(shape)
                or any(o < 0 or s < 0 or o + s > n for o, s, n in zip(offset, size, shape))):
            raise CorruptCheckpointError(f"{file}: tensor {key!r} of shape {list(shape)}: chunk "
                                         f"at {list(offset)} of size {list(size)} lies outside it",
                                         "DATA_LOSS")
    volume = sum(math.prod(size) for _, size in boxes)
    if volume != math.prod(shape) or _overlap(boxes):
        raise CorruptCheckpointError(f"{file}: tensor {key!r} of shape {list(shape)}: its "
                                     f"{len(boxes)} chunks do not tile it (elements missing or "
                                     f"stored twice)", "DATA_LOSS")


def _overlap(boxes: list[tuple[tuple[int, ...], tuple[int, ...]]]) -> bool:
    """Whether two non-empty boxes overlap: exactly for a grid (every box a
    cell of the cuts the boxes make) and for short lists, else False."""
    boxes = [b for b in boxes if all(b[1])]
    if len(set(boxes)) != len(boxes):
        return True
    if _is_grid(boxes):
        return False
    if len(boxes) > _PAIRWISE_LIMIT:
        return False
    return any(all(oa < ob + sb and ob < oa + sa for oa, sa, ob, sb in zip(*a, *b))
               for a, b in itertools.combinations(boxes, 2))


def _is_grid(boxes: list[tuple[tuple[int, ...], tuple[int, ...]]]) -> bool:
    """Whether the boxes are distinct cells of one grid: per dimension, each
    box spans one interval between consecutive cuts."""
    if not boxes:
        return True
    for d in range(len(boxes[0][0])):
        cuts = sorted({b[0][d] for b in boxes} | {b[0][d] + b[1][d] for b in boxes})
        nxt = {c: cuts[i + 1] for i, c in enumerate(cuts[:-1])}
        if any(nxt.get(b[0][d]) != b[0][d] + b[1][d] for b in boxes):
            return False
    return True
