"""load: the checkpoint opened, the state walked, each target's reads
planned (renames, experts, FP8, flat ranges), keys matched across ranks,
the engine's load run, and values handed back."""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch
import torch.distributed as dist

from . import _C, _boxes, _device, _hub, _keys, _paths, foreign
from ._boxes import Box, Boxes, dtype_name, in_place
from ._comm import TorchComm, agree, failure_of, resolve
from ._engine import without_gc
from ._key_check import Agreement, Report
from ._options import LoadOptions
from ._parts import (PerRank, Sharded, decode_per_rank, group_rank, group_tensor_name,
                     parse_group_tensor_name)
from ._result import LoadResult
from ._state import (DTYPE_NAMES, PER_RANK_PREFIX, PICKLE_PREFIX, RESERVED_KEY, TORCH_DTYPES, Flat,
                     TensorLeaf, decode_value, decoded_values, flatten, rebuild)
from .errors import (CheckpointNotFoundError, CorruptCheckpointError, DTypeMismatchError,
                     InvalidStateError, KeyMismatchError, ShapeMismatchError, ShardsafeError)


@dataclass(slots=True)
class _Read:
    """One box of one checkpoint tensor and where it lands."""

    key: str  # checkpoint key
    shape: tuple[int, ...]  # its global shape
    offset: tuple[int, ...]
    size: tuple[int, ...]
    dest: torch.Tensor  # view of the target's local tensor, shaped `size` (1-D for `flat`)
    flat: tuple[int, int] | None = None  # the box's row-major elements [begin, end) only
    buf: torch.Tensor | None = None  # where the engine writes: dest itself when it can
    scale: tuple | None = None  # FP8 dequantisation: (key, shape, offset, size, dtype name)
    scale_buf: torch.Tensor | None = None


@dataclass
class _Plan:
    reads: list[_Read]
    # The engine's targets of whole tensors read straight into themselves,
    # planned by _plan_whole without a _Read each (None: none planned).
    whole: _C.WholeTargets | None
    missing: list[str]  # state keys
    used: set[str]  # checkpoint tensor keys some target reads
    notes: list[str]  # for the KeyMismatchError message


def _plan(flat: Flat, asked: _C.AskedTensors | None, keys: _keys.KeyMap, source: _C.OpenedSource,
          dequantize_fp8: bool, convert: bool) -> _Plan:
    """This rank's reads for the state's tensors, and what did not match;
    `asked` (_boxes.ask(flat.tensors)) or None turns the fast path on or off."""
    plan = _Plan([], None, [], set(), [])
    whole = asked is not None and not keys.renamed
    rest = _plan_whole(flat.tensors, asked, source, plan) if whole else flat.tensors
    if rest or flat.sharded:
        keys.materialize()
    box = Boxes()
    targets = [(leaf.key, box(leaf.key, leaf.tensor), None) for leaf in rest]
    for key, sharded in flat.sharded.items():
        targets += [(key, Box(p.local, sharded.shape, p.offset, p.size), p.flat)
                    for p in sharded.parts]
    for key, b, flat_range in targets:
        if b.local.is_meta:
            raise InvalidStateError(f"tensor {key!r} is on the meta device: it has no memory "
                                    f"to load into (materialize the model first, e.g. "
                                    f"module.to_empty(device=...))")
        src, note = keys.resolve(key, b.shape)
        if src is None:
            if key not in plan.missing:
                plan.missing.append(key)
                if note:
                    plan.notes.append(note)
            continue
        _plan_target(plan, keys, src, key, b, flat_range, dequantize_fp8, convert)
    return plan


