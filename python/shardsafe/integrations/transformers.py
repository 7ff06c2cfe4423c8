"""Hugging Face transformers.Trainer checkpoints as shardsafe checkpoints.

    from shardsafe.integrations.transformers import ShardsafeTrainer

    trainer = ShardsafeTrainer(model=model, args=TrainingArguments(
        output_dir="/ckpt/run1", save_steps=100, save_total_limit=3, ...), ...)
    trainer.train()                              # /ckpt/run1/checkpoint-N: shardsafe checkpoints
    trainer.train(resume_from_checkpoint=True)   # the last (transformers' get_last_checkpoint)

``ShardsafeTrainer`` is a ``transformers.Trainer`` (a drop-in subclass) whose
periodic checkpoints are written by one shardsafe save: the plug points are
the Trainer's own checkpoint methods (``save_model`` when called by
``_save_checkpoint``, ``_save_optimizer_and_scheduler``, ``_save_scaler``,
``_save_rng_state`` and their ``_load_*`` counterparts, and
``_load_best_model``); the rest of ``_save_checkpoint`` (best-model
tracking, stateful callbacks, ``trainer_state.json``, rotation by
``save_total_limit``) is transformers' own.

``OUTPUT_DIR/checkpoint-N`` is a committed shardsafe checkpoint of the root
``OUTPUT_DIR`` (``CheckpointManager`` with tag ``checkpoint-{step}``: the
step is recorded, ``latest`` names it; ``shardsafe ls OUTPUT_DIR``) holding

- ``model.*``: the (unwrapped) model's state dict,
- ``optimizer.*``, ``scheduler.*``, ``scaler.*`` (when the accelerator has
  a grad scaler): their state dicts, unless ``save_only_model``,
- ``rng`` (``shardsafe.PerRank``): each rank's python / numpy / torch
  (and CUDA) generator states, as transformers' ``rng_state[_R].pth``,
- the model's ``config.json`` / ``generation_config.json`` and the
  tokenizer's files as saved files (``shardsafe export-hf
  OUTPUT_DIR/checkpoint-N OUT --prefix model.`` writes a model directory
  ``from_pretrained`` loads),

and, next to them, the small files transformers keeps in a checkpoint:
``trainer_state.json`` (written last, by transformers), the config and
tokenizer files and ``training_args.bin``. A resume
(``resume_from_checkpoint=``) of such a directory loads each part in place
through ``shardsafe.load`` (the others skipped, so each part is strict); a
checkpoint directory transformers wrote itself (no ``shardsafe.json``)
resumes through transformers' own code. Every rank takes part in each
save and load (collective over the world group, as the Trainer calls
them): a DDP model is written once, its replicas checksummed.

Not supported (an error naming it, at the first checkpoint save or load):
DeepSpeed, FSDP, XLA / TPU, SageMaker model parallel, and devices whose
generator state transformers saves other than the CPU and CUDA (NPU, HPU,
MLU, MUSA). ``trainer.save_model()`` called by you still writes transformers'
own format. ``shardsafe_options`` (a ``shardsafe.SaveOptions`` or a dict of
its fields) apply to every checkpoint save.
"""

from __future__ import annotations

import logging
import os
import random
import re
from typing import Any

import numpy as np
import torch

from . import require

require("transformers", "transformers", "shardsafe.integrations.transformers")
require("accelerate", "transformers", "shardsafe.integrations.transformers")

from accelerate.optimizer import AcceleratedOptimizer  # noqa: E402
from accelerate.scheduler import AcceleratedScheduler  # noqa: E402
from transformers import Trainer  # noqa: E402
from transformers import trainer_utils  # noqa: E402
from transformers.trainer_pt_utils import set_rng_state_for_device  # noqa: E402
from transformers.training_args import ParallelMode  # noqa: E402
from transformers.utils import (is_sagemaker_mp_enabled, is_torch_hpu_available,  # noqa: E402
                                is_torch_mlu_available, is_torch_musa_available,
                                is_torch_npu_available, is_torch_xla_available)

from .. import _paths  # noqa: E402
from .._describe import describe  # noqa: E402
from .._load import load  # noqa: E402
from .._manager import CheckpointManager  # noqa: E402
from .._options import SaveOptions  # noqa: E402
from .._parts import PerRank  # noqa: E402
from .._save import save  # noqa: E402
from ..errors import InvalidStateError  # noqa: E402
from ..hf import model_files  # noqa: E402

__all__ = ["ShardsafeTrainer", "is_shardsafe_checkpoint"]

