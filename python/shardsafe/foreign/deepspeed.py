"""DeepSpeed checkpoints (`engine.save_checkpoint`), read as global tensors
without DeepSpeed installed: a ForeignCheckpoint of shardsafe.foreign.reader.

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
  save_checkpoint, reached through dicts. A list keeps its tensors among the
  values (moved out, they would leave a hole that shifts the items after
  them); the importer saves them as tensors under the same keys.

Two sources of one key (a parameter named `module.x` and a module entry
`x`) are refused, never mixed. The ZeRO partitions are rebuilt as
zero_to_fp32 rebuilds them (shardsafe.foreign.deepspeed_zero). A read opens only
the rank files whose partitions cover the key; each file is unpickled once,
memory-mapped, and kept until close(), so a read costs the tensor plus the
file pages it touches.

Refused (InvalidStateError, never guessed): more than one model-parallel
rank (tensor or pipeline parallel: how their shards merge is model code),
pipeline layer files, MoE expert files, parameter groups partitioned over
different DP sizes. A missing rank file is a CheckpointNotFoundError; a
truncated file, a partition whose size disagrees with the others, or a
missing entry is a CorruptCheckpointError naming the file and the key.
Without ZeRO (stage 0) only `module.*` and values are read: the optimizer
state there is indexed by position, not name. What is not read is listed
by not_imported() ("KEY: why") and under values' deepspeed.not_imported.

values(): {"step": global_steps, "deepspeed": {tag, zero_stage,
zero_dp_world_size, dp_world_size, global_steps, global_samples,
skipped_steps, lr_scheduler, ds_config, ds_version, loss_scaler, ...,
"not_imported": {what: why}}, "optimizer": {"param_groups":
[hyperparameters, "params": [names]], "state": {name: {state: value}} where
a state is not a tensor}, "client_state": the client state less its
tensors listed as keys}, as saved (DeepSpeed's records and Namespaces as
dicts; the importer drops and reports what JSON cannot hold).

Pickles are read with torch.load(weights_only=True, mmap=True), allowing
DeepSpeed's own small records (loss scaler, ZeRO stage, fragment address)
and argparse.Namespace as plain attribute holders (no DeepSpeed code runs),
unless unsafe_pickle=True (shardsafe.foreign.common.torch_load: a refused type is
an InvalidStateError naming the way out, a damaged file a
CorruptCheckpointError).
"""

from __future__ import annotations

import argparse
import os
import re
from collections.abc import Callable, Mapping
from typing import Any

import torch

from ..errors import (CheckpointNotFoundError, CorruptCheckpointError, InvalidStateError,
                      ShardsafeError)
from .common import as_dicts, one_line, read_latest, torch_load
from .deepspeed_zero import Reader, add_zero, get_field, param_shapes
from .reader import Format

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
# Attribute holders that values() gives as dicts.
_RECORDS = (_Record, argparse.Namespace)


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
        obj = torch_load(path, unsafe_pickle=self.unsafe_pickle, within=self.directory,
                         safe_globals=_SAFE_GLOBALS, what=need)
        if not isinstance(obj, dict):
            raise CorruptCheckpointError(f"{path}{need}: holds a {type(obj).__name__}, not a "
                                         f"DeepSpeed state dict", "DATA_LOSS")
        self._cache[name] = obj
        return obj

    def close(self) -> None:
        self._cache.clear()


# ------------------------------------------------------------- layout --

def _has_model_states(directory: str) -> bool:
    try:
        return any(_MODEL_RE.match(e.name) for e in os.scandir(directory) if e.is_file())
    except (OSError, ValueError):
        return False


def _resolve(path: str) -> tuple[str, str]:
    """(tag directory, tag) of a checkpoint root or tag directory."""
    tag = read_latest(os.path.join(path, LATEST))
    if tag is not None:
        if not tag or tag in (".", "..") or "/" in tag or os.sep in tag:
            raise CorruptCheckpointError(f"{os.path.join(path, LATEST)}: names {tag!r}, not a "
                                         f"checkpoint directory name", "DATA_LOSS")
        directory = os.path.join(path, tag)
        if not os.path.isdir(directory):
            raise CheckpointNotFoundError(f"{directory}: missing (named by "
                                          f"{os.path.join(path, LATEST)})", "NOT_FOUND")
        return directory, tag
    if _has_model_states(path):
        return path, os.path.basename(os.path.normpath(path))
    raise CheckpointNotFoundError(f"{path}: no DeepSpeed '{LATEST}' file or *_model_states.pt "
                                  f"file", "NOT_FOUND")


