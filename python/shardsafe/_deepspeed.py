"""DeepSpeed checkpoints (`engine.save_checkpoint`), read as global tensors
without DeepSpeed installed: a ForeignCheckpoint of shardsafe._foreign.

Layout (deepspeed/runtime/engine.py _save_checkpoint / _save_zero_checkpoint,
deepspeed/checkpoint/constants.py; checked against deepspeed 0.19.8, whose
save the tests run):

    ROOT/latest                                     the tag, e.g. "global_step100"
    ROOT/TAG/mp_rank_00_model_states.pt             ZeRO 0-2: module state dict, param_shapes,
                                                    frozen params, client state, scheduler
    ROOT/TAG/zero_pp_rank_D_mp_rank_00_model_states.pt   ZeRO-3: the same, one per DP rank D
    ROOT/TAG/[bf16_]zero_pp_rank_D_mp_rank_00_optim_states.pt
                                                    ZeRO 1-3: DP rank D's partition of the
                                                    fp32 master weights and optimizer state

ROOT or ROOT/TAG opens. Keys (all global tensors, contiguous, on the CPU):

- `<name>`: DeepSpeed's own consolidation, exactly the state dict
  `deepspeed.utils.zero_to_fp32.get_fp32_state_dict_from_zero_checkpoint`
  returns: buffers (floating ones as float32), frozen parameters (as saved),
  the fp32 master weights of the trained parameters, and tied names (the
  checkpoint's shared_params) as copies of their source. ZeRO 1-3 only.
- `module.<name>`: the module's state dict as saved (16-bit weights under
  bf16). ZeRO-3 saves parameters only as fp32 partitions, so there it holds
  the buffers (and any parameter saved whole).
- `optimizer.state.<name>.<state>`: the optimizer state of each trained
  parameter, cut out of the flat partitions like the master weights
  (`exp_avg`, `exp_avg_sq`, any state shaped like the partition), and a 0-d
  tensor state such as `step`, which DeepSpeed keeps per parameter group.
- `client_state.<path>`: tensors inside the client_state given to
  save_checkpoint.

ZeRO-1/2 reconstruction (zero_to_fp32 _zero2_merge_trainable_params): per
parameter group, the DP ranks' saved partitions (padding stripped) joined in
rank order form the flat group; parameters follow each other in
param_shapes order, separated by param_alignment_paddings. All partitions
have one padded size P (saved numel + group_paddings), so rank r's data
starts at r * P. ZeRO-3 (_zero3_merge_trainable_params): each parameter is
split into DP-many pieces of ceil(numel / dp); every rank holds its piece of
every parameter back to back (across its sub-groups, in param_shapes order);
the pieces of all ranks joined, cut to numel, make the parameter. Optimizer
state tensors have the layout of the fp32 partition they belong to. A read
opens only the rank files whose partitions cover the key; each file is
unpickled once, memory-mapped, and kept until close(), so a read costs the
tensor plus the file pages it touches.

Refused (InvalidStateError, never guessed): more than one model-parallel
rank (tensor or pipeline parallel: how their shards merge is model code),
pipeline layer files, MoE expert files, parameter groups partitioned over
different DP sizes. A missing rank file is a CheckpointNotFoundError; a
truncated file, a partition whose size disagrees with the others, or a
missing entry is a CorruptCheckpointError naming the file and the key.
Without ZeRO (stage 0) only `module.*` and values are read: the optimizer
state there is indexed by position, not name (values list it as not
imported).

values(): {"step": global_steps, "deepspeed": {tag, zero_stage,
zero_dp_world_size, dp_world_size, global_steps, global_samples, skipped_steps, lr_scheduler,
ds_config, ds_version, loss_scaler, ..., "not_imported": {what: why}},
"optimizer": {"param_groups": [hyperparameters, "params": [names]],
"state": {name: {state: python scalar}} where a state is not a tensor},
"client_state": the plain values of the client state}. Values JSON cannot
hold are listed under not_imported.

Pickles are read with torch.load(weights_only=True, mmap=True), allowing
DeepSpeed's own small records (loss scaler, ZeRO stage, fragment address)
and argparse.Namespace as plain attribute holders (no DeepSpeed code runs),
unless unsafe_pickle=True.
"""

from __future__ import annotations

import argparse
import builtins
import copy
import math
import os
import re
from collections.abc import Callable, Mapping
from typing import Any

import torch

from ._foreign import Format
from .errors import (CheckpointNotFoundError, CorruptCheckpointError, InvalidStateError,
                     ShardsafeError)

LATEST = "latest"
_MODEL_RE = re.compile(r"^(?:zero_pp_rank_(\d+)_)?mp_rank_(\d+)_model_states\.pt$")
_OPTIM_RE = re.compile(r"^((?:bf16_|fp16_)?)zero_pp_rank_(\d+)_mp_rank_(\d+)_optim_states\.pt$")
_REFUSED = (
    (re.compile(r"^layer_\d+-model_.*model_states\.pt$"), "pipeline-parallel layer files"),
    (re.compile(r"expert_\d+_.*model_states\.pt$|^expp_rank_"), "MoE expert files"),
)
# Keys of the model-states file DeepSpeed writes itself; the rest is client state.
_ENGINE_KEYS = {
    "module", "buffer_names", "optimizer", "param_shapes", "frozen_param_shapes", "shared_params",
    "frozen_param_fragments", "lr_scheduler", "data_sampler", "random_ltd",
    "sparse_tensor_module_names", "skipped_steps", "global_steps", "global_samples",
    "dp_world_size", "mp_world_size", "checkpoint_parallel_dimensions", "ds_config", "ds_version",
    "universal_checkpoint_info", "ds_autotp_universal_checkpoint_meta", "num_experts",
    "ds_autoep_layers", "autoep_layers",
}
_INTERNAL = {"module", "buffer_names", "optimizer", "param_shapes", "frozen_param_shapes",
             "shared_params", "frozen_param_fragments"}
