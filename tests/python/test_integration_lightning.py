"""PyTorch Lightning through shardsafe.integrations.lightning.

The real Lightning (lightning==2.6.6) trains a small regression model on
the CPU with ShardsafeCheckpointIO / ShardsafeAsyncCheckpointIO as its
checkpoint plugin and ModelCheckpoint saving shardsafe checkpoints; a run
stopped after one epoch and resumed by a new Trainer (ckpt_path=) must take
bit-for-bit the same losses, and end with the same weights, as a run that
never stopped (AdamW moments and a step LR schedule make the curve depend
on the optimizer and scheduler state). A missing `lightning` fails the
import of this module: never a skip.
"""

from __future__ import annotations

import argparse
import collections
import os
import resource

import lightning as L
import pytest
import torch
import torch.distributed as dist
from lightning.pytorch.callbacks import Callback, ModelCheckpoint

import shardsafe
from conftest import import_error_without
from dist_util import run_workers
from shardsafe.integrations.lightning import (LAYOUT_KEY, ShardsafeAsyncCheckpointIO,
                                              ShardsafeCheckpointIO)

PLUGINS = [ShardsafeCheckpointIO, ShardsafeAsyncCheckpointIO]
STEPS_PER_EPOCH = 4

pytestmark = [
    pytest.mark.filterwarnings("ignore::UserWarning"),
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.filterwarnings("ignore::FutureWarning"),
]


