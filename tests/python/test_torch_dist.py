"""Multi-process tests over torch.distributed (gloo, CPU): FSDP2, tensor
parallel, HSDP-style 2-D meshes, async save during training.

Each test spawns real processes (tests/python/dist_util.py); the checkpoint
goes through real files. References are full tensors written by rank 0 with
torch.save into a separate file, compared with torch.equal (bit-exact).
"""

from __future__ import annotations

import itertools
import os

import pytest
import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor
from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                               parallelize_module)

import shardsafe
from dist_util import run_workers

VOCAB, DIM, FFN, HEADS, LAYERS = 50, 24, 40, 4, 2  # odd sizes: uneven shards at world 4


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = torch.nn.LayerNorm(DIM)
        self.q, self.k, self.v = (torch.nn.Linear(DIM, DIM) for _ in range(3))
        self.o = torch.nn.Linear(DIM, DIM)
        self.up = torch.nn.Linear(DIM, FFN)
        self.down = torch.nn.Linear(FFN, DIM)

    def forward(self, x):
        h = self.norm(x)
        b, t, _ = h.shape
        # -1 heads: under tensor parallelism each rank holds HEADS / tp of them.
        split = lambda y: y.view(b, t, -1, DIM // HEADS).transpose(1, 2)  # noqa: E731
        a = torch.nn.functional.scaled_dot_product_attention(
            split(self.q(h)), split(self.k(h)), split(self.v(h)), is_causal=True)
        x = x + self.o(a.transpose(1, 2).reshape(b, t, -1))
        return x + self.down(torch.nn.functional.gelu(self.up(x)))


class TinyLM(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, DIM)
        self.blocks = torch.nn.ModuleList(Block() for _ in range(LAYERS))
        self.head = torch.nn.Linear(DIM, VOCAB)

    def forward(self, tokens):
        x = self.embed(tokens)
        for b in self.blocks:
            x = b(x)
        return self.head(x)


def batch(step: int, rank: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randint(0, VOCAB, (2, 9), generator=g)


def train_step(model, optim, step: int, rank: int = 0) -> float:
    tokens = batch(step, rank)
    logits = model(tokens[:, :-1])
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))
    optim.zero_grad()
    loss.backward()
    optim.step()
    return loss.item()


def fsdp_model(world: int):
    torch.manual_seed(0)
    model = TinyLM()
    mesh = init_device_mesh("cpu", (world,))
    for b in model.blocks:
        fully_shard(b, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)


def tp_model(world: int):
    torch.manual_seed(5)  # different init: everything must come from the checkpoint
    model = TinyLM()
    mesh = init_device_mesh("cpu", (world,))
    plan = {"q": ColwiseParallel(), "k": ColwiseParallel(), "v": ColwiseParallel(),
            "o": RowwiseParallel(), "up": ColwiseParallel(), "down": RowwiseParallel()}
    for b in model.blocks:
        parallelize_module(b, mesh, plan)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)


def full_state(model, optim) -> dict[str, torch.Tensor]:
    """Every tensor of the model and optimizer state, gathered whole."""
    msd, osd = get_state_dict(model, optim)
    out = {f"model.{k}": v for k, v in msd.items()}
    for fqn, st in osd["state"].items():
        for name, v in st.items():
            out[f"optim.{fqn}.{name}"] = v
    return {k: (v.full_tensor() if isinstance(v, DTensor) else v).detach().clone()
            for k, v in out.items()}


def assert_equal_states(got: dict, want: dict) -> None:
    assert sorted(got) == sorted(want)
    for k in want:
        assert got[k].dtype == want[k].dtype, k
        assert torch.equal(got[k], want[k]), f"{k} differs"


def load_into(model, optim, path: str) -> None:
    """The documented recipe: fill get_state_dict's dicts, hand them back."""
    msd, osd = get_state_dict(model, optim)
    state = {"model": msd, "optim": osd, "step": 0}
    shardsafe.load(state, path)
    assert state["step"] == 3
    set_state_dict(model, optim, model_state_dict=state["model"], optim_state_dict=state["optim"])