def _plan_target(plan: _Plan, keys: _keys.KeyMap, src: _keys.Source, key: str, b: Box,
                 flat_range: tuple[int, int] | None, dequantize_fp8: bool,
                 convert: bool) -> None:
    """The reads of one target box (or flat range of a box) from `src`."""
    name = dtype_name(key, b.local)
    scales = {}
    for k in src.keys:
        plan.used.add(k)
        scale = _keys.fp8_scale(keys.saved, k, b.local.dtype) if dequantize_fp8 else None
        if scale is not None:
            plan.used.add(scale)
            scales[k] = scale
        elif k != key and keys.saved[k][0] != name and not convert:
            raise DTypeMismatchError(
                f"{src.label}: dtype mismatch: checkpoint has {keys.saved[k][0]}, target has "
                f"{name} (allow conversion with convert_dtypes)", "INVALID_ARGUMENT")
    if isinstance(src, _keys.Direct) and scales and keys.saved[src.keys[0]][1] != b.shape:
        raise ShapeMismatchError(
            f"{src.label}: shape mismatch: checkpoint has {list(keys.saved[src.keys[0]][1])}, "
            f"target has {list(b.shape)}", "INVALID_ARGUMENT")
    if flat_range is not None:
        if not isinstance(src, _keys.Direct) or scales:
            raise InvalidStateError(f"tensor {key!r}: a flat range loads only from a saved "
                                    f"tensor of its own shape (no expert merge or FP8 scales)")
        if flat_range[0] == flat_range[1] and math.prod(b.shape) != 0:
            return  # an empty range of a non-empty tensor reads nothing
        try:
            dest = b.local.view(-1)
        except RuntimeError:
            raise InvalidStateError(f"tensor {key!r}: a flat range loads into a tensor that "
                                    f"can be viewed as 1-D (a contiguous one)") from None
        plan.reads.append(_Read(src.keys[0], b.shape, b.offset, b.size, dest, flat_range))
        return
    for p in src.pieces(b.offset, b.size):
        # A direct target keeps its own shape: the engine checks it against the saved one.
        shape = b.shape if isinstance(src, _keys.Direct) else keys.saved[p.key][1]
        if math.prod(p.size) == 0 and math.prod(shape) != 0:
            continue  # an empty box of a non-empty tensor reads nothing
        r = _Read(p.key, shape, p.offset, p.size, b.local[p.index] if p.index else b.local)
        scale = scales.get(p.key)
        if scale is not None:
            so, ss = _keys.scale_box(p.offset, p.size)
            sdtype, sshape = keys.saved[scale]
            r.scale = (scale, sshape, so, ss, sdtype)
        plan.reads.append(r)


def _plan_whole(leaves: list[TensorLeaf], asked: _C.AskedTensors, source: _C.OpenedSource,
                plan: _Plan) -> list:
    """The common case, planned by the extension (_C.plan_whole) in a
    fraction of the general path's ~3 us a tensor: a plain dense CPU tensor
    loaded whole and in place from the checkpoint tensor of its own key,
    dtype and shape. Plans the read the general path would; returns the
    leaves it leaves to the general path."""
    whole, taken, rest = _C.plan_whole(asked, source)
    plan.whole = whole
    plan.used.update(taken)
    return [leaves[i] for i in rest]


def _open(path: str, comm: TorchComm | None
          ) -> _C.OpenedSource | _C.PendingSource | foreign.Format:
    """The checkpoint at `path` opened: collectively (rank 0 reads the index
    once and sends it), or with one process on a thread of its own
    (_C.PendingSource, waited for by _walk); or the other tool's Format
    that claims the path (foreign.detect; with several processes on rank 0
    only: its finding travels in the open's broadcast, so every rank takes
    the same path)."""
    if comm is not None:
        claimed = _claimed(path) if comm.rank == 0 else None
        source = _C.open_source(path, comm, claimed.name if claimed is not None else "")
        return foreign.by_name(source.other_format) if source.other_format else source
    claimed = _claimed(path)
    return claimed if claimed is not None else _C.PendingSource(path)