_PREFIXES = ("module.", "optimizer.", "client_state.")


# ------------------------------------------------------------ pickles --

class _Record:
    """Attributes of a pickled DeepSpeed object, rebuilt without its class."""

    def __new__(cls, *args: Any, **kwargs: Any) -> _Record:
        inst = super().__new__(cls)
        if args:
            inst.__dict__["args"] = list(args)
        return inst

    def __setstate__(self, state: Any) -> None:
        if isinstance(state, tuple) and len(state) == 2:  # (dict, slots)
            state = {**(state[0] or {}), **(state[1] or {})}
        if isinstance(state, Mapping):
            self.__dict__.update(state)
        else:
            self.__dict__["state"] = state


def _zero_stage(value: Any) -> int:
    """ZeroStageEnum(value), as the int it is."""
    return int(value)


def _record(name: str) -> type:
    return type(name, (_Record,), {})


# DeepSpeed globals found in its checkpoints, each allowed as a harmless stand-in.
_SAFE_GLOBALS: list[Any] = [
    (_zero_stage, "deepspeed.runtime.zero.config.ZeroStageEnum"),
    (_record("LossScaler"), "deepspeed.runtime.fp16.loss_scaler.LossScaler"),
    (_record("DynamicLossScaler"), "deepspeed.runtime.fp16.loss_scaler.DynamicLossScaler"),
    (_record("fragment_address"), "deepspeed.utils.tensor_fragment.fragment_address"),
    argparse.Namespace,
]


def _one_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return text[0] if text else type(e).__name__


def _refusal(e: BaseException) -> str:
    """What torch's weights_only unpickler refused (its message spans lines)."""
    for line in str(e).splitlines():
        if "WeightsUnpickler error:" in line:
            return line.split("WeightsUnpickler error:", 1)[1].strip()
    return _one_line(e)


def _torch_load(path: str, unsafe_pickle: bool) -> Any:
    """torch.load of one file, memory-mapped (legacy files: read whole)."""
    def load(mmap: bool) -> Any:
        if unsafe_pickle:
            return torch.load(path, map_location="cpu", weights_only=False, mmap=mmap)
        with torch.serialization.safe_globals(_SAFE_GLOBALS):
            return torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    try:
        return load(True)
    except RuntimeError as e:
        if "mmap" not in str(e) or "zipfile" not in str(e):
            raise
        return load(False)


class _Files:
    """The checkpoint's .pt files, each unpickled once (memory-mapped: the
    cache holds their small pickles; tensor pages are read on use and stay
    reclaimable file pages)."""

    def __init__(self, directory: str, unsafe_pickle: bool) -> None:
        self.directory = directory
        self.unsafe_pickle = unsafe_pickle
        self._cache: dict[str, Any] = {}

    def path(self, name: str) -> str:
        return os.path.join(self.directory, name)

    def get(self, name: str, key: str) -> Any:
        if name in self._cache:
            return self._cache[name]
        path = self.path(name)
        need = f" (needed for {key})" if key else ""
        try:
            obj = _torch_load(path, self.unsafe_pickle)
        except FileNotFoundError:
            raise CheckpointNotFoundError(f"{path}: missing{need}") from None
        except Exception as e:  # torch/pickle/zip errors have no common base
            if not self.unsafe_pickle and "weights_only" in str(e):
                raise InvalidStateError(
                    f"{path}: torch.load(weights_only=True) refuses it ({_refusal(e)}){need}; "
                    f"pass unsafe_pickle=True only if you trust this checkpoint") from None
            raise CorruptCheckpointError(f"{path}: unreadable ({_one_line(e)}){need}") from None
        if not isinstance(obj, dict):
            raise CorruptCheckpointError(f"{path}: holds a {type(obj).__name__}, not a DeepSpeed "
                                         f"state dict{need}")
        self._cache[name] = obj
        return obj

    def close(self) -> None:
        self._cache.clear()


def _field(obj: Any, path: tuple[Any, ...], where: str, key: str) -> Any:
    """obj[p0][p1]..., or a CorruptCheckpointError naming what is missing."""
    for p in path:
        try:
            obj = obj[p]
        except (KeyError, IndexError, TypeError):
            dotted = "/".join(map(str, path))
            need = f" (needed for {key})" if key else ""
            raise CorruptCheckpointError(
                f"{where}: no {dotted} in this DeepSpeed file{need}") from None
    return obj


# ------------------------------------------------------------- layout --

