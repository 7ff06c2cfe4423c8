"""nanotron checkpoints, read as global tensors (a ForeignCheckpoint of
shardsafe._foreign).

Layout (huggingface/nanotron `src/nanotron/serialize/`: weights.py,
utils.py get_path, metadata.py, optimizer.py, random.py, main.py):

    <root>/latest.txt            "<step>" (optional: the root then means <root>/<step>)
    <root>/<step>/
      checkpoint_metadata.json   {"version", "tp", "dp", ["cp"], "metas", ["custom_metas"]}
      model_config.json, config.yaml
      model/<name parts as dirs>/model_<leaf>.safetensors          an unsharded parameter
      model/<...>/model_<leaf>_pp-rank-P-of-PP_tp-rank-T-of-TT[_exp-rank-E-of-EE].safetensors
      optimizer/optimizer_config.json
      optimizer/optimizer_pp-P-of-PP[_dp-D-of-DD]_tp-T-of-TT[_exp-E-of-EE].pt  (dp: ZeRO-1)
      lr_scheduler/lr_scheduler.pt
      random/tp-T-of-TT_dp-D-of-DD_pp-P-of-PP.pt

Weights. Each weight file holds one tensor "data", the local shard (Mamba
parameters add a scalar "_no_weight_decay"). A shard file's safetensors
metadata holds "local_global_slices_pairs" (pairs `local#global` joined by
";", per-dim slices joined by "|", a slice "start,stop,step" with "None")
and "unsharded_shape" (a Python tuple repr, items possibly `np.int64(N)`);
an unsharded parameter's file has no such metadata and is the whole tensor.
`tensors()` lists every parameter under its nanotron name (the file's
directory path joined by "." plus the leaf, e.g.
`model.decoder.0.pp_block.attn.qkv_proj.weight`) with the unsharded shape;
`read(key)` places every shard file's local slices at their global slices.
The slices must tile the global tensor exactly: a missing shard file, a
slice outside the shape, two files claiming one region or a gap is an error
naming the file and the key, never a guess. `read_box` reads one box, only
from the shard files (and bytes) that overlap it. Files named with
nanotron's duplicated-prefix bug (`model_model_weight.safetensors_pp-...`,
repaired by nanotron's scripts/fix_checkpoint_bad_naming.py) are read under
their repaired name. Checkpoint versions are not gated (1.2 to 1.5 share
this layout); values() carries the version.

Tied parameters. nanotron saves a tied group once, under the group's name
(e.g. the token embedding for a tied `lm_head`); the checkpoint does not
record the other names (nanotron's model code rebuilds the ties), so the
tensor is listed once, under the saved name: load it into an alias with a
rename.

Expert parallelism. Shard files with an exp-rank suffix are placed by their
slice metadata like any other; if shards of different exp-ranks claim one
region (their metadata describes the tensor-parallel split only, not which
experts a rank holds), the checkpoint is refused.

Optimizer state. nanotron's optimizer files are torch.save pickles of its
NamedOptimizer state dict: "state" {index: {"exp_avg", ...}} with "names"
{index: parameter name}, and, with fp32 gradient accumulation, the fp32
master weights under "gradient_accumulator" {name: tensor}. A file's states
are the local shards of the process with its (pp, tp, exp) ranks, shaped
like that process's weight shard, whose slice metadata places them. They
are listed as global tensors `optimizer.state.<name>.<state>` and
`optimizer.gradient_accumulator.<name>`. ZeRO-1 files (with a dp rank) hold
contiguous flat pieces of each local shard in dp-rank order (nanotron
optim/zero.py _partition_parameters); they are joined in that order,
checked against optimizer_config.json's `param_name_to_dp_rank_offsets`
where it lists the parameter, and against the shard's size. Copies of one
shard held by several processes (a tied parameter on several pipeline
stages, an unsharded one on every TP rank, a non-expert one on every
exp-rank) must be bit-identical. State that cannot be placed with certainty
(no "names", a pickle weights_only refuses, a state with no matching weight
shard) is not listed: values() names it under nanotron.not_imported and a
warning says so.

values(): {"step", "consumed_train_samples" (checkpoint_metadata.json's
metas), "optimizer": {"type", "parallelism", "param_groups", "step"},
"lr_scheduler": its state dict, "nanotron": {"checkpoint_metadata",
"model_config", "config_yaml", "no_weight_decay" {name: bool},
"tied_parameters" (the note above), "not_imported" {file or key: reason}}}.
Random states (pickles of nanotron.random.RandomStates, restorable only
into the same topology) are not read; they are listed under not_imported.
Pickles are read with torch.load(weights_only=True, mmap=True) unless
unsafe_pickle=True; the safetensors package reads the weight files.
"""

from __future__ import annotations

import json
import math
import os
import pickle
import re
import warnings
from dataclasses import dataclass, field
from typing import Any, Optional

import torch

from ._foreign import Format
from .errors import CheckpointNotFoundError, CorruptCheckpointError, InvalidStateError