class Regressor(L.LightningModule):
    def __init__(self, lr: float = 0.05, width: int = 16):
        super().__init__()
        self.save_hyperparameters()
        self.net = torch.nn.Sequential(torch.nn.Linear(8, width), torch.nn.Tanh(),
                                       torch.nn.Linear(width, 1))

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = (self.net(x) - y).square().mean()
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self):
        optim = torch.optim.AdamW(self.parameters(), lr=self.hparams.lr, weight_decay=0.1)
        sched = torch.optim.lr_scheduler.StepLR(optim, step_size=3, gamma=0.5)
        return {"optimizer": optim, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


class Losses(Callback):
    """The loss of each optimizer step, by global step (1-based)."""

    def __init__(self):
        self.by_step: dict[int, torch.Tensor] = {}

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.by_step[trainer.global_step] = outputs["loss"].detach().clone()


def _loader() -> torch.utils.data.DataLoader:
    g = torch.Generator().manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(16, 8, generator=g),
                                          torch.randn(16, 1, generator=g))
    return torch.utils.data.DataLoader(data, batch_size=16 // STEPS_PER_EPOCH)


def _fit(plugin, dirpath, epochs: int, ckpt_path=None, seed: int = 0, width: int = 16,
         devices: int = 1, **checkpointing
         ) -> tuple[dict[int, torch.Tensor], Regressor, ModelCheckpoint]:
    torch.manual_seed(seed)
    model, losses = Regressor(width=width), Losses()
    checkpoint = ModelCheckpoint(dirpath=dirpath, **(checkpointing or {"save_top_k": -1}))
    strategy = "ddp" if devices > 1 else "auto"
    trainer = L.Trainer(accelerator="cpu", devices=devices, strategy=strategy,
                        max_epochs=epochs, plugins=[plugin],
                        callbacks=[losses, checkpoint], logger=False, enable_progress_bar=False,
                        enable_model_summary=False, deterministic=True)
    trainer.fit(model, _loader(), ckpt_path=ckpt_path)
    return losses.by_step, model, checkpoint


def _assert_same_weights(a: torch.nn.Module, b: torch.nn.Module) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    assert list(sa) == list(sb)
    for k in sa:
        assert torch.equal(sa[k], sb[k]), k


@pytest.mark.parametrize("plugin_cls", PLUGINS)
def test_resumed_run_continues_on_the_same_loss_curve(tmp_path, plugin_cls):
    full, full_model, _ = _fit(plugin_cls(), tmp_path / "full", epochs=3)
    assert sorted(full) == list(range(1, 3 * STEPS_PER_EPOCH + 1))

    first, _, _ = _fit(plugin_cls(), tmp_path / "run", epochs=1)
    ckpt = tmp_path / "run" / f"epoch=0-step={STEPS_PER_EPOCH}.ckpt"
    assert (ckpt / "shardsafe.json").is_file(), "a committed shardsafe checkpoint"
    tensors = shardsafe.describe(ckpt)["tensors"]
    assert "state_dict.net.0.weight" in tensors
    assert "optimizer_states.0.state.0.exp_avg" in tensors
    for step, loss in first.items():
        assert torch.equal(loss, full[step]), step

    # Another initialisation (seed 5): everything comes from the checkpoint.
    resumed, model, _ = _fit(plugin_cls(), tmp_path / "run", epochs=3, ckpt_path=ckpt, seed=5)
    assert sorted(resumed) == list(range(STEPS_PER_EPOCH + 1, 3 * STEPS_PER_EPOCH + 1))
    for step, loss in resumed.items():
        assert torch.equal(loss, full[step]), f"step {step}: {loss} != {full[step]}"
    _assert_same_weights(model, full_model)


def _ddp(rank, world, tmp):
    """Lightning's DDP on the workers' gloo group (Lightning keeps a group
    it finds initialised): rank 0 saves alone, every rank loads alone."""
    os.environ.update(LOCAL_RANK=str(rank), RANK=str(rank), WORLD_SIZE=str(world),
                      NODE_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT="1")
    steps = STEPS_PER_EPOCH // world  # the DistributedSampler halves each epoch
    full, full_model, _ = _fit(ShardsafeAsyncCheckpointIO(), f"{tmp}/full", 2, devices=world)
    _fit(ShardsafeAsyncCheckpointIO(), f"{tmp}/run", 1, devices=world)
    resumed, model, _ = _fit(ShardsafeAsyncCheckpointIO(), f"{tmp}/run", 2, seed=5,
                             ckpt_path=f"{tmp}/run/epoch=0-step={steps}.ckpt", devices=world)
    assert sorted(resumed) == list(range(steps + 1, 2 * steps + 1))
    for step, loss in resumed.items():
        assert torch.equal(loss, full[step]), f"rank {rank} step {step}"
    _assert_same_weights(model, full_model)
    # This rank's own group left the world's group numbering as it was.
    t = torch.ones(1)
    dist.all_reduce(t, group=dist.new_group(list(range(world))))
    assert t.item() == world


def test_ddp_rank_zero_saves_and_every_rank_resumes(tmp_path):
    run_workers(_ddp, 2, str(tmp_path))
    assert sorted(os.listdir(tmp_path / "run")) == ["epoch=0-step=2.ckpt", "epoch=1-step=4.ckpt"]


def test_the_curve_depends_on_the_optimizer_state(tmp_path):
    """The comparison above would catch a lost optimizer state: the same
    checkpoint with its Adam moments zeroed resumes on another curve."""
    io = ShardsafeCheckpointIO()
    full, _, _ = _fit(io, tmp_path / "full", epochs=2)
    _fit(io, tmp_path / "run", epochs=1)
    ckpt = io.load_checkpoint(tmp_path / "run" / f"epoch=0-step={STEPS_PER_EPOCH}.ckpt")
    for state in ckpt["optimizer_states"][0]["state"].values():
        state["exp_avg"].zero_()
    io.save_checkpoint(ckpt, tmp_path / "zeroed.ckpt")
    resumed, _, _ = _fit(io, tmp_path / "run2", epochs=2, ckpt_path=tmp_path / "zeroed.ckpt")
    # The first resumed loss is taken before any optimizer step, the next after one.
    assert torch.equal(resumed[STEPS_PER_EPOCH + 1], full[STEPS_PER_EPOCH + 1])
    assert not torch.equal(resumed[STEPS_PER_EPOCH + 2], full[STEPS_PER_EPOCH + 2])


@pytest.mark.parametrize("plugin_cls", PLUGINS)
def test_top_k_removes_old_checkpoints_and_last_is_replaced(tmp_path, plugin_cls):
    losses, _, checkpoint = _fit(plugin_cls(), tmp_path / "ck", epochs=2, save_top_k=1,
                                 monitor="train_loss", every_n_train_steps=1, save_last=True)
    left = sorted(os.listdir(tmp_path / "ck"))
    best = os.path.basename(checkpoint.best_model_path)
    assert left == sorted([best, "last.ckpt"]), left  # no hidden leftovers either
    best_step = min(losses, key=lambda s: losses[s].item())
    assert best == f"epoch={(best_step - 1) // STEPS_PER_EPOCH}-step={best_step}.ckpt"
    io = plugin_cls()
    last = io.load_checkpoint(tmp_path / "ck" / "last.ckpt")
    assert last["global_step"] == 2 * STEPS_PER_EPOCH
    assert io.load_checkpoint(tmp_path / "ck" / best)["global_step"] == best_step
    io.remove_checkpoint(tmp_path / "ck" / "last.ckpt")
    assert os.listdir(tmp_path / "ck") == [best]


def test_async_saves_are_committed_when_fit_returns(tmp_path):
    _fit(ShardsafeAsyncCheckpointIO(), tmp_path / "ck", epochs=3)
    for epoch in range(3):
        path = tmp_path / "ck" / f"epoch={epoch}-step={(epoch + 1) * STEPS_PER_EPOCH}.ckpt"
        assert shardsafe.describe(path)["values"][LAYOUT_KEY]["format"] == 1


def _file_size_limit(limit: int):
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, hard))
    return lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))


