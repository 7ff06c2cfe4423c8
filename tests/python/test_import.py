"""Other tools' checkpoints through one machinery (shardsafe.foreign:
its readers, load and importer): the formats registered in detection order, Megatron
torch_dist checkpoints written by megatron-core's own save (2 ranks, gloo)
read without Megatron, loaded straight into other layouts (DTensor and
Sharded targets on 2 ranks) and imported with their common state as values,
and an import of a 256 MiB checkpoint whose peak memory stays far below its
size, with a progress bar.

megatron-core 0.16.1 runs its torch_dist save on the CPU but for two CUDA
calls, which the saving worker points at the CPU (_cpu_only): its sync save
calls torch.cuda.synchronize() after staging tensors that are already on the
host (nothing to wait for), and builds the flag tensor of its finalize
all-reduce on torch.cuda.current_device() (the CPU for gloo). Every file is
written by Megatron's own code.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp

import shardsafe
from shardsafe import foreign
from shardsafe.foreign.megatron import MegatronCheckpoint
from conftest import EXIT_OK, describe
from dist_util import run_workers

# The global tensors of the Megatron checkpoint (_megatron_save).
QKV = torch.arange(8 * 6, dtype=torch.float32).reshape(8, 6) / 7
LAYERS = torch.arange(2 * 4 * 4, dtype=torch.bfloat16).reshape(2, 4, 4)
BIAS = torch.linspace(-1, 1, 6, dtype=torch.float64)


def _cpu_only() -> None:
    torch.cuda.synchronize = lambda *a, **k: None
    torch.cuda.current_device = lambda: "cpu"


def _megatron_save(rank: int, world: int, path: str) -> None:
    """TP=2 Megatron state, as a model's sharded_state_dict() builds it: a
    column-split weight, per-layer weights stacked on a prepended layer
    axis and split by rows, a replicated bias, per-rank RNG objects and the
    common state (iteration, args, scheduler)."""
    _cpu_only()
    from megatron.core import dist_checkpointing
    from megatron.core.dist_checkpointing import ShardedObject, ShardedTensor

    half = QKV.shape[0] // world
    layers = {f"layer{i}": ShardedTensor.from_rank_offsets(
        "decoder.layers.mlp.weight", LAYERS[i, 2 * rank:2 * rank + 2].clone(), (0, i, 2),
        (1, rank, world), prepend_axis_num=1) for i in range(2)}
    state = {
        "qkv": ShardedTensor.from_rank_offsets(
            "decoder.qkv.weight", QKV[half * rank:half * (rank + 1)].clone(), (0, rank, world)),
        "layers": layers,
        "bias": ShardedTensor.from_rank_offsets("decoder.bias", BIAS.clone(), replica_id=rank),
        "rng": ShardedObject("rng_state", torch.tensor([rank, 40 + rank]), (world,), (rank,),
                             replica_id=0),
        "iteration": 7,
        "checkpoint_version": 3.0,
        "args": argparse.Namespace(lr=0.25, micro_batch_size=4, tensor_model_parallel_size=2,
                                   params_dtype=torch.bfloat16, seq_length=2048),
        "opt_param_scheduler": {"num_steps": 70, "warmup_steps": 10},
    }
    dist_checkpointing.save(state, path)


@pytest.fixture(scope="module")
def megatron_root(tmp_path_factory) -> Path:
    """A Megatron save root: tracker + iter_0000007 written by megatron-core."""
    root = tmp_path_factory.mktemp("megatron")
    ckpt = root / "iter_0000007"
    ckpt.mkdir()
    run_workers(_megatron_save, 2, str(ckpt))
    (root / "latest_checkpointed_iteration.txt").write_text("7")
    return root


def _zeros() -> dict:
    return {"decoder.qkv.weight": torch.zeros(8, 6), "decoder.bias": torch.zeros(6, dtype=torch.float64),
            "decoder.layers.mlp.weight": torch.zeros(2, 4, 4, dtype=torch.bfloat16),
            "iteration": 0, "args": {}, "opt_param_scheduler": {}, "checkpoint_version": 0.0}


def test_formats_are_registered_in_detection_order(megatron_root, tmp_path):
    names = [f.name for f in foreign.formats()]
    # Megatron's torch_dist is a DCP directory with more: it comes first.
    assert names.index("Megatron torch_dist") < names.index("torch DCP"), names
    modules = {f.open.__module__ for f in foreign.formats()}
    assert {"shardsafe.foreign.deepspeed", "shardsafe.foreign.nanotron"} <= modules, modules
    assert foreign.detect(megatron_root / "iter_0000007").name == "Megatron torch_dist"
    assert foreign.detect(megatron_root).name == "Megatron torch_dist"  # through the tracker
    # A shardsafe root has a `latest` file too (as DeepSpeed's does): never claimed.
    shardsafe.save({"w": torch.ones(2)}, tmp_path / "root" / "step-1")
    (tmp_path / "root" / "latest").write_text("step-1\n")
    assert foreign.detect(tmp_path / "root") is None
    assert foreign.detect(tmp_path / "root" / "step-1") is None


def test_megatron_checkpoint_reads_tensors_common_state_and_objects(megatron_root):
    assert json.loads((megatron_root / "iter_0000007" / "metadata.json").read_text())[
        "sharded_backend"] == "torch_dist"
    fc = MegatronCheckpoint(megatron_root)
    assert fc.tensors() == {"decoder.qkv.weight": (torch.float32, (8, 6)),
                            "decoder.layers.mlp.weight": (torch.bfloat16, (2, 4, 4)),
                            "decoder.bias": (torch.float64, (6,))}
    assert torch.equal(fc.read("decoder.qkv.weight"), QKV)
    assert torch.equal(fc.read("decoder.layers.mlp.weight"), LAYERS)
    assert torch.equal(fc.read_box("decoder.qkv.weight", (3, 2), (2, 3)), QKV[3:5, 2:5])
    values = fc.values()
    assert values["iteration"] == 7 and values["checkpoint_version"] == 3.0
    assert values["args"]["lr"] == 0.25 and values["args"]["params_dtype"] == torch.bfloat16
    assert values["opt_param_scheduler"] == {"num_steps": 70, "warmup_steps": 10}
    objects = sorted(k for k in values if k.startswith("rng_state/"))
    assert objects == ["rng_state/shard_0_2", "rng_state/shard_1_2"], sorted(values)
    assert torch.equal(torch.as_tensor(values["rng_state/shard_1_2"][0]), torch.tensor([1, 41]))


def test_megatron_imports_with_common_state_as_values(megatron_root, tmp_path, run):
    proc = run("import", megatron_root, tmp_path / "ckpt")
    assert proc.returncode == EXIT_OK, describe(proc)
    assert "from Megatron torch_dist checkpoint" in proc.stdout, describe(proc)
    # JSON holds no torch.dtype: reported, never silently lost.
    assert "not imported: args.params_dtype" in proc.stdout, describe(proc)
    assert "100%" in proc.stderr, describe(proc)  # the progress bar
    got = _zeros()
    res = shardsafe.load(got, tmp_path / "ckpt", strict=False)
    assert torch.equal(got["decoder.qkv.weight"], QKV)
    assert torch.equal(got["decoder.layers.mlp.weight"], LAYERS)
    assert torch.equal(got["decoder.bias"], BIAS)
    assert got["iteration"] == 7 and got["checkpoint_version"] == 3.0
    assert got["args"] == {"lr": 0.25, "micro_batch_size": 4, "tensor_model_parallel_size": 2,
                           "seq_length": 2048}
    assert got["opt_param_scheduler"] == {"num_steps": 70, "warmup_steps": 10}
    # The RNG objects were tensors: they are tensors of the imported checkpoint.
    assert sorted(res.unexpected_keys) == ["rng_state/shard_0_2.0", "rng_state/shard_1_2.0"]
    meta = shardsafe.describe(tmp_path / "ckpt")["metadata"]
    assert meta["imported_from"]["format"] == "Megatron torch_dist"


def test_megatron_loads_straight_into_a_state(megatron_root):
    got = _zeros()
    with pytest.raises(shardsafe.KeyMismatchError, match="unexpected keys.*rng_state/shard_0_2"):
        shardsafe.load(got, megatron_root)
    assert got["iteration"] == 0 and not got["decoder.qkv.weight"].any()  # nothing changed
    got["rng_state/shard_1_2"] = [torch.zeros(2, dtype=torch.long)]
    res = shardsafe.load(got, megatron_root, strict=False)
    assert torch.equal(got["decoder.qkv.weight"], QKV) and torch.equal(got["decoder.bias"], BIAS)
    assert torch.equal(got["decoder.layers.mlp.weight"], LAYERS)
    assert torch.equal(got["rng_state/shard_1_2"][0], torch.tensor([1, 41]))
    assert got["args"]["params_dtype"] == torch.bfloat16 and got["iteration"] == 7
    assert res.unexpected_keys == ["rng_state/shard_0_2"] and res.missing_keys == []
    with pytest.raises(shardsafe.DTypeMismatchError, match="decoder.bias.*float64.*float32"):
        shardsafe.load({"decoder.bias": torch.zeros(6)}, megatron_root, strict=False)
    conv = {"decoder.bias": torch.zeros(6)}
    shardsafe.load(conv, megatron_root, strict=False, convert_dtypes=True)
    assert torch.equal(conv["decoder.bias"], BIAS.float())


def _load_megatron_resharded(rank: int, world: int, root: str) -> None:
    """Saved TP=2 by rows; loaded by columns (Sharded), by layers (DTensor
    Shard(0)) and as a flat range of the bias (Sharded flat)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    mesh = init_device_mesh("cpu", (world,))
    cols = torch.zeros(8, 3)
    layers = distribute_tensor(torch.zeros(2, 4, 4, dtype=torch.bfloat16), mesh, [Shard(0)])
    flat = torch.zeros(3, dtype=torch.float64)
    state = {"decoder.qkv.weight": shardsafe.Sharded(cols, (8, 6), (0, 3 * rank)),
             "decoder.layers.mlp.weight": layers,
             "decoder.bias": shardsafe.Sharded(flat, (6,), flat=(3 * rank, 3 * rank + 3)),
             "iteration": 0}
    res = shardsafe.load(state, root, strict=False)
    assert torch.equal(cols, QKV[:, 3 * rank:3 * rank + 3])
    assert torch.equal(layers.to_local(), LAYERS[rank:rank + 1])
    assert torch.equal(flat, BIAS[3 * rank:3 * rank + 3])
    assert state["iteration"] == 7
    assert "opt_param_scheduler" in res.unexpected_keys and res.missing_keys == []