def _safe_open(path: str, **kwargs: Any):
    """safetensors.safe_open, imported only when a nanotron checkpoint is read
    (detection must not need the package)."""
    from safetensors import safe_open
    return safe_open(path, **kwargs)


CHECKPOINT_FILE = "checkpoint_metadata.json"
OPTIMIZER_PREFIX = "optimizer."
TIED_NOTE = ("a tied parameter is saved once, under its tie group's name; its other names are "
             "not recorded in the checkpoint (load it into them with a rename)")
RANDOM_NOTE = ("per-rank RNG state pickled as nanotron.random.RandomStates (restorable only "
               "into the same topology, by nanotron); not read")

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
_OPTIMIZER_NAME = re.compile(
    r"optimizer_pp-(?P<pp>\d+)-of-(?P<npp>\d+)(?:_dp-(?P<dp>\d+)-of-(?P<ndp>\d+))?"
    r"_tp-(?P<tp>\d+)-of-(?P<ntp>\d+)(?:_exp-(?P<ep>\d+)-of-(?P<nep>\d+))?\.pt")
_SHAPE_ITEM = re.compile(r"\s*(?:np\.u?int\d*\((\d+)\)|(\d+))\s*")
_WEIGHT_EXTRAS = {"_no_weight_decay"}


def _corrupt(where: str, problem: str) -> CorruptCheckpointError:
    return CorruptCheckpointError(f"{where}: {problem}")


def _one_line(e: BaseException) -> str:
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    return f"{type(e).__name__}: {lines[0] if lines else ''}"


# ------------------------------------------------------------- layout --

@dataclass(frozen=True)
class _Rank:
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
class _WeightFile:
    path: str
    rank: Optional[_Rank]  # None: an unsharded parameter's only file


@dataclass
class _Piece:
    """One shard file of a tensor and where its local slices go."""
    path: str
    rank: Optional[_Rank]
    local_shape: tuple[int, ...]
    pairs: list[tuple[Box, Box]]  # (local box, global box)


@dataclass
class _Plan:
    key: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    pieces: list[_Piece]
    no_weight_decay_file: Optional[str] = None


def resolve(path: str | os.PathLike) -> Optional[str]:
    """The checkpoint directory `path` names (itself, or the step its
    latest.txt names), or None if it is not a nanotron checkpoint."""
    path = os.fspath(path)
    if _is_step_dir(path):
        return path
    latest = os.path.join(path, "latest.txt")
    if not os.path.isfile(latest):
        return None
    try:
        with open(latest, encoding="utf-8") as f:
            step = f.read().strip()
    except (OSError, UnicodeDecodeError):
        return None
    step_dir = os.path.join(path, step)
    return step_dir if step.isdigit() and _is_step_dir(step_dir) else None


def _is_step_dir(path: str) -> bool:
    return (os.path.isfile(os.path.join(path, CHECKPOINT_FILE))
            and os.path.isdir(os.path.join(path, "model")))


def detect(path: str) -> bool:
    return resolve(path) is not None


def _int(m: re.Match, group: str) -> Optional[int]:
    v = m.group(group)
    return None if v is None else int(v)


def _parse_weight_name(directory: str, name: str) -> tuple[str, Optional[_Rank]]:
    """(leaf, rank) of a weight file name; CorruptCheckpointError if it is
    not one nanotron writes."""
    where = os.path.join(directory, name)
    m = _WEIGHT_NAME.fullmatch(name)
    leaf = m.group("leaf") if m else ""
    if m and "." in leaf:
        bad = _BAD_LEAF.fullmatch(leaf)
        leaf = bad.group("leaf") if bad else ""
    if not m or not leaf:
        raise _corrupt(where, "not a nanotron weight file name "
                              "(model_<name>[_pp-rank-P-of-N_tp-rank-T-of-N].safetensors)")
    if m.group("pp") is None:
        return leaf, None
    r = _Rank(*(_int(m, g) for g in ("pp", "npp", "tp", "ntp", "ep", "nep")))
    if r.pp >= r.npp or r.tp >= r.ntp or (r.ep is not None and r.ep >= r.nep):
        raise _corrupt(where, "a rank in the file name is out of range")
    return leaf, r


def _scan_weights(model_dir: str) -> dict[str, list[_WeightFile]]:
    """Parameter name -> its weight files, from the file names only."""
    found: dict[str, list[_WeightFile]] = {}
    for directory, dirs, files in os.walk(model_dir):
        dirs.sort()
        prefix = os.path.relpath(directory, model_dir).replace(os.sep, ".")
        for name in sorted(files):
            if not name.endswith(".safetensors"):
                continue
            leaf, rank = _parse_weight_name(directory, name)
            key = leaf if prefix == "." else f"{prefix}.{leaf}"
            found.setdefault(key, []).append(_WeightFile(os.path.join(directory, name), rank))
    return found


