"""torch DCP checkpoints (shardsafe.peers) written by torch's own dcp.save:
loaded through DCP's reader (resharded from a 2-process DTensor save), or,
for targets DCP does not know (shardsafe.Sharded, skip_keys), through
shardsafe's loader of foreign checkpoints on 2 ranks; read key by key and
box by box (DcpCheckpoint); saved values unpickled weights_only unless
unsafe_pickle; converted by `shardsafe import` (which hands them to the
Python package); damaged ones refused with one line naming the file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp

import shardsafe
from shardsafe.peers import DcpCheckpoint
from conftest import EXIT_ERROR, EXIT_OK, describe
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
    with pytest.raises(shardsafe.InvalidStateError, match="torch DCP checkpoint: rename and "
                                                          "experts need a shardsafe one"):
        shardsafe.load(got, tmp_path / "dcp", rename=[("^model", "net")])
    # skip_keys: through shardsafe's loader of foreign checkpoints.
    kept = _zeros(state)
    res = shardsafe.load(kept, tmp_path / "dcp", skip_keys=["model.2."])
    assert torch.equal(kept["model"]["0.weight"], state["model"]["0.weight"])
    assert not kept["model"]["2.weight"].any() and kept["step"] == 7
    assert res.missing_keys == [] and res.unexpected_keys == []


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
    # step and extra (a dict of values, one value as shardsafe.save keeps it)
    assert "imported 4 tensors" in proc.stdout and "2 values" in proc.stdout, describe(proc)
    assert "from torch DCP checkpoint" in proc.stdout and "100%" in proc.stderr, describe(proc)
    assert (tmp_path / "ckpt" / "shardsafe.json").exists()
    got = _zeros(state)
    shardsafe.load(got, tmp_path / "ckpt")
    for k, v in state["model"].items():
        assert torch.equal(got["model"][k], v), k
    assert got["step"] == 7 and got["extra"] == {"lr": 0.25, "name": "run-1"}
    proc = run("import", tmp_path / "dcp", tmp_path / "ckpt")
    assert proc.returncode == EXIT_ERROR and "already exists" in proc.stderr, describe(proc)
    assert "--overwrite" in proc.stderr, describe(proc)
    proc = run("import", tmp_path / "dcp", tmp_path / "ckpt", "--overwrite", "--json")
    assert proc.returncode == EXIT_OK, describe(proc)
    out = json.loads(proc.stdout)
    assert out["format"] == "torch DCP" and out["tensors"] == 4 and not out["native"], out


def test_a_directory_nothing_claims_is_one_clear_error(run, tmp_path):
    (tmp_path / "empty").mkdir()
    proc = run("import", tmp_path / "empty", tmp_path / "ckpt")
    assert proc.returncode == EXIT_ERROR, describe(proc)
    line = proc.stderr.strip()
    assert "\n" not in line and "no committed checkpoint" in line, describe(proc)
    assert "nor is it a torch DCP, Megatron torch_dist, DeepSpeed or nanotron" in line, line
    assert not (tmp_path / "ckpt").exists()


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


def test_dcp_checkpoint_reads_one_tensor_or_box_at_a_time(tmp_path):
    run_workers(_save_sharded, 2, str(tmp_path / "dcp"))
    fc = DcpCheckpoint(tmp_path / "dcp")
    full = torch.arange(8 * 6, dtype=torch.float32).reshape(8, 6)
    assert fc.tensors() == {"w": (torch.float32, (8, 6))}
    assert torch.equal(fc.read("w"), full)
    # A box across both ranks' chunks, and one inside rank 1's.
    assert torch.equal(fc.read_box("w", (2, 1), (4, 3)), full[2:6, 1:4])
    assert torch.equal(fc.read_box("w", (5, 0), (3, 6)), full[5:8])
    assert fc.values() == {"step": 3}
    with pytest.raises(shardsafe.InvalidStateError, match="no box at"):
        fc.read_box("w", (6, 0), (3, 6))


def _load_generic(rank: int, world: int, path: str) -> None:
    """A DCP checkpoint saved as one process, loaded on 2 ranks as
    shardsafe.Sharded targets: a column box each, and a flat range each of
    a bias (the last rank's shorter), through the foreign loader."""
    state = _state()
    w = state["model"]["0.weight"]  # [16, 8]
    b = state["model"]["2.bias"]  # [4]
    cols = torch.zeros(16, 4)
    lo, hi = 3 * rank, min(3 * rank + 3, 4)
    flat = torch.zeros(hi - lo)
    target = {"model": {"0.weight": shardsafe.Sharded(cols, (16, 8), (0, 4 * rank)),
                        "2.bias": shardsafe.Sharded(flat, (4,), flat=(lo, hi)),
                        "0.bias": torch.zeros(16), "2.weight": torch.zeros(4, 16)},
              "step": 0, "extra": {"lr": 0.0, "name": ""}}
    res = shardsafe.load(target, path)
    assert torch.equal(cols, w[:, 4 * rank:4 * rank + 4])
    assert torch.equal(flat, b[lo:hi])
    assert torch.equal(target["model"]["2.weight"], state["model"]["2.weight"])
    assert target["step"] == 7 and target["extra"] == {"lr": 0.25, "name": "run-1"}
    assert res.missing_keys == [] and res.unexpected_keys == [] and res.bytes_read > 0
    # Strict key matching agrees across ranks: a key one rank lacks fails both.
    bad = {"model": {"0.weight": torch.zeros(16, 8)}, "absent": torch.zeros(1)} if rank else {
        "model": {"0.weight": shardsafe.Sharded(torch.zeros(16, 8), (16, 8))}}
    with pytest.raises(shardsafe.KeyMismatchError, match="missing keys \\['absent'\\]"):
        shardsafe.load(bad, path)


def test_dcp_loads_into_sharded_targets_on_two_ranks(tmp_path):
    _dcp_save(_state(), tmp_path / "dcp")
    run_workers(_load_generic, 2, str(tmp_path / "dcp"))


def test_damaged_dcp_checkpoints_are_one_line_errors_naming_the_file(tmp_path, run):
    _dcp_save({"w": torch.arange(4096, dtype=torch.float32), "obj": Opaque(3), "step": 1},
              tmp_path / "dcp")
    # A pickled value of a type weights_only refuses: the key and the type.
    with pytest.raises(shardsafe.InvalidStateError) as info:
        DcpCheckpoint(tmp_path / "dcp").values()
    msg = str(info.value)
    assert "\n" not in msg and "'obj'" in msg and "Opaque" in msg, msg
    assert "unsafe_pickle=True" in msg, msg
    proc = run("import", tmp_path / "dcp", tmp_path / "ckpt")
    assert proc.returncode == EXIT_ERROR and "Opaque" in proc.stderr, describe(proc)
    assert len(proc.stderr.strip().splitlines()) == 1 and not (tmp_path / "ckpt").exists()

    # A truncated data file: the file and the key.
    _dcp_save({"w": torch.arange(4096, dtype=torch.float32), "step": 1}, tmp_path / "cut")
    (data,) = (tmp_path / "cut").glob("*.distcp")
    data.write_bytes(data.read_bytes()[:1000])
    with pytest.raises(shardsafe.CorruptCheckpointError) as info:
        DcpCheckpoint(tmp_path / "cut").read("w")
    msg = str(info.value)
    assert "\n" not in msg and data.name in msg and "'w'" in msg, msg
    with pytest.raises(shardsafe.CorruptCheckpointError) as info:
        shardsafe.load({"w": shardsafe.Sharded(torch.zeros(4096), (4096,)), "step": 0},
                       tmp_path / "cut")
    assert "\n" not in str(info.value) and data.name in str(info.value), str(info.value)
    proc = run("import", tmp_path / "cut", tmp_path / "ckpt")
    assert proc.returncode == EXIT_ERROR and data.name in proc.stderr, describe(proc)
    assert len(proc.stderr.strip().splitlines()) == 1 and not (tmp_path / "ckpt").exists()

    # A truncated .metadata.
    meta = tmp_path / "cut" / ".metadata"
    meta.write_bytes(meta.read_bytes()[:50])
    with pytest.raises(shardsafe.CorruptCheckpointError, match=r"cut/\.metadata: unreadable"):
        DcpCheckpoint(tmp_path / "cut")


class _RunsCode:
    """Unpickling this runs code: what a crafted .metadata would do."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_dcp_metadata_runs_no_code_and_must_tile_its_tensors(tmp_path):
    """.metadata is unpickled with DCP's own classes only: a global outside
    them is refused (torch's reader would run it); and each tensor's chunks
    must tile it, so a damaged file cannot leave part of a tensor unread."""
    import pickle

    import torch.distributed.checkpoint.metadata as md

    _dcp_save({"w": torch.arange(64, dtype=torch.float32).reshape(8, 8), "step": 1},
              tmp_path / "dcp")
    meta_file = tmp_path / "dcp" / ".metadata"
    good = meta_file.read_bytes()
    meta = pickle.loads(good)
    marker = tmp_path / "ran"
    meta.planner_data = {"step": ("step",), "evil": _RunsCode(str(marker))}
    meta_file.write_bytes(pickle.dumps(meta))
    for attempt in (lambda: DcpCheckpoint(tmp_path / "dcp"),
                    lambda: shardsafe.load({"w": torch.zeros(8, 8), "step": 0}, tmp_path / "dcp")):
        with pytest.raises(shardsafe.InvalidStateError) as info:
            attempt()
        msg = str(info.value)
        assert "\n" not in msg and "io.open" in msg and "unsafe_pickle" in msg, msg
    assert not marker.exists(), "unpickling .metadata ran code"

    # A chunk list with a gap (the second half of the rows dropped), and one
    # with a chunk stored twice.
    meta = pickle.loads(good)
    w = meta.state_dict_metadata["w"]
    whole = w.chunks[0]
    for chunks in ([md.ChunkStorageMetadata(offsets=torch.Size([0, 0]), sizes=torch.Size([4, 8]))],
                   [whole, whole]):
        w.chunks = chunks
        meta_file.write_bytes(pickle.dumps(meta))
        with pytest.raises(shardsafe.CorruptCheckpointError, match=r"'w'.*do not tile it"):
            DcpCheckpoint(tmp_path / "dcp")
    meta_file.write_bytes(good)
    assert torch.equal(DcpCheckpoint(tmp_path / "dcp").read("w"),
                       torch.arange(64, dtype=torch.float32).reshape(8, 8))
