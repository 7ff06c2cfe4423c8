"""load(state, path, fmt): shardsafe.load of another tool's checkpoint. The
format's own load (Format.own_load: torch DCP's resharding load) where the
format has one and it knows every target (no shardsafe.Sharded parts, no
skip_keys; agreed by every rank), else through the format's reader: each
of the state's tensor targets (plain tensors, DTensor shards,
shardsafe.Sharded parts, flat ranges included) gets its box of the global
tensor of its key: each key this rank needs is read once (`read(key)`, or
`read_box` where the format has it and the targets are boxes, not the
whole tensor) and copied into every target of it, then dropped, so memory
is about the largest tensor. Values come from `values()`, looked up by
the state's key paths ("optim.param_groups" finds values()["optim"]
["param_groups"]); a tensor the format keeps among its values (an RNG
state) loads like a tensor. A PerRank with group= (shardsafe.PerRank)
gets the reader's tensor __shardsafe__/group/G/KEY of its group rank G
(nanotron's random states), decoded as a native load does; a group rank
the reader has none for is "KEY[group rank G]", missing, a saved one no
rank loads unexpected (fatal under per_rank_strict). Strict key matching and its report are the
native load's: a key missing on any rank, or saved and wanted by no rank,
is a KeyMismatchError on every rank before anything changes (one
all_gather); a failure reading on any rank is raised on every rank (one
more). Every rank reads what it needs itself: no data moves between ranks.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from .._boxes import Boxes, dtype_name
from .._comm import agree, resolve
from .._json import from_json, join, to_json
from .._key_check import Agreement, Report
from .._parts import (PerRank, Sharded, decode_per_rank, group_rank, group_tensor_name,
                      parse_group_tensor_name)
from .._result import LoadResult
from .._state import Flat, flatten, holds, rebuild
from ..errors import DTypeMismatchError, InvalidStateError, ShapeMismatchError
from .reader import ForeignCheckpoint, Format, checked


def load(state_dict: Any, path: str, fmt: Format, *, strict: bool = True,
         process_group: dist.ProcessGroup | None = None, unsafe_pickle: bool = False,
         convert_dtypes: bool = False, skip: Callable[[str], bool] | None = None,
         mapped: bool = False, per_rank_strict: bool = True) -> LoadResult:
    """shardsafe.load of the checkpoint at `path` that format `fmt` claims
    (formats.detect) into `state_dict` in place; returns a
    shardsafe.LoadResult. Collective over `process_group` (module doc).
    `mapped`: the caller passed rename or experts, which only a shardsafe
    checkpoint loads with (an InvalidStateError)."""
    if mapped:
        raise InvalidStateError(f"{path} is a {fmt.name} checkpoint: rename and experts need a "
                                f"shardsafe one (shardsafe import SRC DST)")
    if fmt.own_load is not None and _own_load_knows(state_dict, skip, process_group):
        missing, unexpected, seconds = fmt.own_load(state_dict, path, strict=strict,
                                                    process_group=process_group,
                                                    unsafe_pickle=unsafe_pickle)
        return LoadResult(path, os.path.basename(os.path.normpath(path)), missing, unexpected,
                          None, 0, seconds, 0, {})
    return _load_read(state_dict, path, fmt, strict, process_group, unsafe_pickle,
                      convert_dtypes, skip, per_rank_strict)


def _own_load_knows(state_dict: Any, skip: Callable[[str], bool] | None,
                    process_group: dist.ProcessGroup | None) -> bool:
    """Whether a format's own load knows every target on every rank (one
    way on every rank): no skip_keys, no shardsafe.Sharded parts."""
    generic = skip is not None or holds(state_dict, lambda v: isinstance(v, Sharded))
    comm = resolve(process_group)
    if comm is not None:
        generic = any(agree(comm, None, generic))
    return not generic


@dataclass
class _Target:
    """One box (or flat range of a box) of a global tensor that a state
    tensor on this rank holds."""

    key: str
    dest: torch.Tensor  # shaped `size`; for a flat range, any shape with that many elements
    shape: tuple[int, ...]  # global
    offset: tuple[int, ...]
    size: tuple[int, ...]
    flat: tuple[int, int] | None = None


def _targets(flat: Flat) -> list[_Target]:
    box = Boxes()
    out = []
    for leaf in flat.tensors:
        b = box(leaf.key, leaf.tensor)
        out.append(_Target(leaf.key, b.local, b.shape, b.offset, b.size))
    for key, sharded in flat.sharded.items():
        for p in sharded.parts:
            out.append(_Target(key, p.local, sharded.shape, p.offset, p.size, p.flat))
    for t in out:
        dtype_name(t.key, t.dest)
        if t.dest.is_meta:
            raise InvalidStateError(f"tensor {t.key!r} is on the meta device: it has no memory "
                                    f"to load into (materialize the model first, e.g. "
                                    f"module.to_empty(device=...))")
    return out


def _index(values: Any, prefix: str = "", out: dict | None = None) -> dict[str, Any]:
    """Every node of the nested values by its joined key path."""
    out = {} if out is None else out
    if isinstance(values, Mapping):
        items = values.items()
    elif isinstance(values, (list, tuple)) and prefix:
        items = enumerate(values)
    else:
        return out
    for k, v in items:
        key = join(prefix, k)
        out[key] = v
        _index(v, key, out)
    return out


def _unwanted(values: Any, wanted: set[str], prefix: str = "") -> list[str]:
    """The largest subtrees of the nested values that no wanted key reaches."""
    out = []
    items = values.items() if isinstance(values, Mapping) else enumerate(values)
    for k, v in items:
        key = join(prefix, k)
        if key in wanted:
            continue
        below = key + "."
        if isinstance(v, (Mapping, list, tuple)) and v and any(w.startswith(below)
                                                               for w in wanted):
            out += _unwanted(v, wanted, key)
        else:
            out.append(key)
    return out


@dataclass
class _Match:
    """This rank's key matching: where each target reads from, and the report."""

    saved: dict[str, tuple[torch.dtype, tuple[int, ...]]]
    values: dict[str, Any]
    index: dict[str, Any]
    targets: list[_Target]
    missing: list[str]
    unexpected: list[str]
    # Grouped PerRank values: {KEY: (group rank, its target)} this rank
    # loads, the "KEY[group rank G]" missing here, and {KEY: the group
    # ranks the checkpoint holds}.
    grouped: dict[str, tuple[int, _Target]]
    per_rank_missing: list[str]
    saved_groups: dict[str, list[int]]

    def report(self) -> Report:
        """This rank's report to the key check (_key_check.Agreement)."""
        return Report(self.missing, self.unexpected, [], [], self.per_rank_missing, [],
                      {k: g for k, (g, _) in self.grouped.items()}, self.saved_groups)