def _walk(state: Any, opened: _C.OpenedSource | _C.PendingSource, ask: bool,
          skip: Callable[[str], bool] | None = None
          ) -> tuple[_C.OpenedSource, Flat, _C.AskedTensors | None]:
    """The state walked and, if `ask`, its tensors asked what the fast path
    needs (ask), with the opened source. An open on a thread of its own
    (20,000 tensors: ~22 against ~9 + ~20 ms walking and asking) is waited
    for before the walk changes anything (an optimizer's state created), so
    a checkpoint that cannot be opened leaves the state as it was. Keys
    `skip` accepts are left out of the walk's record (not loaded)."""
    pending = opened if isinstance(opened, _C.PendingSource) else None
    flat = flatten(state, for_load=True, before_init=pending.wait if pending else None)
    if skip is not None:
        flat.drop(skip)
    asked = _boxes.ask(flat.tensors) if ask else None
    return (pending.result() if pending else opened), flat, asked


def _claimed(path: str) -> foreign.Format | None:
    """The other tool's format that claims `path` (foreign.detect); None
    also where looking failed (the engine's open then names the problem)."""
    try:
        return foreign.detect(path)
    except (ShardsafeError, OSError):
        return None


@dataclass
class _Grouped:
    """This rank's grouped PerRank values: {KEY: group rank}, {KEY: its
    checkpoint tensor, where the checkpoint has one}, and {KEY: the group
    ranks the checkpoint holds} (of every PerRank's KEY, grouped or not)."""

    ranks: dict[str, int]
    tensors: dict[str, str]
    saved: dict[str, list[int]]


def _grouped(flat: Flat, keys: _keys.KeyMap, rank: int, path: str,
             by_rank: Mapping[str, object]) -> _Grouped:
    """The grouped PerRank values of the state; each one the checkpoint has
    (a U8 tensor GROUP/G/KEY, docs/format.md §6) gets a target in
    flat.sharded under the tensor's name, read with the other tensors.
    The checkpoint's tensor list is scanned only when the state has a
    grouped value or a PerRank the checkpoint has no per-rank blobs of
    (`by_rank`: their keys)."""
    grouped = _Grouped({}, {}, {})
    for key, value in flat.per_rank.items():
        g = group_rank(value, key, rank)
        if g is not None:
            grouped.ranks[key] = g
    if not grouped.ranks and all(k in by_rank for k in flat.per_rank):
        return grouped
    keys.materialize()
    for name in keys.saved:
        parsed = parse_group_tensor_name(name)
        if parsed is not None and parsed[0] in flat.per_rank:
            grouped.saved.setdefault(parsed[0], []).append(parsed[1])
    for key, g in grouped.ranks.items():
        name = group_tensor_name(key, g)
        ckpt = keys.to_ckpt.get(name)
        if ckpt is None:
            continue
        dtype, shape = keys.saved[ckpt]
        if dtype != "U8" or len(shape) != 1:
            raise CorruptCheckpointError(f"{path}: per-rank value {key!r} (group rank {g}): its "
                                         f"tensor {ckpt!r} is {dtype} {list(shape)}, not 1-D U8 "
                                         f"bytes", "DATA_LOSS")
        grouped.tensors[key] = name
        flat.sharded[name] = Sharded(torch.empty(tuple(shape), dtype=torch.uint8), shape)
    for gs in grouped.saved.values():
        gs.sort()
    return grouped


def _per_rank_notes(flat: Flat, grouped: _Grouped, per_rank: dict) -> list[str]:
    """Why a per-rank value is missing when the checkpoint has it keyed the
    other way (by rank where the state asks by group rank, or the reverse)."""
    notes = []
    for key in flat.per_rank:
        if key in grouped.ranks and key not in grouped.tensors and key in per_rank:
            notes.append(f"per-rank value {key!r} was saved by rank, without a group: load it "
                         f"into a PerRank without group=")
        elif key not in grouped.ranks and key not in per_rank and key in grouped.saved:
            notes.append(f"per-rank value {key!r} was saved by group rank: load it into a "
                         f"PerRank with group=")
    return notes


