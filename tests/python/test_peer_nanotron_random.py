"""nanotron's per-rank random-state files (random/tp-T-of-TT_dp-D-of-DD_pp-P-of-PP.pt)
carried as grouped shardsafe.PerRank values "random", group rank
(P * DD + D) * TT + T (shardsafe.foreign.nanotron_random): through
`shardsafe import` and a native load, and through a load of the nanotron
directory itself. The checkpoint is test_peer_nanotron's (tp 2, pp 2, dp 1)."""

from __future__ import annotations

import io
import os

import pytest
import torch

import shardsafe
from shardsafe import foreign
from shardsafe.errors import KeyMismatchError
from shardsafe.foreign import nanotron as _nanotron

from dist_util import run_workers
from test_peer_nanotron import Opaque, make_checkpoint


def _rng_file(root, tp: int, pp: int) -> str:
    return str(root / "random" / f"tp-{tp}-of-2_dp-0-of-1_pp-{pp}-of-2.pt")


def _states(tp: int, pp: int) -> dict:
    gen = torch.Generator().manual_seed(100 + 10 * pp + tp)
    return {"default": {"torch_cpu": gen.get_state(), "tp": tp, "pp": pp}}


@pytest.fixture()
def ckpt(tmp_path):
    root = tmp_path / "checkpoints" / "40"
    make_checkpoint(root)
    for pp in range(2):
        for tp in range(2):  # what nanotron keeps per process, one file each
            torch.save(_states(tp, pp), _rng_file(root, tp, pp))
    return root


def _restored(value: dict, weights_only: bool = True):
    return torch.load(io.BytesIO(value["torch_save"].numpy().tobytes()), weights_only=weights_only)


def _check(value: dict, g: int) -> None:
    tp, pp = g % 2, g // 2
    assert value["file"] == f"tp-{tp}-of-2_dp-0-of-1_pp-{pp}-of-2.pt"
    assert (value["tp"], value["dp"], value["pp"]) == ([tp, 2], [0, 1], [pp, 2])
    restored = _restored(value)
    assert restored["default"]["tp"] == tp and restored["default"]["pp"] == pp
    assert torch.equal(restored["default"]["torch_cpu"], _states(tp, pp)["default"]["torch_cpu"])


def test_import_carries_each_process_random_state_by_group_rank(ckpt, tmp_path):
    out = tmp_path / "imported"
    result = foreign.import_checkpoint(ckpt, out, progress=False)
    assert not any("random" in line for line in result["not_imported"]), result
    # one process loads one group rank: the others are unused (per_rank_strict=False)
    for g in range(4):
        state = {"random": shardsafe.PerRank(None, group=g)}
        loaded = shardsafe.load(state, str(out), strict=False, per_rank_strict=False)
        _check(state["random"].value, g)
        assert f"random[group rank {(g + 1) % 4}]" in loaded.unexpected_keys
    # straight from the nanotron directory, the same values
    state = {"random": shardsafe.PerRank(None, group=3)}
    with pytest.raises(KeyMismatchError, match=r"random\[group rank 0\]"):
        shardsafe.load(state, str(ckpt), strict=False)
    shardsafe.load(state, str(ckpt), strict=False, per_rank_strict=False)
    _check(state["random"].value, 3)


def _load_by_process(rank: int, world: int, path: str) -> None:
    state = {"random": shardsafe.PerRank(None, group=lambda r: r)}
    shardsafe.load(state, path, strict=False)
    _check(state["random"].value, rank)


def test_every_process_gets_its_own_file_back(ckpt, tmp_path):
    out = tmp_path / "imported"
    foreign.import_checkpoint(ckpt, out, progress=False)
    run_workers(_load_by_process, 4, str(out))


def test_a_group_rank_without_a_file_is_missing_never_another_file(ckpt, tmp_path):
    out = tmp_path / "imported"
    foreign.import_checkpoint(ckpt, out, progress=False)
    for path in (str(out), str(ckpt)):
        state = {"random": shardsafe.PerRank("mine", group=4)}
        with pytest.raises(KeyMismatchError, match=r"random\[group rank 4\]"):
            shardsafe.load(state, path, strict=False)
        result = shardsafe.load(state, path, strict=False, per_rank_strict=False)
        assert state["random"].value == "mine"
        assert "random[group rank 4]" in result.missing_keys


def test_an_unpicklable_state_is_carried_as_bytes(ckpt, tmp_path):
    torch.save({"default": Opaque(7)}, _rng_file(ckpt, 1, 0))  # like nanotron's RandomStates
    out = tmp_path / "imported"
    foreign.import_checkpoint(ckpt, out, progress=False)
    state = {"random": shardsafe.PerRank(None, group=1)}
    shardsafe.load(state, str(out), strict=False, per_rank_strict=False)
    assert _restored(state["random"].value, weights_only=False)["default"].n == 7


def test_files_that_are_not_one_grid_are_noted_not_listed(ckpt):
    os.remove(_rng_file(ckpt, 1, 1))
    ck = _nanotron.FORMAT.open(str(ckpt))
    assert not any(k.startswith("__shardsafe__/") for k in ck.tensors())
    assert ck.not_imported() == [f"{ckpt / 'random'}: 3 per-rank RNG state file(s), not read: "
                                 f"they are not one whole tp x dp x pp grid of one size"]
