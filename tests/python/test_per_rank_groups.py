"""PerRank(value, group=...): per-rank values keyed by rank within a group
(a DP rank's data-loader state through a TP/PP change at fixed DP), with
real torch.distributed gloo processes; docs/format.md §6."""

from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist

import shardsafe
from shardsafe.errors import CorruptCheckpointError, InvalidStateError, KeyMismatchError

from dist_util import run_workers
from test_collective_counts import _Counter


def _loader(dp: int) -> dict:
    return {"dp": dp, "pos": 1000 + 7 * dp, "order": torch.arange(4) + 10 * dp}


def _blank() -> dict:
    return {"dp": -1, "pos": -1, "order": torch.full((4,), -1)}


def _save_tp2_dp2(rank: int, world: int, path: str) -> None:
    # Megatron's order: rank = dp * TP + tp; the DP groups are the ranks of one tp rank.
    tp, dp = rank % 2, rank // 2
    groups = [dist.new_group([t, t + 2]) for t in range(2)]
    assert dist.get_rank(groups[tp]) == dp
    state = {"w": torch.ones(4) * 3, "loader": shardsafe.PerRank(_loader(dp), group=groups[tp]),
             "rng": shardsafe.PerRank({"rank": rank})}
    shardsafe.save(state, path)


def _load_tp1_dp2(rank: int, world: int, path: str) -> None:
    group = dist.group.WORLD  # TP1 x DP2: every rank is its own DP rank
    state = {"w": torch.zeros(4), "loader": shardsafe.PerRank(_blank(), group=group)}
    result = shardsafe.load(state, path, skip_keys=["rng"])
    assert state["loader"].value["dp"] == rank
    assert state["loader"].value["pos"] == 1000 + 7 * rank
    assert torch.equal(state["loader"].value["order"], torch.arange(4) + 10 * rank)
    assert torch.equal(state["w"], torch.ones(4) * 3)
    assert result.missing_keys == [] and result.unexpected_keys == []


def _load_dp_fastest(rank: int, world: int, path: str) -> None:
    # Another layout at world 4: rank = tp * DP + dp, the DP rank given by a rule.
    state = {"loader": shardsafe.PerRank(_blank(), group=lambda r: r % 2),
             "rng": shardsafe.PerRank(None)}
    shardsafe.load(state, path, skip_keys=["w"])
    assert state["loader"].value["dp"] == rank % 2
    assert state["rng"].value == {"rank": rank}  # by global rank, as before


def _load_dp3(rank: int, world: int, path: str) -> None:
    state = {"w": torch.zeros(4), "loader": shardsafe.PerRank(_blank(), group=rank)}
    with pytest.raises(KeyMismatchError) as info:  # on every rank: the report is agreed
        shardsafe.load(state, path, skip_keys=["rng"])
    assert "loader[group rank 2]" in str(info.value), info.value
    assert "per_rank_strict=False" in str(info.value)
    assert state["loader"].value["dp"] == -1  # nothing changed
    result = shardsafe.load(state, path, skip_keys=["rng"], per_rank_strict=False)
    assert result.missing_keys == ["loader[group rank 2]"]
    if rank < 2:
        assert state["loader"].value["dp"] == rank
    else:  # keeps its own value, never another group rank's
        assert (state["loader"].value["dp"], state["loader"].value["pos"]) == (-1, -1)
        assert torch.equal(state["loader"].value["order"], torch.full((4,), -1))


def _load_dp1(rank: int, world: int, path: str) -> None:
    state = {"loader": shardsafe.PerRank(_blank(), group=0)}  # TP2 x DP1
    with pytest.raises(KeyMismatchError) as info:  # saved DP rank 1: loaded by no rank
        shardsafe.load(state, path, skip_keys=["rng", "w"])
    assert "loader[group rank 1]" in str(info.value), info.value


def test_grouped_per_rank_follows_the_dp_rank_through_a_tp_change(tmp_path):
    path = str(tmp_path / "ckpt")
    run_workers(_save_tp2_dp2, 4, path)
    run_workers(_load_tp1_dp2, 2, path)
    run_workers(_load_dp_fastest, 4, path)
    run_workers(_load_dp3, 3, path)
    run_workers(_load_dp1, 2, path)