def _read_latest(root: str) -> str | None:
    try:
        with builtins.open(os.path.join(root, LATEST), encoding="utf-8") as f:
            return f.read(4096).strip()
    except (OSError, UnicodeDecodeError):
        return None


def _has_model_states(directory: str) -> bool:
    try:
        return any(_MODEL_RE.match(e.name) for e in os.scandir(directory) if e.is_file())
    except (OSError, ValueError):
        return False


def _resolve(path: str) -> tuple[str, str]:
    """(tag directory, tag) of a checkpoint root or tag directory."""
    tag = _read_latest(path) if os.path.isfile(os.path.join(path, LATEST)) else None
    if tag is not None:
        if not tag or tag in (".", "..") or "/" in tag or os.sep in tag:
            raise CorruptCheckpointError(f"{os.path.join(path, LATEST)}: names {tag!r}, not a "
                                         f"checkpoint directory name")
        directory = os.path.join(path, tag)
        if not os.path.isdir(directory):
            raise CheckpointNotFoundError(f"{directory}: missing (named by "
                                          f"{os.path.join(path, LATEST)})")
        return directory, tag
    if _has_model_states(path):
        return path, os.path.basename(os.path.normpath(path))
    raise CheckpointNotFoundError(f"{path}: no DeepSpeed '{LATEST}' file or *_model_states.pt file")


def detect(path: str) -> bool:
    """A DeepSpeed checkpoint root (its `latest` names a directory with
    model-states files) or tag directory; file names only."""
    tag = _read_latest(path)
    if tag and "/" not in tag and os.sep not in tag and tag not in (".", ".."):
        if _has_model_states(os.path.join(path, tag)):
            return True
    return _has_model_states(path)


class _Scan:
    """The tag directory's files, classified by name."""

    def __init__(self, directory: str) -> None:
        names = sorted(e.name for e in os.scandir(directory) if e.is_file())
        for pattern, what in _REFUSED:
            hit = next((n for n in names if pattern.search(n)), None)
            if hit:
                raise InvalidStateError(f"{os.path.join(directory, hit)}: DeepSpeed checkpoint "
                                        f"with {what}, which shardsafe does not read")
        self.model: dict[int | None, str] = {}  # DP rank (ZeRO-3) or None -> file
        self.optim: dict[int, str] = {}
        prefixes: dict[str, str] = {}  # optimizer file prefix -> a file with it
        mp_ranks: set[int] = set()
        for n in names:
            if m := _MODEL_RE.match(n):
                mp_ranks.add(int(m.group(2)))
                if int(m.group(2)) == 0:
                    self.model[None if m.group(1) is None else int(m.group(1))] = n
            elif m := _OPTIM_RE.match(n):
                mp_ranks.add(int(m.group(3)))
                if int(m.group(3)) == 0:
                    prefixes.setdefault(m.group(1), n)
                    self.optim[int(m.group(2))] = n
        if mp_ranks - {0}:
            raise InvalidStateError(
                f"{directory}: DeepSpeed checkpoint with model-parallel ranks {sorted(mp_ranks)} "
                f"(tensor or pipeline parallel): how their shards merge is model code, refusing "
                f"to guess")
        if len(prefixes) > 1:
            both = " and ".join(sorted(prefixes.values()))
            raise CorruptCheckpointError(
                f"{directory}: optimizer files of two runs ({both}): remove the stale ones")
        if None in self.model and len(self.model) > 1:
            raise CorruptCheckpointError(f"{directory}: both mp_rank_00_model_states.pt and "
                                         f"zero_pp_rank_*_model_states.pt: remove the stale ones")
        if not self.model:
            raise CheckpointNotFoundError(f"{directory}: no mp_rank_00 model-states file")


# ------------------------------------------------------------- values --

_DROP = object()


def _plain(x: Any, path: str, skipped: dict[str, str],
           tensor: Callable[[str, torch.Tensor], Any]) -> Any:
    """x as JSON-holdable values; tensors go through `tensor`; anything else
    is recorded in `skipped` and dropped."""
    if x is None or isinstance(x, (bool, str)):
        return x
    if isinstance(x, int):
        return int(x)
    if isinstance(x, float):
        return float(x)
    if isinstance(x, torch.Size):
        return list(x)
    if isinstance(x, torch.Tensor):
        return tensor(path, x)
    if isinstance(x, (_Record, argparse.Namespace)):
        x = vars(x)
    if isinstance(x, Mapping):
        out = {}
        for k, v in x.items():
            if not isinstance(k, (str, int)) or isinstance(k, bool):
                skipped[f"{path}.{k!r}" if path else repr(k)] = f"a {type(k).__name__} key"
                continue
            sub = f"{path}.{k}" if path else str(k)
            value = _plain(v, sub, skipped, tensor)
            if value is not _DROP:
                out[str(k)] = value
        return out
    if isinstance(x, (list, tuple)):
        items = [_plain(v, f"{path}.{i}", skipped, tensor) for i, v in enumerate(x)]
        return [v for v in items if v is not _DROP]
    skipped[path] = f"a {type(x).__module__}.{type(x).__qualname__} object JSON cannot hold"
    return _DROP


# ---------------------------------------------------------- the reader --

_Reader = Callable[[str], torch.Tensor]  # read(key): the key names it in errors
_Entry = tuple[torch.dtype, tuple[int, ...], _Reader]


