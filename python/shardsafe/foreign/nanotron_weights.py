"""nanotron weight files read as global tensors: file names, slice
metadata, tiling and reads (the weights part of shardsafe.foreign.nanotron, whose
module doc describes the whole format).

Each weight file holds one tensor "data", the local shard (Mamba
parameters add a scalar "_no_weight_decay"). A shard file's safetensors
metadata holds "local_global_slices_pairs" (pairs `local#global` joined by
";", per-dim slices joined by "|", a slice "start,stop,step" with "None")
and "unsharded_shape" (a Python tuple repr, items possibly `np.int64(N)`);
an unsharded parameter's file has no such metadata and is the whole tensor.
A parameter's name is the file's directory path under model/ joined by "."
plus the leaf (e.g. `model.decoder.0.pp_block.attn.qkv_proj.weight`).
plan_weight checks that the slices tile the global tensor exactly: a
missing shard file (CheckpointNotFoundError naming it), a slice outside the
shape, two files claiming one region or a gap (CorruptCheckpointError
naming the file and the key) is an error, never a guess. read_weight reads
one box, only from the shard files (and bytes) that overlap it. Files named
with nanotron's duplicated-prefix bug (`model_model_weight.safetensors_pp-...`,
repaired by nanotron's scripts/fix_checkpoint_bad_naming.py) are read under
their repaired name. Expert-parallel shards (an exp-rank suffix) are placed
by their slice metadata like any other; shards of different exp-ranks
claiming one region are refused (their metadata describes the
tensor-parallel split only, not which experts a rank holds).

Each weight file is opened checked (shardsafe._files: a regular file
inside the checkpoint directory) and safetensors reads that descriptor.
The safetensors package reads the files: safetensors_module() imports it,
or raises an ImportError saying how to install it (a checkpoint's opening
calls it; detection does not need the package).
"""

from __future__ import annotations

import contextlib
import math
import os
import re
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Optional

import torch

from .._files import FileRefusedError, fd_path, open_read
from ..errors import (CheckpointNotFoundError, CorruptCheckpointError, InvalidStateError,
                      StorageError)
from .common import one_line

CHECKPOINT_FILE = "checkpoint_metadata.json"

Box = tuple[tuple[int, int], ...]  # per dim [start, stop)

_SAFETENSORS_DTYPES: dict[str, torch.dtype] = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8,
    "U64": torch.uint64, "U32": torch.uint32, "U16": torch.uint16, "U8": torch.uint8,
    "BOOL": torch.bool, "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2,
}
_RANKS = (r"_pp-rank-(?P<pp>\d+)-of-(?P<npp>\d+)_tp-rank-(?P<tp>\d+)-of-(?P<ntp>\d+)"
          r"(?:_exp-rank-(?P<ep>\d+)-of-(?P<nep>\d+))?")
_WEIGHT_NAME = re.compile(rf"model_(?P<leaf>.+?)(?:{_RANKS})?\.safetensors")
_BAD_LEAF = re.compile(r"model_(?P<leaf>[^.]+)\.safetensors")  # the duplicated-prefix names
_SHAPE_ITEM = re.compile(r"\s*(?:np\.u?int\d*\((\d+)\)|(\d+))\s*")
_WEIGHT_EXTRAS = {"_no_weight_decay"}


def safetensors_module() -> ModuleType:
    """The safetensors package, imported on first use (detecting a nanotron
    checkpoint does not need it)."""
    try:
        import safetensors
    except ImportError:
        raise ImportError("reading a nanotron checkpoint needs the safetensors package "
                          "(pip install safetensors)") from None
    return safetensors


def corrupt(where: str, problem: str) -> CorruptCheckpointError:
    return CorruptCheckpointError(f"{where}: {problem}", "DATA_LOSS")


def _unreadable(path: str, key: str, e: OSError) -> Exception:
    """A failed open or read of a weight file, as the shardsafe error."""
    if isinstance(e, FileNotFoundError):
        return CheckpointNotFoundError(f"{path}: tensor {key!r}: shard file vanished", "NOT_FOUND")
    return StorageError(f"{path}: tensor {key!r}: cannot be read: {one_line(e)}", "UNAVAILABLE")


# ------------------------------------------------------------- layout --

