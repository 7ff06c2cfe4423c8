"""DeepSpeed ZeRO partitions rebuilt into global tensors, as DeepSpeed's
zero_to_fp32 rebuilds them: the part of shardsafe.foreign.deepspeed that reads the
optimizer-states files (`add_zero(ck)` lists every key of them on the
reader `ck`).

ZeRO-1/2 (zero_to_fp32 _zero2_merge_trainable_params): per parameter group,
the DP ranks' saved partitions (padding stripped) joined in rank order form
the flat group; parameters follow each other in param_shapes order,
separated by param_alignment_paddings. All partitions have one padded size P
(saved numel + group_paddings), so rank r's data starts at r * P. ZeRO-3
(_zero3_merge_trainable_params): each parameter is split into DP-many pieces
of ceil(numel / dp); every rank holds its piece of every parameter back to
back (across its sub-groups, in param_shapes order); the pieces of all ranks
joined, cut to numel, make the parameter. Optimizer state tensors have the
layout of the fp32 partition they belong to. A read opens only the rank
files whose partitions cover the key.

The reader `ck` (shardsafe.foreign.deepspeed.DeepSpeedCheckpoint, seen here
as the ZeroCheckpoint it is) gives: `ms` (the rank-0 model-states dict),
`osd0` (rank 0's optimizer_state_dict), `stage`, `world` (the DP size),
`files` (path(name), get(name, key)), `optim_name(r)`, `osd(r, key)`,
`where()` (the model-states file), `add(key, dtype, shape, read)`, and
collects `skipped` {key: why}, `state_values`, `param_groups` and
`consolidated` (zero_to_fp32's names, in its order).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any, Protocol

import torch

from ..errors import CorruptCheckpointError

Reader = Callable[[str], torch.Tensor]  # read(key): the key names it in errors
_Entry = tuple[torch.dtype, tuple[int, ...], Reader]


class ZeroCheckpoint(Protocol):
    """What this module reads of, and records on, the DeepSpeed reader
    (module doc)."""

    ms: Mapping[str, Any]
    osd0: dict[str, Any]
    stage: int
    world: int
    files: Any  # path(name) -> str, get(name, key) -> the unpickled file
    skipped: dict[str, str]
    state_values: dict[str, dict[str, Any]]
    param_groups: list[dict[str, Any]]
    consolidated: list[str]

    def where(self) -> str: ...

    def optim_name(self, rank: int) -> str: ...

    def osd(self, rank: int, key: str) -> dict[str, Any]: ...

    def add(self, key: str, dtype: torch.dtype, shape: tuple[int, ...], read: Reader) -> None: ...


def add_zero(ck: ZeroCheckpoint) -> None:
    """Lists the consolidated parameters and the optimizer state of a ZeRO
    1-3 checkpoint (ck.stage) on `ck`."""
    (Zero3 if ck.stage == 3 else Zero12)(ck).add()


def get_field(obj: Any, path: tuple[Any, ...], where: str, key: str) -> Any:
    """obj[p0][p1]..., or a CorruptCheckpointError naming what is missing."""
    for p in path:
        try:
            obj = obj[p]
        except (KeyError, IndexError, TypeError):
            dotted = "/".join(map(str, path))
            need = f" (needed for {key})" if key else ""
            raise CorruptCheckpointError(
                f"{where}: no {dotted} in this DeepSpeed file{need}", "DATA_LOSS") from None
    return obj


def copy_range(parts: list[torch.Tensor], start: int, length: int, out: torch.Tensor) -> None:
    """out[:] = the elements [start, start + length) of the parts joined."""
    base = 0
    done = 0
    for t in parts:
        n = t.numel()
        lo, hi = max(start + done, base), min(start + length, base + n)
        if lo < hi:
            out[done:done + hi - lo].copy_(t.reshape(-1)[lo - base:hi - base])
            done += hi - lo
        base += n
        if done == length:
            return
    raise AssertionError("range past the parts")  # callers check the sizes first


# -------------------------------------------- zero_to_fp32 names, shared --

def _add_consolidated(ck: ZeroCheckpoint,
                      trained: list[tuple[str, torch.dtype, tuple[int, ...], Reader]],
                      frozen: Callable[[str, tuple[int, ...]], tuple[torch.dtype, Reader]]
                      ) -> None:
    """The keys of zero_to_fp32's state dict in its order: buffers, frozen
    parameters, trained parameters, tied aliases."""
    ms = ck.ms
    plan: dict[str, _Entry] = {}
    buffer_names = set(ms.get("buffer_names") or [])
    for name, t in ms["module"].items():
        if name in buffer_names and isinstance(t, torch.Tensor):
            dtype = torch.float32 if t.is_floating_point() else t.dtype
            plan[name] = (dtype, tuple(t.shape), _buffer_reader(ck, name))
    for name, shape in (ms.get("frozen_param_shapes") or {}).items():
        dtype, read = frozen(name, tuple(shape))
        plan[name] = (dtype, tuple(int(s) for s in shape), read)
    for name, dtype, shape, read in trained:
        plan[name] = (dtype, shape, read)
    for alias, source in (ms.get("shared_params") or {}).items():
        if source in plan:
            dtype, shape, read = plan[source]
            plan[alias] = (dtype, shape, _alias_reader(read, source))
    ck.consolidated = list(plan)
    for name, (dtype, shape, read) in plan.items():
        ck.add(name, dtype, shape, read)


def _buffer_reader(ck: ZeroCheckpoint, name: str) -> Reader:
    def read(key: str) -> torch.Tensor:
        t = ck.ms["module"][name]
        if t.is_floating_point() and t.dtype != torch.float32:
            return t.float()
        return t.detach().clone()
    return read


def _alias_reader(read: Reader, source: str) -> Reader:
    return lambda key: read(source)


def _state_tensors(state: Any) -> dict[str, Any]:
    return dict(state) if isinstance(state, Mapping) else {}


def _record_scalars(ck: ZeroCheckpoint, names: list[str], state: Mapping[str, Any]) -> None:
    """Non-tensor per-group optimizer state (an int step of older torch): values."""
    for k, v in state.items():
        if not isinstance(v, torch.Tensor):
            for n in names:
                ck.state_values.setdefault(n, {})[k] = v


def _groups_values(ck: ZeroCheckpoint, groups: Any, names: list[list[str]]) -> None:
    out = []
    for i, group_names in enumerate(names):
        g = groups[i] if isinstance(groups, list) and i < len(groups) else {}
        hyper = {k: v for k, v in g.items() if k != "params"} if isinstance(g, Mapping) else {}
        out.append({**hyper, "params": list(group_names)})
    ck.param_groups = out


# ------------------------------------------------------------ ZeRO 1/2 --

class Zero12:
    """ZeRO-1/2: one flat fp32 group per parameter group, cut into DP-many
    partitions of one padded size; rank r's data starts at r * P."""

    def __init__(self, ck: ZeroCheckpoint) -> None:
        self.ck = ck
        osd0 = ck.osd0
        where0 = ck.files.path(ck.optim_name(0))
        shapes = param_shapes(ck)
        flat0 = _tensor_list(osd0, "single_partition_of_fp32_groups", where0)
        pads0 = get_field(osd0, ("group_paddings",), where0, "")
        if not (len(shapes) == len(flat0) and isinstance(pads0, list) and len(pads0) == len(flat0)
                and all(isinstance(p, int) and p >= 0 for p in pads0)):
            raise CorruptCheckpointError(f"{where0}: {len(flat0)} fp32 groups and group_paddings "
                                         f"{pads0!r} for {len(shapes)} param_shapes groups in "
                                         f"{ck.where()}", "DATA_LOSS")
        align = osd0.get("param_alignment_paddings")
        self.part: list[int] = []  # padded partition size per group
        # name -> (group, offset in the flat group, numel, shape)
        self.params: dict[str, tuple[int, int, int, tuple[int, ...]]] = {}
        self.names: list[list[str]] = []
        for g, group in enumerate(shapes):
            self.part.append(int(flat0[g].numel()) + int(pads0[g]))
            paddings = align[g] if isinstance(align, list) and g < len(align) else [0] * len(group)
            if len(paddings) != len(group):
                raise CorruptCheckpointError(
                    f"{where0}: {len(paddings)} parameter alignment paddings for the "
                    f"{len(group)} parameters of group {g}", "DATA_LOSS")
            offset = 0
            for (name, shape), pad in zip(group.items(), paddings):
                if name in self.params:
                    raise CorruptCheckpointError(
                        f"{ck.where()}: parameter {name!r} in param_shapes groups "
                        f"{self.params[name][0]} and {g}", "DATA_LOSS")
                numel = math.prod(shape)
                self.params[name] = (g, offset, numel, shape)
                offset += numel + int(pad)
            if offset > self.part[g] * ck.world:
                raise CorruptCheckpointError(
                    f"{where0}: parameter group {g} needs {offset} elements but its {ck.world} "
                    f"partitions of {self.part[g]} hold {self.part[g] * ck.world}", "DATA_LOSS")
            self.names.append(list(group))
        base = get_field(osd0, ("base_optimizer_state",), where0, "")
        self.rigid = isinstance(base, Mapping)  # torch state_dict; else "elastic": a list per group
        self.dtypes = [t.dtype for t in flat0]

    def _group_state(self, osd: Mapping[str, Any], g: int, where: str, key: str) -> dict[str, Any]:
        base = get_field(osd, ("base_optimizer_state",), where, key)
        if isinstance(base, Mapping):
            params = get_field(base, ("param_groups", g, "params"), where, key)
            return _state_tensors(base.get("state", {}).get(params[0])) if params else {}
        return _state_tensors(get_field(base, (g,), where, key))

    def _partition(self, r: int, g: int, state: str | None, key: str) -> tuple[torch.Tensor, int]:
        """Rank r's partition of group g (fp32 or a state) and its unpadded
        size, checked."""
        ck = self.ck
        osd = ck.osd(r, key)
        where = ck.files.path(ck.optim_name(r))
        flat = get_field(osd, ("single_partition_of_fp32_groups", g), where, key)
        pad = get_field(osd, ("group_paddings", g), where, key)
        lean = int(flat.numel())
        if lean + int(pad) != self.part[g]:
            raise CorruptCheckpointError(
                f"{where}: {key}: partition of group {g} is {lean} + {pad} padding elements, "
                f"rank 0's is {self.part[g]}: mismatched partition sizes", "DATA_LOSS")
        t = flat if state is None else self._group_state(osd, g, where, key).get(state)
        want = self.part[g] if state is not None and self._rigid(osd) else lean
        dtype = self.dtypes[g] if state is None else self._state0[g][state].dtype
        if not isinstance(t, torch.Tensor) or t.numel() != want or t.dtype != dtype:
            got = f"{t.numel()} {t.dtype} elements" if isinstance(t, torch.Tensor) else "none"
            raise CorruptCheckpointError(f"{where}: {key}: {state or 'fp32'} partition of group "
                                         f"{g}: {got}, expected {want} {dtype} as on rank 0",
                                         "DATA_LOSS")
        return t, lean

    @staticmethod
    def _rigid(osd: Mapping[str, Any]) -> bool:
        return isinstance(osd.get("base_optimizer_state"), Mapping)

    def _read_flat(self, name: str, state: str | None, key: str) -> torch.Tensor:
        g, offset, numel, shape = self.params[name]
        part = self.part[g]
        dtype = self.dtypes[g] if state is None else self._state0[g][state].dtype
        out = torch.empty(numel, dtype=dtype)
        pos, end = offset, offset + numel
        while pos < end:
            r = pos // part
            lo, hi = pos - r * part, min(part, end - r * part)
            t, lean = self._partition(r, g, state, key)
            if lean < hi:
                raise CorruptCheckpointError(
                    f"{self.ck.files.path(self.ck.optim_name(r))}: {key}: partition of group "
                    f"{g} holds {lean} elements, the parameter needs up to {hi}", "DATA_LOSS")
            out[pos - offset:pos - offset + hi - lo].copy_(t.reshape(-1)[lo:hi])
            pos = r * part + hi
        return out.view(shape)

    def add(self) -> None:
        ck = self.ck
        trained = [(name, self.dtypes[g], shape, self._reader(name, None))
                   for name, (g, _, _, shape) in self.params.items()]
        _add_consolidated(ck, trained, self._frozen)
        where0 = ck.files.path(ck.optim_name(0))
        self._state0 = [self._group_state(ck.osd0, g, where0, "") for g in range(len(self.part))]
        lean0 = [t.numel() for t in ck.osd0["single_partition_of_fp32_groups"]]
        want = self.part if self.rigid else lean0
        for g, state in enumerate(self._state0):
            _record_scalars(ck, self.names[g], state)
            for k, t in state.items():
                if not isinstance(t, torch.Tensor):
                    continue
                for name in self.names[g]:
                    key, shape = f"optimizer.state.{name}.{k}", self.params[name][3]
                    if t.dim() == 0:
                        ck.add(key, t.dtype, (), _scalar_reader(t))
                    elif t.numel() == want[g]:
                        ck.add(key, t.dtype, shape, self._reader(name, k))
                    else:
                        ck.skipped[key] = f"{t.numel()} elements, not the partition's {want[g]}"
        base = ck.osd0.get("base_optimizer_state")
        groups = base.get("param_groups") if isinstance(base, Mapping) else None
        _groups_values(ck, groups, self.names)

    def _reader(self, name: str, state: str | None) -> Reader:
        return lambda key: self._read_flat(name, state, key)

    def _frozen(self, name: str, shape: tuple[int, ...]) -> tuple[torch.dtype, Reader]:
        """ZeRO-1/2 save frozen parameters whole in the model-states file."""
        ck = self.ck
        t = get_field(ck.ms, ("frozen_param_fragments", name), ck.where(),
                   f"frozen parameter {name}")

        def read(key: str) -> torch.Tensor:
            if t.numel() != math.prod(shape):
                raise CorruptCheckpointError(
                    f"{ck.where()}: {key}: frozen parameter holds {t.numel()} elements, its "
                    f"shape {list(shape)} needs {math.prod(shape)}", "DATA_LOSS")
            return t.detach().clone().view(shape)
        return t.dtype, read


