"""torchtitan (0.3.0) through shardsafe.integrations.torchtitan.

torchtitan's own components on two CPU processes (gloo; tests/python/
dist_util.py): an FSDP2 model (fully_shard on a 1-D mesh), its
OptimizersContainer (AdamW, FQN-keyed state) and LRSchedulersContainer
(warm-up, linear decay), a ParallelAwareDataloader (per-rank state) and a
train state, checkpointed by ShardsafeCheckpointManager built from its
Config as torchtitan's Trainer builds it, in torchtitan's train-loop order
(step, then checkpointer.save). A run stopped after step 4 and resumed by
new objects (another initialisation; checkpointer.load() finds step-3)
must take bit-for-bit the same losses on every rank, and end with the same
weights, as a run that never stopped. A missing torchtitan fails the
import of this module: never a skip.
"""

from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torchtitan.components.checkpointer import CheckpointManager
from torchtitan.components.dataloader import ParallelAwareDataloader
from torchtitan.components.optimizer import LRSchedulersContainer, OptimizersContainer
from torchtitan.components.optimizer.optimizer import ParamGroupConfig

import shardsafe
from conftest import import_error_without
from dist_util import run_workers
from shardsafe.integrations.torchtitan import ShardsafeCheckpointManager

STEPS, INTERVAL, STOP = 8, 3, 4

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


class TrainState:
    def __init__(self):
        self.step = 0

    def state_dict(self):
        return {"step": self.step}

    def load_state_dict(self, sd):
        self.step = sd["step"]


def _dataset(rank: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(2 * 2 * STEPS, 6, generator=g), torch.randn(2 * 2 * STEPS, 1, generator=g)
    return list(zip(x, y))[rank::2]  # this data-parallel rank's samples


def _build(rank: int, folder: str, seed: int, keep: int = 0, interval: int = INTERVAL):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(6, 10), torch.nn.Tanh(), torch.nn.Linear(10, 1))
    mesh = init_device_mesh("cpu", (2,))
    for layer in (model[0], model[2]):
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optims = OptimizersContainer.Config(
        implementation="for-loop",
        param_groups=[ParamGroupConfig(pattern=".*", optimizer_name="AdamW",
                                       optimizer_kwargs={"lr": 0.05, "weight_decay": 0.1})],
    ).build(model_parts=[model])
    scheds = LRSchedulersContainer.Config(warmup_steps=2).build(optimizers=optims,
                                                                  training_steps=STEPS)
    loader = ParallelAwareDataloader(_dataset(rank), dp_rank=rank, dp_world_size=2,
                                     batch_size=2)
    state = TrainState()
    checkpointer = ShardsafeCheckpointManager.Config(
        enable=True, folder="ckpt", interval=interval, keep_latest_k=keep,
        last_save_model_only=False,
    ).build(dataloader=loader, model_parts=[model], optimizers=optims, lr_schedulers=scheds,
            states={"train_state": state}, sd_adapter=None, base_folder=folder)
    return model, optims, scheds, loader, state, checkpointer


def _train(rank, folder, seed=0, stop=STEPS, keep=0, interval=INTERVAL):
    """torchtitan's loop: load, then per step train, step the schedulers, save."""
    model, optims, scheds, loader, state, checkpointer = _build(rank, folder, seed, keep,
                                                                interval)
    checkpointer.load()
    losses = {}
    batches = iter(loader)
    while state.step < stop:
        state.step += 1
        x, y = next(batches)
        loss = (model(x) - y).square().mean()
        loss.backward()
        optims.step()
        scheds.step()
        optims.zero_grad()
        losses[state.step] = loss.detach().clone()
        checkpointer.save(state.step, last_step=state.step == STEPS)
    checkpointer.close()
    full = {k: v.full_tensor() for k, v in model.state_dict().items()}
    return losses, full


def _resume(rank, world, tmp):
    full_losses, full_weights = _train(rank, f"{tmp}/full", keep=2, interval=2)
    _train(rank, f"{tmp}/run", stop=STOP)
    losses, weights = _train(rank, f"{tmp}/run", seed=5)
    assert sorted(losses) == list(range(STOP, STEPS + 1)), sorted(losses)
    for step, loss in losses.items():
        assert torch.equal(loss, full_losses[step]), f"rank {rank} step {step}"
    for key in full_weights:
        assert torch.equal(weights[key], full_weights[key]), key
    dist.barrier()


def test_resumed_run_continues_on_the_same_loss_curve(tmp_path):
    run_workers(_resume, 2, str(tmp_path))
    # The interrupted run saved step 3; resumed from it, it saved 6 and the last, 8.
    assert sorted(os.listdir(tmp_path / "run" / "ckpt")) == ["step-3", "step-6", "step-8"]
    ckpt = tmp_path / "run" / "ckpt" / "step-3"
    desc = shardsafe.describe(ckpt)
    assert desc["tensors"]["0.weight"] == ("F32", (10, 6))  # FSDP2 shards, one tensor
    assert any(k.startswith("optimizer.state.0.weight.exp_avg") for k in desc["tensors"])
    # keep_latest_k=2 removed step 2 of the uninterrupted run when it saved step 6
    # (torchtitan purges after interval saves, not after the last step's).
    assert sorted(os.listdir(tmp_path / "full" / "ckpt")) == ["step-4", "step-6", "step-8"]
    # The model part loads with shardsafe.load, without DCP.
    target = {"0.weight": torch.zeros(10, 6)}
    shardsafe.load(target, ckpt, strict=False)
    assert target["0.weight"].abs().sum() > 0


def test_async_mode_is_refused():
    with pytest.raises(shardsafe.InvalidStateError, match="async_mode 'async' is not supported"):
        ShardsafeCheckpointManager.Config(enable=True, async_mode="async").build(
            dataloader=None, model_parts=[], optimizers=None, lr_schedulers=None, states={},
            sd_adapter=None)


def test_config_builds_the_shardsafe_manager():
    assert ShardsafeCheckpointManager.Config._owner is ShardsafeCheckpointManager
    assert issubclass(ShardsafeCheckpointManager, CheckpointManager)


def test_import_without_torchtitan_names_the_extra():
    out = import_error_without("torchtitan", "shardsafe.integrations.torchtitan")
    assert "pip install shardsafe[torchtitan]" in out, out