@dataclass(frozen=True)
class Rank:
    """The parallel ranks in a shard file's name (ep None: no exp suffix)."""
    pp: int
    npp: int
    tp: int
    ntp: int
    ep: Optional[int] = None
    nep: Optional[int] = None

    def suffix(self) -> str:
        s = f"_pp-rank-{self.pp}-of-{self.npp}_tp-rank-{self.tp}-of-{self.ntp}"
        return s + (f"_exp-rank-{self.ep}-of-{self.nep}" if self.ep is not None else "")


@dataclass(frozen=True)
class WeightFile:
    path: str
    rank: Optional[Rank]  # None: an unsharded parameter's only file


@dataclass
class Piece:
    """One shard file of a tensor and where its local slices go."""
    path: str
    rank: Optional[Rank]
    local_shape: tuple[int, ...]
    pairs: list[tuple[Box, Box]]  # (local box, global box)


@dataclass
class Plan:
    key: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    pieces: list[Piece]
    no_weight_decay_file: Optional[str] = None



def _int(m: re.Match, group: str) -> Optional[int]:
    v = m.group(group)
    return None if v is None else int(v)


def _parse_weight_name(directory: str, name: str) -> tuple[str, Optional[Rank]]:
    """(leaf, rank) of a weight file name; CorruptCheckpointError if it is
    not one nanotron writes."""
    where = os.path.join(directory, name)
    m = _WEIGHT_NAME.fullmatch(name)
    leaf = m.group("leaf") if m else ""
    if m and "." in leaf:
        bad = _BAD_LEAF.fullmatch(leaf)
        leaf = bad.group("leaf") if bad else ""
    if not m or not leaf:
        raise corrupt(where, "not a nanotron weight file name "
                              "(model_<name>[_pp-rank-P-of-N_tp-rank-T-of-N].safetensors)")
    if m.group("pp") is None:
        return leaf, None
    r = Rank(*(_int(m, g) for g in ("pp", "npp", "tp", "ntp", "ep", "nep")))
    if r.pp >= r.npp or r.tp >= r.ntp or (r.ep is not None and r.ep >= r.nep):
        raise corrupt(where, "a rank in the file name is out of range")
    return leaf, r


def scan_weights(model_dir: str) -> dict[str, list[WeightFile]]:
    """Parameter name -> its weight files, from the file names only."""
    found: dict[str, list[WeightFile]] = {}
    for directory, dirs, files in os.walk(model_dir):
        dirs.sort()
        prefix = os.path.relpath(directory, model_dir).replace(os.sep, ".")
        for name in sorted(files):
            if not name.endswith(".safetensors"):
                continue
            leaf, rank = _parse_weight_name(directory, name)
            key = leaf if prefix == "." else f"{prefix}.{leaf}"
            found.setdefault(key, []).append(WeightFile(os.path.join(directory, name), rank))
    return found


def _check_file_set(key: str, files: list[WeightFile], meta_tp: Optional[int]) -> None:
    """The files of `key` are one complete set of one layout:
    CheckpointNotFoundError naming a missing shard file, CorruptCheckpointError
    for a mixed set."""
    plain = [f.path for f in files if f.rank is None]
    ranked = [f for f in files if f.rank is not None]
    if len(plain) > 1 or (plain and ranked):
        other = plain[1] if len(plain) > 1 else ranked[0].path
        raise corrupt(plain[0], f"tensor {key!r} is also in {other} "
                                 f"(two files claim the whole tensor)")
    if not ranked:
        return
    sizes = {(f.rank.npp, f.rank.ntp, f.rank.nep) for f in ranked}
    if len(sizes) > 1:
        raise corrupt(ranked[0].path, f"shard files of {key!r} name different parallel sizes "
                                       f"{sorted(sizes, key=str)} (files of two layouts)")
    ntp = ranked[0].rank.ntp
    if meta_tp is not None and ntp != meta_tp:
        raise corrupt(ranked[0].path, f"tensor {key!r}: the file name says tp size {ntp} but "
                                       f"{CHECKPOINT_FILE} says tp={meta_tp}")
    twice = [r for r, n in Counter(f.rank for f in ranked).items() if n > 1]
    if twice:
        a, b = [f.path for f in ranked if f.rank == twice[0]][:2]
        raise corrupt(a, f"tensor {key!r}: shard {twice[0].suffix()[1:]} is also in {b}")
    _check_complete(key, ranked)