def _check_file_set(key: str, files: list[_WeightFile], meta_tp: Optional[int]) -> None:
    """The files of `key` are one complete set of one layout:
    CheckpointNotFoundError naming a missing shard file, CorruptCheckpointError
    for a mixed set."""
    plain = [f.path for f in files if f.rank is None]
    ranked = [f for f in files if f.rank is not None]
    if len(plain) > 1 or (plain and ranked):
        other = plain[1] if len(plain) > 1 else ranked[0].path
        raise _corrupt(plain[0], f"tensor {key!r} is also in {other} "
                                 f"(two files claim the whole tensor)")
    if not ranked:
        return
    sizes = {(f.rank.npp, f.rank.ntp, f.rank.nep) for f in ranked}
    if len(sizes) > 1:
        raise _corrupt(ranked[0].path, f"shard files of {key!r} name different parallel sizes "
                                       f"{sorted(sizes, key=str)} (files of two layouts)")
    ntp = ranked[0].rank.ntp
    if meta_tp is not None and ntp != meta_tp:
        raise _corrupt(ranked[0].path, f"tensor {key!r}: the file name says tp size {ntp} but "
                                       f"{CHECKPOINT_FILE} says tp={meta_tp}")
    ranks = [f.rank for f in ranked]
    for r in ranks:
        if ranks.count(r) > 1:
            a, b = [f.path for f in ranked if f.rank == r][:2]
            raise _corrupt(a, f"tensor {key!r}: shard {r.suffix()[1:]} is also in {b}")
    _check_complete(key, ranked)


def _check_complete(key: str, ranked: list[_WeightFile]) -> None:
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
            want = _Rank(first.pp, first.npp, tp, first.ntp, ep, first.nep)
            name = os.path.basename(ranked[0].path)
            name = name[: name.index("_pp-rank-")] + want.suffix() + ".safetensors"
            missing = os.path.join(os.path.dirname(ranked[0].path), name)
            raise CheckpointNotFoundError(
                f"{missing}: missing shard file of tensor {key!r} "
                f"({len(present)} of {first.ntp * len(eps)} shard files present)")


# ---------------------------------------------------- slice metadata --

def _parse_slice(text: str, size: int, where: str) -> tuple[int, int]:
    parts = text.split(",")
    try:
        if len(parts) != 3:
            raise ValueError
        start, stop, step = (None if p.strip() == "None" else int(p) for p in parts)
    except ValueError:
        raise _corrupt(where, f"bad slice {text!r} (start,stop,step)") from None
    if step not in (None, 1):
        raise _corrupt(where, f"slice {text!r} has step {step}; only contiguous slices are read")
    start = 0 if start is None else start
    stop = size if stop is None else stop
    if not 0 <= start <= stop <= size:
        raise _corrupt(where, f"slice {text!r} is outside the dimension of size {size}")
    return start, stop


def _parse_box(text: str, shape: tuple[int, ...], where: str) -> Box:
    parts = text.split("|") if shape else []
    if len(parts) != len(shape):
        raise _corrupt(where, f"slices {text!r} have {len(parts)} dims, the tensor "
                              f"{list(shape)} has {len(shape)}")
    return tuple(_parse_slice(p, n, where) for p, n in zip(parts, shape))


def _parse_shape(text: str, where: str) -> tuple[int, ...]:
    """nanotron writes `str(tuple(shape))`: "(4096, 512)", "(8,)", items
    possibly `np.int64(N)`."""
    t = text.strip()
    if not (t.startswith("(") and t.endswith(")")):
        raise _corrupt(where, f"bad unsharded_shape {text!r}")
    items = t[1:-1].split(",")
    if items and not items[-1].strip():
        items = items[:-1]
    dims = []
    for item in items:
        m = _SHAPE_ITEM.fullmatch(item)
        if not m:
            raise _corrupt(where, f"bad unsharded_shape {text!r}")
        dims.append(int(m.group(1) or m.group(2)))
    return tuple(dims)