def test_megatron_loads_into_another_layout_on_two_ranks(megatron_root):
    run_workers(_load_megatron_resharded, 2, str(megatron_root / "iter_0000007"))


def _copy_megatron(root: Path, dst: Path) -> Path:
    import shutil

    shutil.copytree(root / "iter_0000007", dst)
    return dst


def test_megatron_hostile_checkpoints(megatron_root, tmp_path):
    missing = _copy_megatron(megatron_root, tmp_path / "missing")
    (missing / "common.pt").unlink()
    with pytest.raises(shardsafe.CheckpointNotFoundError, match=r"missing/common.pt: missing"):
        shardsafe.load(_zeros(), missing)

    class Evil:
        def __reduce__(self):
            return (os.system, ("echo pwned",))

    evil = _copy_megatron(megatron_root, tmp_path / "evil")
    torch.save({"iteration": 7, "hook": Evil()}, evil / "common.pt")
    with pytest.raises(shardsafe.InvalidStateError) as info:
        foreign.import_checkpoint(evil, tmp_path / "out")
    msg = str(info.value)
    assert "\n" not in msg and "evil/common.pt" in msg and "system" in msg, msg
    assert "unsafe_pickle=True" in msg and not (tmp_path / "out").exists()

    cut = _copy_megatron(megatron_root, tmp_path / "cut")
    data = (cut / "common.pt").read_bytes()
    (cut / "common.pt").write_bytes(data[:len(data) // 2])
    with pytest.raises(shardsafe.CorruptCheckpointError, match=r"cut/common.pt: unreadable"):
        MegatronCheckpoint(cut).values()
    # Garbage bytes: torch words this failure "Weights only load failed" too,
    # but it is a damaged file, not a type to allow with unsafe_pickle.
    (cut / "common.pt").write_bytes(b"\xff" * 64)
    with pytest.raises(shardsafe.CorruptCheckpointError) as info:
        MegatronCheckpoint(cut).values()
    msg = str(info.value)
    assert "\n" not in msg and "cut/common.pt: unreadable pickle" in msg, msg
    assert "unsafe_pickle" not in msg, msg

    tracker = tmp_path / "tracker"  # a tracker that is not UTF-8 names nothing
    _copy_megatron(megatron_root, tracker / "iter_0000007")
    (tracker / "latest_checkpointed_iteration.txt").write_bytes(b"\xff\xfe7")
    assert foreign.detect(tracker) is None

    zarr = _copy_megatron(megatron_root, tmp_path / "zarr")
    (zarr / "metadata.json").write_text(json.dumps({"sharded_backend": "zarr"}))
    with pytest.raises(shardsafe.InvalidStateError, match="sharded_backend 'zarr'"):
        shardsafe.load(_zeros(), zarr)


def test_a_value_tensor_of_an_unstorable_dtype_is_one_clear_error(tmp_path):
    state = {"w": torch.ones(3), "obj": (torch.zeros(2, dtype=torch.complex128), 1)}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save(state, storage_writer=dcp.FileSystemWriter(str(tmp_path / "dcp")), no_dist=True)
    fc = foreign.open_checkpoint(tmp_path / "dcp")
    assert list(fc.tensors()) == ["w"]  # DCP pickled the tuple: a value holding a tensor
    with pytest.raises(shardsafe.InvalidStateError) as info:
        foreign.import_checkpoint(tmp_path / "dcp", tmp_path / "out")
    assert str(info.value) == (f"{tmp_path / 'dcp'}: tensor 'obj.0': dtype torch.complex128 cannot "
                               f"be stored in safetensors")
    assert not (tmp_path / "out").exists()


# ------------------------------------------------------------- bounded import --

N_TENSORS, ELEMS = 64, 1 << 20  # 64 int32 tensors of 4 MiB: 256 MiB
MiB = 1 << 20

_MEASURE = textwrap.dedent("""
    import json, sys
    def rss(field):
        for line in open("/proc/self/status"):
            if line.startswith(field):
                return int(line.split()[1]) * 1024
    import torch, shardsafe.foreign as imp
    before = rss("VmRSS:")
    done = imp.import_checkpoint(sys.argv[1], sys.argv[2], progress=True)
    print(json.dumps({"growth": rss("VmHWM:") - before, "done": done}))
""")


def test_import_holds_far_less_than_the_checkpoint_and_shows_progress(tmp_path):
    state = {f"layers.{i}.w": torch.arange(ELEMS, dtype=torch.int32) + i for i in range(N_TENSORS)}
    state["step"] = 12
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save(state, storage_writer=dcp.FileSystemWriter(str(tmp_path / "dcp")), no_dist=True)
    size = N_TENSORS * ELEMS * 4
    # A fresh process: its peak RSS (VmHWM) minus its RSS before the import
    # is what the import added at its worst (an earlier peak only adds).
    proc = subprocess.run([sys.executable, "-c", _MEASURE, tmp_path / "dcp", tmp_path / "ckpt"],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, describe(proc)
    out = json.loads(proc.stdout.splitlines()[-1])
    # Whole in memory would add the full 256 MiB; one tensor at a time (4 MiB,
    # read through DCP: twice) plus the engine's write buffers (32 MiB)
    # adds ~50 MiB. Half the checkpoint is a bound no noise reaches.
    assert out["growth"] < size // 2, f"peak RSS grew {out['growth'] / MiB:.0f} MiB"
    assert out["done"]["bytes"] == size and out["done"]["tensors"] == N_TENSORS
    assert out["done"]["reads"] == N_TENSORS  # each tensor read once
    assert "100%" in proc.stderr and "256M" in proc.stderr, proc.stderr[-500:]  # tqdm's bar
    got = {k: torch.zeros(ELEMS, dtype=torch.int32) for k in state if k != "step"}
    got["step"] = 0
    shardsafe.load(got, tmp_path / "ckpt")
    for k in got:
        if k != "step":
            assert torch.equal(got[k], state[k]), k
    assert got["step"] == 12
