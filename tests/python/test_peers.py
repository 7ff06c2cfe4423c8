"""Other tools' checkpoints (shardsafe.peers): torch DCP checkpoints written
by torch's own dcp.save, loaded through DCP's reader (resharded from a
2-process DTensor save), with saved values unpickled weights_only unless
unsafe_pickle, and converted by `shardsafe import` (which hands DCP to
`python -m shardsafe import`)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp

import shardsafe
from conftest import EXIT_OK, describe
from dist_util import run_workers


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))


def _dcp_save(state: dict, path: Path) -> None:
    dcp.save(state, storage_writer=dcp.FileSystemWriter(str(path)), no_dist=True)


def _state() -> dict:
    model = _model()
    return {"model": model.state_dict(), "step": 7, "extra": {"lr": 0.25, "name": "run-1"}}


def _zeros(state: dict) -> dict:
    return {"model": {k: torch.zeros_like(v) for k, v in state["model"].items()},
            "step": 0, "extra": {"lr": 0.0, "name": ""}}


class Opaque:  # a saved value that is no plain type
    def __init__(self, n: int) -> None:
        self.n = n


def test_a_dcp_checkpoint_loads_through_dcps_reader(tmp_path):
    state = _state()
    _dcp_save(state, tmp_path / "dcp")
    got = _zeros(state)
    res = shardsafe.load(got, tmp_path / "dcp")
    for k, v in state["model"].items():
        assert torch.equal(got["model"][k], v), k
    assert got["step"] == 7 and got["extra"] == {"lr": 0.25, "name": "run-1"}
    assert res.missing_keys == [] and res.unexpected_keys == [] and res.tag == "dcp"
    with pytest.raises(shardsafe.ShardsafeError, match="loading DCP checkpoint .*dcp"):
        shardsafe.load({"absent": torch.zeros(1)}, tmp_path / "dcp")
    part = {"absent": torch.zeros(1), "step": 0}
    res = shardsafe.load(part, tmp_path / "dcp", strict=False)
    assert res.missing_keys == ["absent"] and "model.0.weight" in res.unexpected_keys
    assert part["step"] == 7
    with pytest.raises(shardsafe.InvalidStateError, match="rename, experts and skip_keys"):
        shardsafe.load(got, tmp_path / "dcp", skip_keys=["model."])


def test_dcp_values_are_unpickled_weights_only_unless_asked(tmp_path):
    _dcp_save({"w": torch.ones(2), "obj": Opaque(3)}, tmp_path / "dcp")
    with pytest.raises(shardsafe.ShardsafeError, match="value 'obj'.*unsafe_pickle=True"):
        shardsafe.load({"w": torch.zeros(2), "obj": None}, tmp_path / "dcp")
    got = {"w": torch.zeros(2), "obj": None}
    shardsafe.load(got, tmp_path / "dcp", unsafe_pickle=True)
    assert isinstance(got["obj"], Opaque) and got["obj"].n == 3


def test_shardsafe_import_converts_a_dcp_checkpoint(run, tmp_path):
    state = _state()
    _dcp_save(state, tmp_path / "dcp")
    proc = run("import", tmp_path / "dcp", tmp_path / "ckpt")
    assert proc.returncode == EXIT_OK, describe(proc)
    assert "imported 4 tensors" in proc.stdout and "3 values" in proc.stdout, describe(proc)
    assert (tmp_path / "ckpt" / "shardsafe.json").exists()
    got = _zeros(state)
    shardsafe.load(got, tmp_path / "ckpt")
    for k, v in state["model"].items():
        assert torch.equal(got["model"][k], v), k
    assert got["step"] == 7 and got["extra"] == {"lr": 0.25, "name": "run-1"}
    proc = run("import", tmp_path / "dcp", tmp_path / "ckpt")
    assert proc.returncode != EXIT_OK and "already exists" in proc.stderr, describe(proc)


def _save_sharded(rank: int, world: int, path: str) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    mesh = init_device_mesh("cpu", (world,))
    full = torch.arange(8 * 6, dtype=torch.float32).reshape(8, 6)
    dcp.save({"w": distribute_tensor(full, mesh, [Shard(0)]), "step": 3},
             storage_writer=dcp.FileSystemWriter(path))


def test_a_dcp_checkpoint_of_two_ranks_loads_whole_in_one_process(tmp_path):
    run_workers(_save_sharded, 2, str(tmp_path / "dcp"))
    assert len(list((tmp_path / "dcp").glob("*.distcp"))) == 2
    got = {"w": torch.zeros(8, 6), "step": 0}
    shardsafe.load(got, tmp_path / "dcp")
    assert torch.equal(got["w"], torch.arange(8 * 6, dtype=torch.float32).reshape(8, 6))
    assert got["step"] == 3