def _prepare_load(flat: Flat, asked: _C.AskedTensors | None, source: _C.OpenedSource,
                  desc: dict, rename: _keys.Rename, experts: Sequence[_keys.ExpertGroup],
                  dequantize_fp8: bool, options: LoadOptions,
                  skip: Callable[[str], bool] | None, rank: int, world: int
                  ) -> tuple[_keys.KeyMap, _Plan, dict, dict, dict, _Grouped]:
    """This rank's side of a load, before any collective: the checkpoint's
    keys mapped, this rank's reads planned, its report (a Report as a
    dict) of missing and unexpected keys, and the saved values (renamed;
    parsed here once per load) as stored and as Python (a value no save
    writes is a CorruptCheckpointError here, before anything is loaded),
    and its grouped PerRank values (_grouped)."""
    keys = _keys.KeyMap(desc["tensors"], rename, experts)
    values = keys.rename_values(json.loads(desc["values"]) or {})
    excluded = set(values.pop(RESERVED_KEY, {}).get("excluded_frozen", ()))
    saved = decoded_values(values, desc["path"])
    pickled = {keys.name(b[len(PICKLE_PREFIX):]) for b in desc["blobs"]
               if b.startswith(PICKLE_PREFIX)}
    per_rank = {b[len(PER_RANK_PREFIX):]: ranks for b, ranks in desc["per_rank_blobs"].items()
                if b.startswith(PER_RANK_PREFIX)}
    grouped = _grouped(flat, keys, rank, desc["path"], per_rank)
    plan = _plan(flat, asked, keys, source, dequantize_fp8,
                 bool(options.convert_dtypes))
    missing = plan.missing + [k for k in flat.values if k not in values and k not in pickled]
    # plan.used holds saved keys only: as many as saved means every one was used.
    unused = ([k for k in keys.saved if k not in plan.used]
              if len(plan.used) < len(keys.saved) else [])
    unexpected = []
    if unused or values or pickled or per_rank:
        wanted = ({leaf.key for leaf in flat.tensors} | set(flat.values) | set(flat.sharded)
                  | set(flat.per_rank))
        # Grouped PerRank tensors count under their KEY (their group ranks
        # no rank loads: per_rank_unused, after the agreement).
        in_groups = {k: parse_group_tensor_name(k) for k in unused}
        unexpected = sorted({keys.name(k) for k in unused
                             if in_groups[k] is None and keys.name(k) not in wanted}
                            | {g[0] for g in in_groups.values() if g and g[0] not in wanted}
                            | {k for k in [*values, *pickled, *per_rank] if k not in wanted})
    if skip is not None:
        unexpected = [k for k in unexpected if not skip(k)]
    # The saved keys listed only when an optimizer's state can be missing
    # (a list of every key: tens of MB for 500,000 tensors).
    absent = (_absent_param_state(flat, missing, [*map(keys.name, keys.saved), *values])
              if flat.optimizers and missing else set())
    absent |= excluded.intersection(missing)
    by_rank = [k for k in flat.per_rank if k not in grouped.ranks]
    pr_missing = ([f"{k}[rank {rank}]" for k in by_rank if rank not in per_rank.get(k, ())]
                  + [f"{k}[group rank {g}]" for k, g in grouped.ranks.items()
                     if k not in grouped.tensors])
    report = Report([k for k in missing if k not in absent], unexpected,
                     plan.notes + _per_rank_notes(flat, grouped, per_rank),
                     sorted(absent), pr_missing,
                     [f"{k}[rank {r}]" for k in by_rank for r in per_rank.get(k, ())
                      if r >= world],
                     {k: g for k, g in grouped.ranks.items() if k in grouped.tensors},
                     grouped.saved)
    return keys, plan, report.__dict__, values, saved, grouped


def _absent_param_state(flat: Flat, missing: list[str], saved: list[str]) -> set[str]:
    """The missing keys that are an optimizer's state for a parameter with
    no saved state at all (ids under OPTIM.state. that no saved key has): an
    optimizer saved before every parameter had state (unrouted MoE experts
    got no gradient), which torch's own load_state_dict accepts."""
    if not flat.optimizers or not missing:
        return set()
    absent = set()
    for prefix in flat.optimizers:
        head = f"{prefix}.state." if prefix else "state."
        have = {k[len(head):].split(".", 1)[0] for k in saved if k.startswith(head)}
        absent |= {k for k in missing
                   if k.startswith(head) and k[len(head):].split(".", 1)[0] not in have}
    return absent