# --------------------------------------- FSDP2 world 4 -> TP world 2 -> 1 --

def _save_fsdp(rank, world, tmp):
    model, optim = fsdp_model(world)
    for step in range(3):
        train_step(model, optim, step, rank)
    msd, osd = get_state_dict(model, optim)
    shardsafe.save({"model": msd, "optim": osd, "step": 3}, f"{tmp}/step-3")
    ref = full_state(model, optim)
    if rank == 0:
        torch.save(ref, f"{tmp}/reference.pt")


def _load_tp(rank, world, tmp):
    model, optim = tp_model(world)
    train_step(model, optim, 0, rank)  # creates optimizer state to fill
    load_into(model, optim, f"{tmp}/step-3")
    assert_equal_states(full_state(model, optim), torch.load(f"{tmp}/reference.pt"))


def _load_plain(rank, world, tmp):
    torch.manual_seed(9)
    model = TinyLM()
    optim = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    train_step(model, optim, 0)
    load_into(model, optim, f"{tmp}/step-3")
    assert_equal_states(full_state(model, optim), torch.load(f"{tmp}/reference.pt"))


def test_fsdp2_world4_to_tensor_parallel_world2_to_one_process(tmp_path):
    run_workers(_save_fsdp, 4, str(tmp_path))
    assert shardsafe.describe(tmp_path / "step-3")["values"]["step"] == 3
    run_workers(_load_tp, 2, str(tmp_path))
    run_workers(_load_plain, 1, str(tmp_path))


# ------------------------------------------------------- resumed training --

def _resume(rank, world, tmp):
    model, optim = fsdp_model(world)
    straight = [train_step(model, optim, s, rank) for s in range(6)]

    model, optim = fsdp_model(world)
    curve = [train_step(model, optim, s, rank) for s in range(3)]
    msd, osd = get_state_dict(model, optim)
    shardsafe.save({"model": msd, "optim": osd, "step": 3}, f"{tmp}/step-3")
    del model, optim

    model, optim = fsdp_model(world)
    torch.manual_seed(123)  # a different init, overwritten by the load
    with torch.no_grad():
        for p in model.parameters():
            p.uniform_()
    train_step(model, optim, 99, rank)
    msd, osd = get_state_dict(model, optim)
    state = {"model": msd, "optim": osd, "step": 0}
    shardsafe.load(state, f"{tmp}/step-3")
    set_state_dict(model, optim, model_state_dict=state["model"], optim_state_dict=state["optim"])
    curve += [train_step(model, optim, s, rank) for s in range(state["step"], 6)]
    assert curve == straight, (curve, straight)


def test_resumed_fsdp2_training_follows_the_uninterrupted_loss_curve(tmp_path):
    run_workers(_resume, 4, str(tmp_path))


# ---------------------------------------------------- async while training --

def _async(rank, world, tmp):
    model, optim = fsdp_model(world)
    mgr = shardsafe.CheckpointManager(f"{tmp}/root", keep_last=2)
    futures, snapshots = [], {}
    for step in range(1, 7):
        train_step(model, optim, step, rank)
        if step == 1:  # the optimizer's state exists: staging sized once, ahead of the saves
            msd, osd = get_state_dict(model, optim)
            assert mgr.reserve_async_save({"model": msd, "optim": osd, "step": step}) > 0
        if step % 2 == 0:
            msd, osd = get_state_dict(model, optim)
            futures.append(mgr.async_save(step, {"model": msd, "optim": osd, "step": step}))
            snapshots[step] = full_state(model, optim)  # what the checkpoint must hold
    assert [f.result(timeout=300) for f in futures] == [mgr.path(s) for s in (2, 4, 6)]
    assert mgr.latest_step() == 6
    assert [c["step"] for c in mgr.list()] == [4, 6]

    fresh, fresh_optim = fsdp_model(world)
    train_step(fresh, fresh_optim, 0, rank)
    msd, osd = get_state_dict(fresh, fresh_optim)
    state = {"model": msd, "optim": osd, "step": 0}
    mgr.load(state, step=4)
    set_state_dict(fresh, fresh_optim, model_state_dict=state["model"],
                   optim_state_dict=state["optim"])
    assert state["step"] == 4
    assert_equal_states(full_state(fresh, fresh_optim), snapshots[4])


