"""nanotron checkpoints, read as global tensors (a ForeignCheckpoint of
shardsafe.foreign.reader).

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

Weights (shardsafe.foreign.nanotron_weights). `tensors()` lists every parameter
under its nanotron name (e.g. `model.decoder.0.pp_block.attn.qkv_proj.weight`)
with the unsharded shape; `read(key)` places every shard file's local
slices at their global slices, which must tile the global tensor exactly;
`read_box` reads one box, only from the shard files that overlap it.
Checkpoint versions are not gated (1.2 to 1.5 share this layout); values()
carries the version.

Tied parameters. nanotron saves a tied group once, under the group's name
(e.g. the token embedding for a tied `lm_head`); the checkpoint does not
record the other names (nanotron's model code rebuilds the ties), so the
tensor is listed once, under the saved name: load it into an alias with a
rename.

Optimizer state. nanotron's optimizer files are torch.save pickles of its
NamedOptimizer state dict: "state" {index: {"exp_avg", ...}} with "names"
{index: parameter name}, and, with fp32 gradient accumulation, the fp32
master weights under "gradient_accumulator" {name: tensor}. Every process
with dp rank 0 writes one (ZeRO-0), or every process (ZeRO-1, with a dp
rank in the name): the file names must form that whole set (one layout, every
pp x [dp x] tp x exp rank), a missing file is a CheckpointNotFoundError
naming it. A file's states are the local shards of the process with its
(pp, tp, exp) ranks, shaped like that process's weight shard, whose slice
metadata places them. They are listed as global tensors
`optimizer.state.<name>.<state>` and `optimizer.gradient_accumulator.<name>`.
ZeRO-1 files hold contiguous flat pieces of each local shard in dp-rank
order (nanotron optim/zero.py _partition_parameters); they are joined in
that order, checked against optimizer_config.json's
`param_name_to_dp_rank_offsets` where it lists the parameter, and against
the shard's size. Copies of one shard held by several processes (a tied
parameter on several pipeline stages, an unsharded one on every TP rank, a
non-expert one on every exp-rank) must be bit-identical. A shard whose state
another shard of the parameter has but no file holds is a
CorruptCheckpointError naming the file that should. What cannot be placed
with certainty is not listed, and not_imported() says so: a file without
"names" or that weights_only refuses (its (pp, tp, exp) group's states are
left out, and the parameters whose shards only that group holds), a state
of a parameter with no weight file, a state matching several weight shards.

values(): {"step", "consumed_train_samples" (checkpoint_metadata.json's
metas), "optimizer": {"type", "parallelism", "param_groups", "step"},
"lr_scheduler": its state dict, "nanotron": {"checkpoint_metadata",
"model_config", "config_yaml", "no_weight_decay" {name: bool},
"tied_parameters" (the note above), "not_imported" {file or key: reason}}},
as saved (the importer drops and reports what JSON cannot hold).

Random states (pickles of nanotron.random.RandomStates, one per process)
are carried unread, as grouped PerRank values listed as the U8 tensors
`__shardsafe__/group/G/random` (shardsafe.foreign.nanotron_random: G from
the file's tp, dp and pp ranks); files that are not one whole grid are
listed under not_imported instead. Pickles
are read with torch.load(weights_only=True, mmap=True) unless
unsafe_pickle=True (shardsafe.foreign.common.torch_load: a damaged pickle is a
CorruptCheckpointError naming it); the safetensors package reads the weight
files, and opening a checkpoint without it installed is an ImportError.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import re
from dataclasses import dataclass, field
from typing import Any, Optional

import torch

from .._files import read_bytes
from ..errors import CheckpointNotFoundError, InvalidStateError, StorageError
from .common import PickleRefusedError, as_dicts, one_line, read_latest, torch_load
from .nanotron_weights import (CHECKPOINT_FILE, Box, Piece, Plan, box_index, corrupt, hits,
                                plan_weight, read_tensor, read_weight, safetensors_module,
                                scan_weights)
from .nanotron_random import random_blob, scan_random
from .reader import Format

OPTIMIZER_PREFIX = "optimizer."
TIED_NOTE = ("a tied parameter is saved once, under its tie group's name; its other names are "
             "not recorded in the checkpoint (load it into them with a rename)")

_OPTIMIZER_NAME = re.compile(
    r"optimizer_pp-(?P<pp>\d+)-of-(?P<npp>\d+)(?:_dp-(?P<dp>\d+)-of-(?P<ndp>\d+))?"
    r"_tp-(?P<tp>\d+)-of-(?P<ntp>\d+)(?:_exp-(?P<ep>\d+)-of-(?P<nep>\d+))?\.pt")


def resolve(path: str | os.PathLike) -> Optional[str]:
    """The checkpoint directory `path` names (itself, or the step its
    latest.txt names), or None if it is not a nanotron checkpoint."""
    path = os.fspath(path)
    if _is_step_dir(path):
        return path
    step = read_latest(os.path.join(path, "latest.txt"))
    if not step or not (step.isascii() and step.isdigit()):
        return None
    step_dir = os.path.join(path, step)
    return step_dir if _is_step_dir(step_dir) else None


def _is_step_dir(path: str) -> bool:
    return (os.path.isfile(os.path.join(path, CHECKPOINT_FILE))
            and os.path.isdir(os.path.join(path, "model")))


def detect(path: str) -> bool:
    return resolve(path) is not None


def _read_json(path: str, within: str) -> Any:
    """The JSON file `path` of the checkpoint directory `within`."""
    try:
        text = read_bytes(path, within=within)
    except FileNotFoundError:
        raise CheckpointNotFoundError(f"{path}: missing", "NOT_FOUND") from None
    except OSError as e:
        raise StorageError(f"{path}: cannot be read: {one_line(e)}", "UNAVAILABLE") from None
    try:
        return json.loads(text.decode("utf-8"))
    except ValueError as e:  # UnicodeDecodeError included
        raise corrupt(path, f"unreadable JSON: {one_line(e)}") from None


def _read_text(path: str, within: str) -> str:
    """The text file `path` of the checkpoint directory `within` (bytes not
    UTF-8 replaced)."""
    try:
        return read_bytes(path, within=within).decode("utf-8", errors="replace")
    except FileNotFoundError:
        raise CheckpointNotFoundError(f"{path}: missing", "NOT_FOUND") from None
    except OSError as e:
        raise StorageError(f"{path}: cannot be read: {one_line(e)}", "UNAVAILABLE") from None


# ---------------------------------------------------- optimizer files --

@dataclass(frozen=True)
class _OptFile:
    path: str
    pp: int
    tp: int
    ep: int
    dp: Optional[int]  # None: ZeRO-0 (only dp rank 0 saves)
    sizes: tuple[int, Optional[int], int, Optional[int]]  # (npp, ndp, ntp, nep) of its name


Group = tuple[int, int, int]  # (pp, tp, ep) of the process that saved a state


@dataclass
class _OptState:
    """One optimizer tensor: its files by (pp, tp, ep) group and dp rank."""
    key: str
    name: str  # the parameter's name
    field: tuple[str, ...]  # ("state", "exp_avg") or ("gradient_accumulator",)
    files: dict[Group, dict[Optional[int], _OptFile]] = field(default_factory=dict)


class _Unplaceable(Exception):
    """State that cannot be placed with certainty (reported, not listed)."""

    def __init__(self, where: str, why: str) -> None:
        super().__init__(why)
        self.where, self.why = where, why


def _file_name(pp: int, dp: Optional[int], tp: int, ep: int,
               sizes: tuple[int, Optional[int], int, Optional[int]]) -> str:
    """nanotron's optimizer file name (serialize/optimizer.py optimizer_filename)."""
    npp, ndp, ntp, nep = sizes
    return (f"optimizer_pp-{pp}-of-{npp}" + (f"_dp-{dp}-of-{ndp}" if ndp is not None else "")
            + f"_tp-{tp}-of-{ntp}" + (f"_exp-{ep}-of-{nep}" if nep is not None else "") + ".pt")