def release_load_staging() -> None:
    """Frees the page-locked host memory loads into CUDA tensors stage their
    bytes in (LoadOptions.device_staging_bytes), which the first such load
    allocates and later ones reuse; the next such load allocates it again.
    Waits for a load using it."""
    _device.LOAD_STAGING.release()


@without_gc
def load(state_dict: Any, path: str | os.PathLike, *, strict: bool = True,
         process_group: dist.ProcessGroup | None = None, unsafe_pickle: bool = False,
         rename: _keys.Rename = None, experts: Sequence[_keys.ExpertGroup] = (),
         dequantize_fp8: bool = True, skip_keys: Sequence[str | re.Pattern] = (),
         per_rank_strict: bool = True, options: LoadOptions | None = None,
         **kwargs: Any) -> LoadResult:
    """Loads a checkpoint into `state_dict` in place, resharding as needed:
    each tensor (or DTensor shard) gets its part of the saved tensor, values
    are replaced by the saved ones, stateful objects get load_state_dict.
    `path`: a checkpoint directory, a root of step checkpoints (its latest),
    a .safetensors file, a Hugging Face model directory, a hub repo id
    ("ORG/NAME") in the local hub cache (refs/main; no network), or another
    tool's checkpoint: torch DCP (through DCP's own reader: shardsafe.peers),
    Megatron torch_dist, DeepSpeed, nanotron (shardsafe.foreign; rename
    and experts need it imported first: shardsafe import). Collective.
    An s3:// URI is read by the engine, or, where it holds nothing the
    engine opens, staged on a local disk by every rank and read as another
    tool's checkpoint there (shardsafe._paths.staged).

    strict=True raises KeyMismatchError (before changing anything) when a
    key is missing from the checkpoint or a saved key is wanted by no rank;
    strict=False loads what matches and reports both lists. An optimizer's
    state for a parameter that had none when saved (an unrouted MoE expert)
    is reported in missing_keys but is no error, as with torch's
    load_state_dict: that parameter is left without state.
    skip_keys: state keys left as they are and saved keys ignored, strict
      or not: a str skips the keys it prefixes, an re.Pattern the keys it
      matches (re.search), e.g. ["lm_head."] (NeMo's skip_task_head_prefixes).
    per_rank_strict: shardsafe.PerRank values: rank r loads saved rank r's
      (with group=, group rank g loads saved group rank g's). A rank the
      checkpoint has none for (a larger world), or saved ranks no rank
      loads (a smaller one), raise KeyMismatchError naming "KEY[rank R]"
      ("KEY[group rank G]"); with False those keep their value, and are
      reported in missing_keys / unexpected_keys.
    Engine options (verify_checksums, convert_dtypes, share_reads, ...:
    shardsafe.LoadOptions) as keywords or as `options`.

    Hugging Face checkpoints (details in shardsafe.hf):
    rename: ordered (pattern, replacement) regex rules (RE2 patterns, every
      match replaced as re.sub does, \\1 for groups, each applied to the
      result of the previous one: shardsafe.hf) or a
      callable, mapping each checkpoint key to its state key; e.g.
      [(r"^model\\.", ""), (r"\\.self_attn\\.q_proj\\.weight$", ".attn.wq")].
      Two checkpoint keys mapping to one name are an error. missing_keys and
      unexpected_keys are state-side names.
    experts: shardsafe.hf.ExpertGroup rules filling grouped [E, ...] state
      tensors from per-expert checkpoint tensors (or per-expert state
      tensors from a grouped one), e.g. shardsafe.hf.QWEN2_MOE_EXPERTS;
      each rank reads only the experts and rows of its box.
    dequantize_fp8: an F8_E4M3 checkpoint tensor with `<key>_scale_inv`
      128x128 block scales, loaded into a BF16/F16/F32/F64 target, is
      dequantised (this rank's box only); the scales count as loaded.
    """
    asked_path = os.fspath(path)
    path = _hub.resolve(asked_path)
    options = LoadOptions.of(options, kwargs, load)
    skip = _skipper(skip_keys)
    comm = resolve(process_group)
    foreign_args = dict(strict=strict, process_group=process_group, unsafe_pickle=unsafe_pickle,
                        convert_dtypes=bool(options.convert_dtypes), skip=skip,
                        mapped=rename is not None or bool(experts),
                        per_rank_strict=per_rank_strict)
    opened = flat = plan = desc = keys = source = values = saved_values = grouped = None
    error, report = None, None
    try:
        # Collective: rank 0 reads the index once; the engine load reuses it.
        # The fast path's questions are asked while the index is read (no use with a rename).
        opened = _open(os.fspath(path), comm)
        if not isinstance(opened, foreign.Format):
            if comm is not None:
                source = opened  # every rank has it, whatever fails below
            source, flat, asked = _walk(state_dict, opened, ask=rename is None, skip=skip)
            desc = _C.describe_source(source)
            keys, plan, report, values, saved_values, grouped = _prepare_load(
                flat, asked, source, desc, rename, experts, dequantize_fp8, options, skip,
                comm.rank if comm is not None else 0, comm.size if comm is not None else 1)
    except (ShardsafeError, ValueError, TypeError, RuntimeError) as e:
        error = _hub.explain_missing(asked_path, e)
    if error is None and isinstance(opened, foreign.Format):  # on every rank alike
        return foreign.load(state_dict, path, opened, **foreign_args)
    # The open's failure is rank 0's, the same on every rank: so is this test.
    if (_paths.is_s3(path) and source is None and isinstance(error, CheckpointNotFoundError)
            and error.detail != "NO_SUCH_BUCKET"):
        return _load_staged(state_dict, path, error, comm, foreign_args)
    if error is not None:
        if source is not None:  # the other ranks learn it in the load's first collective
            _tell_failure(source, comm, options, error)
        raise error  # else the open failed alike on every rank, or no other rank waits
    agreed = Agreement(strict, per_rank_strict, keys, desc["path"])
    result = _read(plan, source, comm, options, (json.dumps(report).encode(), agreed))
    blobs = result.blobs
    if keys.renamed:
        blobs = {(PICKLE_PREFIX + keys.name(b[len(PICKLE_PREFIX):])
                  if b.startswith(PICKLE_PREFIX) else b): v for b, v in blobs.items()}
    if skip is not None:
        values = {k: v for k, v in values.items() if not skip(k)}
    _finish(state_dict, flat, values, blobs, unsafe_pickle, agreed.absent, desc["path"],
            comm.rank if comm is not None else 0, grouped)
    return LoadResult(desc["path"], desc["tag"],
                      sorted(agreed.missing + agreed.absent + agreed.per_rank_missing),
                      sorted(agreed.unexpected + agreed.per_rank_unused),
                      json.loads(desc["metadata"]), result.bytes_read, result.seconds,
                      result.bytes_shared, saved_values)