def _copy_range(parts: list[torch.Tensor], start: int, length: int, out: torch.Tensor) -> None:
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


class DeepSpeedCheckpoint:
    """A DeepSpeed checkpoint (module docstring). Not thread-safe."""

    def __init__(self, path: str | os.PathLike, unsafe_pickle: bool = False) -> None:
        self.path = os.fspath(path)
        self.directory, self.tag = _resolve(self.path)
        self._scan = _Scan(self.directory)
        self._files = _Files(self.directory, unsafe_pickle)
        self._entries: dict[str, _Entry] = {}
        self._skipped: dict[str, str] = {}
        self._param_groups: list[dict[str, Any]] = []
        self._state_values: dict[str, dict[str, Any]] = {}
        self._consolidated: list[str] = []  # zero_to_fp32's names (bare keys)
        self._model_name = self._scan.model.get(None) or self._scan.model.get(0)
        if self._model_name is None:
            raise CheckpointNotFoundError(
                f"{self._files.path('zero_pp_rank_0_mp_rank_00_model_states.pt')}: missing")
        self._ms = self._files.get(self._model_name, "")
        self._check_parallelism()
        self.stage, self.world = 0, 1
        self._osd0: dict[str, Any] = {}
        self._client_tensors: dict[str, torch.Tensor] = {}
        try:
            self._plan()
        except ShardsafeError:
            raise
        except (AttributeError, TypeError, KeyError, IndexError, ValueError) as e:
            raise CorruptCheckpointError(f"{self.directory}: malformed DeepSpeed metadata "
                                         f"({type(e).__name__}: {_one_line(e)})") from None
        self.format = f"DeepSpeed ZeRO-{self.stage}" if self.stage else "DeepSpeed"

    def _plan(self) -> None:
        """Lists every key (and how to read it) from the rank-0 files."""
        if self._scan.optim:
            self._open_zero()
        elif self._ms.get("param_shapes") is not None:
            raise CheckpointNotFoundError(
                f"{self.directory}: ZeRO checkpoint without its *_optim_states.pt files")
        else:
            self._skipped["optimizer"] = ("without ZeRO the optimizer state is indexed by "
                                          "parameter position, not by name")
        self._add_module()
        client = {k: _plain(v, f"client_state.{k}", self._skipped, self._client_tensor)
                  for k, v in self._ms.items() if k not in _ENGINE_KEYS}
        self._client = {k: v for k, v in client.items() if v is not _DROP}
        self._check_collisions()

    # -------------------------------------------------------- interface --

    def tensors(self) -> dict[str, tuple[torch.dtype, tuple[int, ...]]]:
        return {k: (dtype, shape) for k, (dtype, shape, _) in self._entries.items()}

    def read(self, key: str) -> torch.Tensor:
        entry = self._entries.get(key)
        if entry is None:
            raise CheckpointNotFoundError(f"{self.directory}: no tensor {key!r} in this DeepSpeed "
                                          f"checkpoint")
        dtype, shape, read = entry
        try:
            t = read(key)
        except ShardsafeError:
            raise
        except (AttributeError, TypeError, KeyError, IndexError, ValueError, RuntimeError) as e:
            raise CorruptCheckpointError(f"{self.directory}: {key}: malformed DeepSpeed file "
                                         f"({type(e).__name__}: {_one_line(e)})") from None
        if t.dtype != dtype or tuple(t.shape) != shape:
            raise CorruptCheckpointError(
                f"{self.directory}: {key}: read {t.dtype} {tuple(t.shape)}, listed {dtype} "
                f"{shape}: the rank files disagree")
        return t.contiguous()

    def values(self) -> dict[str, Any]:
        ds: dict[str, Any] = {"tag": self.tag, "zero_stage": self.stage}
        if self.stage:
            ds["zero_dp_world_size"] = self.world
        inline = lambda _path, t: t.detach().clone()  # noqa: E731 (DeepSpeed's own: small)
        for k, v in self._ms.items():
            if k in _ENGINE_KEYS and k not in _INTERNAL:
                value = _plain(v, f"deepspeed.{k}", self._skipped, inline)
                if value is not _DROP:
                    ds[k] = value
        for k in ("loss_scaler", "dynamic_loss_scale", "overflow", "clip_grad"):
            if k in self._osd0:
                value = _plain(self._osd0[k], f"deepspeed.{k}", self._skipped, inline)
                if value is not _DROP:
                    ds[k] = value
        ds["not_imported"] = dict(self._skipped)
        optimizer: dict[str, Any] = {"param_groups": self._param_groups}
        if self._state_values:
            optimizer["state"] = self._state_values
        out: dict[str, Any] = {"deepspeed": ds, "optimizer": optimizer,
                               "client_state": self._client}
        if isinstance(self._ms.get("global_steps"), int):
            out["step"] = self._ms["global_steps"]
        return copy.deepcopy(out)

    def close(self) -> None:
        self._files.close()
        self._client_tensors.clear()

    def __enter__(self) -> DeepSpeedCheckpoint:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # ---------------------------------------------------------- opening --

    def _where(self) -> str:
        return self._files.path(self._model_name)

    def _check_parallelism(self) -> None:
        ms = self._ms
        dims = ms.get("checkpoint_parallel_dimensions") or {}
        sizes = {"mp_world_size": ms.get("mp_world_size", 1)}
        if isinstance(dims, Mapping):
            sizes.update({k: dims.get(k, 1) for k in ("tp_degree", "pp_degree")})
        many = {k: v for k, v in sizes.items() if isinstance(v, int) and v > 1}
        if many:
            raise InvalidStateError(
                f"{self._where()}: DeepSpeed checkpoint saved with model parallelism "
                f"({', '.join(f'{k}={v}' for k, v in many.items())}): how its shards merge is "
                f"model code, refusing to guess")
        if ms.get("ds_autoep_layers") or ms.get("autoep_layers"):
            raise InvalidStateError(f"{self._where()}: DeepSpeed AutoEP (MoE) checkpoint: expert "
                                    f"partitions are not read")
        if "module" not in ms or not isinstance(ms["module"], Mapping):
            raise CorruptCheckpointError(f"{self._where()}: no module state dict: not a DeepSpeed "
                                         f"model-states file")

    def _optim_name(self, rank: int) -> str:
        name0 = next(iter(self._scan.optim.values()))
        prefix = _OPTIM_RE.match(name0).group(1)  # type: ignore[union-attr]
        return f"{prefix}zero_pp_rank_{rank}_mp_rank_00_optim_states.pt"

    def _osd(self, rank: int, key: str) -> dict[str, Any]:
        name = self._optim_name(rank)
        state = self._files.get(name, key)
        return _field(state, ("optimizer_state_dict",), self._files.path(name), key)

    def _open_zero(self) -> None:
        self._osd0 = self._osd(0, "")
        where = self._files.path(self._optim_name(0))
        stage = _field(self._osd0, ("zero_stage",), where, "")
        if not isinstance(stage, int) or stage not in (0, 1, 2, 3):
            raise CorruptCheckpointError(f"{where}: unknown ZeRO stage {stage!r}")
        if stage == 0:  # older DeepSpeed's bf16 optimizer: per-rank files, not ZeRO partitions
            self._skipped["optimizer"] = "ZeRO stage 0 optimizer files are not read"
            return
        counts = _field(self._osd0, ("partition_count",), where, "")
        counts = counts if isinstance(counts, list) else [counts]
        if not counts or any(not isinstance(c, int) or c < 1 for c in counts):
            raise CorruptCheckpointError(f"{where}: bad partition_count {counts!r}")
        if len(set(counts)) > 1:
            raise InvalidStateError(f"{where}: parameter groups partitioned over different DP "
                                    f"sizes {counts} (expert parallelism): not read")
        self.stage, self.world = int(stage), counts[0]
        self._check_ranks(self._scan.optim, "ZeRO optimizer partitions", self._optim_name)
        if self.stage == 3:
            if None in self._scan.model:
                raise CorruptCheckpointError(f"{self._where()}: ZeRO-3 optimizer files with a "
                                             f"ZeRO-0/1/2 model-states file")
            self._check_ranks(self._scan.model, "ZeRO-3 model states",
                              lambda r: f"zero_pp_rank_{r}_mp_rank_00_model_states.pt")
            _Zero3(self).add()
        else:
            if None not in self._scan.model:
                raise CorruptCheckpointError(f"{self._where()}: ZeRO-{self.stage} optimizer files "
                                             f"with ZeRO-3 model-states files")
            _Zero12(self).add()

    def _check_ranks(self, files: Mapping[Any, str], what: str, name: Callable[[int], str]) -> None:
        for r in range(self.world):
            if r not in files:
                raise CheckpointNotFoundError(
                    f"{self._files.path(name(r))}: missing (rank {r} of {self.world} {what})")
        extra = sorted(r for r in files if r is not None and r >= self.world)
        if extra:
            raise CorruptCheckpointError(
                f"{self._files.path(files[extra[0]])}: rank {extra[0]} beyond the checkpoint's "
                f"{self.world} {what}: a stale file of another run?")

    def _add_module(self) -> None:
        module = self._ms["module"]
        whole = self._whole_shapes() if self.stage == 3 else {}
        for name, t in module.items():
            key = f"module.{name}"
            if not isinstance(t, torch.Tensor):
                self._skipped[key] = f"a {type(t).__name__} in the module state dict"
                continue
            if name in whole and tuple(t.shape) != whole[name]:
                continue  # a ZeRO-3 placeholder: the parameter lives in the partitions
            self._entries[key] = (t.dtype, tuple(t.shape), self._module_reader(name))

    def _whole_shapes(self) -> dict[str, tuple[int, ...]]:
        """Every parameter name (trained, frozen, tied) -> its full shape."""
        shapes: dict[str, tuple[int, ...]] = {}
        for group in _param_shapes(self):
            shapes.update(group)
        shapes.update({n: tuple(s) for n, s in (self._ms.get("frozen_param_shapes") or {}).items()})
        for alias, source in (self._ms.get("shared_params") or {}).items():
            if source in shapes:
                shapes[alias] = shapes[source]
        return shapes

    def _module_reader(self, name: str) -> _Reader:
        return lambda key: self._ms["module"][name].detach().clone()

    def _client_tensor(self, path: str, t: torch.Tensor) -> Any:
        self._client_tensors[path] = t
        self._entries[path] = (t.dtype, tuple(t.shape),
                               lambda key: self._client_tensors[key].detach().clone())
        return _DROP

    def _check_collisions(self) -> None:
        bare = [k for k in self._entries if k.startswith(_PREFIXES)]
        names = set(self._consolidated)
        clash = [k for k in bare if k in names]
        if clash:
            raise InvalidStateError(f"{self.directory}: parameter {clash[0]!r} has the name of "
                                    f"another key this reader lists; refusing to mix them")

    def _add(self, key: str, dtype: torch.dtype, shape: tuple[int, ...],
             read: _Reader) -> None:
        self._entries[key] = (dtype, tuple(int(s) for s in shape), read)