def _opt_file(directory: str, m: re.Match) -> _OptFile:
    def num(group: str) -> Optional[int]:
        return None if m[group] is None else int(m[group])
    sizes = (int(m["npp"]), num("ndp"), int(m["ntp"]), num("nep"))
    f = _OptFile(os.path.join(directory, m[0]), int(m["pp"]), int(m["tp"]), num("ep") or 0,
                 num("dp"), sizes)
    if (f.pp >= sizes[0] or f.tp >= sizes[2] or (f.dp is not None and f.dp >= sizes[1])
            or (sizes[3] is not None and f.ep >= sizes[3])):
        raise corrupt(f.path, "a rank in the file name is out of range")
    return f


def _check_file_set(directory: str, files: list[_OptFile]) -> None:
    """The optimizer files are the whole set of one layout: every pp x [dp x]
    tp x exp rank. CheckpointNotFoundError names the first missing file."""
    layouts = sorted({f.sizes for f in files}, key=str)
    if len(layouts) > 1:
        a, b = (next(f.path for f in files if f.sizes == s) for s in layouts[:2])
        raise corrupt(a, f"optimizer files of two layouts (also {os.path.basename(b)}): remove "
                         f"the stale ones")
    sizes = layouts[0]
    npp, ndp, ntp, nep = sizes
    present = {(f.pp, f.dp, f.tp, f.ep) for f in files}
    dps = range(ndp) if ndp is not None else [None]
    want = list(itertools.product(range(npp), dps, range(ntp), range(nep or 1)))
    for pp, dp, tp, ep in want:
        if (pp, dp, tp, ep) not in present:
            raise CheckpointNotFoundError(
                f"{os.path.join(directory, _file_name(pp, dp, tp, ep, sizes))}: missing "
                f"optimizer file ({len(present)} of {len(want)} present)", "NOT_FOUND")