def _check_complete(key: str, ranked: list[WeightFile]) -> None:
    """Every (tp, exp) rank of the shards' pipeline stage has its file
    (checked when all shards are on one stage, as nanotron writes them; the
    slice tiling check finds any other gap)."""
    first = ranked[0].rank
    if len({f.rank.pp for f in ranked}) != 1:
        return
    eps = range(first.nep) if first.nep is not None else [None]
    present = {(f.rank.tp, f.rank.ep) for f in ranked}
    for tp in range(first.ntp):
        for ep in eps:
            if (tp, ep) in present:
                continue
            want = Rank(first.pp, first.npp, tp, first.ntp, ep, first.nep)
            name = os.path.basename(ranked[0].path)
            name = name[: name.index("_pp-rank-")] + want.suffix() + ".safetensors"
            missing = os.path.join(os.path.dirname(ranked[0].path), name)
            raise CheckpointNotFoundError(
                f"{missing}: missing shard file of tensor {key!r} "
                f"({len(present)} of {first.ntp * len(eps)} shard files present)", "NOT_FOUND")




# ---------------------------------------------------- slice metadata --

def _parse_slice(text: str, size: int, where: str) -> tuple[int, int]:
    parts = text.split(",")
    try:
        if len(parts) != 3:
            raise ValueError
        start, stop, step = (None if p.strip() == "None" else int(p) for p in parts)
    except ValueError:
        raise corrupt(where, f"bad slice {text!r} (start,stop,step)") from None
    if step not in (None, 1):
        raise corrupt(where, f"slice {text!r} has step {step}; only contiguous slices are read")
    start = 0 if start is None else start
    stop = size if stop is None else stop
    if not 0 <= start <= stop <= size:
        raise corrupt(where, f"slice {text!r} is outside the dimension of size {size}")
    return start, stop


def _parse_box(text: str, shape: tuple[int, ...], where: str) -> Box:
    parts = text.split("|") if shape else []
    if len(parts) != len(shape):
        raise corrupt(where, f"slices {text!r} have {len(parts)} dims, the tensor "
                              f"{list(shape)} has {len(shape)}")
    return tuple(_parse_slice(p, n, where) for p, n in zip(parts, shape))


def _parse_shape(text: str, where: str) -> tuple[int, ...]:
    """nanotron writes `str(tuple(shape))`: "(4096, 512)", "(8,)", items
    possibly `np.int64(N)`."""
    t = text.strip()
    if not (t.startswith("(") and t.endswith(")")):
        raise corrupt(where, f"bad unsharded_shape {text!r}")
    items = t[1:-1].split(",")
    if items and not items[-1].strip():
        items = items[:-1]
    dims = []
    for item in items:
        m = _SHAPE_ITEM.fullmatch(item)
        if not m:
            raise corrupt(where, f"bad unsharded_shape {text!r}")
        dims.append(int(m.group(1) or m.group(2)))
    return tuple(dims)


def _parse_pairs(text: str, local: tuple[int, ...], shape: tuple[int, ...],
                 where: str) -> list[tuple[Box, Box]]:
    pairs = []
    for pair in text.split(";"):
        sides = pair.split("#")
        if len(sides) != 2:
            raise corrupt(where, f"bad local_global_slices_pairs item {pair!r} (local#global)")
        lbox, gbox = _parse_box(sides[0], local, where), _parse_box(sides[1], shape, where)
        if _extent(lbox) != _extent(gbox):
            raise corrupt(where, f"local slices {sides[0]!r} ({_extent(lbox)}) and global slices "
                                  f"{sides[1]!r} ({_extent(gbox)}) differ in shape")
        pairs.append((lbox, gbox))
    return pairs


# ---------------------------------------------------------- boxes --

def _extent(box: Box) -> list[int]:
    return [b - a for a, b in box]


def _volume(box: Box) -> int:
    return math.prod(_extent(box))


def _full(shape) -> Box:
    return tuple((0, n) for n in shape)


def _intersect(a: Box, b: Box) -> Optional[Box]:
    box = tuple((max(x0, y0), min(x1, y1)) for (x0, x1), (y0, y1) in zip(a, b))
    return box if all(s < e for s, e in box) else None