def _tell_failure(source: _C.OpenedSource, comm: TorchComm, options: LoadOptions,
                  error: BaseException) -> None:
    """This rank's failure preparing its part, sent to the other ranks in the
    engine load's first collective (they raise its class, naming this
    rank); raises nothing itself."""
    try:
        _C.load_source([], source, comm, options.engine(), check=(b"", lambda reports: None),
                       failed=failure_of(error))
    except ShardsafeError:
        pass


def _load_staged(state_dict: Any, uri: str, not_native: CheckpointNotFoundError,
                 comm: TorchComm | None, foreign_args: dict) -> LoadResult:
    """load() of an s3:// prefix holding nothing the engine opens (its
    error: `not_native`): the prefix staged on a local disk by every rank
    (shardsafe._paths.staged, removed afterwards), another tool's checkpoint
    detected there and loaded (foreign.load with `foreign_args`), as from a
    local directory; nothing known there is `not_native`, extended."""
    with contextlib.ExitStack() as stack:
        local, error = None, None
        try:
            local = stack.enter_context(_paths.staged(uri))
        except (ShardsafeError, OSError) as e:
            error = e
        agree(comm, error)
        fmt = _detect_on_every_rank(local, comm)
        if fmt is None:
            raise CheckpointNotFoundError(f"{not_native}; nor is it a {foreign.KNOWN} "
                                          f"checkpoint", not_native.code)
        result = foreign.load(state_dict, local, fmt, **foreign_args)
    return replace(result, path=uri, tag=os.path.basename(uri.rstrip("/")))