logger = logging.getLogger(__name__)

TRAINING_ARGS_NAME = "training_args.bin"  # transformers' name (trainer.py)


def is_shardsafe_checkpoint(path: str | os.PathLike | None) -> bool:
    """Whether `path` is a committed shardsafe checkpoint directory."""
    return path is not None and os.path.isfile(os.path.join(os.fspath(path), "shardsafe.json"))


def _only(*parts: str) -> list[re.Pattern]:
    """skip_keys leaving out every key outside the given top-level parts."""
    names = "|".join(map(re.escape, parts))
    return [re.compile(rf"^(?!(?:{names})(?:\.|$))")]


def _saved(checkpoint: str, part: str) -> bool:
    """Whether the checkpoint holds top-level part `part` (tensors or values)."""
    desc = describe(checkpoint)
    return any(k == part or k.startswith(part + ".")
               for k in [*desc["tensors"], *desc["values"]])


def _inner(obj: Any) -> Any:
    """The torch optimizer / scheduler an accelerate wrapper holds."""
    if isinstance(obj, AcceleratedOptimizer):
        return obj.optimizer
    if isinstance(obj, AcceleratedScheduler):
        return obj.scheduler
    return obj


def _rng_state(distributed: bool) -> dict[str, Any]:
    """This process's generator states, as transformers' _save_rng_state
    takes them (python, numpy, cpu, cuda), in a form PerRank stores."""
    version, internal, gauss = random.getstate()
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    state: dict[str, Any] = {
        "python": [version, list(internal), gauss],
        "numpy": {"kind": kind, "keys": torch.from_numpy(keys.copy()), "pos": int(pos),
                  "has_gauss": int(has_gauss), "cached_gaussian": float(cached)},
        "cpu": torch.random.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = (torch.cuda.random.get_rng_state_all() if distributed
                         else torch.cuda.random.get_rng_state())
    return state


def _set_rng_state(state: dict[str, Any], distributed: bool) -> None:
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    n = state["numpy"]
    np.random.set_state((n["kind"], n["keys"].numpy(), n["pos"], n["has_gauss"],
                         n["cached_gaussian"]))
    torch.random.set_rng_state(state["cpu"])
    if torch.cuda.is_available():
        set_rng_state_for_device("CUDA", torch.cuda, state, distributed)


class ShardsafeTrainer(Trainer):
    """transformers.Trainer with shardsafe checkpoints (module doc)."""

    def __init__(self, *args: Any, shardsafe_options: SaveOptions | dict | None = None,
                 **kwargs: Any):
        super().__init__(*args, **kwargs)
        if isinstance(shardsafe_options, dict):
            shardsafe_options = SaveOptions.of(None, shardsafe_options)
        self._shardsafe_options = shardsafe_options or SaveOptions()
        self._shardsafe_saving = False  # inside _save_checkpoint
        self._shardsafe_managers: dict[str, CheckpointManager] = {}

    # ---------------------------------------------------------------- save --

    def _check_supported(self) -> None:
        unsupported = [name for name, on in [
            ("DeepSpeed", self.is_deepspeed_enabled), ("FSDP", self.is_fsdp_enabled),
            ("XLA", is_torch_xla_available()), ("SageMaker MP", is_sagemaker_mp_enabled()),
            ("NPU", is_torch_npu_available()), ("HPU", is_torch_hpu_available()),
            ("MLU", is_torch_mlu_available()), ("MUSA", is_torch_musa_available())] if on]
        if unsupported:
            raise InvalidStateError(f"ShardsafeTrainer: {', '.join(unsupported)} is not supported "
                                    f"(use transformers.Trainer's own checkpoints)")

    def _distributed(self) -> bool:
        return self.args.parallel_mode == ParallelMode.DISTRIBUTED

    def _save_checkpoint(self, model: torch.nn.Module, trial: Any) -> None:
        self._check_supported()
        self._shardsafe_saving = True
        try:
            super()._save_checkpoint(model, trial)
        finally:
            self._shardsafe_saving = False

    def save_model(self, output_dir: str | None = None, _internal_call: bool = False) -> None:
        if not (self._shardsafe_saving and _internal_call):
            return super().save_model(output_dir, _internal_call)
        self._save_shardsafe(output_dir or self.args.output_dir)

    def _save_shardsafe(self, output_dir: str) -> None:
        """The checkpoint's one shardsafe save (every rank), then the small
        files transformers keeps next to it (the main process)."""
        model = self.accelerator.unwrap_model(self.model, keep_torch_compile=False)
        state: dict[str, Any] = {"model": model}
        if not self.args.save_only_model:
            state["optimizer"] = _inner(self.optimizer)
            state["scheduler"] = _inner(self.lr_scheduler)
            scaler = getattr(self.accelerator, "scaler", None)
            if scaler is not None:
                state["scaler"] = scaler
            state["rng"] = PerRank(_rng_state(self._distributed()))
        tokenizer = self.processing_class or getattr(self.data_collator, "tokenizer", None)
        files = model_files(model if hasattr(model, "config") else None, tokenizer)
        root, tag = os.path.split(_paths.absolute(output_dir))
        step = self.state.global_step
        if tag == f"{trainer_utils.PREFIX_CHECKPOINT_DIR}-{step}":
            self._manager(root).save(step, state, files=files, overwrite=True,
                                     options=self._shardsafe_options)
        else:  # a checkpoint name of another form: saved by path
            save(state, output_dir, files=files, overwrite=True, options=self._shardsafe_options)
        if self.args.should_save:
            for name, content in files.items():
                with open(os.path.join(output_dir, name), "wb") as f:
                    f.write(content)
            torch.save(self.args, os.path.join(output_dir, TRAINING_ARGS_NAME))

    def _manager(self, root: str) -> CheckpointManager:
        if root not in self._shardsafe_managers:
            self._shardsafe_managers[root] = CheckpointManager(
                root, tag_format=f"{trainer_utils.PREFIX_CHECKPOINT_DIR}-{{step}}")
        return self._shardsafe_managers[root]

    def _save_optimizer_and_scheduler(self, output_dir: str) -> None:
        if not self._shardsafe_saving:
            super()._save_optimizer_and_scheduler(output_dir)  # saved with the model otherwise

    def _save_scaler(self, output_dir: str) -> None:
        if not self._shardsafe_saving:
            super()._save_scaler(output_dir)

    def _save_rng_state(self, output_dir: str) -> None:
        if not self._shardsafe_saving:
            super()._save_rng_state(output_dir)

    # ---------------------------------------------------------------- load --

    def _load_from_checkpoint(self, resume_from_checkpoint: str,
                              model: torch.nn.Module | None = None) -> None:
        if not is_shardsafe_checkpoint(resume_from_checkpoint):
            return super()._load_from_checkpoint(resume_from_checkpoint, model)
        self._check_supported()
        model = self.model if model is None else model
        logger.info("Loading model from %s (shardsafe).", resume_from_checkpoint)
        load({"model": self.accelerator.unwrap_model(model, keep_torch_compile=False)},
             resume_from_checkpoint, skip_keys=_only("model"))

    def _load_best_model(self) -> None:
        best = self.state.best_model_checkpoint
        if not is_shardsafe_checkpoint(best):
            return super()._load_best_model()
        logger.info("Loading best model from %s (score: %s).", best, self.state.best_metric)
        self._load_from_checkpoint(best)

    def _load_optimizer_and_scheduler(self, checkpoint: str | None) -> None:
        if not is_shardsafe_checkpoint(checkpoint):
            return super()._load_optimizer_and_scheduler(checkpoint)
        self._check_supported()
        if not _saved(checkpoint, "optimizer"):
            return  # saved with save_only_model: nothing to load, as transformers
        load({"optimizer": _inner(self.optimizer), "scheduler": _inner(self.lr_scheduler)},
             checkpoint, skip_keys=_only("optimizer", "scheduler"))

    def _load_scaler(self, checkpoint: str | None) -> None:
        if not is_shardsafe_checkpoint(checkpoint):
            return super()._load_scaler(checkpoint)
        scaler = getattr(self.accelerator, "scaler", None)
        if scaler is not None and _saved(checkpoint, "scaler"):
            load({"scaler": scaler}, checkpoint, skip_keys=_only("scaler"))

    def _load_rng_state(self, checkpoint: str | None) -> None:
        if not is_shardsafe_checkpoint(checkpoint):
            return super()._load_rng_state(checkpoint)
        rng = PerRank(None)
        result = load({"rng": rng}, checkpoint, skip_keys=_only("rng"), strict=False,
                      per_rank_strict=False)
        if rng.value is None:  # no RNG state for this rank (save_only_model, another world)
            logger.info("%s: no RNG state for process %d (%s); reproducibility is not "
                        "guaranteed.", checkpoint, self.args.process_index,
                        ", ".join(result.missing_keys) or "none saved")
            return
        _set_rng_state(rng.value, self._distributed())