class _Optimizer:
    """The optimizer files of one checkpoint, unpickled (memory-mapped) once
    and indexed by parameter name. A file whose states cannot be matched to
    parameters with certainty leaves its (pp, tp, ep) group out (`lost`)."""

    def __init__(self, root: str, unsafe_pickle: bool, notes: dict[str, str]) -> None:
        self.root = root
        self.dir = os.path.join(root, "optimizer")
        self.unsafe_pickle = unsafe_pickle
        self.notes = notes
        self.config: dict = {}
        self.files: list[_OptFile] = []
        self.states: dict[str, _OptState] = {}
        self.steps: dict[str, float] = {}
        self.param_groups: Any = None
        self.lost: dict[Group, str] = {}  # group left out -> the file that could not be read
        self._objs: dict[str, Any] = {}
        if os.path.isdir(self.dir):
            self._scan()

    def _scan(self) -> None:
        config = os.path.join(self.dir, "optimizer_config.json")
        if os.path.isfile(config):
            self.config = _read_json(config, self.root)
            if not isinstance(self.config, dict):
                raise corrupt(config, "not a JSON object")
        for name in sorted(os.listdir(self.dir)):
            m = _OPTIMIZER_NAME.fullmatch(name)
            if m:
                self.files.append(_opt_file(self.dir, m))
            elif name.endswith(".pt"):
                self.notes[os.path.join(self.dir, name)] = ("not a nanotron optimizer file name; "
                                                            "not read")
        if not self.files:
            return
        _check_file_set(self.dir, self.files)
        for f in sorted(self.files, key=lambda f: (f.pp, f.dp or 0, f.tp, f.ep)):
            try:
                self._index(f)
            except _Unplaceable as e:
                self.notes[e.where] = f"optimizer state not imported: {e.why}"
                self.lost.setdefault((f.pp, f.tp, f.ep), f.path)
        for st in self.states.values():  # a lost group's other dp pieces are incomplete
            for group in self.lost:
                st.files.pop(group, None)
        self.states = {k: st for k, st in self.states.items() if st.files}

    def load(self, f: _OptFile) -> Any:
        obj = self._objs.get(f.path)
        if obj is None:
            obj = self._objs[f.path] = torch_load(f.path, unsafe_pickle=self.unsafe_pickle,
                                                  within=self.root)
        return obj

    def _index(self, f: _OptFile) -> None:
        try:
            obj = self.load(f)
        except PickleRefusedError as e:
            raise _Unplaceable(f.path, e.reason) from None
        if not isinstance(obj, dict) or not isinstance(obj.get("state"), dict):
            raise corrupt(f.path, "no 'state' dict: not a nanotron optimizer state dict")
        names = obj.get("names")
        if not isinstance(names, dict):
            raise _Unplaceable(f.path, "no 'names' (index -> parameter name) in the file; its "
                                       "states cannot be matched to parameters with certainty")
        if self.param_groups is None and isinstance(obj.get("param_groups"), list):
            self.param_groups = [{k: v for k, v in g.items() if k != "params"}
                                 for g in obj["param_groups"] if isinstance(g, dict)]
        for index, state in obj["state"].items():
            if index not in names or not isinstance(state, dict):
                raise corrupt(f.path, f"state index {index!r} has no name or is no dict")
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

    def group_file(self, group: Group) -> str:
        """A file of the (pp, tp, ep) group (the dp-0 one), or the directory
        if the optimizer's layout has no such group."""
        return next((f.path for f in sorted(self.files, key=lambda f: f.dp or 0)
                     if (f.pp, f.tp, f.ep) == group), self.dir)

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
            raise corrupt(os.path.join(self.dir, "optimizer_config.json"),
                          f"bad param_name_to_dp_rank_offsets of {name!r}") from None

    def values(self) -> dict[str, Any]:
        if not self.files:
            return {}
        out = {k: self.config[k] for k in ("type", "parallelism") if k in self.config}
        if self.param_groups is not None:
            out["param_groups"] = as_dicts(self.param_groups)
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
    sources: list[tuple[Piece, list[Group]]]  # per weight shard: the groups holding copies


