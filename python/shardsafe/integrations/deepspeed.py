"""A live DeepSpeed engine saved and loaded as a shardsafe checkpoint.

    from shardsafe.integrations import deepspeed as ss_deepspeed

    ss_deepspeed.save(engine, "/ckpt/run1/step-100", client_state={"epoch": 3})
    ...
    client_state = ss_deepspeed.load(engine, "/ckpt/run1/step-100")   # any DP size

Both are collective over the world group (every rank calls them), which
must be the engine's data-parallel group. What a checkpoint holds, every
parameter under its name in the module (a tied one under its first):

- ``module.*``: the module's weights as the engine holds them (bf16 / fp16
  or fp32) and its buffers: under ZeRO-0/1/2 its state dict, whole on every
  rank; under ZeRO-3 each parameter's partition (``ds_tensor``) as a
  ``shardsafe.Sharded`` flat range of the parameter, frozen ones included;
- ``optim.fp32.NAME``: each trained parameter's fp32 master weights, in its
  own shape, every rank saving the flat range of it that its ZeRO
  partition holds (``Sharded``; the padding DeepSpeed adds is not saved),
  so a load at any DP size gives each rank its new ranges;
- ``optim.STATE.NAME``: the optimizer's per-element state (Adam's
  ``exp_avg`` / ``exp_avg_sq``) alike; ``optim.group.I.STATE`` its other
  tensors (Adam's ``step``) per flat group (ZeRO-1/2's parameter groups,
  ZeRO-3's sub-groups), ``optim.param_groups`` the hyperparameters;
- under ZeRO-0 (fp32) instead ``optim.*`` is the torch optimizer's own
  state dict, whole on every rank, as ``shardsafe.save`` stores an optimizer;
- ``lr_scheduler``, ``engine`` (``global_steps``, ``global_samples``,
  ``skipped_steps``), ``loss_scaler`` (the scaler's numbers: ``cur_scale``,
  ``cur_iter``, ``last_overflow_iter``, hysteresis ...), and ``client_state``
  (JSON values; its tensors under ``client_tensors.I``).

``load`` fills the engine in place, then re-syncs the bf16 / fp16 weights
from the fp32 masters as DeepSpeed does after a load (ZeRO-1/2: the
optimizer's ``update_lp_params``; ZeRO-3: the partitions, then persistent
parameters gathered by ``checkpoint_event_epilogue``), so the engine is
ready to step. It returns ``client_state`` as JSON keeps it (tuples come
back as lists, dict keys as strings), its tensors in place. The load must
use the ZeRO stage, dtype and (ZeRO-3) sub-group size of the save; the
DP size may differ.

Supported: ZeRO stages 1-3 (``DeepSpeedZeroOptimizer``, round-robin
gradients too; ``DeepSpeedZeroOptimizer_Stage3``, sub-groups) with fp32,
bf16 or fp16 and its loss scaler, and ZeRO-0 in fp32 (a torch optimizer);
data parallelism only. Anything else (ZeRO-0 in bf16 / fp16, where
DeepSpeed wraps the optimizer in its FP16 / BF16 optimizers; MoE, model or
pipeline parallelism, CPU or NVMe offload) is an
``InvalidStateError`` naming it; use ``engine.save_checkpoint`` there.
"""

from __future__ import annotations

import os
from typing import Any

import torch

from . import require

require("deepspeed", "deepspeed", "shardsafe.integrations.deepspeed")

import torch.distributed as dist  # noqa: E402
from deepspeed.runtime.zero.stage3 import DeepSpeedZeroOptimizer_Stage3  # noqa: E402
from deepspeed.runtime.zero.stage_1_and_2 import DeepSpeedZeroOptimizer  # noqa: E402

import shardsafe  # noqa: E402

from ..errors import InvalidStateError  # noqa: E402

__all__ = ["save", "load"]

FORMAT = 1  # the layout described above, recorded as "deepspeed.format"
_COUNTERS = ("global_steps", "global_samples", "skipped_steps")
_TENSOR = "__client_tensor__"  # {"__client_tensor__": I}: client_state's tensor I