def test_async_save_while_training_continues(tmp_path):
    run_workers(_async, 4, str(tmp_path))


# --------------------------------------------- 1-D and 2-D mesh placements --

PLACEMENTS_2D = [
    [Replicate(), Shard(0)],  # HSDP: replicate across groups, shard within
    [Shard(0), Shard(1)],
    [Shard(1), Shard(1)],     # one dim sharded twice, uneven
    [Shard(0), Replicate()],
]


def _placements(rank, world, tmp):
    mesh2 = init_device_mesh("cpu", (2, 2))
    mesh1 = init_device_mesh("cpu", (world,))
    full = torch.arange(7 * 11, dtype=torch.float64).reshape(7, 11)
    layouts = [(mesh1, [Shard(0)]), (mesh1, [Shard(1)]), (mesh1, [Replicate()])]
    layouts += [(mesh2, p) for p in PLACEMENTS_2D]
    for i, (mesh, placements) in enumerate(layouts):
        shardsafe.save({"w": distribute_tensor(full, mesh, placements)}, f"{tmp}/l{i}")
    for (i, _), (mesh, placements) in itertools.product(enumerate(layouts), layouts):
        target = distribute_tensor(torch.zeros_like(full), mesh, placements)
        shardsafe.load({"w": target}, f"{tmp}/l{i}")
        assert torch.equal(target.full_tensor(), full), (i, placements)
    # Every layout in one state, for two shapes: one call plans tensors of one shape on several
    # meshes and placements, and the same mesh and placements for two shapes (a box is
    # computed once per shape, mesh and placements); loaded with the layouts rotated.
    other = torch.arange(5 * 4, dtype=torch.float64).reshape(5, 4) - 100
    fulls = {"w": full, "v": other}
    state = {f"{n}{i}": distribute_tensor(t, mesh, placements)
             for n, t in fulls.items() for i, (mesh, placements) in enumerate(layouts)}
    shardsafe.save(state, f"{tmp}/all")
    targets = {f"{n}{i}": distribute_tensor(torch.zeros_like(t), *layouts[(i + 1) % len(layouts)])
               for n, t in fulls.items() for i in range(len(layouts))}
    shardsafe.load(targets, f"{tmp}/all")
    for key, target in targets.items():
        assert torch.equal(target.full_tensor(), fulls[key[0]]), key


def test_shard_and_replicate_on_1d_and_2d_meshes_reshard_both_ways(tmp_path):
    run_workers(_placements, 4, str(tmp_path))


def _shared_reads(rank, world, tmp):
    mesh = init_device_mesh("cpu", (world,))
    full = torch.randn(2048, 1024, generator=torch.Generator().manual_seed(3))  # 8 MiB
    shardsafe.save({"w": distribute_tensor(full, mesh, [Shard(0)])}, f"{tmp}/rows")
    for share in (True, False):
        target = distribute_tensor(torch.zeros_like(full), mesh, [Shard(1)])
        res = shardsafe.load({"w": target}, f"{tmp}/rows", share_reads=share)
        assert torch.equal(target.full_tensor(), full), share
        # Every rank wants a quarter of every row, so reads every file whole,
        # as do the three others on this machine: through the page cache.
        assert res.bytes_shared <= res.bytes_read
        if share:
            assert res.bytes_shared >= 0.9 * res.bytes_read, (res.bytes_shared, res.bytes_read)
        else:
            assert res.bytes_shared == 0