def _holds(piece: Piece, group: Group) -> bool:
    """Whether the process of `group` holds (a copy of) weight shard `piece`."""
    _, tp, ep = group
    return piece.rank is None or (piece.rank.tp == tp
                                  and (piece.rank.ep is None or piece.rank.ep == ep))


def _plan_optimizer(st: _OptState, weight: Plan, opt: _Optimizer) -> _OptPlan:
    """Matches the state's (pp, tp, ep) groups to the weight's shard files.
    CorruptCheckpointError where files and weights disagree; _Unplaceable
    where the match is not certain (several shards, a lost group)."""
    sources: list[tuple[Piece, list[Group]]] = [(p, []) for p in weight.pieces]
    for group in sorted(st.files):
        match = [s for s in sources if _holds(s[0], group)]
        if not match:
            pp, tp, ep = group
            raise corrupt(opt.group_file(group), f"{st.key!r} of the process with pp {pp} tp {tp} "
                                                 f"exp {ep} matches no weight shard file of "
                                                 f"{st.name!r}")
        if len(match) > 1:
            raise _Unplaceable(st.key, f"the state saved by {opt.group_file(group)} matches "
                                       f"several weight shard files")
        match[0][1].append(group)
    for piece, groups in sources:
        if groups:
            continue
        lost = [g for g in opt.lost if _holds(piece, g)]
        if lost:
            raise _Unplaceable(st.key, f"the state of shard {piece.path} is in "
                                       f"{opt.lost[lost[0]]}, which is not imported")
        group = (piece.rank.pp, piece.rank.tp, piece.rank.ep or 0)  # ranked: unranked has groups
        raise corrupt(opt.group_file(group), f"no {st.key!r} for weight shard {piece.path} (the "
                                             f"parameter's other shards have it)")
    first = next(iter(st.files[sources[0][1][0]].values()))
    return _OptPlan(st, opt.tensor(first, st).dtype, weight.shape, sources)


def _group_path(st: _OptState, group: Group) -> str:
    return next(iter(st.files[group].values())).path