def _shift(box: Box, frm: Box, to: Box) -> Box:
    """`box` (inside `frm`) moved to the same place relative to `to`."""
    return tuple((a - f0 + t0, b - f0 + t0) for (a, b), (f0, _), (t0, _) in zip(box, frm, to))


def box_index(box: Box) -> tuple[slice, ...]:
    return tuple(slice(a, b) for a, b in box)


def _fmt(box: Box) -> str:
    return "[" + ", ".join(f"{a}:{b}" for a, b in box) + "]"


def _first_overlap(boxes: list[Box]) -> Optional[tuple[int, int]]:
    """Indices of two overlapping non-empty boxes, or None (a sweep along
    the first dimension: disjoint shards cost about k log k)."""
    def lo(i: int) -> int:
        return boxes[i][0][0] if boxes[i] else 0

    def hi(i: int) -> int:
        return boxes[i][0][1] if boxes[i] else 1

    active: list[int] = []
    for i in sorted((i for i in range(len(boxes)) if _volume(boxes[i])), key=lo):
        active = [j for j in active if hi(j) > lo(i)]
        for j in active:
            if _intersect(boxes[j], boxes[i]) is not None:
                return j, i
        active.append(i)
    return None


def hits(piece: Piece, box: Box) -> list[tuple[Box, Box]]:
    """(box in the shard, box in the output) of every slice pair of `piece`
    that overlaps `box`, the output's place in the global tensor."""
    out = []
    for lb, gb in piece.pairs:
        hit = _intersect(gb, box) if box else None
        if hit is not None:
            out.append((_shift(hit, gb, lb), _shift(hit, box, _full(_extent(box)))))
    return out


def _check_tiling(key: str, pieces: list[Piece], shape: tuple[int, ...]) -> None:
    """The pieces' global boxes cover `shape` exactly once, and each piece's
    local boxes cover its stored shard exactly once."""
    for p in pieces:
        local = [lb for lb, _ in p.pairs]
        if _first_overlap(local) or sum(map(_volume, local)) != math.prod(p.local_shape):
            raise corrupt(p.path, f"tensor {key!r}: its local slices do not cover the stored "
                                   f"shard {list(p.local_shape)} exactly once")
    owners = [(p, gb) for p in pieces for _, gb in p.pairs]
    hit = _first_overlap([gb for _, gb in owners])
    if hit:
        (a, ga), (b, gb) = owners[hit[0]], owners[hit[1]]
        region = _fmt(_intersect(ga, gb))
        if a.path == b.path:
            raise corrupt(a.path, f"tensor {key!r}: two of its slice pairs claim region {region}")
        why = ""
        if a.rank and b.rank and a.rank.ep != b.rank.ep:
            why = (" (expert-parallel shards whose metadata does not say which experts each "
                   "exp-rank holds; not placed by guess)")
        raise corrupt(b.path, f"tensor {key!r}: region {region} is also claimed by {a.path}{why}")
    covered, numel = sum(_volume(gb) for _, gb in owners), math.prod(shape)
    if covered != numel:
        raise corrupt(pieces[0].path,
                       f"tensor {key!r}: its {len(pieces)} shard file(s) cover {covered} of the "
                       f"{numel} elements of {list(shape)} (a shard file is missing or its slice "
                       f"metadata is wrong)")


# ----------------------------------------------------- weight plans --

def plan_weight(key: str, files: list[WeightFile], meta_tp: Optional[int], within: str) -> Plan:
    """The plan of tensor `key` from its weight files, which lie in the
    checkpoint directory `within`."""
    _check_file_set(key, files, meta_tp)
    pieces, dtypes, shapes, nwd = [], set(), set(), None
    for wf in files:
        dtype, local, meta, extras = _read_header(wf.path, key, within)
        where = f"{wf.path}: tensor {key!r}"
        pairs_text = meta.get("local_global_slices_pairs")
        shape_text = meta.get("unsharded_shape")
        if (pairs_text is None) != (shape_text is None):
            raise corrupt(where, "the metadata has only one of local_global_slices_pairs and "
                                  "unsharded_shape")
        if pairs_text is None:
            if wf.rank is not None:
                raise corrupt(where, "a shard file without local_global_slices_pairs metadata")
            shape, pairs = local, [(_full(local), _full(local))]
        else:
            shape = _parse_shape(shape_text, where)
            pairs = _parse_pairs(pairs_text, local, shape, where)
        pieces.append(Piece(wf.path, wf.rank, local, pairs))
        dtypes.add(dtype)
        shapes.add(shape)
        if "_no_weight_decay" in extras and nwd is None:
            nwd = wf.path
    if len(dtypes) > 1 or len(shapes) > 1:
        what = (f"dtypes {sorted(map(str, dtypes))}" if len(dtypes) > 1
                else f"unsharded shapes {sorted(shapes)}")
        raise corrupt(files[0].path, f"shard files of tensor {key!r} disagree: {what}")
    shape = shapes.pop()
    _check_tiling(key, pieces, shape)
    return Plan(key, dtypes.pop(), shape, pieces, nwd)