# -------------------------------------------- zero_to_fp32 names, shared --

def _add_consolidated(ck: DeepSpeedCheckpoint,
                      trained: list[tuple[str, torch.dtype, tuple[int, ...], _Reader]],
                      frozen: Callable[[str, tuple[int, ...]], tuple[torch.dtype, _Reader]]
                      ) -> None:
    """The keys of zero_to_fp32's state dict in its order: buffers, frozen
    parameters, trained parameters, tied aliases."""
    ms = ck._ms
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
    ck._consolidated = list(plan)
    for name, (dtype, shape, read) in plan.items():
        ck._add(name, dtype, shape, read)


def _buffer_reader(ck: DeepSpeedCheckpoint, name: str) -> _Reader:
    def read(key: str) -> torch.Tensor:
        t = ck._ms["module"][name]
        if t.is_floating_point() and t.dtype != torch.float32:
            return t.float()
        return t.detach().clone()
    return read


def _alias_reader(read: _Reader, source: str) -> _Reader:
    return lambda key: read(source)


def _state_tensors(state: Any) -> dict[str, Any]:
    return dict(state) if isinstance(state, Mapping) else {}


def _record_scalars(ck: DeepSpeedCheckpoint, names: list[str], state: Mapping[str, Any]) -> None:
    """Non-tensor per-group optimizer state (an int step of older torch): values."""
    for k, v in state.items():
        if not isinstance(v, torch.Tensor):
            value = _plain(v, f"optimizer.state.*.{k}", ck._skipped, lambda p, t: _DROP)
            if value is not _DROP:
                for n in names:
                    ck._state_values.setdefault(n, {})[k] = value