def _parse_pairs(text: str, local: tuple[int, ...], shape: tuple[int, ...],
                 where: str) -> list[tuple[Box, Box]]:
    pairs = []
    for pair in text.split(";"):
        sides = pair.split("#")
        if len(sides) != 2:
            raise _corrupt(where, f"bad local_global_slices_pairs item {pair!r} (local#global)")
        lbox, gbox = _parse_box(sides[0], local, where), _parse_box(sides[1], shape, where)
        if _extent(lbox) != _extent(gbox):
            raise _corrupt(where, f"local slices {sides[0]!r} ({_extent(lbox)}) and global slices "
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


def _index(box: Box) -> tuple[slice, ...]:
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


def _hits(piece: _Piece, box: Box) -> list[tuple[Box, Box]]:
    """(box in the shard, box in the output) of every slice pair of `piece`
    that overlaps `box`, the output's place in the global tensor."""
    out = []
    for lb, gb in piece.pairs:
        hit = _intersect(gb, box) if box else None
        if hit is not None:
            out.append((_shift(hit, gb, lb), _shift(hit, box, _full(_extent(box)))))
    return out


def _check_tiling(key: str, pieces: list[_Piece], shape: tuple[int, ...]) -> None:
    """The pieces' global boxes cover `shape` exactly once, and each piece's
    local boxes cover its stored shard exactly once."""
    for p in pieces:
        local = [lb for lb, _ in p.pairs]
        if _first_overlap(local) or sum(map(_volume, local)) != math.prod(p.local_shape):
            raise _corrupt(p.path, f"tensor {key!r}: its local slices do not cover the stored "
                                   f"shard {list(p.local_shape)} exactly once")
    owners = [(p, gb) for p in pieces for _, gb in p.pairs]
    hit = _first_overlap([gb for _, gb in owners])
    if hit:
        (a, ga), (b, gb) = owners[hit[0]], owners[hit[1]]
        region = _fmt(_intersect(ga, gb))
        if a.path == b.path:
            raise _corrupt(a.path, f"tensor {key!r}: two of its slice pairs claim region {region}")
        why = ""
        if a.rank and b.rank and a.rank.ep != b.rank.ep:
            why = (" (expert-parallel shards whose metadata does not say which experts each "
                   "exp-rank holds; not placed by guess)")
        raise _corrupt(b.path, f"tensor {key!r}: region {region} is also claimed by {a.path}{why}")
    covered, numel = sum(_volume(gb) for _, gb in owners), math.prod(shape)
    if covered != numel:
        raise _corrupt(pieces[0].path,
                       f"tensor {key!r}: its {len(pieces)} shard file(s) cover {covered} of the "
                       f"{numel} elements of {list(shape)} (a shard file is missing or its slice "
                       f"metadata is wrong)")


# ----------------------------------------------------- weight plans --

def _plan_weight(key: str, files: list[_WeightFile], meta_tp: Optional[int]) -> _Plan:
    _check_file_set(key, files, meta_tp)
    pieces, dtypes, shapes, nwd = [], set(), set(), None
    for wf in files:
        dtype, local, meta, extras = _read_header(wf.path, key)
        where = f"{wf.path}: tensor {key!r}"
        pairs_text = meta.get("local_global_slices_pairs")
        shape_text = meta.get("unsharded_shape")
        if (pairs_text is None) != (shape_text is None):
            raise _corrupt(where, "the metadata has only one of local_global_slices_pairs and "
                                  "unsharded_shape")
        if pairs_text is None:
            if wf.rank is not None:
                raise _corrupt(where, "a shard file without local_global_slices_pairs metadata")
            shape, pairs = local, [(_full(local), _full(local))]
        else:
            shape = _parse_shape(shape_text, where)
            pairs = _parse_pairs(pairs_text, local, shape, where)
        pieces.append(_Piece(wf.path, wf.rank, local, pairs))
        dtypes.add(dtype)
        shapes.add(shape)
        if "_no_weight_decay" in extras and nwd is None:
            nwd = wf.path
    if len(dtypes) > 1 or len(shapes) > 1:
        what = (f"dtypes {sorted(map(str, dtypes))}" if len(dtypes) > 1
                else f"unsharded shapes {sorted(shapes)}")
        raise _corrupt(files[0].path, f"shard files of tensor {key!r} disagree: {what}")
    shape = shapes.pop()
    _check_tiling(key, pieces, shape)
    return _Plan(key, dtypes.pop(), shape, pieces, nwd)


def _read_header(path: str, key: str) -> tuple[torch.dtype, tuple[int, ...], dict, set[str]]:
    """(dtype, shape of "data", string metadata, the other tensors' names)."""
    try:
        with _safe_open(path, framework="pt") as f:
            names = set(f.keys())
            meta = f.metadata() or {}
            if "data" not in names:
                raise _corrupt(path, f"tensor {key!r}: no tensor 'data' in the file")
            sl = f.get_slice("data")
            dtype_name, local = sl.get_dtype(), tuple(sl.get_shape())
    except CorruptCheckpointError:
        raise
    except FileNotFoundError:
        raise CheckpointNotFoundError(f"{path}: tensor {key!r}: shard file vanished") from None
    except Exception as e:  # safetensors' header errors
        raise _corrupt(path, f"tensor {key!r}: unreadable safetensors file: "
                             f"{_one_line(e)}") from None
    extras = names - {"data"}
    if extras - _WEIGHT_EXTRAS:
        raise _corrupt(path, f"tensor {key!r}: unexpected tensors "
                             f"{sorted(extras - _WEIGHT_EXTRAS)}")
    dtype = _SAFETENSORS_DTYPES.get(dtype_name)
    if dtype is None:
        raise _corrupt(path, f"tensor {key!r}: unsupported dtype {dtype_name}")
    return dtype, local, meta, extras


def _read_tensor(path: str, key: str, name: str = "data") -> torch.Tensor:
    """Tensor `name` of a weight file, whole."""
    try:
        with _safe_open(path, framework="pt") as f:
            return f.get_tensor(name)
    except FileNotFoundError:
        raise CheckpointNotFoundError(f"{path}: tensor {key!r}: shard file vanished") from None
    except Exception as e:
        raise _corrupt(path, f"tensor {key!r}: unreadable: {_one_line(e)}") from None


def _read_weight(plan: _Plan, box: Box, out: torch.Tensor) -> None:
    """Box `box` of the planned tensor into `out`, reading only the shard
    files (and, through safetensors slices, the bytes) that overlap it."""
    for piece in plan.pieces:
        hits = _hits(piece, box)
        if not hits and box:
            continue
        try:
            with _safe_open(piece.path, framework="pt") as f:
                sl = f.get_slice("data")
                if tuple(sl.get_shape()) != piece.local_shape:
                    raise _corrupt(piece.path, f"tensor {plan.key!r}: the shard changed since "
                                               f"it was listed")
                if not box:  # a 0-dim tensor
                    out.copy_(f.get_tensor("data"))
                for src, dst in hits:
                    out[_index(dst)] = sl[_index(src)]
        except (CorruptCheckpointError, CheckpointNotFoundError):
            raise
        except FileNotFoundError:
            raise CheckpointNotFoundError(f"{piece.path}: tensor {plan.key!r}: shard file "
                                          f"vanished") from None
        except Exception as e:
            raise _corrupt(piece.path, f"tensor {plan.key!r}: unreadable: {_one_line(e)}") from None


# ---------------------------------------------------- optimizer files --

@dataclass(frozen=True)
class _OptFile:
    path: str
    pp: int
    tp: int
    ep: int
    dp: Optional[int]  # None: ZeRO-0 (only dp rank 0 saves)


Group = tuple[int, int, int]  # (pp, tp, ep) of the process that saved a state


@dataclass
class _OptState:
    """One optimizer tensor: its files by (pp, tp, ep) group and dp rank."""
    key: str
    name: str  # the parameter's name
    field: tuple[str, ...]  # ("state", "exp_avg") or ("gradient_accumulator",)
    files: dict[Group, dict[Optional[int], _OptFile]] = field(default_factory=dict)


class _Unplaceable(Exception):
    def __init__(self, where: str, why: str) -> None:
        super().__init__(why)
        self.where, self.why = where, why


class _PickleRefused(Exception):
    pass


def _torch_load(path: str, unsafe_pickle: bool) -> Any:
    """torch.load, memory-mapped, weights_only unless unsafe_pickle;
    _PickleRefused if weights_only refuses the file."""
    try:
        try:
            return torch.load(path, map_location="cpu", weights_only=not unsafe_pickle, mmap=True)
        except RuntimeError as e:  # a file of torch's legacy (non-zip) format
            if "mmap" not in str(e):
                raise
            return torch.load(path, map_location="cpu", weights_only=not unsafe_pickle)
    except FileNotFoundError:
        raise CheckpointNotFoundError(f"{path}: file vanished") from None
    except Exception as e:
        refused = isinstance(e, pickle.UnpicklingError) or "weights_only" in str(e)
        if refused and not unsafe_pickle:
            raise _PickleRefused(f"torch.load(weights_only=True) refuses it ({_one_line(e)}); "
                                 f"unsafe_pickle=True unpickles it") from None
        raise _corrupt(path, f"unreadable pickle: {_one_line(e)}") from None


def _read_json(path: str) -> Any:
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        raise _corrupt(path, f"unreadable JSON: {_one_line(e)}") from None


class _Optimizer:
    """The optimizer files of one checkpoint, unpickled (memory-mapped) once
    and indexed by parameter name."""

    def __init__(self, root: str, unsafe_pickle: bool, notes: dict[str, str]) -> None:
        self.dir = os.path.join(root, "optimizer")
        self.unsafe_pickle = unsafe_pickle
        self.notes = notes
        self.config: dict = {}
        self.files: list[_OptFile] = []
        self.states: dict[str, _OptState] = {}
        self.steps: dict[str, float] = {}
        self.param_groups: Any = None
        self._objs: dict[str, Any] = {}
        if os.path.isdir(self.dir):
            self._scan()

    def _scan(self) -> None:
        config = os.path.join(self.dir, "optimizer_config.json")
        if os.path.isfile(config):
            self.config = _read_json(config)
        for name in sorted(os.listdir(self.dir)):
            m = _OPTIMIZER_NAME.fullmatch(name)
            path = os.path.join(self.dir, name)
            if m:
                self.files.append(_OptFile(path, int(m["pp"]), int(m["tp"]), int(m["ep"] or 0),
                                           _int(m, "dp")))
            elif name.endswith(".pt"):
                self.notes[path] = "not a nanotron optimizer file name; not read"
        if len({f.dp is None for f in self.files}) > 1:
            raise _corrupt(self.dir, "both ZeRO-0 and ZeRO-1 optimizer files")
        try:
            for f in sorted(self.files, key=lambda f: (f.pp, f.dp or 0, f.tp, f.ep)):
                self._index(f)
        except _Unplaceable as e:
            self.states.clear()
            self.steps.clear()
            self.notes[e.where] = f"optimizer state not imported: {e.why}"
            warnings.warn(f"{e.where}: nanotron optimizer state not imported: {e.why}",
                          stacklevel=4)

    def load(self, f: _OptFile) -> Any:
        obj = self._objs.get(f.path)
        if obj is None:
            obj = self._objs[f.path] = _torch_load(f.path, self.unsafe_pickle)
        return obj

    def _index(self, f: _OptFile) -> None:
        try:
            obj = self.load(f)
        except _PickleRefused as e:
            raise _Unplaceable(f.path, str(e)) from None
        if not isinstance(obj, dict) or not isinstance(obj.get("state"), dict):
            raise _Unplaceable(f.path, "no 'state' dict in the file")
        names = obj.get("names")
        if not isinstance(names, dict):
            raise _Unplaceable(f.path, "no 'names' (index -> parameter name) in the file; its "
                                       "states cannot be matched to parameters with certainty")
        if self.param_groups is None and isinstance(obj.get("param_groups"), list):
            self.param_groups = [{k: v for k, v in g.items() if k != "params"}
                                 for g in obj["param_groups"]]
        for index, state in obj["state"].items():
            if index not in names:
                raise _Unplaceable(f.path, f"state index {index} has no name")
            for sk, value in state.items():
                self._add(f, names[index], ("state", str(sk)), value)
        for name, value in (obj.get("gradient_accumulator") or {}).items():
            self._add(f, name, ("gradient_accumulator",), value)

    def _add(self, f: _OptFile, name: str, fld: tuple[str, ...], value: Any) -> None:
        if not isinstance(value, torch.Tensor):
            return
        if value.dim() == 0 and fld[0] == "state":
            if fld[1] == "step":
                self.steps[name] = value.item()
            return
        key = OPTIMIZER_PREFIX + ".".join((fld[0], name, *fld[1:]))
        st = self.states.setdefault(key, _OptState(key, name, fld))
        st.files.setdefault((f.pp, f.tp, f.ep), {})[f.dp] = f

    def tensor(self, f: _OptFile, st: _OptState) -> torch.Tensor:
        obj = self.load(f)
        if st.field[0] == "gradient_accumulator":
            return obj["gradient_accumulator"][st.name]
        index = next(i for i, n in obj["names"].items() if n == st.name)
        return obj["state"][index][st.field[1]]

    def offsets(self, name: str) -> Optional[dict[int, tuple[int, int]]]:
        """optimizer_config.json's ZeRO-1 dp offsets of `name`, if it lists them."""
        table = (self.config.get("configs") or {}).get("param_name_to_dp_rank_offsets") or {}
        raw = table.get(name)
        if not isinstance(raw, dict):
            return None
        try:
            return {int(dp): (int(v[0]), int(v[1])) for dp, v in raw.items()}
        except (TypeError, ValueError, IndexError):
            raise _corrupt(os.path.join(self.dir, "optimizer_config.json"),
                           f"bad param_name_to_dp_rank_offsets of {name!r}") from None

    def values(self) -> dict[str, Any]:
        if not self.files:
            return {}
        out = {k: self.config[k] for k in ("type", "parallelism") if k in self.config}
        if self.param_groups is not None:
            out["param_groups"] = _plain(self.param_groups)
        steps = set(self.steps.values())
        if len(steps) == 1:
            out["step"] = steps.pop()
        elif steps:
            out["step"] = dict(sorted(self.steps.items()))
        return out

    def close(self) -> None:
        self._objs.clear()


# ----------------------------------------------- optimizer placement --

@dataclass
class _OptPlan:
    st: _OptState
    dtype: torch.dtype
    shape: tuple[int, ...]
    sources: list[tuple[_Piece, list[Group]]]  # per weight shard: the groups holding copies


def _plan_optimizer(st: _OptState, weight: _Plan, opt: _Optimizer) -> _OptPlan:
    """Matches the state's (pp, tp, ep) groups to the weight's shard files;
    _Unplaceable if a group or a shard has no certain partner."""
    sources: list[tuple[_Piece, list[Group]]] = [(p, []) for p in weight.pieces]
    for group in sorted(st.files):
        pp, tp, ep = group
        match = [s for s in sources if s[0].rank is None or (
            s[0].rank.tp == tp and (s[0].rank.ep is None or s[0].rank.ep == ep))]
        if len(match) != 1:
            what = "no weight shard file" if not match else "several weight shard files"
            raise _Unplaceable(st.key, f"the state saved by pp {pp} tp {tp} exp {ep} matches "
                                       f"{what}")
        match[0][1].append(group)
    for piece, groups in sources:
        if not groups:
            raise _Unplaceable(st.key, f"no optimizer file holds the state of shard {piece.path}")
    first = next(iter(st.files[sources[0][1][0]].values()))
    return _OptPlan(st, opt.tensor(first, st).dtype, weight.shape, sources)


def _group_path(st: _OptState, group: Group) -> str:
    return next(iter(st.files[group].values())).path


def _group_tensor(opt: _Optimizer, st: _OptState, piece: _Piece, group: Group) -> torch.Tensor:
    """The state of one (pp, tp, ep) group, shaped like the weight shard
    (ZeRO-1 pieces joined in dp-rank order)."""
    by_dp = st.files[group]
    if None in by_dp:
        t = opt.tensor(by_dp[None], st)
        if tuple(t.shape) != piece.local_shape:
            raise _corrupt(by_dp[None].path, f"{st.key!r} has shape {list(t.shape)}, its weight "
                                             f"shard {piece.path} {list(piece.local_shape)}")
        return t
    dps = sorted(by_dp)
    flats = [opt.tensor(by_dp[d], st).reshape(-1) for d in dps]
    offsets, start = opt.offsets(st.name) or {}, 0
    for d, flat in zip(dps, flats):
        held = (start, start + flat.numel())
        if d in offsets and offsets[d] != held:
            raise _corrupt(by_dp[d].path, f"{st.key!r} holds [{held[0]}, {held[1]}) but "
                                          f"optimizer_config.json says {list(offsets[d])}")
        start = held[1]
    numel = math.prod(piece.local_shape)
    if dps != list(range(len(dps))) or start != numel:
        raise _corrupt(by_dp[dps[0]].path, f"{st.key!r}: the ZeRO-1 pieces of dp ranks {dps} hold "
                                           f"{start} of the {numel} elements of shard {piece.path}")
    return torch.cat(flats).view(piece.local_shape)


def _read_optimizer(opt: _Optimizer, plan: _OptPlan, box: Box, out: torch.Tensor) -> None:
    """Box `box` of the planned optimizer tensor into `out`; every copy of a
    shard is checked bit-identical to the first."""
    st = plan.st
    for piece, groups in plan.sources:
        hits = _hits(piece, box)
        if not hits and box:
            continue
        local = _group_tensor(opt, st, piece, groups[0])
        for group in groups[1:]:
            if not _bit_equal(local, _group_tensor(opt, st, piece, group)):
                raise _corrupt(_group_path(st, group),
                               f"{st.key!r}: this copy differs from the one in "
                               f"{_group_path(st, groups[0])} (copies of one shard must be "
                               f"identical)")
        if local.dtype != out.dtype:
            raise _corrupt(_group_path(st, groups[0]), f"{st.key!r} is {local.dtype} here and "
                                                       f"{out.dtype} in another optimizer file")
        if not box:
            out.copy_(local)
        for src, dst in hits:
            out[_index(dst)] = local[_index(src)]


def _bit_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if a.dtype.is_floating_point or a.dtype.is_complex:
        return torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))
    return torch.equal(a, b)