def save(engine: Any, path: str | os.PathLike, client_state: dict | None = None,
         **options: Any) -> None:
    """Saves `engine` (a DeepSpeedEngine) and `client_state` to `path`, one
    collective shardsafe checkpoint (module doc); `options` are
    shardsafe.save's. client_state must be equal on every rank."""
    opt = _zero_optimizer(engine)
    skeleton, tensors = _strip(client_state or {})
    plain = _plain(opt)
    state: dict[str, Any] = {
        "module": _module_state(engine, opt),
        "optim": opt if plain else _optimizer_state(engine, opt, for_load=False),
        "engine": {k: int(getattr(engine, k)) for k in _COUNTERS},
        "loss_scaler": {} if plain else _scaler_values(opt.loss_scaler),
        "client_state": skeleton,
        "client_tensors": tensors,
        "deepspeed": _meta(engine, opt, tensors),
    }
    if engine.lr_scheduler is not None:
        state["lr_scheduler"] = engine.lr_scheduler
    shardsafe.save(state, path, **options)


def load(engine: Any, path: str | os.PathLike, **options: Any) -> dict:
    """Loads `path` (saved by `save`, at any DP size) into `engine` in place
    and returns its client_state (module doc); `options` are shardsafe.load's."""
    opt = _zero_optimizer(engine)
    described = shardsafe.describe(path)
    meta = described["values"].get("deepspeed")
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise InvalidStateError(f"{os.fspath(path)}: not a checkpoint of "
                                f"shardsafe.integrations.deepspeed.save (no \"deepspeed\" value "
                                f"of format {FORMAT}); load it with shardsafe.load")
    _check_layout(path, engine, opt, meta)
    plain = _plain(opt)
    optim = opt if plain else _optimizer_state(engine, opt, for_load=True, meta=meta)
    tensors = [torch.empty(described["tensors"][f"client_tensors.{i}"][1],
                           dtype=_dtype(meta["client_tensor_dtypes"][i]))
               for i in range(meta["client_tensors"])]
    if _stage3(opt):
        opt.checkpoint_event_prologue()  # every parameter partitioned
    try:
        state: dict[str, Any] = {"module": _module_state(engine, opt), "optim": optim,
                                 "engine": {k: 0 for k in _COUNTERS}, "loss_scaler": {},
                                 "client_state": {}, "client_tensors": tensors,
                                 "deepspeed": {}}
        if engine.lr_scheduler is not None and meta["lr_scheduler"]:
            state["lr_scheduler"] = engine.lr_scheduler
        shardsafe.load(state, path, **options)
        for k in _COUNTERS:
            setattr(engine, k, int(state["engine"][k]))
        if not plain:
            _apply_optimizer_values(opt, optim)
            _set_scaler_values(opt.loss_scaler, state["loss_scaler"])
            _update_lp_params(opt)
    finally:
        if _stage3(opt):  # persistent parameters gathered again, also after a failure
            opt.checkpoint_event_epilogue()
    return _dress(state["client_state"], tensors)


# ------------------------------------------------------------- the engine --

_WHAT = "shardsafe.integrations.deepspeed"
_INSTEAD = "use engine.save_checkpoint / load_checkpoint"