def _groups_values(ck: DeepSpeedCheckpoint, groups: Any, names: list[list[str]]) -> None:
    out = []
    for i, group_names in enumerate(names):
        g = groups[i] if isinstance(groups, list) and i < len(groups) else {}
        hyper = {k: v for k, v in g.items() if k != "params"} if isinstance(g, Mapping) else {}
        value = _plain(hyper, f"optimizer.param_groups.{i}", ck._skipped,
                       lambda _path, t: t.detach().clone())
        out.append({**(value if isinstance(value, dict) else {}), "params": list(group_names)})
    ck._param_groups = out


# ------------------------------------------------------------ ZeRO 1/2 --

class _Zero12:
    """ZeRO-1/2: one flat fp32 group per parameter group, cut into DP-many
    partitions of one padded size; rank r's data starts at r * P."""

    def __init__(self, ck: DeepSpeedCheckpoint) -> None:
        self.ck = ck
        osd0 = ck._osd0
        where0 = ck._files.path(ck._optim_name(0))
        shapes = _param_shapes(ck)
        flat0 = _tensor_list(osd0, "single_partition_of_fp32_groups", where0)
        pads0 = _field(osd0, ("group_paddings",), where0, "")
        if not (len(shapes) == len(flat0) and isinstance(pads0, list) and len(pads0) == len(flat0)
                and all(isinstance(p, int) and p >= 0 for p in pads0)):
            raise CorruptCheckpointError(f"{where0}: {len(flat0)} fp32 groups and group_paddings "
                                         f"{pads0!r} for {len(shapes)} param_shapes groups in "
                                         f"{ck._where()}")
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
                    f"{len(group)} parameters of group {g}")
            offset = 0
            for (name, shape), pad in zip(group.items(), paddings):
                numel = math.prod(shape)
                self.params[name] = (g, offset, numel, shape)
                offset += numel + int(pad)
            if offset > self.part[g] * ck.world:
                raise CorruptCheckpointError(
                    f"{where0}: parameter group {g} needs {offset} elements but its {ck.world} "
                    f"partitions of {self.part[g]} hold {self.part[g] * ck.world}")
            self.names.append(list(group))
        base = _field(osd0, ("base_optimizer_state",), where0, "")
        self.rigid = isinstance(base, Mapping)  # torch state_dict; else "elastic": a list per group
        self.dtypes = [t.dtype for t in flat0]

    def _group_state(self, osd: Mapping[str, Any], g: int, where: str, key: str) -> dict[str, Any]:
        base = _field(osd, ("base_optimizer_state",), where, key)
        if isinstance(base, Mapping):
            params = _field(base, ("param_groups", g, "params"), where, key)
            return _state_tensors(base.get("state", {}).get(params[0])) if params else {}
        return _state_tensors(_field(base, (g,), where, key))

    def _partition(self, r: int, g: int, state: str | None, key: str) -> tuple[torch.Tensor, int]:
        """Rank r's partition of group g (fp32 or a state) and its unpadded
        size, checked."""
        ck = self.ck
        osd = ck._osd(r, key)
        where = ck._files.path(ck._optim_name(r))
        flat = _field(osd, ("single_partition_of_fp32_groups", g), where, key)
        pad = _field(osd, ("group_paddings", g), where, key)
        lean = int(flat.numel())
        if lean + int(pad) != self.part[g]:
            raise CorruptCheckpointError(
                f"{where}: {key}: partition of group {g} is {lean} + {pad} padding elements, "
                f"rank 0's is {self.part[g]}: mismatched partition sizes")
        t = flat if state is None else self._group_state(osd, g, where, key).get(state)
        want = self.part[g] if state is not None and self._rigid(osd) else lean
        dtype = self.dtypes[g] if state is None else self._state0[g][state].dtype
        if not isinstance(t, torch.Tensor) or t.numel() != want or t.dtype != dtype:
            got = f"{t.numel()} {t.dtype} elements" if isinstance(t, torch.Tensor) else "none"
            raise CorruptCheckpointError(f"{where}: {key}: {state or 'fp32'} partition of group "
                                         f"{g}: {got}, expected {want} {dtype} as on rank 0")
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
                    f"{self.ck._files.path(self.ck._optim_name(r))}: {key}: partition of group "
                    f"{g} holds {lean} elements, the parameter needs up to {hi}")
            out[pos - offset:pos - offset + hi - lo].copy_(t.reshape(-1)[lo:hi])
            pos = r * part + hi
        return out.view(shape)

    def add(self) -> None:
        ck = self.ck
        trained = [(name, self.dtypes[g], shape, self._reader(name, None))
                   for name, (g, _, _, shape) in self.params.items()]
        _add_consolidated(ck, trained, self._frozen)
        where0 = ck._files.path(ck._optim_name(0))
        self._state0 = [self._group_state(ck._osd0, g, where0, "") for g in range(len(self.part))]
        lean0 = [t.numel() for t in ck._osd0["single_partition_of_fp32_groups"]]
        want = self.part if self.rigid else lean0
        for g, state in enumerate(self._state0):
            _record_scalars(ck, self.names[g], state)
            for k, t in state.items():
                if not isinstance(t, torch.Tensor):
                    continue
                for name in self.names[g]:
                    key, shape = f"optimizer.state.{name}.{k}", self.params[name][3]
                    if t.dim() == 0:
                        ck._add(key, t.dtype, (), _scalar_reader(t))
                    elif t.numel() == want[g]:
                        ck._add(key, t.dtype, shape, self._reader(name, k))
                    else:
                        ck._skipped[key] = f"{t.numel()} elements, not the partition's {want[g]}"
        base = ck._osd0.get("base_optimizer_state")
        groups = base.get("param_groups") if isinstance(base, Mapping) else None
        _groups_values(ck, groups, self.names)

    def _reader(self, name: str, state: str | None) -> _Reader:
        return lambda key: self._read_flat(name, state, key)

    def _frozen(self, name: str, shape: tuple[int, ...]) -> tuple[torch.dtype, _Reader]:
        """ZeRO-1/2 save frozen parameters whole in the model-states file."""
        ck = self.ck
        t = _field(ck._ms, ("frozen_param_fragments", name), ck._where(),
                   f"frozen parameter {name}")

        def read(key: str) -> torch.Tensor:
            if t.numel() != math.prod(shape):
                raise CorruptCheckpointError(
                    f"{ck._where()}: {key}: frozen parameter holds {t.numel()} elements, its "
                    f"shape {list(shape)} needs {math.prod(shape)}")
            return t.detach().clone().view(shape)
        return t.dtype, read


