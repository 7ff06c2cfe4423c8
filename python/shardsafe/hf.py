r"""Hugging Face interop: loading HF checkpoints into any layout (renamed
keys, grouped MoE experts, FP8 block dequantisation; used by
``shardsafe.load``), exporting checkpoints as HF directories (``export``,
``model_files``; collectively with ``process_group``, each rank writing its
share of the files), and PEFT adapters (``save_adapter``, ``load_adapter``).

    import shardsafe
    from shardsafe.hf import ExpertGroup, QWEN2_MOE_EXPERTS

    shardsafe.load(state, "/models/qwen3-moe",              # an HF model directory
                   rename=[(r"^model\.", ""),               # checkpoint key -> state key
                           (r"\.self_attn\.q_proj\.weight$", ".attn.wq")],
                   experts=QWEN2_MOE_EXPERTS)                # per-expert <-> [E, ...] tensors

The three steps, in the order they apply to each checkpoint tensor:

1. **rename**: ordered ``(pattern, replacement)`` rules, each replacing every
   match of its pattern (as ``re.sub``) in the result of the previous one; or
   a callable ``key -> key``. Patterns are RE2, the engine's one dialect for
   name rules (loads, exports, include / exclude): Python ``re`` syntax
   without backreferences or lookaround; replacements name groups ``\1`` ..
   ``\9``. A bad pattern is an InvalidStateError naming it.
   The result is the key in the state's namespace. Two checkpoint keys that
   end at the same name are an error naming both. Values saved by shardsafe
   (JSON, pickled blobs) are renamed the same way.
2. **experts** (``ExpertGroup`` rules, on the renamed keys): a state tensor
   that is not in the checkpoint but whose key contains a rule's ``target``
   is filled from the per-expert tensors of its ``sources`` (stacked on a
   new dim 0, several sources concatenated along ``dim``, as transformers'
   ``MergeModulelist(0)`` + ``Concatenate(dim)``); a state tensor whose key
   contains a source with an expert number is filled from its slice of a
   grouped checkpoint tensor (the reverse). Each per-expert tensor is read
   by the engine straight into its place in the grouped tensor (no full
   copy is ever built), and only for the experts and rows of this rank's
   box: an expert-parallel DTensor (Shard(0)) reads only its experts.
3. **FP8** (``dequantize_fp8=True``, the default): a checkpoint tensor of
   dtype F8_E4M3 loaded into a floating-point target of another dtype
   (BF16, F16, F32, F64), when the checkpoint also holds its
   ``<key>_scale_inv`` (``<name>.weight_scale_inv``, F32/BF16/F16, one value
   per 128x128 block of the last two dims: shape [..., ceil(R/128),
   ceil(C/128)]), is dequantised: ``w = float32(fp8) * scale_inv[r // 128,
   c // 128]``, rounded once to the target dtype (as DeepSeek-V3's
   ``weight_dequant``); ragged edge blocks use the last scale row/column.
   Only this rank's box of the weight and the scale blocks covering it are
   read. The scale tensor then counts as loaded (not unexpected). Without a
   scale tensor, or with ``dequantize_fp8=False``, an F8 checkpoint tensor
   into a BF16 target is a dtype mismatch as before. The default is on
   because the alternative (plain conversion) would silently give wrong
   values.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import tempfile
import time
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from . import _C, _hub, _paths
from ._comm import TorchComm, agree, resolve
from ._describe import describe
from ._files import read_bytes
from ._keys import (FP8_BLOCK, MIXTRAL_EXPERTS, QWEN2_MOE_EXPERTS, SCALE_SUFFIX, ExpertGroup,
                    Rename, renamer)
from ._load import load
from ._result import LoadResult, as_dict
from ._save import save
from ._state import DTYPE_NAMES
from .errors import InvalidStateError, ShardsafeError

__all__ = ["ExpertGroup", "QWEN2_MOE_EXPERTS", "MIXTRAL_EXPERTS", "Rename", "export",
           "model_files", "save_adapter", "load_adapter", "FP8_BLOCK", "SCALE_SUFFIX"]


# ----------------------------------------------------------------- export --

def export(source: str | os.PathLike, out: str | os.PathLike, *, prefix: str = "",
           include: Sequence[str] = (), exclude: Sequence[str] = (), rename: Rename = None,
           experts: Sequence[ExpertGroup] = (), dtype: torch.dtype | str | None = None,
           max_shard_size: int | str = "50GB", weights_name: str = "model",
           overwrite: bool = False, verify_checksums: bool = True, io_threads: int = 4,
           process_group: Any = None) -> dict:
    r"""Writes `source` (a checkpoint, root, HF directory or .safetensors file)
    as the Hugging Face weights directory `out`, as ``shardsafe export-hf``
    does (docs/format.md §7): ``model.safetensors`` or
    ``model-0000i-of-0000N.safetensors`` + ``model.safetensors.index.json``,
    split as transformers splits (``max_shard_size``: bytes, "5GB", "2GiB"),
    plus the files saved with the checkpoint (``save(..., files=...)``).

    Keys starting with `prefix` are taken, without it (``prefix="model."`` for
    the model part of a training state); `include` / `exclude` are regexes
    searched in those keys. `experts` (ExpertGroup rules, e.g.
    QWEN2_MOE_EXPERTS) split grouped ``[E, ...]`` tensors into per-expert
    ones; then `rename` (RE2 rules, as for load, or a callable) maps
    every name. `dtype` (torch.bfloat16 or "BF16") casts floating tensors.
    Streams with bounded memory; verifies the source's checksums; `out`
    appears atomically. Returns stats (files, copied, tensors, bytes,
    total_parameters, bytes_read, chunks_verified, seconds, warnings).

    Without `process_group` one process runs the export (call it on one
    rank). With one (``torch.distributed.group.WORLD`` for all ranks) it is
    collective, NeMo's ``save_consolidated`` / torchtitan's
    ``last_save_in_hf`` at save time: every rank computes the same plan and
    writes weight files i with ``i % world == rank`` into one temporary
    directory next to `out` (a file system all ranks share), reading the
    source itself; rank 0 then checks every file against the plan, writes
    the index and saved files and publishes `out` with one rename. Any
    rank's failure raises on every rank (naming the failed rank) and leaves
    no output: `out` stays as it was (the previous export under overwrite).
    Every rank must pass the same source and options. The stats, the same
    on every rank, add ``files_by_rank`` (the weight files each rank wrote);
    bytes_read and chunks_verified are summed over ranks.
    """
    if isinstance(dtype, torch.dtype):
        dtype = DTYPE_NAMES[dtype]
    if isinstance(max_shard_size, str):
        max_shard_size = _C.parse_byte_size(max_shard_size)
    if isinstance(experts, ExpertGroup):
        experts = [experts]
    options = _C.ExportHfOptions()
    options.max_shard_bytes = int(max_shard_size)
    options.prefix, options.include, options.exclude = prefix, list(include), list(exclude)
    options.weights_name, options.overwrite = weights_name, overwrite
    options.verify_checksums, options.io_threads = verify_checksums, io_threads
    rules = [(list(g.sources), g.target, g.dim) for g in experts]
    fn = None if rename is None else renamer(rename)
    args = (options, dtype, fn, rules)
    comm = None if process_group is None else resolve(process_group)
    if comm is None:
        return as_dict(_C.export_hf(os.fspath(source), os.fspath(out), *args))
    return _export_collective(comm, source, out, args)


def _export_collective(comm: TorchComm, source: str | os.PathLike, out: str | os.PathLike,
                       args: tuple) -> dict:
    """export() over `comm`: rank 0 stages (checks `out`, creates the
    temporary directory), every rank writes its part, rank 0 publishes.
    Each step ends in an agree(), so a rank's failure stops every rank
    before the next step; rank 0 then removes the temporary directory."""
    start = time.monotonic()
    staging, error, where = None, None, None
    if comm.rank == 0:
        try:
            staging = _C.ExportHfStaging(_paths.absolute(source), _paths.absolute(out), *args)
            where = [staging.source, staging.dir]
        except Exception as e:  # noqa: BLE001 - every rank must hear of it
            error = e
    try:
        resolved, tmp = agree(comm, error, where)[0]
        part, error = None, None
        try:
            part = as_dict(_C.export_hf_part(resolved, tmp, *args, comm.rank, comm.size))
        except Exception as e:  # noqa: BLE001
            error = e
        parts = agree(comm, error, part)
        stats, error = None, None
        if staging is not None:
            try:
                stats = as_dict(staging.finish())
            except Exception as e:  # noqa: BLE001
                error = e
        stats = agree(comm, error, stats)[0]
    finally:
        if staging is not None:
            staging.abort()  # removes the temporary directory unless published
    stats["files_by_rank"] = [p["files"] for p in parts]
    stats["bytes_read"] = sum(p["bytes_read"] for p in parts)
    stats["chunks_verified"] = sum(p["chunks_verified"] for p in parts)
    stats["seconds"] = time.monotonic() - start
    return stats


def model_files(model: Any = None, tokenizer: Any = None) -> dict[str, bytes]:
    """The files transformers' save_pretrained writes next to the weights,
    as {name: bytes}, for ``shardsafe.save(..., files=...)``: config.json
    (with ``architectures`` set from `model`), generation_config.json when
    the model generates, and the tokenizer's files. `model` may be a
    PreTrainedModel or a PretrainedConfig."""
    files = {}
    with tempfile.TemporaryDirectory() as d:
        config = getattr(model, "config", model)
        if config is not None:
            config = copy.deepcopy(config)
            if config is not model:
                config.architectures = [type(model).__name__]
            config.save_pretrained(d)
        can_generate = getattr(model, "can_generate", lambda: False)
        if getattr(model, "generation_config", None) is not None and can_generate():
            model.generation_config.save_pretrained(d)
        if tokenizer is not None:
            tokenizer.save_pretrained(d)
        for name in sorted(os.listdir(d)):
            files[name] = read_bytes(os.path.join(d, name), within=d)
    return files


# ------------------------------------------------------------------- PEFT --

def save_adapter(model: Any, path: str | os.PathLike, *, adapter_config: Any = None,
                 adapter_name: str = "default", process_group: Any = None,
                 overwrite: bool = False) -> dict:
    """Saves only the adapter parameters of a PEFT model as a PEFT adapter
    directory, ``adapter_model.safetensors`` + ``adapter_config.json``,
    loadable by ``peft.PeftModel.from_pretrained``. Collective over
    `process_group` like save: each rank contributes its shards (FSDP2 /
    tensor-parallel DTensors are fine); rank 0 writes the directory, which
    appears atomically.

    `model`: a ``peft.PeftModel`` (its adapter is selected and named by
    ``peft.get_peft_model_state_dict``, its config taken from
    ``model.peft_config[adapter_name]``), or a state dict already holding only
    the adapter tensors under their PEFT names, with `adapter_config` (a peft
    config, a dict, or JSON bytes) given.
    """
    if isinstance(model, Mapping):
        state = dict(model)
    else:
        from peft import get_peft_model_state_dict

        state = get_peft_model_state_dict(model, adapter_name=adapter_name)
        if adapter_config is None:
            adapter_config = _peft_config_bytes(model, adapter_name)
    if adapter_config is None:
        raise InvalidStateError("save_adapter: adapter_config is required for a state dict")
    if _paths.is_s3(path):
        raise InvalidStateError(f"{path}: save_adapter writes a local directory only; save it "
                                f"there and copy it into the bucket")
    path = _paths.absolute(path)
    parent, base = os.path.split(path)
    hidden = os.path.join(parent, f".tmp-adapter-{base}")  # removed afterwards
    staging = os.path.join(hidden, "adapter")
    files = {"adapter_config.json": _adapter_config_bytes(adapter_config)}
    save(state, staging, process_group=process_group, files=files, overwrite=True)
    comm = resolve(process_group)
    stats, error = None, None
    if comm is None or comm.rank == 0:
        try:
            stats = export(staging, path, weights_name="adapter_model", max_shard_size=2**62,
                           overwrite=overwrite)
        except ShardsafeError as e:
            error = e
        finally:
            shutil.rmtree(hidden, ignore_errors=True)
    agree(comm, error)
    return stats


def load_adapter(model: Any, path: str | os.PathLike, *, adapter_name: str = "default",
                 strict: bool = True, process_group: Any = None) -> LoadResult:
    """Loads a PEFT adapter into the live ``peft.PeftModel`` `model`'s adapter
    `adapter_name`, in place: to resume a PEFT run, or to start from a
    published adapter. `path`: the directory peft's ``save_pretrained`` (or
    save_adapter) writes, ``adapter_model.safetensors`` +
    ``adapter_config.json``; a hub repo id of one in the local cache; or
    any adapter shardsafe.load reads (a .safetensors file, a checkpoint of
    ``get_peft_model_state_dict(model)``).

    The saved keys are peft's, without the adapter name
    (``base_model.model.x.lora_A.weight``); the live parameters
    (``...lora_A.default.weight``) are the tensors peft's own
    ``get_peft_model_state_dict(model, adapter_name=...)`` names so, which
    share storage with the parameters: no rename rule is needed, and any
    adapter name works. Embedding layers saved with the adapter (targeted
    or resized embeddings) load too. Strict as shardsafe.load: a key the
    adapter has and the file lacks, or the reverse, is a KeyMismatchError
    naming it before anything changes; shapes and dtypes must match.
    FSDP2 / tensor-parallel DTensors load their shards; collective over
    `process_group` like load.

    When ``adapter_config.json`` is there, it must agree with the live
    adapter's config on what changes the adapter's output (peft type, r,
    lora_alpha, target modules, use_rslora, use_dora, ...): an
    InvalidStateError names the field otherwise (rebuild the model with
    ``LoraConfig.from_pretrained(path)`` to take the saved one). Returns
    load's LoadResult.
    """
    # Every rank's checks fail every rank before the collective load, so
    # none is left waiting in it.
    state = weights = error = None
    try:
        state, weights = _adapter_state(model, path, adapter_name)
    except (ShardsafeError, OSError, ValueError, TypeError) as e:
        error = e
    agree(resolve(process_group), error)
    return load(state, weights, strict=strict, process_group=process_group)


def _adapter_state(model: Any, path: str | os.PathLike,
                   adapter_name: str) -> tuple[dict[str, Any], str]:
    """load_adapter's checks; the live adapter tensors peft names as the
    files do, and the weights file."""
    from peft import get_peft_model_state_dict

    configs = getattr(model, "peft_config", None)
    if not isinstance(configs, Mapping):
        raise InvalidStateError(f"load_adapter: {type(model).__name__} is not a peft model "
                                f"(no peft_config); wrap it with peft.get_peft_model first")
    if adapter_name not in configs:
        raise InvalidStateError(f"load_adapter: the model has no adapter {adapter_name!r} "
                                f"(it has {sorted(configs)})")
    weights, config_file = _adapter_files(_hub.resolve(os.fspath(path)))
    if config_file is not None:
        _check_adapter_config(config_file, configs[adapter_name], adapter_name)
    state = get_peft_model_state_dict(model, adapter_name=adapter_name,
                                      save_embedding_layers=False)
    extra = set(describe(weights)["tensors"]) - set(state)
    if extra:  # peft saves embedding layers with some adapters: take those saved
        full = get_peft_model_state_dict(model, adapter_name=adapter_name,
                                         save_embedding_layers=True)
        state.update({k: v for k, v in full.items() if k in extra})
    _check_in_place(model, state)
    return state, weights


# What changes an adapter's output, compared between adapter_config.json and
# the live config (fields a config type lacks are skipped).
_CONFIG_FIELDS = ("peft_type", "r", "lora_alpha", "use_rslora", "use_dora", "fan_in_fan_out",
                  "bias", "target_modules", "exclude_modules", "modules_to_save",
                  "rank_pattern", "alpha_pattern", "layers_to_transform", "layers_pattern",
                  "trainable_token_indices", "lora_bias", "target_parameters")


def _adapter_files(path: str) -> tuple[str, str | None]:
    """(weights, adapter_config.json or None) of an adapter path."""
    if not os.path.isdir(path):
        return path, None
    weights = os.path.join(path, "adapter_model.safetensors")
    config = os.path.join(path, "adapter_config.json")
    if os.path.isfile(weights):
        return weights, config if os.path.isfile(config) else None
    if os.path.isfile(os.path.join(path, "adapter_model.bin")):
        raise InvalidStateError(f"{path}: holds adapter_model.bin (a pickle), not "
                                f"adapter_model.safetensors; save the adapter with peft's "
                                f"default safe_serialization=True")
    return path, None


def _normal(value: Any) -> Any:
    """A config value in a form that compares equal across JSON and live
    configs: sets and lists sorted, empty collections as None, enums as
    their values."""
    if isinstance(value, (set, frozenset, list, tuple)):
        # Sorted by their JSON text: items may be of types that do not
        # compare (dicts, None beside strings).
        items = [_normal(v) for v in value]
        return sorted(items, key=lambda v: json.dumps(v, sort_keys=True, default=str)) \
            if items else None
    if isinstance(value, Mapping):
        return {str(k): _normal(v) for k, v in value.items()} if value else None
    return getattr(value, "value", value)


def _check_adapter_config(config_file: str, live_config: Any, adapter_name: str) -> None:
    text = read_bytes(config_file)
    try:
        saved = json.loads(text)
    except ValueError as e:
        raise InvalidStateError(f"{config_file}: not JSON ({e})") from None
    live = live_config.to_dict()
    for field in _CONFIG_FIELDS:
        if field in saved and field in live and _normal(saved[field]) != _normal(live[field]):
            raise InvalidStateError(f"{config_file}: {field} is {saved[field]!r}, but the live "
                                    f"adapter {adapter_name!r} has {_normal(live[field])!r}")


def _check_in_place(model: Any, state: Mapping[str, torch.Tensor]) -> None:
    """Every tensor of `state` shares storage with a parameter or buffer of
    `model`, so loading into it changes the model."""
    from torch.distributed.tensor import DTensor

    def storage(t: torch.Tensor) -> int:
        return (t.to_local() if isinstance(t, DTensor) else t).untyped_storage().data_ptr()

    live = {storage(t) for t in (*model.parameters(), *model.buffers())}
    for key, t in state.items():
        if t.numel() and storage(t) not in live:
            raise InvalidStateError(f"load_adapter: {key!r} (as peft names it) is not the "
                                    f"storage of a parameter of the model; cannot load it "
                                    f"in place")


def _peft_config_bytes(model: Any, adapter_name: str) -> bytes:
    """adapter_config.json as PeftModel.save_pretrained writes it: inference
    mode, the base model's name, and the auto mapping when there is no task."""
    config = copy.deepcopy(model.peft_config[adapter_name])
    if config.base_model_name_or_path is None:
        base = model.base_model if config.is_prompt_learning else model.base_model.model
        config.base_model_name_or_path = base.__dict__.get("name_or_path", None) or None
    config.inference_mode = True
    auto_mapping = None
    if config.task_type is None:
        cls = model._get_base_model_class(is_prompt_tuning=config.is_prompt_learning)
        auto_mapping = {"base_model_class": cls.__name__, "parent_library": cls.__module__}
    with tempfile.TemporaryDirectory() as d:
        config.save_pretrained(d, auto_mapping_dict=auto_mapping)
        return read_bytes(os.path.join(d, "adapter_config.json"), within=d)


def _adapter_config_bytes(config: Any) -> bytes:
    if isinstance(config, (bytes, bytearray)):
        return bytes(config)
    if isinstance(config, Mapping):
        return (json.dumps(dict(config), indent=2, sort_keys=True) + "\n").encode()
    with tempfile.TemporaryDirectory() as d:  # a peft config writes itself
        config.save_pretrained(d)
        return read_bytes(os.path.join(d, "adapter_config.json"), within=d)