@pytest.mark.parametrize("epochs", [1, 2], ids=["at-teardown", "at-next-save"])
def test_a_background_write_failure_surfaces(tmp_path, epochs):
    """The data files (a 1 MiB weight) exceed RLIMIT_FSIZE: the async save
    fails after it returned, and fit raises it, at the next save or at
    teardown. The plugin then saves again as usual."""
    io = ShardsafeAsyncCheckpointIO()
    restore = _file_size_limit(256 << 10)  # Python ignores SIGXFSZ: writes fail with EFBIG
    try:
        with pytest.raises(shardsafe.StorageError, match="epoch=0-step=4.ckpt.*File too large"):
            _fit(io, tmp_path / "ck", epochs=epochs, width=16384)
    finally:
        restore()
    assert not os.path.exists(tmp_path / "ck" / "epoch=0-step=4.ckpt")
    _fit(io, tmp_path / "ok", epochs=1, width=16384)
    assert (tmp_path / "ok" / "epoch=0-step=4.ckpt" / "shardsafe.json").is_file()


class Custom:
    def __init__(self, x):
        self.x = x

    def __eq__(self, other):
        return type(other) is Custom and other.x == self.x


def _structure(x):
    """`x` with its types spelled out, for an exact comparison."""
    if isinstance(x, torch.Tensor):
        return ("tensor", x.dtype, tuple(x.shape), x.layout)
    if isinstance(x, dict):
        return (type(x).__name__, [(type(k).__name__, k, _structure(v)) for k, v in x.items()],
                _structure(getattr(x, "_metadata", None)))
    if isinstance(x, (list, tuple)):
        return (type(x).__name__, [_structure(v) for v in x])
    return (type(x).__name__, repr(x))


def _tensors(x, out=None):
    out = [] if out is None else out
    if isinstance(x, torch.Tensor):
        out.append(x)
    elif isinstance(x, dict):
        [_tensors(v, out) for v in x.values()]
    elif isinstance(x, (list, tuple)):
        [_tensors(v, out) for v in x]
    return out


def _odd_checkpoint() -> dict:
    sd = collections.OrderedDict([("a.weight", torch.randn(3, 2)),
                                  ("a.bias", torch.arange(3, dtype=torch.bfloat16))])
    sd._metadata = collections.OrderedDict([("", {"version": 1}), ("a", {"version": 2})])
    return {
        "state_dict": sd,
        "optimizer_states": [{"state": {0: {"step": torch.tensor(3.0)}, 7: {}},
                              "param_groups": [{"betas": (0.9, 0.95), "params": [0, 7]}]}],
        "floats": [float("nan"), float("inf"), -float("inf"), 0.1, 1e300],
        "ints": [2**63 - 1, -2**63, 2**64 - 1, 2**70, True, None],
        "strings": {"": "empty key", "a.b": "dotted"},
        "state_dict.a.weight": torch.ones(1),  # the key of state_dict / a.weight
        "tuple_in_tuple": ((1, "x"), ()),
        "empty": torch.empty(0, 5, dtype=torch.int8),
        "shared": [torch.ones(2)] * 2,
        "sparse": torch.eye(3).to_sparse(),
        "dtype": torch.float16,
        "lightning_checkpoint": torch.zeros(1),  # the name of our layout value
        "non_json_keys": {(1, 2): "tuple key", 1.5: "float key"},
    }


