"""The part of each global tensor a rank's tensor holds (a box), and what
the engine can take of a tensor as it lies."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from . import _C
from ._state import DTYPE_NAMES, TensorLeaf
from .errors import InvalidStateError


try:
    from torch.distributed.tensor import DTensor, Replicate, Shard
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset
except ImportError:  # torch without distributed support
    DTensor = None


@dataclass
class Box:
    local: torch.Tensor  # the tensor holding this rank's part
    shape: tuple[int, ...]  # global
    offset: tuple[int, ...]
    size: tuple[int, ...]


class Boxes:
    """The part of the global tensor that each tensor holds on this rank, for
    the tensors of one call. A DTensor's box is a function of its global
    shape, mesh and placements, computed once per combination (torch's
    compute_local_shape_and_global_offset costs ~30 us a call, most of a
    DTensor's planning; a model repeats a few shapes)."""

    def __init__(self) -> None:
        self._seen: dict[tuple, tuple[tuple, tuple]] = {}

    def __call__(self, key: str, t: torch.Tensor) -> Box:
        if DTensor is None or not isinstance(t, DTensor):
            shape = tuple(t.shape)
            return Box(t, shape, (0,) * len(shape), shape)
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
        return Box(local, tuple(t.shape), offset, size)


# What the per-tensor fast paths (_C.ask_tensors, then _C.plan_whole or
# _C.plan_save_whole) take:
# tensors of these types (subclasses, DTensor among them, take the general
# paths), of this layout, of these dtypes.
PLAIN = ((torch.Tensor, torch.nn.Parameter), torch.strided, DTYPE_NAMES)


def in_place(t: torch.Tensor) -> bool:
    """The engine can read or write `t`'s bytes where they lie."""
    return t.is_cpu and t.is_contiguous() and not t.is_neg() and not t.is_conj()


def dtype_name(key: str, t: torch.Tensor) -> str:
    name = DTYPE_NAMES.get(t.dtype)
    if name is None:
        raise InvalidStateError(f"tensor {key!r}: dtype {t.dtype} cannot be stored in safetensors")
    if t.is_sparse or t.layout != torch.strided:
        raise InvalidStateError(f"tensor {key!r}: layout {t.layout} is not supported; "
                                f"convert it to a dense tensor")
    return name


def ask(leaves: list[TensorLeaf]) -> _C.AskedTensors:
    """What the fast paths need of each tensor, asked by the extension
    (~1 us a tensor, most of it the first touch of its objects)."""
    return _C.ask_tensors([leaf.key for leaf in leaves], [leaf.tensor for leaf in leaves],
                          *PLAIN)