def _zero_optimizer(engine: Any) -> Any:
    """engine's optimizer: a DeepSpeedZeroOptimizer (ZeRO-1/2), a
    DeepSpeedZeroOptimizer_Stage3, or under ZeRO-0 in fp32 the torch
    optimizer itself; otherwise InvalidStateError naming what this
    integration does not support."""
    stage, opt = engine.zero_optimization_stage(), engine.optimizer
    name = type(opt).__name__ if opt is not None else "no optimizer"
    if getattr(engine, "has_moe_layers", False):
        raise InvalidStateError(f"{_WHAT}: MoE layers are not supported; {_INSTEAD}")
    if stage == 0:
        if not isinstance(opt, torch.optim.Optimizer) or engine.fp16_enabled() or \
                engine.bfloat16_enabled():
            raise InvalidStateError(f"{_WHAT}: ZeRO stage 0 with {name} is not supported, only "
                                    f"with an fp32 torch optimizer (or ZeRO stages 1-3); "
                                    f"{_INSTEAD}")
        _check_pure_dp([engine.dp_world_size])
        return opt
    if not ((stage in (1, 2) and isinstance(opt, DeepSpeedZeroOptimizer)) or
            (stage == 3 and isinstance(opt, DeepSpeedZeroOptimizer_Stage3))):
        raise InvalidStateError(f"{_WHAT}: ZeRO stage {stage} ({name}) is not supported; "
                                f"{_INSTEAD}")
    if stage == 3 and (opt.offload_optimizer or opt.offload_param):
        raise InvalidStateError(f"{_WHAT}: ZeRO-3 offload is not supported; {_INSTEAD}")
    if stage in (1, 2) and opt.cpu_offload:
        raise InvalidStateError(f"{_WHAT}: ZeRO-{stage} CPU offload is not supported; {_INSTEAD}")
    if engine.zero_nvme_offload_optimizer():
        raise InvalidStateError(f"{_WHAT}: NVMe offload is not supported; {_INSTEAD}")
    groups = ([p.ds_process_group for g in opt.fp16_groups for p in g] if _stage3(opt)
              else opt.real_dp_process_group)
    _check_pure_dp([dist.get_world_size(group=g) for g in groups])
    return opt


def _check_pure_dp(sizes: list[int]) -> None:
    """Each partition group (`sizes`: their sizes) is the world."""
    world = dist.get_world_size() if dist.is_initialized() else 1
    for i, size in enumerate(sizes):
        if size != world:
            raise InvalidStateError(
                f"{_WHAT}: data-parallel group {i} has {size} ranks, the world {world}: only pure "
                f"data parallelism is supported (no model, pipeline or sequence parallelism)")


def _check_layout(path: Any, engine: Any, opt: Any, meta: dict) -> None:
    """The checkpoint's ZeRO stage and flat groups are the engine's."""
    stage, groups = int(engine.zero_optimization_stage()), len(_flat_groups(opt))
    if meta.get("zero_stage") != stage or len(meta.get("state", [])) != groups:
        raise InvalidStateError(
            f"{os.fspath(path)}: saved under ZeRO stage {meta.get('zero_stage')} with "
            f"{len(meta.get('state', []))} flat parameter groups, the engine runs stage {stage} "
            f"with {groups}: load with the save's ZeRO stage, parameter groups and (ZeRO-3) "
            f"sub_group_size (the DP size may differ)")


def _names(engine: Any) -> dict[int, str]:
    """id(parameter) -> its name in the module (a tied one: its first)."""
    return {id(p): n for n, p in engine.module.named_parameters()}


def _plain(opt: Any) -> bool:
    """ZeRO-0 in fp32: the torch optimizer steps the module's parameters."""
    return isinstance(opt, torch.optim.Optimizer)


def _stage3(opt: Any) -> bool:
    return hasattr(opt, "fp32_partitioned_groups_flat")


def _flat_groups(opt: Any) -> list[tuple[torch.Tensor, list]]:
    """(fp32 partition, _ranges) of each flat group the base optimizer steps:
    ZeRO-1/2's parameter groups, ZeRO-3's sub-groups; none under ZeRO-0."""
    if _plain(opt):
        return []
    if _stage3(opt):
        return [(flat, _ranges3(group)) for flat, group in
                zip(opt.fp32_partitioned_groups_flat, opt.fp16_groups)]
    return [(flat, _ranges(opt, i)) for i, flat in enumerate(opt.single_partition_of_fp32_groups)]


def _ranges3(params: list) -> list[tuple[Any, torch.Size, int, int, int]]:
    """_ranges of a ZeRO-3 sub-group: each parameter's partition of
    partition_numel() elements lies in the flat group in turn; this rank's
    holds elements [rank * n, rank * n + real) of the parameter."""
    out, at = [], 0
    for p in params:
        n = p.partition_numel()
        begin = dist.get_rank(group=p.ds_process_group) * n
        real = max(0, min(n, p.ds_numel - begin))
        out.append((p, p.ds_shape, begin, begin + real, at) if real else (p, p.ds_shape, 0, 0, 0))
        at += n
    return out