def _detect_on_every_rank(path: str, comm: TorchComm | None) -> foreign.Format | None:
    """The other tool's format `path` holds (None: shardsafe's own or a
    model), the same on every rank: ranks that see the file system
    differently (a `latest` rewritten meanwhile, a lagging shared file
    system) would otherwise take different paths and wait on each other."""
    fmt, error = None, None
    try:
        fmt = foreign.detect(path)
    except ShardsafeError as e:
        error = e
    names = agree(comm, error, None if fmt is None else fmt.name)
    if len(set(names)) > 1:
        seen = ", ".join(f"rank {r}: {n or 'a shardsafe checkpoint or model'}"
                         for r, n in enumerate(names))
        raise InvalidStateError(f"{path}: ranks see different checkpoints there ({seen})")
    return fmt


def _skipper(skip_keys: Sequence[str | re.Pattern]) -> Callable[[str], bool] | None:
    """load's skip_keys as a predicate on keys (None: skip nothing)."""
    if isinstance(skip_keys, (str, re.Pattern)):
        skip_keys = [skip_keys]
    prefixes = tuple(s for s in skip_keys if isinstance(s, str))
    patterns = [s for s in skip_keys if isinstance(s, re.Pattern)]
    if len(prefixes) + len(patterns) != len(skip_keys):
        raise InvalidStateError("skip_keys: expected key prefixes (str) or re.Pattern objects")
    if not skip_keys:
        return None
    return lambda key: key.startswith(prefixes) or any(p.search(key) for p in patterns)


def _read(plan: _Plan, source: _C.OpenedSource, comm: TorchComm | None,
          options: LoadOptions, check: tuple[bytes, Callable[[list[bytes]], None]]
          ) -> _C.LoadResult:
    """Runs the engine load into the plan's direct targets and each read's
    buffer: the target itself when it can take the data in place, else
    staging (then copied in), or FP8 temporaries (then dequantised in)."""
    fp8 = [r for r in plan.reads if r.scale is not None]
    device = [r for r in plan.reads if _on_device(r)]  # the engine stages them, bounded
    staged = []
    for r in plan.reads:
        if r.scale is None and not _on_device(r):
            if in_place(r.dest):
                r.buf = r.dest
            else:
                staged.append(r)  # strided, lazily conjugated/negated, another device
    with _device.STAGING.borrow([r.dest for r in staged]) as hosts:
        return _read_into(plan, staged, device, fp8, hosts, source, comm, options, check)


def _on_device(r: _Read) -> bool:
    """A read the engine fills in CUDA memory (through _device_specs)."""
    return r.scale is None and r.dest.device.type == "cuda"


def _spec(r: _Read, buf: torch.Tensor) -> tuple:
    """The engine's target of read `r` landing in `buf`."""
    spec = (r.key, DTYPE_NAMES[buf.dtype], r.shape, r.offset, r.size, buf.data_ptr())
    return spec if r.flat is None else spec + (r.flat,)


def _load_specs(reads: list[_Read]) -> list[tuple]:
    """The engine's host targets: each read's buffer, and FP8 reads' scale
    buffers."""
    specs = []
    for r in reads:
        if _on_device(r):
            continue
        if r.scale is not None:
            key, sshape, so, ss, sdtype = r.scale
            r.buf = torch.empty(r.size, dtype=TORCH_DTYPES["F8_E4M3"])
            r.scale_buf = torch.empty(ss, dtype=TORCH_DTYPES[sdtype])
            specs.append((key, sdtype, sshape, so, ss, r.scale_buf.data_ptr()))
        specs.append(_spec(r, r.buf))
    return specs


