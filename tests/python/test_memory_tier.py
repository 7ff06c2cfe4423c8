"""CheckpointManager with a memory tier: saves go to the tier's folder,
every persist_every-th is copied to the root by rank 0 in the background,
and a load reads the fastest tier's copy, passing over a corrupt copy
(with a warning) for the root's copy of the step, then for older steps.
Tiers are plain folders here (a test's tmp_path stands in for /dev/shm)."""

from __future__ import annotations

import os

import pytest
import torch

import shardsafe
from shardsafe import CheckpointManager, MemoryTier
from dist_util import run_workers


def _state(step: int) -> dict:
    return {"w": torch.arange(1024, dtype=torch.float32) + step, "step": step}


def _zeros() -> dict:
    return {"w": torch.zeros(1024), "step": -1}


def _corrupt(checkpoint: str, name: str = "data-00000-000.safetensors") -> None:
    """Flips a byte of the last tensor data in one data file of the checkpoint."""
    path = os.path.join(checkpoint, name)
    with open(path, "r+b") as f:
        f.seek(-3, os.SEEK_END)
        b = f.read(1)
        f.seek(-3, os.SEEK_END)
        f.write(bytes([b[0] ^ 0x5A]))


def _tiered(tmp_path, persist_every: int, **kw) -> CheckpointManager:
    return CheckpointManager(tmp_path / "root", memory=MemoryTier(tmp_path / "mem", replicas=0),
                             persist_every=persist_every, **kw)


def test_saves_go_to_memory_and_every_nth_is_persisted(tmp_path):
    mgr = _tiered(tmp_path, persist_every=2, keep_last=3)
    for step in (10, 20, 30, 40):
        mgr.save(step, _state(step))
    mgr.wait()
    assert mgr.memory_dir == str(tmp_path / "mem")
    listed = {c["step"]: c["tiers"] for c in mgr.list()}
    assert listed == {20: ["root"], 30: ["memory"], 40: ["memory", "root"]}
    assert mgr.latest_step() == 40
    state = _zeros()
    result = mgr.load(state)
    assert state["step"] == 40 and torch.equal(state["w"], _state(40)["w"])
    assert result.step == 40 and result.warnings == []
    assert result.bytes_by_tier == {"memory": result.bytes_read} and result.bytes_read > 0
    assert mgr.load(_zeros(), step=20).bytes_by_tier.keys() == {"root"}


def test_async_saves_are_persisted_after_their_commit(tmp_path):
    mgr = _tiered(tmp_path, persist_every=1)
    mgr.async_save(5, _state(5)).result()
    mgr.wait()
    assert [c["tiers"] for c in mgr.list()] == [["memory", "root"]]
    state = _zeros()
    # A fresh process on a fresh node: the root's copy loads.
    (tmp_path / "mem" / "step-00000005" / "shardsafe.json").unlink()
    result = _tiered(tmp_path, persist_every=1).load(state)
    assert state["step"] == 5 and result.bytes_by_tier.keys() == {"root"}


def test_a_corrupt_memory_copy_is_passed_over_for_the_roots_copy(tmp_path):
    mgr = _tiered(tmp_path, persist_every=1)
    mgr.save(7, _state(7))
    mgr.wait()
    _corrupt(str(tmp_path / "mem" / "step-00000007"))
    state = _zeros()
    with pytest.warns(UserWarning, match=r"memory copy of step 7 .* passed over: .*checksum"):
        result = mgr.load(state)
    assert state["step"] == 7 and torch.equal(state["w"], _state(7)["w"])
    assert result.bytes_by_tier.keys() == {"root"} and len(result.warnings) == 1


def test_with_no_whole_copy_of_the_latest_the_newest_older_step_loads_and_says_so(tmp_path):
    mgr = _tiered(tmp_path, persist_every=2)
    for step in (1, 2, 3):
        mgr.save(step, _state(step))
    mgr.wait()
    _corrupt(str(tmp_path / "mem" / "step-00000003"))  # in memory only
    state = _zeros()
    with pytest.warns(UserWarning) as record:
        result = mgr.load(state)
    said = [str(w.message) for w in record]
    assert said == result.warnings and len(said) == 2
    assert "memory copy of step 3" in said[0] and "checksum mismatch" in said[0]
    assert "step 3 could not be loaded from any tier; loaded step 2" in said[1]
    assert state["step"] == 2 and result.step == 2
    assert result.bytes_by_tier.keys() == {"memory"}
    with pytest.raises(shardsafe.CorruptCheckpointError, match="checksum"):
        mgr.load(_zeros(), step=3)  # an asked step is never replaced by another


def test_bad_tier_options_are_refused(tmp_path):
    with pytest.raises(shardsafe.InvalidStateError, match="persist_every"):
        _tiered(tmp_path, persist_every=0)
    with pytest.raises(shardsafe.InvalidStateError, match="object store root"):
        CheckpointManager("s3://bucket/ckpt", memory=MemoryTier(tmp_path / "mem"))


def _two_ranks(rank: int, world: int, tmp: str) -> None:
    mgr = CheckpointManager(os.path.join(tmp, "root"), persist_every=1,
                            memory=MemoryTier(os.path.join(tmp, "mem"), replicas=0))
    w = torch.arange(8, dtype=torch.float32)
    mine = w[rank * 4:(rank + 1) * 4].clone()
    mgr.save(1, {"w": shardsafe.Sharded(mine, (8,), (rank * 4,)), "step": 1})
    mgr.wait()  # on rank 0, the persist too
    torch.distributed.barrier()
    if rank == 1:  # rank 1's chunk corrupt in memory: every rank passes the copy over
        _corrupt(os.path.join(tmp, "mem", "step-00000001"), "data-00001-000.safetensors")
    torch.distributed.barrier()
    out = torch.zeros(4)
    with pytest.warns(UserWarning, match="memory copy of step 1"):
        result = mgr.load({"w": shardsafe.Sharded(out, (8,), (rank * 4,)), "step": 0})
    assert torch.equal(out, w[rank * 4:(rank + 1) * 4])
    assert result.bytes_by_tier.keys() == {"root"}


def test_two_ranks_share_the_tier_and_agree_on_the_copy_they_load(tmp_path):
    run_workers(_two_ranks, 2, str(tmp_path))


def _two_nodes(rank: int, world: int, tmp: str) -> None:
    mgr = CheckpointManager(os.path.join(tmp, "root"),
                            memory=MemoryTier(os.path.join(tmp, f"mem{rank}")))
    with pytest.raises(shardsafe.ShardsafeError, match="ranks use different folders"):
        mgr.save(1, {"w": torch.zeros(4), "step": 1})


def test_ranks_on_two_simulated_nodes_are_refused(tmp_path):
    run_workers(_two_nodes, 2, str(tmp_path))
    assert not (tmp_path / "root").exists()