def _module_state(engine: Any, opt: Any) -> Any:
    """The module as saved: ZeRO-0/1/2 its state dict (weights whole on every
    rank); ZeRO-3 each parameter's partition (ds_tensor) as a Sharded flat
    range, and the buffers."""
    if not _stage3(opt):
        return engine.module
    out: dict[str, Any] = {}
    for name, p in engine.module.named_parameters():
        (_, shape, begin, end, _), = _ranges3([p])
        out[name] = _sharded(p.ds_tensor, shape, begin, end, 0)
    buffers = dict(engine.module.named_buffers())
    for name in engine.module.state_dict():
        if name in buffers:
            out[name] = buffers[name]
    return out


def _update_lp_params(opt: Any) -> None:
    """bf16 / fp16 weights from the fp32 masters, as DeepSpeed's own load
    does: ZeRO-1/2 update_lp_params (all-gathered); ZeRO-3 the partitions
    (load gathers the persistent parameters afterwards)."""
    if not _stage3(opt):
        opt.update_lp_params()
        return
    for lp, fp32 in zip(opt.fp16_partitioned_groups_flat, opt.fp32_partitioned_groups_flat):
        if fp32.numel() > 0:
            lp.data.copy_(fp32.data)


def _ranges(opt: Any, i: int) -> list[tuple[Any, torch.Size, int, int, int]]:
    """(param, shape, begin, end, local) for parameter group i: the flat range
    [begin, end) of each parameter that this rank's partition holds, at
    element `local` of the partition; (0, 0, 0) where it holds none."""
    rank = dist.get_rank(group=opt.real_dp_process_group[i])
    size = int(opt.partition_size[i])
    start, stop = rank * size, (rank + 1) * size
    out = []
    for p, meta, offset in zip(opt.round_robin_bit16_groups[i], opt.round_robin_bit16_meta[i],
                               opt.round_robin_bit16_offsets[i]):
        lo, hi = max(offset, start), min(offset + meta.numel(), stop)
        if lo < hi:
            out.append((p, meta.shape, lo - offset, hi - offset, lo - start))
        else:
            out.append((p, meta.shape, 0, 0, 0))
    return out


def _sharded(partition: torch.Tensor, shape: torch.Size, begin: int, end: int,
             local: int) -> shardsafe.Sharded:
    piece = partition.view(-1)[local:local + end - begin]
    return shardsafe.Sharded(piece, shape=tuple(shape), flat=(begin, end))


def _optimizer_state(engine: Any, opt: Any, for_load: bool, meta: dict | None = None) -> dict:
    """The optimizer part of the state: fp32 masters and per-element state as
    Sharded flat ranges of each parameter, other state tensors per group, the
    hyperparameters. For a load, missing per-element state (a fresh engine)
    is created as zeros, as the saved layout in `meta` says."""
    names, base = _names(engine), opt.optimizer
    fp32: dict[str, Any] = {}
    per_element: dict[str, dict[str, Any]] = {}
    groups: dict[str, dict[str, torch.Tensor]] = {}
    for i, (flat, ranges) in enumerate(_flat_groups(opt)):
        state = base.state[flat]
        if for_load:
            for key, dtype in meta["state"][i]["per_element"].items():
                if key not in state:
                    state[key] = torch.zeros(flat.shape, dtype=_dtype(dtype), device=flat.device)
            groups[str(i)] = {k: torch.empty(s, dtype=_dtype(d))
                              for k, (d, s) in meta["state"][i]["other"].items()}
        else:
            groups[str(i)] = {k: v for k, v in state.items()
                              if torch.is_tensor(v) and v.shape != flat.shape}
        keys = [k for k, v in state.items() if torch.is_tensor(v) and v.shape == flat.shape]
        for p, shape, begin, end, local in ranges:
            name = names[id(p)]
            fp32[name] = _sharded(flat, shape, begin, end, local)
            for k in keys:
                per_element.setdefault(k, {})[name] = _sharded(state[k], shape, begin, end, local)
    hyper = [{k: v for k, v in g.items() if k != "params"} for g in base.param_groups]
    return {"fp32": fp32, **per_element, "group": groups, "param_groups": hyper}


