"""What a plain tensor or value is, when a rank's state is not the whole story.

A plain tensor under a key is the whole tensor, and every rank that passes
the key must hold the same bytes (the save checks it). Two wrappers say
otherwise, for frameworks that shard without DTensor:

- ``Sharded``: this rank's local tensor is a part of a global tensor: a box
  (offsets + sizes: Megatron / nanotron tensor-parallel shards), a flat
  element range of a box (DeepSpeed ZeRO-1/2 and FSDP1 flat partitions,
  padding included), or several such pieces (a fused QKV shard under GQA).
  Saving writes each part in its place; loading fills each part from any
  saved layout.
- ``PerRank``: a value or tensor (or a structure of them) that differs by
  rank: RNG states, data-loader positions. Each rank saves its own, in the
  same atomic checkpoint, and gets its own back; with ``group=``, one
  value per rank within a group (a DP rank's), checked equal across the
  ranks that share it (docs/format.md §6).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from ._json import (FLOAT_TAG, MAX_NESTING, StoredValueError, from_json, nesting, non_finite,
                    to_json)
from .errors import CorruptCheckpointError, InvalidStateError


@dataclass(frozen=True)
class Part:
    """One piece of a global tensor that a rank holds: `local`, the data
    (shaped `size`, or 1-D with flat[1] - flat[0] elements for a flat range),
    covers box (`offset`, `size`), or the row-major elements [flat[0],
    flat[1]) of that box."""

    local: torch.Tensor
    offset: tuple[int, ...]
    size: tuple[int, ...]
    flat: tuple[int, int] | None = None


def _ints(name: str, v: Any, n: int | None = None) -> tuple[int, ...]:
    try:
        out = tuple(int(x) for x in v)
    except TypeError:
        raise InvalidStateError(f"{name} must be a sequence of ints, got {v!r}") from None
    if n is not None and len(out) != n:
        raise InvalidStateError(f"{name} {out} has {len(out)} dimensions, the tensor {n}")
    if any(x < 0 for x in out):
        raise InvalidStateError(f"{name} {out} has a negative entry")
    return out


class Sharded:
    """A rank's part of a global tensor of shape `shape`, as a framework
    that does not use DTensor knows it.

        # Megatron / nanotron: rows [r * 32, (r + 1) * 32) of a [64, 16] weight
        Sharded(local, shape=(64, 16), offset=(32 * r, 0))
        # DeepSpeed ZeRO-1: elements [22 * r, min(22 * (r + 1), 83)) of a flat
        # fp32 buffer of 83 elements (the last partition is shorter)
        Sharded(partition, shape=(83,), flat=(22 * r, min(22 * (r + 1), 83)))
        # A fused QKV shard under GQA: three row ranges of one [q + 2 kv, h]
        Sharded.pieces((q + 2 * kv, h), [(local[:qr], (q0, 0)),
                                         (local[qr:qr + kr], (q + k0, 0)),
                                         (local[qr + kr:], (q + kv + k0, 0))])

    With `flat`, `local` holds the row-major elements [flat[0], flat[1]) of
    the box (`offset`, `size`), which defaults to the whole tensor; its
    shape does not matter (it is read and written as `local.view(-1)`).
    Otherwise `local` is the box at `offset` of its own shape. Loading fills
    `local` (each piece's tensor) in place. Ranks whose parts of one key are
    equal hold replicas: their bytes must agree.
    """

    def __init__(self, local: torch.Tensor, shape: Sequence[int],
                 offset: Sequence[int] | None = None, *, flat: Sequence[int] | None = None,
                 size: Sequence[int] | None = None):
        self.shape = _ints("shape", shape)
        self.parts = [self._part(local, offset, size, flat)]

    @classmethod
    def pieces(cls, shape: Sequence[int],
               pieces: Sequence[tuple[torch.Tensor, Sequence[int]]]) -> Sharded:
        """Several boxes of one global tensor held by one rank: (tensor,
        offset) pairs, each tensor (usually a view of one local tensor) the
        box at its offset. The boxes must not overlap."""
        if not pieces:
            raise InvalidStateError("Sharded.pieces needs at least one (tensor, offset) piece")
        self = cls.__new__(cls)
        self.shape = _ints("shape", shape)
        self.parts = [self._part(t, off, None, None) for t, off in pieces]
        return self

    def _part(self, local: Any, offset: Any, size: Any, flat: Any) -> Part:
        if not isinstance(local, torch.Tensor):
            raise InvalidStateError(f"Sharded: expected a tensor, got {type(local).__name__}")
        n = len(self.shape)
        if flat is None:
            if size is not None:
                raise InvalidStateError("Sharded: size is given with flat only (the box's size); "
                                        "otherwise it is the local tensor's shape")
            size = _ints("local shape", local.shape, n)
            offset = _ints("offset", offset if offset is not None else (0,) * n, n)
            self._check_box(offset, size)
            return Part(local, offset, size)
        offset = _ints("offset", offset if offset is not None else (0,) * n, n)
        size = _ints("size", size if size is not None else self.shape, n)
        self._check_box(offset, size)
        begin, end = _ints("flat", flat, 2)
        if not begin <= end <= math.prod(size):
            raise InvalidStateError(f"Sharded: flat range {(begin, end)} is not within the "
                                    f"box's {math.prod(size)} elements")
        if local.numel() != end - begin:
            raise InvalidStateError(f"Sharded: flat range {(begin, end)} has {end - begin} "
                                    f"elements, the local tensor {local.numel()}")
        return Part(local, offset, size, (begin, end))

    def _check_box(self, offset: tuple[int, ...], size: tuple[int, ...]) -> None:
        for d, (o, s, g) in enumerate(zip(offset, size, self.shape)):
            if o + s > g:
                raise InvalidStateError(f"Sharded: the box at {offset} of size {size} passes "
                                        f"the end of dimension {d} of shape {self.shape}")

    @property
    def dtype(self) -> torch.dtype:
        return self.parts[0].local.dtype

    def __repr__(self) -> str:
        parts = ", ".join(f"{p.offset}+{p.size}" + (f".flat{p.flat}" if p.flat else "")
                          for p in self.parts)
        return f"Sharded(shape={self.shape}, parts=[{parts}])"


class PerRank:
    """A value that differs by rank, saved for each rank and loaded back by
    each rank: a tensor, a JSON-able value, or a dict / list of them.

        state["rng"] = shardsafe.PerRank({"cpu": torch.get_rng_state(), "seed": seed})
        ...
        shardsafe.load(state, path)
        torch.set_rng_state(state["rng"].value["cpu"])

    Without `group`, values are keyed by rank in the save's and load's
    process group (the global rank by default): rank r gets saved rank r's.
    At another world size, a rank the checkpoint has no value for is a
    KeyMismatchError naming "KEY[rank R]" (load's per_rank_strict=False
    leaves its value as it was and reports the key as missing).

    With `group`, values are keyed by a group rank, so that state owned by
    one data-parallel rank (its data-loader position) follows that DP rank
    through a TP/PP change:

        # Megatron / nanotron: one value per DP rank; its TP/PP peers hold the same
        state["loader"] = shardsafe.PerRank(loader.state_dict(), group=dp_group)

    `group` is a torch.distributed ProcessGroup (the key is
    dist.get_rank(group), this rank's rank in it), an int (the key itself,
    e.g. a DP rank from the framework's parallel state), or a callable
    taking this rank's rank in the save's or load's process group and
    returning the key (an int >= 0). Ranks with one key hold replicas of
    one value: the save checks their encoded bytes as it does a tensor's
    replicas (equal values with their dicts in the same key order are equal
    bytes; a difference is an InvalidStateError naming the tensor
    __shardsafe__/group/G/KEY and two ranks, nothing committed; only
    verify_replicas=False skips it). A load gives
    each rank the value saved under its key at load time, whatever the
    world size; a key with no saved value is a KeyMismatchError naming
    "KEY[group rank R]" (per_rank_strict=False: the rank keeps its own value,
    never another key's). Stored as docs/format.md §6 says; a checkpoint
    saved without `group` loads only into a PerRank without one, and the
    other way round (the error says which).
    """

    def __init__(self, value: Any, group: Any = None):
        self.value = value
        self.group = group

    def __repr__(self) -> str:
        group = "" if self.group is None else f", group={self.group!r}"
        return f"PerRank({self.value!r}{group})"


def group_rank(per_rank: PerRank, key: str, rank: int) -> int | None:
    """The key a PerRank is stored under: None without a group (keyed by
    `rank`, this rank's rank in the save's or load's process group), else
    its group rank as PerRank's doc says; an InvalidStateError naming
    `key` for a group this rank is not in or a rule that gives no int >= 0."""
    group = per_rank.group
    if group is None:
        return None
    if isinstance(group, bool):
        raise InvalidStateError(f"PerRank {key!r}: group must be a ProcessGroup, an int or a "
                                f"callable rank -> int, got a bool")
    if isinstance(group, int):
        g = group
    elif callable(group) and not _is_process_group(group):
        g = group(rank)
    else:
        if not _is_process_group(group):
            raise InvalidStateError(f"PerRank {key!r}: group must be a ProcessGroup, an int or "
                                    f"a callable rank -> int, got {type(group).__name__}")
        g = dist.get_rank(group)
        if g < 0:
            raise InvalidStateError(f"PerRank {key!r}: rank {rank} is not in its group")
    if isinstance(g, bool) or not isinstance(g, int) or g < 0:
        raise InvalidStateError(f"PerRank {key!r}: the group rule gave {g!r} for rank {rank}, "
                                f"not an int >= 0")
    return g


def _is_process_group(x: Any) -> bool:
    return dist.is_available() and isinstance(x, dist.ProcessGroup)


# Tensor names of grouped PerRank values: GROUP_PREFIX + "G/KEY" (docs/format.md §6).
GROUP_PREFIX = "__shardsafe__/group/"


def group_tensor_name(key: str, g: int) -> str:
    return f"{GROUP_PREFIX}{g}/{key}"


def parse_group_tensor_name(name: str) -> tuple[str, int] | None:
    """(KEY, G) of a grouped PerRank tensor's name; None for any other name."""
    if not name.startswith(GROUP_PREFIX):
        return None
    g, _, key = name[len(GROUP_PREFIX):].partition("/")
    if not key or not g.isdigit() or str(int(g)) != g:
        return None
    return key, int(g)


# ------------------------------------------------- per-rank value encoding --

_TENSOR_TAG = "__shardsafe_tensor__"  # {"__shardsafe_tensor__": "t0"}: a tensor of the blob


def encode_per_rank(value: Any, key: str) -> bytes:
    """A PerRank value as its blob: a safetensors file whose tensors are the
    value's tensors and whose `__metadata__["value"]` is the value as JSON,
    each tensor replaced by {"__shardsafe_tensor__": NAME} (docs/format.md §6)."""
    from safetensors.torch import save

    tensors: dict[str, torch.Tensor] = {}

    def strip(v: Any, at: str) -> Any:
        if isinstance(v, torch.Tensor):
            name = f"t{len(tensors)}"
            tensors[name] = v.detach().cpu().contiguous().clone()
            return {_TENSOR_TAG: name}
        if isinstance(v, dict):
            return {k: strip(x, f"{at}.{k}") for k, x in v.items()}
        if isinstance(v, (list, tuple)):
            return [strip(x, f"{at}.{i}") for i, x in enumerate(v)]
        return to_json(v, at)

    stripped = strip(value, key)
    if nesting(stripped) > MAX_NESTING:
        raise InvalidStateError(f"per-rank value {key!r} nests deeper than {MAX_NESTING} lists "
                                f"and dicts, more than a checkpoint holds (docs/format.md §6)")
    doc = json.dumps(stripped, allow_nan=False)
    return save(tensors, metadata={"value": doc})


def decode_per_rank(blob: bytes, like: Any, key: str, path: str, rank: int | str) -> Any:
    """The value of rank `rank`'s per-rank blob (`rank` a str: a grouped
    value's, "group rank G") of `key` in the checkpoint at `path`, shaped
    after `like` (the target's value): a tensor where the target has one
    of the same shape and dtype is filled in place and kept.
    A blob no save writes (docs/format.md §6) is a CorruptCheckpointError
    "PATH: per-rank value KEY (rank R): PROBLEM": not a safetensors file,
    no JSON `value` in its metadata, a tensor tag that names no tensor of
    the blob, a float tag other than the three non-finite floats."""
    def corrupt(problem: str) -> CorruptCheckpointError:
        who = rank if isinstance(rank, str) else f"rank {rank}"
        return CorruptCheckpointError(f"{path}: per-rank value {key!r} ({who}): {problem}",
                                      "DATA_LOSS")

    tensors, doc = _parse_blob(blob, corrupt)

    def restore(stored: Any, like: Any) -> Any:
        if isinstance(stored, dict) and set(stored) == {_TENSOR_TAG}:
            name = stored[_TENSOR_TAG]
            t = tensors.get(name) if isinstance(name, str) else None
            if t is None:
                raise corrupt(f"tensor tag {name!r} names no tensor of the blob (it holds "
                              f"{sorted(tensors) or 'none'})")
            if (isinstance(like, torch.Tensor) and like.shape == t.shape
                    and like.dtype == t.dtype):
                with torch.no_grad():
                    like.copy_(t)
                return like
            return t
        if isinstance(stored, dict) and set(stored) == {FLOAT_TAG}:
            return non_finite(stored[FLOAT_TAG])
        if isinstance(stored, dict):
            likes = like if isinstance(like, dict) else {}
            return {k: restore(v, likes.get(k)) for k, v in stored.items()}
        if isinstance(stored, list):
            likes = like if isinstance(like, (list, tuple)) and len(like) == len(stored) else None
            items = [restore(v, likes[i] if likes is not None else None)
                     for i, v in enumerate(stored)]
            if isinstance(like, tuple) and likes is not None:
                return type(like)(*items) if hasattr(like, "_fields") else type(like)(items)
            return items
        return from_json(stored, like)

    try:
        return restore(doc, like)
    except StoredValueError as e:
        raise corrupt(str(e)) from None
    except RecursionError:
        raise corrupt("its value is nested too deeply") from None


def _parse_blob(blob: bytes, corrupt: Callable[[str], Exception]) -> tuple[dict, Any]:
    """(tensors, value as parsed JSON) of a per-rank blob: a safetensors
    file whose metadata `value` is JSON text; `corrupt(problem)` otherwise."""
    from safetensors.torch import load

    try:
        tensors = load(blob)
    except Exception as e:  # noqa: BLE001 - safetensors' errors have no common base
        raise corrupt(f"not a safetensors blob ({type(e).__name__}: "
                      f"{str(e).splitlines()[0] if str(e) else ''})") from None
    n = int.from_bytes(blob[:8], "little")  # load checked the header: its length, then JSON
    try:
        header = json.loads(blob[8:8 + n])
    except ValueError as e:
        raise corrupt(f"unreadable safetensors header ({e})") from None
    metadata = header.get("__metadata__") if isinstance(header, dict) else None
    text = metadata.get("value") if isinstance(metadata, dict) else None
    if not isinstance(text, str):
        raise corrupt("its safetensors metadata has no 'value'")
    try:
        doc = json.loads(text, parse_constant=_no_constant)
    except (ValueError, RecursionError) as e:
        raise corrupt(f"its 'value' is not JSON ({type(e).__name__}: {e})") from None
    if nesting(doc) > MAX_NESTING:
        raise corrupt(f"its 'value' nests deeper than {MAX_NESTING} lists and dicts")
    return tensors, doc


def _no_constant(name: str) -> Any:
    """json.loads' NaN / Infinity, which are not JSON (a save writes them as
    float tags)."""
    raise ValueError(f"{name} is not JSON")