def _group_tensor(opt: _Optimizer, st: _OptState, piece: Piece, group: Group) -> torch.Tensor:
    """The state of one (pp, tp, ep) group, shaped like the weight shard
    (ZeRO-1 pieces joined in dp-rank order)."""
    by_dp = st.files[group]
    if None in by_dp:
        t = opt.tensor(by_dp[None], st)
        if tuple(t.shape) != piece.local_shape:
            raise corrupt(by_dp[None].path, f"{st.key!r} has shape {list(t.shape)}, its weight "
                                            f"shard {piece.path} {list(piece.local_shape)}")
        return t
    dps = sorted(by_dp)
    flats = [opt.tensor(by_dp[d], st).reshape(-1) for d in dps]
    offsets, start = opt.offsets(st.name) or {}, 0
    for d, flat in zip(dps, flats):
        held = (start, start + flat.numel())
        if d in offsets and offsets[d] != held:
            raise corrupt(by_dp[d].path, f"{st.key!r} holds [{held[0]}, {held[1]}) but "
                                         f"optimizer_config.json says {list(offsets[d])}")
        start = held[1]
    numel = math.prod(piece.local_shape)
    if dps != list(range(len(dps))) or start != numel:
        raise corrupt(by_dp[dps[0]].path, f"{st.key!r}: the ZeRO-1 pieces of dp ranks {dps} hold "
                                          f"{start} of the {numel} elements of shard {piece.path}")
    return torch.cat(flats).view(piece.local_shape)


def _read_optimizer(opt: _Optimizer, plan: _OptPlan, box: Box, out: torch.Tensor) -> None:
    """Box `box` of the planned optimizer tensor into `out`; every copy of a
    shard is checked bit-identical to the first."""
    st = plan.st
    for piece, groups in plan.sources:
        found = hits(piece, box)
        if not found and box:
            continue
        local = _group_tensor(opt, st, piece, groups[0])
        for group in groups[1:]:
            if not _bit_equal(local, _group_tensor(opt, st, piece, group)):
                raise corrupt(_group_path(st, group),
                              f"{st.key!r}: this copy differs from the one in "
                              f"{_group_path(st, groups[0])} (copies of one shard must be "
                              f"identical)")
        if local.dtype != out.dtype:
            raise corrupt(_group_path(st, groups[0]), f"{st.key!r} is {local.dtype} here and "
                                                      f"{out.dtype} in another optimizer file")
        if not box:
            out.copy_(local)
        for src, dst in found:
            out[box_index(dst)] = local[box_index(src)]


def _bit_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if a.dtype.is_floating_point or a.dtype.is_complex:
        return torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))
    return torch.equal(a, b)


# --------------------------------------------------------- checkpoint --