def _grouped(flat: Flat, saved: Mapping[str, tuple], rank: int
             ) -> tuple[dict[str, tuple[int, _Target]], list[str], dict[str, list[int]]]:
    """_Match's grouped fields: each grouped PerRank's target (a U8 tensor
    of its saved tensor's size), what this rank misses, and the saved
    group ranks of its keys."""
    grouped, missing = {}, []
    ranks = {k: g for k, v in flat.per_rank.items()
             if (g := group_rank(v, k, rank)) is not None}
    for key, g in ranks.items():
        found = saved.get(group_tensor_name(key, g))
        if found is None:
            missing.append(f"{key}[group rank {g}]")
            continue
        shape = tuple(found[1])
        grouped[key] = (g, _Target(group_tensor_name(key, g), torch.empty(shape, dtype=torch.uint8),
                                   shape, (0,) * len(shape), shape))
    saved_groups: dict[str, list[int]] = {}
    for name in saved:
        parsed = parse_group_tensor_name(name)
        if parsed is not None and parsed[0] in ranks:
            saved_groups.setdefault(parsed[0], []).append(parsed[1])
    return grouped, missing, saved_groups


def _match(flat: Flat, fc: ForeignCheckpoint, convert: bool,
           skip: Callable[[str], bool] | None, rank: int = 0) -> _Match:
    saved = fc.tensors()
    values = fc.values()
    index = _index(values)
    targets, missing = [], []
    for t in _targets(flat):
        found = saved.get(t.key)
        if found is None and isinstance(index.get(t.key), torch.Tensor):
            found = (index[t.key].dtype, tuple(index[t.key].shape))
        if found is None:
            if t.key not in missing:
                missing.append(t.key)
            continue
        dtype, shape = found
        if tuple(shape) != t.shape:
            raise ShapeMismatchError(f"{fc.path}: tensor {t.key!r}: shape mismatch: checkpoint "
                                     f"has {list(shape)}, target has {list(t.shape)}",
                                     "INVALID_ARGUMENT")
        if dtype != t.dest.dtype and not convert:
            raise DTypeMismatchError(f"{fc.path}: tensor {t.key!r}: dtype mismatch: checkpoint "
                                     f"has {dtype}, target has {t.dest.dtype} (allow conversion "
                                     f"with convert_dtypes)", "INVALID_ARGUMENT")
        targets.append(t)
    missing += [k for k in flat.values if k not in index]
    grouped, pr_missing, saved_groups = _grouped(flat, saved, rank)
    # Without a group: no foreign format has shardsafe's per-rank values.
    missing += [k for k, v in flat.per_rank.items() if v.group is None]
    targets += [t for _, t in grouped.values()]
    wanted = {t.key for t in targets} | set(flat.values) | set(flat.per_rank)
    in_groups = {k: parse_group_tensor_name(k) for k in saved}
    unexpected = sorted({k for k in saved if k not in wanted and in_groups[k] is None}
                        | {g[0] for g in in_groups.values() if g and g[0] not in wanted}
                        | (set(_unwanted(values, wanted)) - set(saved)))
    if skip is not None:
        unexpected = [k for k in unexpected if not skip(k)]
    return _Match(saved, values, index, targets, missing, unexpected, grouped, pr_missing,
                  saved_groups)