def _device_specs(reads: list[_Read], staging: tuple[int, int] | None
                  ) -> tuple[_device.DeviceCopier, list[tuple]] | None:
    """The engine's device targets and their copier (which lends the load
    `staging`): each read's destination where the engine can fill it in
    place, else a contiguous device temporary (`r.buf`, copied in
    afterwards)."""
    if not reads:
        return None
    bufs, specs = [], []
    for r in reads:
        fits = r.dest.is_contiguous() and not r.dest.is_neg() and not r.dest.is_conj()
        buf = r.dest if fits else torch.empty(r.dest.shape, dtype=r.dest.dtype,
                                              device=r.dest.device)
        r.buf = None if fits else buf
        bufs.append(buf)
        specs.append(_spec(r, buf))
    return _device.DeviceCopier(bufs, staging), specs


def _read_into(plan: _Plan, staged: list[_Read], device: list[_Read], fp8: list[_Read],
               hosts: list[torch.Tensor], source: _C.OpenedSource, comm: TorchComm | None,
               options: LoadOptions, check: tuple[bytes, Callable[[list[bytes]], None]]
               ) -> _C.LoadResult:
    for r, h in zip(staged, hosts):
        r.buf = h
    # At least the engine's two buffers of at least 1 MiB each.
    staging_bytes = max(options.device_staging_bytes or _C.DEFAULT_DEVICE_STAGING_BYTES, 2 << 20)
    with (_device.LOAD_STAGING.borrow(staging_bytes) if device
          else contextlib.nullcontext()) as lent:
        devices = _device_specs(device, lent)
        result = _C.load_source(_load_specs(plan.reads), source, comm, options.engine(),
                                plan.whole, devices, check)
    with torch.no_grad():
        for r in staged:
            r.dest.copy_(r.buf, non_blocking=r.dest.device.type != "cpu")
        for r in device:
            if r.buf is not None:
                r.dest.copy_(r.buf)
                r.buf = None
        for r in fp8:
            r.dest.copy_(_keys.dequantize(r.buf, r.scale_buf, r.offset).to(r.dest.dtype))
            r.buf = r.scale_buf = None
    if any(r.dest.device.type == "cuda" for r in staged + device + fp8):
        torch.cuda.synchronize()
    return result


def _finish(state: Any, flat: Flat, values: dict, blobs: dict, unsafe_pickle: bool,
            absent_state: list[str], path: str, rank: int, grouped: _Grouped) -> None:
    """Puts the saved values (and this rank's per-rank values, from the
    checkpoint at `path`: grouped ones from their tensors, read into
    flat.sharded) into the state, drops the optimizer state of
    parameters that had none when saved (`absent_state`, keys under
    OPTIM.state.ID.) and hands state dicts back."""
    if not flat.values and not flat.state_dicts and not flat.per_rank:
        return  # tensors only, all filled in place: nothing to hand back
    for prefix, optim in flat.optimizers.items():
        head = f"{prefix}.state." if prefix else "state."
        ids = {k[len(head):].split(".", 1)[0] for k in absent_state if k.startswith(head)}
        param_state = flat.state_dicts[optim].get("state", {})
        for pid in [p for p in param_state if str(p) in ids]:
            del param_state[pid]

    def value(key: str, old: Any) -> Any:
        if isinstance(old, PerRank) and key in grouped.ranks:
            name = grouped.tensors.get(key)
            if name is not None:  # absent (per_rank_strict=False) or skipped: kept
                blob = flat.sharded[name].parts[0].local.numpy().tobytes()
                old.value = decode_per_rank(blob, old.value, key, path,
                                            f"group rank {grouped.ranks[key]}")
            return old
        if isinstance(old, PerRank):
            blob = blobs.get(PER_RANK_PREFIX + key) if key in flat.per_rank else None
            if blob is not None:  # absent (per_rank_strict=False) or skipped: kept
                old.value = decode_per_rank(blob, old.value, key, path, rank)
            return old
        try:
            return decode_value(key, old, values, blobs, unsafe_pickle)
        except KeyError:
            return old  # missing (strict=False) or skipped: left as it was

    rebuild(state, flat, lambda key, t: None, value)