def _plain(obj: Any) -> Any:
    """Containers as dicts and lists (tuples become lists), other values as they are."""
    if isinstance(obj, dict):
        return {k if isinstance(k, (str, int)) else str(k): _plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_plain(v) for v in obj]
    return obj


# --------------------------------------------------------- checkpoint --

class NanotronCheckpoint:
    """A nanotron checkpoint as a ForeignCheckpoint (see the module doc)."""

    format = "nanotron"

    def __init__(self, path: str | os.PathLike, *, unsafe_pickle: bool = False) -> None:
        root = resolve(path)
        if root is None:
            raise CheckpointNotFoundError(
                f"{os.fspath(path)}: not a nanotron checkpoint (no {CHECKPOINT_FILE} and model/ "
                f"directory, nor a latest.txt naming one)")
        self.path = root
        self._unsafe_pickle = unsafe_pickle
        self._meta = _read_json(os.path.join(root, CHECKPOINT_FILE))
        if not isinstance(self._meta, dict):
            raise _corrupt(os.path.join(root, CHECKPOINT_FILE), "not a JSON object")
        tp = self._meta.get("tp")
        self._meta_tp = tp if isinstance(tp, int) else None
        self._files = _scan_weights(os.path.join(root, "model"))
        self._plans: dict[str, _Plan] = {}
        self._notes: dict[str, str] = {}
        self._opt: Optional[_Optimizer] = None
        self._opt_plans: Optional[dict[str, _OptPlan]] = None

    def tensors(self) -> dict[str, tuple[torch.dtype, tuple[int, ...]]]:
        out = {}
        for key in self._files:
            plan = self._plan(key)
            out[key] = (plan.dtype, plan.shape)
        for key, oplan in self._optimizer_plans().items():
            out[key] = (oplan.dtype, oplan.shape)
        return out

    def read(self, key: str) -> torch.Tensor:
        _, shape = self._describe(key)
        return self.read_box(key, (0,) * len(shape), shape)

    def read_box(self, key: str, offset: tuple[int, ...], size: tuple[int, ...]) -> torch.Tensor:
        """The box (offset, size) of tensor `key`, read only from the shard
        files that overlap it."""
        dtype, shape = self._describe(key)
        if len(offset) != len(shape) or len(size) != len(shape) or any(
                o < 0 or s < 0 or o + s > n for o, s, n in zip(offset, size, shape)):
            raise InvalidStateError(f"{self.path}: tensor {key!r} of shape {list(shape)} has no "
                                    f"box at {list(offset)} of size {list(size)}")
        box = tuple((o, o + s) for o, s in zip(offset, size))
        out = torch.empty(tuple(size), dtype=dtype)
        if key in self._files:
            _read_weight(self._plan(key), box, out)
        else:
            _read_optimizer(self._optimizer(), self._optimizer_plans()[key], box, out)
        return out

    def values(self) -> dict[str, Any]:
        self._optimizer_plans()
        metas = self._meta.get("metas")
        metas = metas if isinstance(metas, dict) else {}
        out: dict[str, Any] = {k: metas[k] for k in ("consumed_train_samples",) if k in metas}
        if "last_train_step" in metas:
            out["step"] = metas["last_train_step"]
        optimizer = self._optimizer().values()
        if optimizer:
            out["optimizer"] = optimizer
        scheduler = self._lr_scheduler()
        if scheduler is not None:
            out["lr_scheduler"] = scheduler
        out["nanotron"] = self._nanotron_values()
        return out

    def close(self) -> None:
        if self._opt is not None:
            self._opt.close()

    # ---- weights
    def _plan(self, key: str) -> _Plan:
        plan = self._plans.get(key)
        if plan is None:
            plan = self._plans[key] = _plan_weight(key, self._files[key], self._meta_tp)
        return plan

    def _describe(self, key: str) -> tuple[torch.dtype, tuple[int, ...]]:
        if key in self._files:
            plan = self._plan(key)
            return plan.dtype, plan.shape
        oplan = self._optimizer_plans().get(key)
        if oplan is None:
            raise InvalidStateError(f"{self.path}: no tensor {key!r} in this nanotron checkpoint")
        return oplan.dtype, oplan.shape

    # ---- optimizer
    def _optimizer(self) -> _Optimizer:
        if self._opt is None:
            self._opt = _Optimizer(self.path, self._unsafe_pickle, self._notes)
        return self._opt

    def _optimizer_plans(self) -> dict[str, _OptPlan]:
        if self._opt_plans is None:
            opt, plans = self._optimizer(), {}
            for key, st in sorted(opt.states.items()):
                if key in self._files:
                    raise _corrupt(self.path, f"optimizer tensor {key!r} has a weight's name")
                if st.name not in self._files:
                    self._notes[key] = f"no weight file of parameter {st.name!r}; not placed"
                    continue
                try:
                    plans[key] = _plan_optimizer(st, self._plan(st.name), opt)
                except _Unplaceable as e:
                    self._notes[e.where] = e.why
                    warnings.warn(f"{self.path}: {e.where}: nanotron optimizer state not "
                                  f"imported: {e.why}", stacklevel=3)
            self._opt_plans = plans
        return self._opt_plans

    # ---- values
    def _nanotron_values(self) -> dict[str, Any]:
        nano: dict[str, Any] = {"checkpoint_metadata": self._meta, "tied_parameters": TIED_NOTE}
        model_config = os.path.join(self.path, "model_config.json")
        if os.path.isfile(model_config):
            nano["model_config"] = _read_json(model_config)
        config_yaml = os.path.join(self.path, "config.yaml")
        if os.path.isfile(config_yaml):
            with open(config_yaml, encoding="utf-8", errors="replace") as f:
                nano["config_yaml"] = f.read()
        nwd = {}
        for key in self._files:
            path = self._plan(key).no_weight_decay_file
            if path is not None:
                nwd[key] = bool(_read_tensor(path, key, "_no_weight_decay").item())
        if nwd:
            nano["no_weight_decay"] = nwd
        random_dir = os.path.join(self.path, "random")
        if os.path.isdir(random_dir):
            for name in sorted(os.listdir(random_dir)):
                self._notes[os.path.join(random_dir, name)] = RANDOM_NOTE
        nano["not_imported"] = dict(sorted(self._notes.items()))
        return nano

    def _lr_scheduler(self) -> Any:
        directory = os.path.join(self.path, "lr_scheduler")
        if not os.path.isdir(directory):
            return None
        found = {}
        for name in sorted(os.listdir(directory)):
            if name.endswith(".pt"):
                path = os.path.join(directory, name)
                try:
                    found[name[:-3]] = _plain(_torch_load(path, self._unsafe_pickle))
                except _PickleRefused as e:
                    self._notes[path] = str(e)
        if list(found) == ["lr_scheduler"]:
            return found["lr_scheduler"]
        return found or None


def open_checkpoint(path: str | os.PathLike, unsafe_pickle: bool = False) -> NanotronCheckpoint:
    return NanotronCheckpoint(path, unsafe_pickle=unsafe_pickle)


FORMAT = Format("nanotron", detect, open_checkpoint)