def _copy(t: _Target, box: torch.Tensor, whole: bool) -> None:
    """Copies target `t`'s part from `box`: the global tensor (whole) or
    exactly t's box."""
    src = box[tuple(slice(o, o + s) for o, s in zip(t.offset, t.size))] if whole else box
    if t.flat is None:
        t.dest.copy_(src)
        return
    try:
        dest = t.dest.view(-1)
    except RuntimeError:
        raise InvalidStateError(f"tensor {t.key!r}: a flat range loads into a tensor that can "
                                f"be viewed as 1-D (a contiguous one)") from None
    dest.copy_(src.reshape(-1)[t.flat[0]:t.flat[1]])


def _read_all(m: _Match, fc: ForeignCheckpoint) -> int:
    """Reads each key this rank's targets need, once, into its targets;
    returns the bytes read."""
    by_key: dict[str, list[_Target]] = {}
    for t in m.targets:
        by_key.setdefault(t.key, []).append(t)
    read_box = getattr(fc, "read_box", None)
    nbytes = 0
    with torch.no_grad():
        for key in sorted(by_key):
            targets = by_key[key]
            if key not in m.saved:  # a tensor among the values
                for t in targets:
                    _copy(t, m.index[key], whole=True)
                continue
            covered = sum(math.prod(t.size) for t in targets)
            if (read_box is not None and covered < math.prod(targets[0].shape)
                    and all(t.flat is None for t in targets)):
                for t in targets:  # each box alone: only the chunks that hold it
                    box = read_box(key, t.offset, t.size)
                    nbytes += box.numel() * box.element_size()
                    _copy(t, checked(fc, key, box, tuple(t.size), m.saved[key][0]), whole=False)
                continue
            whole = checked(fc, key, fc.read(key), m.saved[key][1], m.saved[key][0])
            nbytes += whole.numel() * whole.element_size()
            for t in targets:
                _copy(t, whole, whole=True)
            del whole
    return nbytes


def _value(saved: Any, like: Any) -> Any:
    """A saved value shaped after the target's (tuples, int dict keys), as a
    native load gives it; one JSON cannot hold as it is."""
    try:
        return from_json(to_json(saved, "value"), like)
    except InvalidStateError:
        return saved


def _per_rank(key: str, old: PerRank, m: _Match, path: str) -> PerRank:
    """A grouped PerRank given its group rank's saved value (read into its
    target); any other kept as it is."""
    found = m.grouped.get(key)
    if found is not None:
        g, t = found
        old.value = decode_per_rank(t.dest.numpy().tobytes(), old.value, key, path,
                                    f"group rank {g}")
    return old


def _load_read(state_dict: Any, path: str, fmt: Format, strict: bool,
               process_group: dist.ProcessGroup | None, unsafe_pickle: bool, convert_dtypes: bool,
               skip: Callable[[str], bool] | None, per_rank_strict: bool = True) -> LoadResult:
    """load() through the format's reader (`fmt.open`): every target gets
    its box of the global tensor of its key (module doc)."""
    start = time.monotonic()
    comm = resolve(process_group)
    fc = m = flat = error = report = None
    try:
        fc = fmt.open(path, unsafe_pickle=unsafe_pickle)
        flat = flatten(state_dict, for_load=True)
        if skip is not None:
            flat.drop(skip)
        m = _match(flat, fc, convert_dtypes, skip, comm.rank if comm is not None else 0)
        report = m.report().__dict__
    except Exception as e:  # noqa: BLE001 - every rank must reach the agreement
        error = e
    try:
        agreed = Agreement(strict, per_rank_strict, None, path)
        agreed.check(agree(comm, error, report))
        error = None
        try:
            nbytes = _read_all(m, fc)
        except Exception as e:  # noqa: BLE001 - as above
            error, nbytes = e, 0
        agree(comm, error)
    finally:
        if fc is not None:
            fc.close()
    if flat.values or flat.state_dicts or flat.per_rank:
        rebuild(state_dict, flat, lambda key, t: None,
                lambda key, old: (_per_rank(key, old, m, path) if isinstance(old, PerRank)
                                  else old if key not in m.index
                                  else _value(m.index[key], old)))
    return LoadResult(path, os.path.basename(os.path.normpath(path)),
                      sorted(agreed.missing + agreed.per_rank_missing),
                      sorted(agreed.unexpected + agreed.per_rank_unused),
                      None, nbytes, time.monotonic() - start, 0, m.values)