def test_checkpoint_dicts_round_trip_exactly(tmp_path):
    ckpt = _odd_checkpoint()
    io = ShardsafeCheckpointIO()
    io.save_checkpoint(ckpt, tmp_path / "odd.ckpt")
    got = io.load_checkpoint(tmp_path / "odd.ckpt")
    assert _structure(got) == _structure(ckpt)
    for a, b in zip(_tensors(got), _tensors(ckpt)):
        assert torch.equal(a.to_dense(), b.to_dense())
    assert [repr(v) for v in got["floats"]] == ["nan", "inf", "-inf", "0.1", "1e+300"]
    assert got["ints"] == ckpt["ints"] and got["non_json_keys"] == ckpt["non_json_keys"]
    # Tensors are stored as tensors under their dotted path (a clash gets "#2").
    tensors = shardsafe.describe(tmp_path / "odd.ckpt")["tensors"]
    assert tensors["state_dict.a.bias"] == ("BF16", (3,))
    assert tensors["state_dict.a.weight#2"] == ("F32", (1,))
    assert tensors["optimizer_states.0.state.0.step"] == ("F32", ())
    assert tensors["lightning_checkpoint#2"] == ("F32", (1,))


def test_saving_again_replaces_the_checkpoint(tmp_path):
    io = ShardsafeCheckpointIO()
    io.save_checkpoint({"w": torch.zeros(2), "step": 1}, tmp_path / "c.ckpt")
    io.save_checkpoint({"w": torch.ones(3), "step": 2}, tmp_path / "c.ckpt")
    got = io.load_checkpoint(tmp_path / "c.ckpt")
    assert got["step"] == 2 and torch.equal(got["w"], torch.ones(3))


def test_objects_load_only_with_weights_only_false(tmp_path):
    io = ShardsafeCheckpointIO()
    io.save_checkpoint({"hyper_parameters": {"args": argparse.Namespace(a=1), "c": Custom(2)},
                        "w": torch.ones(2)}, tmp_path / "h.ckpt")
    with pytest.raises(shardsafe.InvalidStateError,
                       match=r"h\.ckpt: object 'hyper_parameters\.args': torch\.load failed "
                             r"\(load with weights_only=False"):
        io.load_checkpoint(tmp_path / "h.ckpt")
    got = io.load_checkpoint(tmp_path / "h.ckpt", weights_only=False)
    assert got["hyper_parameters"] == {"args": argparse.Namespace(a=1), "c": Custom(2)}


def test_load_errors(tmp_path):
    io = ShardsafeCheckpointIO()
    with pytest.raises(FileNotFoundError):  # Lightning's contract (CheckpointNotFoundError)
        io.load_checkpoint(tmp_path / "missing.ckpt")
    shardsafe.save({"w": torch.ones(2)}, tmp_path / "plain")
    with pytest.raises(shardsafe.InvalidStateError, match="plain: no 'lightning_checkpoint' value"):
        io.load_checkpoint(tmp_path / "plain")
    io.save_checkpoint({"w": torch.ones(2)}, tmp_path / "c.ckpt")
    with pytest.raises(shardsafe.InvalidStateError, match="map_location .* not a function"):
        io.load_checkpoint(tmp_path / "c.ckpt", map_location=lambda s, loc: s)
    with pytest.raises(shardsafe.InvalidStateError, match="storage_options: a shardsafe"):
        io.save_checkpoint({"w": torch.ones(2)}, tmp_path / "d.ckpt", storage_options=3)


def test_storage_options_and_torch_files(tmp_path):
    io = ShardsafeCheckpointIO(direct_io=False)
    io.save_checkpoint({"a": torch.ones(4), "b": torch.ones(4)}, tmp_path / "a.ckpt",
                       storage_options={"max_file_bytes": 8})
    assert len([f for f in os.listdir(tmp_path / "a.ckpt") if f.startswith("data-")]) == 2
    # A torch.save checkpoint from before the switch still loads (Lightning's loader).
    torch.save({"w": torch.arange(3), "epoch": 4}, tmp_path / "old.ckpt")
    got = io.load_checkpoint(tmp_path / "old.ckpt")
    assert got["epoch"] == 4 and torch.equal(got["w"], torch.arange(3))


def test_import_without_lightning_names_the_extra():
    out = import_error_without("lightning", "shardsafe.integrations.lightning")
    assert "pip install shardsafe[lightning]" in out, out