def _divergent(rank: int, world: int, path: str, same_size: bool) -> None:
    # Two TP peers of DP rank 0 that disagree on its loader state.
    value = {"pos": 5 + rank} if same_size else {"pos": 5, "extra": [1] * (rank + 1)}
    state = {"loader": shardsafe.PerRank(value, group=0)}
    with pytest.raises(InvalidStateError) as info:
        shardsafe.save(state, path)
    message = str(info.value)
    assert "__shardsafe__/group/0/loader" in message, message
    assert "ranks 0 and 1" in message, message
    assert not os.path.exists(os.path.join(path, "shardsafe.json"))


@pytest.mark.parametrize("same_size", [True, False])
def test_divergent_values_of_one_group_rank_fail_the_save(tmp_path, same_size):
    run_workers(_divergent, 2, str(tmp_path / "ckpt"), same_size)


# ------------------------------------------------------------ one process --

def test_one_process_round_trip_and_the_other_keying(tmp_path):
    path = str(tmp_path / "ckpt")
    shardsafe.save({"loader": shardsafe.PerRank(_loader(3), group=3)}, path)
    state = {"loader": shardsafe.PerRank(_blank(), group=lambda r: 3)}
    shardsafe.load(state, path)
    assert state["loader"].value["pos"] == 1000 + 21
    with pytest.raises(KeyMismatchError, match=r"loader\[rank 0\].*saved by group rank"):
        shardsafe.load({"loader": shardsafe.PerRank(None)}, path)
    old = str(tmp_path / "old")
    shardsafe.save({"loader": shardsafe.PerRank(_loader(0))}, old)
    with pytest.raises(KeyMismatchError,
                       match=r"loader\[group rank 0\].*saved by rank, without a group"):
        shardsafe.load({"loader": shardsafe.PerRank(None, group=0)}, old)


@pytest.mark.parametrize("group", [True, -1, 1.5, "dp", lambda r: -2, lambda r: "0"])
def test_a_group_that_gives_no_rank_is_refused(tmp_path, group):
    with pytest.raises(InvalidStateError, match="PerRank 'loader'"):
        shardsafe.save({"loader": shardsafe.PerRank(1, group=group)}, str(tmp_path / "c"))


def test_the_grouped_tensor_names_are_reserved(tmp_path):
    with pytest.raises(InvalidStateError, match="reserved"):
        shardsafe.save({"__shardsafe__/group/0/x": torch.ones(1)}, str(tmp_path / "c"))


# -------------------------------------------------- no collective of its own --

def _counts(rank: int, world: int, tmp: str) -> None:
    counter = _Counter()

    def state(grouped: bool) -> dict:
        s = {"w": torch.arange(8.0), "step": 3}
        if grouped:  # one DP rank: both ranks hold its value
            s["loader"] = shardsafe.PerRank(_loader(0), group=0)
        return s

    plain = [counter.during(lambda: shardsafe.save(state(False), f"{tmp}/p{i}")) for i in (0, 1)]
    grouped = [counter.during(lambda: shardsafe.save(state(True), f"{tmp}/g{i}")) for i in (0, 1)]
    assert plain == grouped, (plain, grouped)
    target = {"w": torch.zeros(8), "step": 0}
    load_plain = counter.during(lambda: shardsafe.load(target, f"{tmp}/p0", share_reads=False))
    target["loader"] = shardsafe.PerRank(_blank(), group=0)
    load_grouped = counter.during(lambda: shardsafe.load(target, f"{tmp}/g0", share_reads=False))
    assert load_plain == load_grouped, (load_plain, load_grouped)
    assert target["loader"].value["pos"] == 1000


def test_a_grouped_value_adds_no_torch_distributed_call(tmp_path):
    run_workers(_counts, 2, str(tmp_path))


def test_a_grouped_tensor_no_save_writes_is_a_corrupt_checkpoint(tmp_path):
    # A checkpoint tensor renamed onto a grouped value's name stands in for a damaged one.
    for name, tensor, problem in [("f32", torch.ones(3), "is F32 \\[3\\], not 1-D U8 bytes"),
                                  ("u8", torch.arange(10, dtype=torch.uint8),
                                   "\\(group rank 0\\): not a safetensors blob")]:
        path = str(tmp_path / name)
        shardsafe.save({"x": tensor}, path)
        state = {"l": shardsafe.PerRank("mine", group=0)}
        with pytest.raises(CorruptCheckpointError, match=f"per-rank value 'l'.*{problem}"):
            shardsafe.load(state, path, rename=[("^x$", "__shardsafe__/group/0/l")])
        assert state["l"].value == "mine"