class NanotronCheckpoint:
    """A nanotron checkpoint as a ForeignCheckpoint (see the module doc)."""

    format = "nanotron"

    def __init__(self, path: str | os.PathLike, *, unsafe_pickle: bool = False) -> None:
        safetensors_module()  # the weight files' reader: a clear ImportError now, not per file
        root = resolve(path)
        if root is None:
            raise CheckpointNotFoundError(
                f"{os.fspath(path)}: not a nanotron checkpoint (no {CHECKPOINT_FILE} and model/ "
                f"directory, nor a latest.txt naming one)", "NOT_FOUND")
        self.path = root
        self._unsafe_pickle = unsafe_pickle
        self._meta = _read_json(os.path.join(root, CHECKPOINT_FILE), root)
        if not isinstance(self._meta, dict):
            raise corrupt(os.path.join(root, CHECKPOINT_FILE), "not a JSON object")
        tp = self._meta.get("tp")
        self._meta_tp = tp if isinstance(tp, int) else None
        self._files = scan_weights(os.path.join(root, "model"))
        self._plans: dict[str, Plan] = {}
        self._notes: dict[str, str] = {}
        self._opt: Optional[_Optimizer] = None
        self._opt_plans: Optional[dict[str, _OptPlan]] = None
        self._scheduler: Optional[tuple[Any]] = None  # (state,) once read
        # Random-state files: {tensor name: (file, ranks)}, their encoded values once read.
        self._random, self._random_note = scan_random(root)
        self._random_blobs: dict[str, torch.Tensor] = {}

    def tensors(self) -> dict[str, tuple[torch.dtype, tuple[int, ...]]]:
        out = {}
        for key in self._files:
            plan = self._plan(key)
            out[key] = (plan.dtype, plan.shape)
        for key, oplan in self._optimizer_plans().items():
            out[key] = (oplan.dtype, oplan.shape)
        for key in self._random:
            out[key] = (torch.uint8, (self._random_blob(key).numel(),))
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
        if key in self._random:
            return self._random_blob(key)[offset[0]:offset[0] + size[0]].clone()
        box = tuple((o, o + s) for o, s in zip(offset, size))
        out = torch.empty(tuple(size), dtype=dtype)
        if key in self._files:
            read_weight(self._plan(key), box, out, self.path)
        else:
            _read_optimizer(self._optimizer(), self._optimizer_plans()[key], box, out)
        return out

    def values(self) -> dict[str, Any]:
        self._find_notes()
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

    def not_imported(self) -> list[str]:
        """What is not read or cannot be placed with certainty, one line each
        ("FILE or KEY: why")."""
        self._find_notes()
        return [f"{where}: {why}" for where, why in sorted(self._notes.items())]

    def close(self) -> None:
        if self._opt is not None:
            self._opt.close()

    # ---- weights
    def _plan(self, key: str) -> Plan:
        plan = self._plans.get(key)
        if plan is None:
            plan = self._plans[key] = plan_weight(key, self._files[key], self._meta_tp,
                                                  self.path)
        return plan

    def _random_blob(self, key: str) -> torch.Tensor:
        blob = self._random_blobs.get(key)
        if blob is None:
            blob = self._random_blobs[key] = random_blob(*self._random[key])
        return blob

    def _describe(self, key: str) -> tuple[torch.dtype, tuple[int, ...]]:
        if key in self._random:
            return torch.uint8, (self._random_blob(key).numel(),)
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
                    raise corrupt(self.path, f"optimizer tensor {key!r} has a weight's name")
                if st.name not in self._files:
                    self._notes[key] = f"no weight file of parameter {st.name!r}; not placed"
                    continue
                try:
                    plans[key] = _plan_optimizer(st, self._plan(st.name), opt)
                except _Unplaceable as e:
                    self._notes[e.where] = f"optimizer state not imported: {e.why}"
            self._opt_plans = plans
        return self._opt_plans

    # ---- values
    def _find_notes(self) -> None:
        """Fills the notes of everything not read (optimizer, scheduler, RNG)."""
        self._optimizer_plans()
        self._lr_scheduler()
        if self._random_note is not None:
            self._notes[os.path.join(self.path, "random")] = self._random_note

    def _nanotron_values(self) -> dict[str, Any]:
        nano: dict[str, Any] = {"checkpoint_metadata": self._meta, "tied_parameters": TIED_NOTE}
        model_config = os.path.join(self.path, "model_config.json")
        if os.path.isfile(model_config):
            nano["model_config"] = _read_json(model_config, self.path)
        config_yaml = os.path.join(self.path, "config.yaml")
        if os.path.isfile(config_yaml):
            nano["config_yaml"] = _read_text(config_yaml, self.path)
        nwd = {}
        for key in self._files:
            path = self._plan(key).no_weight_decay_file
            if path is not None:
                nwd[key] = bool(read_tensor(path, key, self.path, "_no_weight_decay").item())
        if nwd:
            nano["no_weight_decay"] = nwd
        nano["not_imported"] = dict(sorted(self._notes.items()))
        return nano

    def _lr_scheduler(self) -> Any:
        """The scheduler's state dict (read once); a file weights_only
        refuses is noted, not read."""
        if self._scheduler is None:
            self._scheduler = (self._read_lr_scheduler(),)
        return self._scheduler[0]

    def _read_lr_scheduler(self) -> Any:
        directory = os.path.join(self.path, "lr_scheduler")
        if not os.path.isdir(directory):
            return None
        found = {}
        for name in sorted(os.listdir(directory)):
            if name.endswith(".pt"):
                path = os.path.join(directory, name)
                try:
                    state = torch_load(path, unsafe_pickle=self._unsafe_pickle, within=self.path)
                    found[name[:-3]] = as_dicts(state)
                except PickleRefusedError as e:
                    self._notes[path] = e.reason
        if list(found) == ["lr_scheduler"]:
            return found["lr_scheduler"]
        return found or None


def open_checkpoint(path: str | os.PathLike, unsafe_pickle: bool = False) -> NanotronCheckpoint:
    return NanotronCheckpoint(path, unsafe_pickle=unsafe_pickle)


FORMAT = Format("nanotron", detect, open_checkpoint)
