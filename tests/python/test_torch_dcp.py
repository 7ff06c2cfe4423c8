"""torch.distributed.checkpoint through shardsafe.dcp.Writer / Reader.

Real DCP save and load calls (torch.distributed.checkpoint.save / load), one
process and several (gloo, CPU; tests/python/dist_util.py), real files. Every
comparison is bit-exact (torch.equal); multi-process references are full
tensors that rank 0 writes with torch.save into a separate file.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor

import shardsafe
import shardsafe.dcp
from dist_util import run_workers
from test_torch_dist import assert_equal_states, full_state

# dcp.save / dcp.load without an initialised process group warn that they
# assume one process: that is what these single-process tests mean.
pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")


class Net(torch.nn.Module):
    """Odd sizes: at world 4 some FSDP2 shards are uneven or empty."""

    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(10, 6)
        self.b = torch.nn.Linear(6, 5)
        self.norm = torch.nn.LayerNorm(5)

    def forward(self, x):
        return self.norm(self.b(torch.relu(self.a(x))))


def trained(seed: int, steps: int = 2, model_fn=None):
    """A model and AdamW after `steps` steps (so the optimizer has state)."""
    torch.manual_seed(seed)
    model = Net() if model_fn is None else model_fn()
    optim = torch.optim.AdamW(model.parameters(), lr=1e-2, betas=(0.8, 0.95), weight_decay=0.1)
    for step in range(steps):
        g = torch.Generator().manual_seed(100 * seed + step)
        model(torch.randn(4, 10, generator=g)).square().mean().backward()
        optim.step()
        optim.zero_grad()
    return model, optim


def dcp_state(model, optim) -> dict:
    msd, osd = get_state_dict(model, optim)
    return {"model": msd, "optim": osd, "step": 0, "note": "", "best": 0.0}


def load_back(model, optim, state: dict) -> None:
    set_state_dict(model, optim, model_state_dict=state["model"], optim_state_dict=state["optim"])


SAVED_VALUES = {"step": 7, "note": "ünïcode", "best": float("inf")}


# ------------------------------------------------------------ one process --

def test_single_process_model_and_optimizer_round_trip_bit_exact(tmp_path):
    model, optim = trained(0)
    state = {**dcp_state(model, optim), **SAVED_VALUES}
    dcp.save(state, storage_writer=shardsafe.dcp.Writer(tmp_path / "step-7"))

    model2, optim2 = trained(1, steps=1)  # different values everywhere
    target = dcp_state(model2, optim2)
    dcp.load(target, storage_reader=shardsafe.dcp.Reader(tmp_path / "step-7"))
    assert {k: target[k] for k in SAVED_VALUES} == SAVED_VALUES
    load_back(model2, optim2, target)

    assert_equal_states(full_state(model2, optim2), full_state(model, optim))
    assert optim2.state_dict()["param_groups"] == optim.state_dict()["param_groups"]
    assert isinstance(optim2.state_dict()["param_groups"][0]["betas"], tuple)


def test_checkpoint_id_and_reuse_of_writer_and_reader(tmp_path):
    writer, reader = shardsafe.dcp.Writer(), shardsafe.dcp.Reader()
    for step in (1, 2):
        state = {"w": torch.full((3, 4), float(step)), "step": step}
        dcp.save(state, checkpoint_id=tmp_path / f"step-{step}", storage_writer=writer)
    assert writer.checkpoint_id == str(tmp_path / "step-2")
    for step in (1, 2):
        target = {"w": torch.zeros(3, 4), "step": 0}
        dcp.load(target, checkpoint_id=tmp_path / f"step-{step}", storage_reader=reader)
        assert target["step"] == step and torch.equal(target["w"], torch.full((3, 4), float(step)))


def test_a_load_through_reader_opens_the_checkpoint_once(tmp_path, monkeypatch):
    """The reader's open (in the constructor, or in the reset dcp.load
    makes) serves its description, the Writer's planner data and the reads;
    a second load opens again (a root's latest may have moved)."""
    state = {"w": torch.arange(12.0).reshape(3, 4), "step": 5}
    dcp.save(state, storage_writer=shardsafe.dcp.Writer(tmp_path / "c"))
    opens = []
    for name in ("PendingSource", "describe", "open_source"):
        real = getattr(shardsafe._C, name)
        monkeypatch.setattr(shardsafe._C, name,
                            lambda *a, _real=real, _name=name, **k: (opens.append(_name),
                                                                     _real(*a, **k))[1])
    reader = shardsafe.dcp.Reader(tmp_path / "c")
    for load in (1, 2):
        target = {"w": torch.zeros(3, 4), "step": 0}
        dcp.load(target, checkpoint_id=tmp_path / "c", storage_reader=reader)
        assert target["step"] == 5 and torch.equal(target["w"], state["w"])
        assert len(opens) == load, opens


def test_reader_converts_dtype_and_fills_non_contiguous_targets(tmp_path):
    w = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    dcp.save({"w": w, "h": w.to(torch.bfloat16)},
             storage_writer=shardsafe.dcp.Writer(tmp_path / "c"))
    target = {"w": torch.zeros(6, 4).t(), "h": torch.zeros(4, 6, dtype=torch.float32)}
    dcp.load(target, storage_reader=shardsafe.dcp.Reader(tmp_path / "c"))
    assert torch.equal(target["w"], w) and not target["w"].is_contiguous()
    assert torch.equal(target["h"], w.to(torch.bfloat16).float())


# ------------------------------------------------------ interop both ways --

def test_writer_checkpoint_loads_with_plain_shardsafe_load(tmp_path):
    model, optim = trained(0)
    dcp.save({**dcp_state(model, optim), **SAVED_VALUES},
             storage_writer=shardsafe.dcp.Writer(tmp_path / "d"))
    desc = shardsafe.describe(tmp_path / "d")
    assert "model.a.weight" in desc["tensors"] and desc["values"]["step"] == 7

    model2, optim2 = trained(1, steps=1)
    target = dcp_state(model2, optim2)
    result = shardsafe.load(target, tmp_path / "d")  # strict: every key matches
    assert result.missing_keys == [] and result.unexpected_keys == []
    assert {k: target[k] for k in SAVED_VALUES} == SAVED_VALUES
    load_back(model2, optim2, target)
    assert_equal_states(full_state(model2, optim2), full_state(model, optim))
    assert optim2.state_dict()["param_groups"] == optim.state_dict()["param_groups"]


def test_shardsafe_save_loads_with_reader(tmp_path):
    model, optim = trained(0)
    shardsafe.save({**dcp_state(model, optim), **SAVED_VALUES}, tmp_path / "s")

    model2, optim2 = trained(1, steps=1)
    target = dcp_state(model2, optim2)
    dcp.load(target, storage_reader=shardsafe.dcp.Reader(tmp_path / "s"))
    assert {k: target[k] for k in SAVED_VALUES} == SAVED_VALUES
    load_back(model2, optim2, target)
    assert_equal_states(full_state(model2, optim2), full_state(model, optim))
    groups = optim2.state_dict()["param_groups"]
    assert groups == optim.state_dict()["param_groups"]
    assert isinstance(groups[0]["betas"], tuple)  # shaped after the target's value


def test_reader_on_a_root_and_on_a_safetensors_file(tmp_path):
    from safetensors.torch import save_file

    mgr = shardsafe.CheckpointManager(tmp_path / "root")
    for step in (1, 2):
        mgr.save(step, {"w": torch.full((2, 3), float(step)), "step": step})
    target = {"w": torch.zeros(2, 3), "step": 0}
    dcp.load(target, storage_reader=shardsafe.dcp.Reader(tmp_path / "root"))
    assert target["step"] == 2 and torch.equal(target["w"], torch.full((2, 3), 2.0))

    save_file({"emb": torch.arange(6.0).reshape(3, 2)}, str(tmp_path / "m.safetensors"))
    target = {"emb": torch.zeros(3, 2)}
    dcp.load(target, storage_reader=shardsafe.dcp.Reader(tmp_path / "m.safetensors"))
    assert torch.equal(target["emb"], torch.arange(6.0).reshape(3, 2))


def test_pickled_values_need_the_opt_in(tmp_path):
    shardsafe.save({"w": torch.ones(2), "obj": {1, 2}}, tmp_path / "p", unsafe_pickle=True)
    target = {"w": torch.zeros(2), "obj": None}
    with pytest.raises(CheckpointException, match=r"'obj'.*pickle"):
        dcp.load(target, storage_reader=shardsafe.dcp.Reader(tmp_path / "p"))
    dcp.load(target, storage_reader=shardsafe.dcp.Reader(tmp_path / "p", unsafe_pickle=True))
    assert target["obj"] == {1, 2}


# ----------------------------------------------------------------- errors --

def test_missing_checkpoint_is_a_clear_error(tmp_path):
    missing = tmp_path / "nope" / "step-1"
    with pytest.raises(shardsafe.CheckpointNotFoundError, match="nope"):
        shardsafe.dcp.Reader(missing)
    with pytest.raises(shardsafe.CheckpointNotFoundError, match="nope"):
        dcp.load({"w": torch.zeros(1)}, checkpoint_id=missing,
                 storage_reader=shardsafe.dcp.Reader())
    assert not shardsafe.dcp.Reader.validate_checkpoint_id(missing)


def test_writer_errors(tmp_path):
    with pytest.raises(shardsafe.InvalidStateError, match="tag"):
        shardsafe.dcp.Writer(tmp_path / "bad tag")
    assert not shardsafe.dcp.Writer.validate_checkpoint_id(tmp_path / "latest")
    assert shardsafe.dcp.Writer.validate_checkpoint_id(tmp_path / "step-1")
    with pytest.raises(CheckpointException, match="no checkpoint path"):
        dcp.save({"w": torch.ones(1)}, storage_writer=shardsafe.dcp.Writer())

    dcp.save({"w": torch.ones(1)}, storage_writer=shardsafe.dcp.Writer(tmp_path / "x"))
    with pytest.raises(CheckpointException, match="exists"):
        dcp.save({"w": torch.zeros(1)}, storage_writer=shardsafe.dcp.Writer(tmp_path / "x"))
    dcp.save({"w": torch.zeros(1)},
             storage_writer=shardsafe.dcp.Writer(tmp_path / "x", overwrite=True))
    target = {"w": torch.ones(1)}
    dcp.load(target, storage_reader=shardsafe.dcp.Reader(tmp_path / "x"))
    assert torch.equal(target["w"], torch.zeros(1))


# ------------------------------------------------- FSDP2 world 4 -> world 2 --

def fsdp_net(world: int):
    def build():
        model = Net()
        mesh = init_device_mesh("cpu", (world,))
        fully_shard(model.a, mesh=mesh)
        fully_shard(model, mesh=mesh)
        return model
    return build


def _save_fsdp(rank, world, tmp):
    model, optim = trained(0, model_fn=fsdp_net(world))
    assert isinstance(model.a.weight, DTensor)
    state = {**dcp_state(model, optim), **SAVED_VALUES}
    dcp.save(state, storage_writer=shardsafe.dcp.Writer(f"{tmp}/step-7"))
    ref = full_state(model, optim)
    if rank == 0:
        torch.save({"tensors": ref, "groups": optim.state_dict()["param_groups"]},
                   f"{tmp}/reference.pt")


def _load_fsdp(rank, world, tmp):
    model, optim = trained(3, steps=1, model_fn=fsdp_net(world))
    target = dcp_state(model, optim)
    dcp.load(target, storage_reader=shardsafe.dcp.Reader(f"{tmp}/step-7"))
    assert {k: target[k] for k in SAVED_VALUES} == SAVED_VALUES
    load_back(model, optim, target)
    ref = torch.load(f"{tmp}/reference.pt")
    assert_equal_states(full_state(model, optim), ref["tensors"])
    assert optim.state_dict()["param_groups"] == ref["groups"]


def test_fsdp2_saved_at_world4_loads_at_world2(tmp_path):
    run_workers(_save_fsdp, 4, str(tmp_path))
    desc = shardsafe.describe(tmp_path / "step-7")
    assert desc["tensors"]["model.a.weight"] == ("F32", (6, 10))
    run_workers(_load_fsdp, 2, str(tmp_path))
    # and one process reads it whole, with the Reader and with shardsafe.load
    ref = torch.load(tmp_path / "reference.pt")
    for load in (lambda t: dcp.load(t, storage_reader=shardsafe.dcp.Reader(tmp_path / "step-7")),
                 lambda t: shardsafe.load(t, tmp_path / "step-7")):
        model, optim = trained(5, steps=1)
        target = dcp_state(model, optim)
        load(target)
        assert {k: target[k] for k in SAVED_VALUES} == SAVED_VALUES
        load_back(model, optim, target)
        assert_equal_states(full_state(model, optim), ref["tensors"])
        assert optim.state_dict()["param_groups"] == ref["groups"]