def detect(path: str) -> bool:
    """A DeepSpeed checkpoint root (its `latest` names a directory with
    model-states files) or tag directory; file names only."""
    tag = read_latest(os.path.join(path, LATEST))
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
                f"{directory}: optimizer files of two runs ({both}): remove the stale ones",
                "DATA_LOSS")
        if None in self.model and len(self.model) > 1:
            raise CorruptCheckpointError(f"{directory}: both mp_rank_00_model_states.pt and "
                                         f"zero_pp_rank_*_model_states.pt: remove the stale "
                                         f"ones", "DATA_LOSS")
        if not self.model:
            raise CheckpointNotFoundError(f"{directory}: no mp_rank_00 model-states file",
                                          "NOT_FOUND")


# ---------------------------------------------------------- the reader --

_Entry = tuple[torch.dtype, tuple[int, ...], Reader]


class DeepSpeedCheckpoint:
    """A DeepSpeed checkpoint (module docstring). Not thread-safe."""

    def __init__(self, path: str | os.PathLike, unsafe_pickle: bool = False) -> None:
        self.path = os.fspath(path)
        self.directory, self.tag = _resolve(self.path)
        self._scan = _Scan(self.directory)
        self.files = _Files(self.directory, unsafe_pickle)
        self._entries: dict[str, _Entry] = {}
        self.skipped: dict[str, str] = {}  # key -> why it is not read
        self.param_groups: list[dict[str, Any]] = []
        self.state_values: dict[str, dict[str, Any]] = {}
        self.consolidated: list[str] = []  # zero_to_fp32's names (bare keys)
        self._model_name = self._scan.model.get(None) or self._scan.model.get(0)
        if self._model_name is None:
            raise CheckpointNotFoundError(
                f"{self.files.path('zero_pp_rank_0_mp_rank_00_model_states.pt')}: missing",
                "NOT_FOUND")
        self.ms = self.files.get(self._model_name, "")
        self._check_parallelism()
        self.stage, self.world = 0, 1
        self.osd0: dict[str, Any] = {}
        self._client: dict[str, Any] = {}
        self._client_tensors: dict[str, torch.Tensor] = {}
        try:
            self._plan()
        except ShardsafeError:
            raise
        except (AttributeError, TypeError, KeyError, IndexError, ValueError) as e:
            raise CorruptCheckpointError(f"{self.directory}: malformed DeepSpeed metadata "
                                         f"({one_line(e)})", "DATA_LOSS") from None
        self.format = f"DeepSpeed ZeRO-{self.stage}" if self.stage else "DeepSpeed"

    def _plan(self) -> None:
        """Lists every key (and how to read it) from the rank-0 files."""
        if self._scan.optim:
            self._open_zero()
        elif self.ms.get("param_shapes") is not None:
            raise CheckpointNotFoundError(
                f"{self.directory}: ZeRO checkpoint without its *_optim_states.pt files",
                "NOT_FOUND")
        else:
            self.skipped["optimizer"] = ("without ZeRO the optimizer state is indexed by "
                                         "parameter position, not by name")
        self._add_module()
        self._client = self._client_value(
            {k: v for k, v in self.ms.items() if k not in _ENGINE_KEYS}, "client_state")

    # -------------------------------------------------------- interface --

    def tensors(self) -> dict[str, tuple[torch.dtype, tuple[int, ...]]]:
        return {k: (dtype, shape) for k, (dtype, shape, _) in self._entries.items()}

    def read(self, key: str) -> torch.Tensor:
        entry = self._entries.get(key)
        if entry is None:
            raise CheckpointNotFoundError(f"{self.directory}: no tensor {key!r} in this DeepSpeed "
                                          f"checkpoint", "NOT_FOUND")
        dtype, shape, read = entry
        try:
            t = read(key)
        except ShardsafeError:
            raise
        except (AttributeError, TypeError, KeyError, IndexError, ValueError, RuntimeError) as e:
            raise CorruptCheckpointError(f"{self.directory}: {key}: malformed DeepSpeed file "
                                         f"({one_line(e)})", "DATA_LOSS") from None
        if t.dtype != dtype or tuple(t.shape) != shape:
            raise CorruptCheckpointError(
                f"{self.directory}: {key}: read {t.dtype} {tuple(t.shape)}, listed {dtype} "
                f"{shape}: the rank files disagree", "DATA_LOSS")
        return t.contiguous()

    def values(self) -> dict[str, Any]:
        ds: dict[str, Any] = {"tag": self.tag, "zero_stage": self.stage}
        if self.stage:
            ds["zero_dp_world_size"] = self.world
        ds.update({k: v for k, v in self.ms.items() if k in _ENGINE_KEYS and k not in _INTERNAL})
        ds.update({k: self.osd0[k] for k in ("loss_scaler", "dynamic_loss_scale", "overflow",
                                             "clip_grad") if k in self.osd0})
        ds["not_imported"] = dict(self.skipped)
        optimizer: dict[str, Any] = {"param_groups": self.param_groups}
        if self.state_values:
            optimizer["state"] = self.state_values
        out: dict[str, Any] = {"deepspeed": ds, "optimizer": optimizer,
                               "client_state": self._client}
        if isinstance(self.ms.get("global_steps"), int):
            out["step"] = self.ms["global_steps"]
        return as_dicts(out, _RECORDS)  # fresh containers: callers may change them

    def not_imported(self) -> list[str]:
        """What is not read, one line each ("KEY: why")."""
        return [f"{key}: {why}" for key, why in self.skipped.items()]

    def close(self) -> None:
        self.files.close()
        self._client_tensors.clear()

    def __enter__(self) -> DeepSpeedCheckpoint:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # ------------------------------------ for shardsafe.foreign.deepspeed_zero --

    def where(self) -> str:
        """The rank-0 model-states file."""
        return self.files.path(self._model_name)

    def optim_name(self, rank: int) -> str:
        name0 = next(iter(self._scan.optim.values()))
        prefix = _OPTIM_RE.match(name0).group(1)  # type: ignore[union-attr]
        return f"{prefix}zero_pp_rank_{rank}_mp_rank_00_optim_states.pt"

    def osd(self, rank: int, key: str) -> dict[str, Any]:
        """Rank `rank`'s optimizer_state_dict (`key`: the tensor it is read for)."""
        name = self.optim_name(rank)
        state = self.files.get(name, key)
        return get_field(state, ("optimizer_state_dict",), self.files.path(name), key)

    def add(self, key: str, dtype: torch.dtype, shape: tuple[int, ...], read: Reader) -> None:
        """Lists tensor `key`; a key listed twice (two tensors that this
        reader's naming gives one name) is refused, never mixed."""
        if key in self._entries:
            raise InvalidStateError(f"{self.directory}: two tensors of this DeepSpeed checkpoint "
                                    f"would both be listed as {key!r} (e.g. a parameter named "
                                    f"{key!r} and a module state dict entry); refusing to mix "
                                    f"them", "INVALID_ARGUMENT")
        self._entries[key] = (dtype, tuple(int(s) for s in shape), read)

    # ---------------------------------------------------------- opening --

    def _check_parallelism(self) -> None:
        ms = self.ms
        dims = ms.get("checkpoint_parallel_dimensions") or {}
        sizes = {"mp_world_size": ms.get("mp_world_size", 1)}
        if isinstance(dims, Mapping):
            sizes.update({k: dims.get(k, 1) for k in ("tp_degree", "pp_degree")})
        many = {k: v for k, v in sizes.items() if isinstance(v, int) and v > 1}
        if many:
            raise InvalidStateError(
                f"{self.where()}: DeepSpeed checkpoint saved with model parallelism "
                f"({', '.join(f'{k}={v}' for k, v in many.items())}): how its shards merge is "
                f"model code, refusing to guess")
        if ms.get("ds_autoep_layers") or ms.get("autoep_layers"):
            raise InvalidStateError(f"{self.where()}: DeepSpeed AutoEP (MoE) checkpoint: expert "
                                    f"partitions are not read")
        if "module" not in ms or not isinstance(ms["module"], Mapping):
            raise CorruptCheckpointError(f"{self.where()}: no module state dict: not a DeepSpeed "
                                         f"model-states file", "DATA_LOSS")

    def _open_zero(self) -> None:
        self.osd0 = self.osd(0, "")
        where = self.files.path(self.optim_name(0))
        stage = get_field(self.osd0, ("zero_stage",), where, "")
        if not isinstance(stage, int) or stage not in (0, 1, 2, 3):
            raise CorruptCheckpointError(f"{where}: unknown ZeRO stage {stage!r}", "DATA_LOSS")
        if stage == 0:  # older DeepSpeed's bf16 optimizer: per-rank files, not ZeRO partitions
            self.skipped["optimizer"] = "ZeRO stage 0 optimizer files are not read"
            return
        counts = get_field(self.osd0, ("partition_count",), where, "")
        counts = counts if isinstance(counts, list) else [counts]
        if not counts or any(not isinstance(c, int) or c < 1 for c in counts):
            raise CorruptCheckpointError(f"{where}: bad partition_count {counts!r}", "DATA_LOSS")
        if len(set(counts)) > 1:
            raise InvalidStateError(f"{where}: parameter groups partitioned over different DP "
                                    f"sizes {counts} (expert parallelism): not read")
        self.stage, self.world = int(stage), counts[0]
        self._check_ranks(self._scan.optim, "ZeRO optimizer partitions", self.optim_name)
        if self.stage == 3:
            if None in self._scan.model:
                raise CorruptCheckpointError(f"{self.where()}: ZeRO-3 optimizer files with a "
                                             f"ZeRO-0/1/2 model-states file", "DATA_LOSS")
            self._check_ranks(self._scan.model, "ZeRO-3 model states",
                              lambda r: f"zero_pp_rank_{r}_mp_rank_00_model_states.pt")
        elif None not in self._scan.model:
            raise CorruptCheckpointError(f"{self.where()}: ZeRO-{self.stage} optimizer files "
                                         f"with ZeRO-3 model-states files", "DATA_LOSS")
        add_zero(self)

    def _check_ranks(self, files: Mapping[Any, str], what: str, name: Callable[[int], str]) -> None:
        for r in range(self.world):
            if r not in files:
                raise CheckpointNotFoundError(
                    f"{self.files.path(name(r))}: missing (rank {r} of {self.world} {what})",
                    "NOT_FOUND")
        extra = sorted(r for r in files if r is not None and r >= self.world)
        if extra:
            raise CorruptCheckpointError(
                f"{self.files.path(files[extra[0]])}: rank {extra[0]} beyond the checkpoint's "
                f"{self.world} {what}: a stale file of another run?", "DATA_LOSS")

    def _add_module(self) -> None:
        module = self.ms["module"]
        whole = self._whole_shapes() if self.stage == 3 else {}
        for name, t in module.items():
            key = f"module.{name}"
            if not isinstance(t, torch.Tensor):
                self.skipped[key] = f"a {type(t).__name__} in the module state dict"
                continue
            if name in whole and tuple(t.shape) != whole[name]:
                continue  # a ZeRO-3 placeholder: the parameter lives in the partitions
            self.add(key, t.dtype, tuple(t.shape), self._module_reader(name))

    def _whole_shapes(self) -> dict[str, tuple[int, ...]]:
        """Every parameter name (trained, frozen, tied) -> its full shape."""
        shapes: dict[str, tuple[int, ...]] = {}
        for group in param_shapes(self):
            shapes.update(group)
        shapes.update({n: tuple(s) for n, s in (self.ms.get("frozen_param_shapes") or {}).items()})
        for alias, source in (self.ms.get("shared_params") or {}).items():
            if source in shapes:
                shapes[alias] = shapes[source]
        return shapes

    def _module_reader(self, name: str) -> Reader:
        return lambda key: self.ms["module"][name].detach().clone()

    def _client_value(self, value: Any, key: str) -> Any:
        """A client-state value less the tensors reached through dicts, which
        are listed as keys (read on demand). Lists keep their items, tensors
        included: one taken out would shift the items after it."""
        if isinstance(value, _RECORDS):
            value = vars(value)
        if not isinstance(value, Mapping):
            return value
        out = {}
        for k, v in value.items():
            if isinstance(k, bool) or not isinstance(k, (str, int)):
                out[k] = v  # the importer drops (and reports) a key JSON cannot hold
            elif isinstance(v, torch.Tensor):
                self._client_tensors[f"{key}.{k}"] = v
                self.add(f"{key}.{k}", v.dtype, tuple(v.shape), self._client_reader)
            else:
                out[k] = self._client_value(v, f"{key}.{k}")
        return out

    def _client_reader(self, key: str) -> torch.Tensor:
        return self._client_tensors[key].detach().clone()


def open(path: str | os.PathLike, unsafe_pickle: bool = False) -> DeepSpeedCheckpoint:  # noqa: A001
    """The DeepSpeed checkpoint at `path` (its root or a tag directory)."""
    return DeepSpeedCheckpoint(path, unsafe_pickle=unsafe_pickle)


FORMAT = Format("DeepSpeed", detect, open)