def _apply_optimizer_values(opt: Any, optim: dict) -> None:
    """The loaded group tensors and hyperparameters into the base optimizer."""
    base = opt.optimizer
    if len(optim["param_groups"]) != len(base.param_groups):
        raise InvalidStateError(f"the checkpoint has {len(optim['param_groups'])} parameter "
                                f"groups, the optimizer {len(base.param_groups)}")
    for group, saved in zip(base.param_groups, optim["param_groups"]):
        for k, v in saved.items():
            group[k] = tuple(v) if isinstance(group.get(k), tuple) else v
    for i, (flat, _) in enumerate(_flat_groups(opt)):
        base.state[flat].update(optim["group"][str(i)])


def _meta(engine: Any, opt: Any, tensors: list[torch.Tensor]) -> dict:
    """What a load needs before it can build its template."""
    state = []
    for flat, _ in _flat_groups(opt):
        items = [(k, v) for k, v in opt.optimizer.state[flat].items() if torch.is_tensor(v)]
        state.append({
            "per_element": {k: str(v.dtype) for k, v in items if v.shape == flat.shape},
            "other": {k: [str(v.dtype), list(v.shape)] for k, v in items if v.shape != flat.shape}})
    return {"format": FORMAT, "zero_stage": int(engine.zero_optimization_stage()),
            "dp_world_size": dist.get_world_size() if dist.is_initialized() else 1,
            "state": state, "lr_scheduler": engine.lr_scheduler is not None,
            "client_tensors": len(tensors), "client_tensor_dtypes": [str(t.dtype) for t in tensors]}


def _dtype(name: str) -> torch.dtype:
    dtype = getattr(torch, name.removeprefix("torch."), None)
    if not isinstance(dtype, torch.dtype):
        raise InvalidStateError(f"unknown dtype {name!r} in the checkpoint's \"deepspeed\" value")
    return dtype


# ------------------------------------------------- loss scaler, client state --

def _scaler_values(scaler: Any) -> dict:
    """The scaler's numbers and flags (cur_scale, cur_iter, ...), JSON-able."""
    out = {}
    for k, v in vars(scaler).items():
        if torch.is_tensor(v) and v.numel() == 1:
            v = v.item()
        if v is None or isinstance(v, (bool, int, float, str)):
            out[k] = v
    return out


def _set_scaler_values(scaler: Any, values: dict) -> None:
    for k, v in values.items():
        current = getattr(scaler, k, None)
        if torch.is_tensor(current):
            current.fill_(v)
        elif hasattr(scaler, k):
            setattr(scaler, k, v)


def _strip(value: Any) -> tuple[Any, list[torch.Tensor]]:
    """client_state without its tensors (each replaced by {_TENSOR: I}), and
    the tensors."""
    tensors: list[torch.Tensor] = []

    def walk(v: Any) -> Any:
        if torch.is_tensor(v):
            tensors.append(v.detach())
            return {_TENSOR: len(tensors) - 1}
        if isinstance(v, dict):
            return {k: walk(x) for k, x in v.items()}
        if isinstance(v, (list, tuple)):
            return type(v)(walk(x) for x in v)
        return v

    return walk(value), tensors


def _dress(value: Any, tensors: list[torch.Tensor]) -> Any:
    """_strip undone: the placeholders replaced by the loaded tensors."""
    if isinstance(value, dict):
        if set(value) == {_TENSOR}:
            return tensors[value[_TENSOR]]
        return {k: _dress(x, tensors) for k, x in value.items()}
    if isinstance(value, list):
        return [_dress(x, tensors) for x in value]
    return value