def param_shapes(ck: ZeroCheckpoint) -> list[dict[str, tuple[int, ...]]]:
    """The model-states file's param_shapes: per group, name -> shape."""
    groups = get_field(ck.ms, ("param_shapes",), ck.where(), "")
    try:
        out = [{str(n): tuple(int(d) for d in s) for n, s in g.items()} for g in groups]
    except (AttributeError, TypeError, ValueError):
        out = None
    if (not isinstance(groups, list) or out is None
            or any(d < 0 for g in out for s in g.values() for d in s)):
        raise CorruptCheckpointError(
            f"{ck.where()}: param_shapes is not a list of name -> shape maps", "DATA_LOSS")
    return out


def _tensor_list(osd: Mapping[str, Any], name: str, where: str) -> list[torch.Tensor]:
    value = get_field(osd, (name,), where, "")
    if not isinstance(value, list) or not all(isinstance(t, torch.Tensor) for t in value):
        raise CorruptCheckpointError(f"{where}: {name} is not a list of tensors", "DATA_LOSS")
    return value


def _scalar_reader(t: torch.Tensor) -> Reader:
    return lambda key: t.detach().clone()


# -------------------------------------------------------------- ZeRO-3 --

class Zero3:
    """ZeRO-3: every parameter cut into DP-many pieces of ceil(numel / dp);
    each rank's pieces follow each other across its fp32 sub-groups."""

    def __init__(self, ck: ZeroCheckpoint) -> None:
        self.ck = ck
        where0 = ck.files.path(ck.optim_name(0))
        shapes = param_shapes(ck)
        flat0 = _tensor_list(ck.osd0, "fp32_flat_groups", where0)
        self.sizes = [int(t.numel()) for t in flat0]
        self.starts = [0]
        for n in self.sizes:
            self.starts.append(self.starts[-1] + n)
        if len({t.dtype for t in flat0}) > 1:
            raise CorruptCheckpointError(f"{where0}: fp32_flat_groups of mixed dtypes", "DATA_LOSS")
        self.dtype = flat0[0].dtype if flat0 else torch.float32
        self._dtypes: dict[str, torch.dtype] = {}  # optimizer state -> dtype on rank 0
        # name -> (offset in each rank's stream, piece size, numel, shape)
        self.params: dict[str, tuple[int, int, int, tuple[int, ...]]] = {}
        offset = 0
        for group in shapes:
            for name, shape in group.items():
                if name in self.params:
                    raise CorruptCheckpointError(
                        f"{ck.where()}: parameter {name!r} twice in param_shapes", "DATA_LOSS")
                numel = math.prod(shape)
                piece = math.ceil(numel / ck.world)
                self.params[name] = (offset, piece, numel, shape)
                offset += piece
        if offset != self.starts[-1]:
            raise CorruptCheckpointError(
                f"{where0}: fp32 partitions hold {self.starts[-1]} elements per rank, the "
                f"parameters' pieces need {offset}", "DATA_LOSS")

    def _stream(self, r: int, state: str | None, key: str) -> list[torch.Tensor]:
        """Rank r's sub-group tensors (fp32 or a state), sizes checked."""
        ck = self.ck
        osd = ck.osd(r, key)
        where = ck.files.path(ck.optim_name(r))
        if state is None:
            parts = get_field(osd, ("fp32_flat_groups",), where, key)
        else:
            base = get_field(osd, ("optimizer_state_dict",), where, key)
            order = _flat_param_ids(base)
            states = base.get("state", {}) if isinstance(base, Mapping) else {}
            parts = [_state_tensors(states.get(i)).get(state) for i in order]
        what = "fp32" if state is None else repr(state)
        sizes = [int(t.numel()) if isinstance(t, torch.Tensor) else -1 for t in parts]
        if sizes != self.sizes:
            raise CorruptCheckpointError(
                f"{where}: {key}: {what} sub-group sizes {sizes}, rank 0's fp32 sizes "
                f"{self.sizes}: mismatched partition sizes", "DATA_LOSS")
        dtype = self.dtype if state is None else self._dtypes[state]
        if any(t.dtype != dtype for t in parts):
            raise CorruptCheckpointError(
                f"{where}: {key}: {what} sub-groups are not all {dtype} as on rank 0", "DATA_LOSS")
        return parts

    def _read(self, name: str, state: str | None, key: str) -> torch.Tensor:
        offset, piece, numel, shape = self.params[name]
        dtype = self.dtype if state is None else self._dtypes[state]
        out = torch.empty(numel, dtype=dtype)
        for r in range(self.ck.world):
            lo = r * piece
            if lo >= numel:
                break
            take = min(piece, numel - lo)
            copy_range(self._stream(r, state, key), offset, take, out[lo:lo + take])
        return out.view(shape)

    def add(self) -> None:
        ck = self.ck
        trained = [(name, self.dtype, shape, self._reader(name, None))
                   for name, (_, _, _, shape) in self.params.items()]
        _add_consolidated(ck, trained, self._frozen)
        self._add_optimizer()

    def _sub_groups(self, name: str) -> range:
        offset, piece, _, _ = self.params[name]
        if not self.sizes:
            return range(0)
        first = max(k for k in range(len(self.sizes)) if self.starts[k] <= offset)
        last = first
        while last + 1 < len(self.sizes) and self.starts[last + 1] < offset + piece:
            last += 1
        return range(first, last + 1)

    def _add_optimizer(self) -> None:
        ck = self.ck
        where0 = ck.files.path(ck.optim_name(0))
        base = get_field(ck.osd0, ("optimizer_state_dict",), where0, "")
        order = _flat_param_ids(base)
        groups = base.get("param_groups") if isinstance(base, Mapping) else None
        if len(order) != len(self.sizes):
            ck.skipped["optimizer.state"] = (
                f"{len(order)} optimizer parameters for {len(self.sizes)} fp32 sub-groups: "
                f"cannot be placed")
            return
        states = [_state_tensors(base.get("state", {}).get(i)) for i in order]
        group_of = [g for g, group in enumerate(groups or []) for _ in group.get("params", [])]
        names: list[list[str]] = [[] for _ in (groups or [])]
        for name, (_, _, _, shape) in self.params.items():
            subs = self._sub_groups(name)
            if not subs:
                continue
            if group_of and len({group_of[k] for k in subs}) == 1:
                names[group_of[subs[0]]].append(name)
            first = states[subs[0]]
            _record_scalars(ck, [name], first)
            for k, t in first.items():
                if not isinstance(t, torch.Tensor):
                    continue
                if t.dim() == 0:
                    ck.add(f"optimizer.state.{name}.{k}", t.dtype, (), _scalar_reader(t))
                elif all(isinstance(states[s].get(k), torch.Tensor)
                         and states[s][k].numel() == self.sizes[s] for s in subs):
                    self._dtypes[k] = t.dtype
                    ck.add(f"optimizer.state.{name}.{k}", t.dtype, shape, self._reader(name, k))
                else:
                    ck.skipped[f"optimizer.state.{name}.{k}"] = "not laid out like the fp32"
        _groups_values(ck, groups, names)

    def _reader(self, name: str, state: str | None) -> Reader:
        return lambda key: self._read(name, state, key)

    def _frozen(self, name: str, shape: tuple[int, ...]) -> tuple[torch.dtype, Reader]:
        """ZeRO-3 saves each rank's piece of a frozen parameter in that rank's
        model-states file."""
        ck = self.ck
        first = get_field(ck.ms, ("frozen_param_fragments", name), ck.where(),
                       f"frozen parameter {name}")
        numel = math.prod(shape)
        piece = math.ceil(numel / ck.world)

        def read(key: str) -> torch.Tensor:
            out = torch.empty(numel, dtype=first.dtype)
            for r in range(ck.world):
                lo = r * piece
                if lo >= numel:
                    break
                file = f"zero_pp_rank_{r}_mp_rank_00_model_states.pt"
                state = ck.files.get(file, key)
                t = get_field(state, ("frozen_param_fragments", name), ck.files.path(file), key)
                if t.numel() != piece or t.dtype != first.dtype:
                    raise CorruptCheckpointError(
                        f"{ck.files.path(file)}: {key}: frozen piece of {t.numel()} {t.dtype} "
                        f"elements, expected {piece} {first.dtype}: mismatched partition sizes",
                        "DATA_LOSS")
                take = min(piece, numel - lo)
                out[lo:lo + take].copy_(t.reshape(-1)[:take])
            return out.view(shape)
        return first.dtype, read


def _flat_param_ids(base: Any) -> list[Any]:
    """The optimizer's parameter ids in param_groups order (one per sub-group)."""
    groups = base.get("param_groups") if isinstance(base, Mapping) else None
    return [i for g in groups or [] if isinstance(g, Mapping) for i in g.get("params", [])]