def _param_shapes(ck: DeepSpeedCheckpoint) -> list[dict[str, tuple[int, ...]]]:
    """The model-states file's param_shapes: per group, name -> shape."""
    groups = _field(ck._ms, ("param_shapes",), ck._where(), "")
    try:
        out = [{str(n): tuple(int(d) for d in s) for n, s in g.items()} for g in groups]
    except (AttributeError, TypeError, ValueError):
        out = None
    if (not isinstance(groups, list) or out is None
            or any(d < 0 for g in out for s in g.values() for d in s)):
        raise CorruptCheckpointError(
            f"{ck._where()}: param_shapes is not a list of name -> shape maps")
    return out


def _tensor_list(osd: Mapping[str, Any], name: str, where: str) -> list[torch.Tensor]:
    value = _field(osd, (name,), where, "")
    if not isinstance(value, list) or not all(isinstance(t, torch.Tensor) for t in value):
        raise CorruptCheckpointError(f"{where}: {name} is not a list of tensors")
    return value


def _scalar_reader(t: torch.Tensor) -> _Reader:
    return lambda key: t.detach().clone()


# -------------------------------------------------------------- ZeRO-3 --

class _Zero3:
    """ZeRO-3: every parameter cut into DP-many pieces of ceil(numel / dp);
    each rank's pieces follow each other across its fp32 sub-groups."""

    def __init__(self, ck: DeepSpeedCheckpoint) -> None:
        self.ck = ck
        where0 = ck._files.path(ck._optim_name(0))
        shapes = _param_shapes(ck)
        flat0 = _tensor_list(ck._osd0, "fp32_flat_groups", where0)
        self.sizes = [int(t.numel()) for t in flat0]
        self.starts = [0]
        for n in self.sizes:
            self.starts.append(self.starts[-1] + n)
        if len({t.dtype for t in flat0}) > 1:
            raise CorruptCheckpointError(f"{where0}: fp32_flat_groups of mixed dtypes")
        self.dtype = flat0[0].dtype if flat0 else torch.float32
        self._dtypes: dict[str, torch.dtype] = {}  # optimizer state -> dtype on rank 0
        # name -> (offset in each rank's stream, piece size, numel, shape)
        self.params: dict[str, tuple[int, int, int, tuple[int, ...]]] = {}
        offset = 0
        for group in shapes:
            for name, shape in group.items():
                if name in self.params:
                    raise CorruptCheckpointError(
                        f"{ck._where()}: parameter {name!r} twice in param_shapes")
                numel = math.prod(shape)
                piece = math.ceil(numel / ck.world)
                self.params[name] = (offset, piece, numel, shape)
                offset += piece
        if offset != self.starts[-1]:
            raise CorruptCheckpointError(
                f"{where0}: fp32 partitions hold {self.starts[-1]} elements per rank, the "
                f"parameters' pieces need {offset}")

    def _stream(self, r: int, state: str | None, key: str) -> list[torch.Tensor]:
        """Rank r's sub-group tensors (fp32 or a state), sizes checked."""
        ck = self.ck
        osd = ck._osd(r, key)
        where = ck._files.path(ck._optim_name(r))
        if state is None:
            parts = _field(osd, ("fp32_flat_groups",), where, key)
        else:
            base = _field(osd, ("optimizer_state_dict",), where, key)
            order = _flat_param_ids(base)
            states = base.get("state", {}) if isinstance(base, Mapping) else {}
            parts = [_state_tensors(states.get(i)).get(state) for i in order]
        what = "fp32" if state is None else repr(state)
        sizes = [int(t.numel()) if isinstance(t, torch.Tensor) else -1 for t in parts]
        if sizes != self.sizes:
            raise CorruptCheckpointError(
                f"{where}: {key}: {what} sub-group sizes {sizes}, rank 0's fp32 sizes "
                f"{self.sizes}: mismatched partition sizes")
        dtype = self.dtype if state is None else self._dtypes[state]
        if any(t.dtype != dtype for t in parts):
            raise CorruptCheckpointError(
                f"{where}: {key}: {what} sub-groups are not all {dtype} as on rank 0")
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
            _copy_range(self._stream(r, state, key), offset, take, out[lo:lo + take])
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
        where0 = ck._files.path(ck._optim_name(0))
        base = _field(ck._osd0, ("optimizer_state_dict",), where0, "")
        order = _flat_param_ids(base)
        groups = base.get("param_groups") if isinstance(base, Mapping) else None
        if len(order) != len(self.sizes):
            ck._skipped["optimizer.state"] = (
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
                    ck._add(f"optimizer.state.{name}.{k}", t.dtype, (), _scalar_reader(t))
                elif all(isinstance(states[s].get(k), torch.Tensor)
                         and states[s][k].numel() == self.sizes[s] for s in subs):
                    self._dtypes[k] = t.dtype
                    ck._add(f"optimizer.state.{name}.{k}", t.dtype, shape, self._reader(name, k))
                else:
                    ck._skipped[f"optimizer.state.{name}.{k}"] = "not laid out like the fp32"
        _groups_values(ck, groups, names)

    def _reader(self, name: str, state: str | None) -> _Reader:
        return lambda key: self._read(name, state, key)

    def _frozen(self, name: str, shape: tuple[int, ...]) -> tuple[torch.dtype, _Reader]:
        """ZeRO-3 saves each rank's piece of a frozen parameter in that rank's
        model-states file."""
        ck = self.ck
        first = _field(ck._ms, ("frozen_param_fragments", name), ck._where(),
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
                state = ck._files.get(file, key)
                t = _field(state, ("frozen_param_fragments", name), ck._files.path(file), key)
                if t.numel() != piece or t.dtype != first.dtype:
                    raise CorruptCheckpointError(
                        f"{ck._files.path(file)}: {key}: frozen piece of {t.numel()} {t.dtype} "
                        f"elements, expected {piece} {first.dtype}: mismatched partition sizes")
                take = min(piece, numel - lo)
                out[lo:lo + take].copy_(t.reshape(-1)[:take])
            return out.view(shape)
        return first.dtype, read


def _flat_param_ids(base: Any) -> list[Any]:
    """The optimizer's parameter ids in param_groups order (one per sub-group)."""
    groups = base.get("param_groups") if isinstance(base, Mapping) else None
    return [i for g in groups or [] if isinstance(g, Mapping) for i in g.get("params", [])]


def open(path: str | os.PathLike, unsafe_pickle: bool = False) -> DeepSpeedCheckpoint:  # noqa: A001
    """The DeepSpeed checkpoint at `path` (its root or a tag directory)."""
    return DeepSpeedCheckpoint(path, unsafe_pickle=unsafe_pickle)


FORMAT = Format("DeepSpeed", detect, open)