@contextlib.contextmanager
def _safe_open(path: str, key: str, within: str) -> Iterator[Any]:
    """safetensors.safe_open of the weight file `path`, opened checked
    (shardsafe._files: a regular file inside `within`; safe_open, which
    takes a path only, opens that descriptor through /proc/self/fd). A
    file refused is an InvalidStateError naming the file and the key."""
    st = safetensors_module()
    try:
        checked = open_read(path, within=within)
    except FileRefusedError as e:
        raise InvalidStateError(f"{path}: tensor {key!r}: {e.problem}", e.code) from None
    with checked, st.safe_open(fd_path(checked), framework="pt") as f:
        yield f


def _read_header(path: str, key: str,
                 within: str) -> tuple[torch.dtype, tuple[int, ...], dict, set[str]]:
    """(dtype, shape of "data", string metadata, the other tensors' names)."""
    st = safetensors_module()
    try:
        with _safe_open(path, key, within) as f:
            names = set(f.keys())
            meta = f.metadata() or {}
            if "data" not in names:
                raise corrupt(path, f"tensor {key!r}: no tensor 'data' in the file")
            sl = f.get_slice("data")
            dtype_name, local = sl.get_dtype(), tuple(sl.get_shape())
    except OSError as e:
        raise _unreadable(path, key, e) from None
    except st.SafetensorError as e:  # a damaged header
        raise corrupt(path, f"tensor {key!r}: unreadable safetensors file: {one_line(e)}") from None
    extras = names - {"data"}
    if extras - _WEIGHT_EXTRAS:
        raise corrupt(path, f"tensor {key!r}: unexpected tensors "
                             f"{sorted(extras - _WEIGHT_EXTRAS)}")
    dtype = _SAFETENSORS_DTYPES.get(dtype_name)
    if dtype is None:
        raise corrupt(path, f"tensor {key!r}: unsupported dtype {dtype_name}")
    return dtype, local, meta, extras


def read_tensor(path: str, key: str, within: str, name: str = "data") -> torch.Tensor:
    """Tensor `name` of a weight file (in the checkpoint directory
    `within`), whole."""
    st = safetensors_module()
    try:
        with _safe_open(path, key, within) as f:
            return f.get_tensor(name)
    except OSError as e:
        raise _unreadable(path, key, e) from None
    except st.SafetensorError as e:
        raise corrupt(path, f"tensor {key!r}: unreadable: {one_line(e)}") from None


def read_weight(plan: Plan, box: Box, out: torch.Tensor, within: str) -> None:
    """Box `box` of the planned tensor into `out`, reading only the shard
    files (in the checkpoint directory `within`; and, through safetensors
    slices, the bytes) that overlap it."""
    st = safetensors_module()
    for piece in plan.pieces:
        found = hits(piece, box)
        if not found and box:
            continue
        try:
            with _safe_open(piece.path, plan.key, within) as f:
                sl = f.get_slice("data")
                if tuple(sl.get_shape()) != piece.local_shape:
                    raise corrupt(piece.path, f"tensor {plan.key!r}: the shard changed since "
                                               f"it was listed")
                if not box:  # a 0-dim tensor
                    out.copy_(f.get_tensor("data"))
                for src, dst in found:
                    out[box_index(dst)] = sl[box_index(src)]
        except OSError as e:
            raise _unreadable(piece.path, plan.key, e) from None
        except st.SafetensorError as e:
            raise corrupt(piece.path, f"tensor {plan.key!r}: unreadable: {one_line(e)}") from None


