"""torchtitan checkpoints as shardsafe checkpoints: a checkpoint manager.

    from shardsafe.integrations.torchtitan import ShardsafeCheckpointManager

    config.checkpoint = ShardsafeCheckpointManager.Config(
        enable=True, folder="checkpoint", interval=500, keep_latest_k=3)
    # torchtitan's Trainer builds it: config.checkpoint.build(dataloader=..., model_parts=...,
    #   optimizers=..., lr_schedulers=..., states=..., sd_adapter=..., base_folder=...)

torchtitan 0.3.0 picks its checkpoint manager by config: ``Trainer.Config.
checkpoint`` is a ``BaseCheckpointManager.Config`` whose owner class the
Trainer builds. ``ShardsafeCheckpointManager`` is torchtitan's own DCP
``CheckpointManager`` (intervals, ``keep_latest_k``, ``load_step``,
``exclude_from_loading``, ``initial_load_path``, model-only and HF exports,
all as torchtitan does them) with the storage step replaced: its
``dcp_save`` runs ``torch.distributed.checkpoint.save`` into
``shardsafe.dcp.Writer`` and its ``dcp_load`` reads a shardsafe checkpoint
through ``shardsafe.dcp.Reader``, so ``FOLDER/step-N`` is a shardsafe
checkpoint (one atomic commit, checksums; ``shardsafe.load`` and
``shardsafe export-hf`` read it) holding DTensor shards, the FQN-keyed
optimizer state, the dataloader's per-rank state and the train state.

- Finding the step to resume: ``step-N`` directories (the name exactly)
  that are committed shardsafe checkpoints, or DCP / HF ones as torchtitan
  accepts; a save in flight (``.tmp-step-N.*``) is never one.
- Loading anything else (a torch DCP checkpoint, e.g. ``initial_load_path``
  from a run before the switch, or an HF directory) goes through
  torchtitan's own DCP code.
- ``last_save_in_hf`` exports go through torchtitan's own HF writer.
- ``async_mode`` must be "disabled": each save is synchronous and
  collective (an error at construction otherwise).
- Retention (``keep_latest_k``) removes only ``step-N`` directories, never
  a save in flight.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Any

from . import require

require("torchtitan", "torchtitan", "shardsafe.integrations.torchtitan")

import torch.distributed as dist  # noqa: E402
import torch.distributed.checkpoint as dcp  # noqa: E402
from torchtitan.components.checkpointer import MODEL, CheckpointManager  # noqa: E402
from torchtitan.tools import filesystem  # noqa: E402
from torchtitan.tools.utils import GarbageCollection  # noqa: E402

from ..dcp import Reader, Writer  # noqa: E402
from ..errors import InvalidStateError  # noqa: E402

__all__ = ["ShardsafeCheckpointManager"]

_STEP = re.compile(r"^step-(\d+)$")


def _is_shardsafe(path: str) -> bool:
    return os.path.isfile(os.path.join(path, "shardsafe.json"))


class ShardsafeCheckpointManager(CheckpointManager):
    """torchtitan's CheckpointManager storing through shardsafe (module doc)."""

    @dataclass(kw_only=True, slots=True)
    class Config(CheckpointManager.Config):
        pass

    def __init__(self, config: Config, **kwargs: Any) -> None:
        if config.enable and config.async_mode != "disabled":
            raise InvalidStateError(f"ShardsafeCheckpointManager: async_mode "
                                    f"{config.async_mode!r} is not supported (use \"disabled\")")
        super().__init__(config, **kwargs)

    def dcp_save(self, state_dict: dict[str, Any], checkpoint_id: str, async_mode: Any,
                 enable_garbage_collection: bool = False, to_hf: bool = False) -> None:
        if to_hf:
            return super().dcp_save(state_dict, checkpoint_id, async_mode,
                                    enable_garbage_collection, to_hf)
        dcp.save(state_dict, storage_writer=Writer(checkpoint_id))
        if enable_garbage_collection:
            GarbageCollection.collect("GC collection invoked by checkpointer.")
        return None

    def dcp_load(self, state_dict: dict[str, Any], checkpoint_id: str, from_hf: bool,
                 from_quantized: bool) -> None:
        if from_hf or not _is_shardsafe(checkpoint_id):
            return super().dcp_load(state_dict, checkpoint_id, from_hf, from_quantized)
        dcp.load(state_dict, storage_reader=Reader(checkpoint_id))
        # The model's FQNs lie flat in the state (as torchtitan saves them).
        if MODEL in self.states:
            self.states[MODEL].load_state_dict(state_dict)

    def _steps(self, folder: str) -> list[tuple[int, str]]:
        """(step, path) of the step-N directories directly in `folder`."""
        if not filesystem.isdir(folder):
            return []
        found = []
        for name in filesystem.listdir(folder):
            m = _STEP.match(name)
            if m:
                found.append((int(m.group(1)), filesystem.join(folder, name)))
        return sorted(found)

    def _find_load_step(self, folder: str = "") -> int:
        valid = [step for step, path in self._steps(folder or self.folder)
                 if _is_shardsafe(path) or filesystem.isfile(os.path.join(path, ".metadata"))
                 or filesystem.isfile(os.path.join(path, "model.safetensors.index.json"))]
        return max(valid) if valid else -1

    def _purge_stale_checkpoints(self) -> None:
        if self._should_purge():
            assert self.purge_thread is not None
            for _, path in self._steps(self.folder)[: -self.keep_latest_k]:
                self.purge_queue.put(path)

    def _should_purge(self) -> bool:
        # torchtitan's check, without requiring torch.distributed for one process.
        rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
        return self.keep_latest_k > 0 and rank == 0 and filesystem.isdir(self.folder)