def test_resharded_load_shares_the_page_cache_between_ranks_of_a_machine(tmp_path):
    run_workers(_shared_reads, 4, str(tmp_path))


# ------------------------------------------------- errors on every rank --

def _one_rank_bad(rank, world, tmp):
    state = {"w": torch.ones(2), "x": object() if rank == 2 else 1}
    with pytest.raises(shardsafe.ShardsafeError) as info:
        shardsafe.save(state, f"{tmp}/bad")
    if rank == 2:
        assert "'x'" in str(info.value)
    else:
        assert "rank 2: failed preparing its state: " in str(info.value)
    # Loading with a key only rank 1 wants: every rank raises, none hangs.
    shardsafe.save({"w": torch.ones(2)}, f"{tmp}/good")
    target = {"w": torch.zeros(2)} | ({"extra": torch.zeros(1)} if rank == 1 else {})
    with pytest.raises(shardsafe.KeyMismatchError, match="'extra'"):
        shardsafe.load(target, f"{tmp}/good")
    assert not os.path.exists(f"{tmp}/bad")


def test_an_error_on_one_rank_is_raised_on_every_rank(tmp_path):
    run_workers(_one_rank_bad, 4, str(tmp_path))


def _comm_body(rank, world, slot):
    from shardsafe._comm import TorchComm
    comm = TorchComm(dist.group.WORLD, slot)
    mine = bytes([rank + 1]) * (rank * 5)  # longer than a 4-byte slot from rank 1 on
    assert comm.all_gather(mine) == [bytes([r + 1]) * (r * 5) for r in range(world)]
    for root in range(world):
        sent = bytes([root + 7]) * (root * 4 + 3)
        assert comm.broadcast(sent if rank == root else b"", root) == sent
    for root in range(world):
        mine = bytes([rank]) * (rank * 3)  # rank 0 sends nothing
        got = comm.gather(mine, root)
        assert got == ([bytes([r]) * (r * 3) for r in range(world)] if rank == root else []), got
    for root in range(world):
        parts = [bytes([r, root]) * (r * 2) for r in range(world)] if rank == root else None
        assert comm.scatter(parts, root) == bytes([rank, root]) * (rank * 2)
    with pytest.raises(shardsafe.ShardsafeError, match="one part per rank"):
        comm.scatter([b"x"] if rank == 0 else None, 0)
    top = 1 << 63
    values = [rank, top | rank, (world - rank) << 40, top - 1 if rank == 1 else 0]
    assert comm.all_reduce_max(values) == [world - 1, top | (world - 1), world << 40, top - 1]
    many = [(i * 977 + rank * 13) % 101 for i in range(3 * comm.REDUCE_SLOT + 1)]
    assert comm.all_reduce_max(many) == [max((i * 977 + r * 13) % 101 for r in range(world))
                                         for i in range(len(many))]
    assert comm.all_reduce_max([]) == []
    with pytest.raises(shardsafe.ShardsafeError, match="between 1 and 2 values"):
        comm.all_reduce_max([1, 2] if rank == 0 else [1])
    parts = [bytes([rank, r]) * ((rank + r) % 3) for r in range(world)]  # some empty
    assert comm.all_to_all(parts) == [bytes([r, rank]) * ((r + rank) % 3) for r in range(world)]
    with pytest.raises(shardsafe.ShardsafeError, match="one part per rank"):
        comm.all_to_all(parts + [b"x"] if rank == 0 else parts)
    assert comm.all_to_all([b""] * world) == [b""] * world


@pytest.mark.parametrize("slot", [None, 4])
def test_the_gather_scatter_max_reduction_and_all_to_all_over_gloo(tmp_path, slot):
    """With the group's own slot every message fits it; with 4 bytes most
    send their rest in the second step."""
    run_workers(_comm_body, 3, slot)
