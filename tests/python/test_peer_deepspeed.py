"""DeepSpeed checkpoints read by shardsafe.foreign.deepspeed, checked against
DeepSpeed itself.

The checkpoints are written by the real deepspeed package (pinned below) on
the CPU: deepspeed_train.py trains a small model three steps on 3 processes
joined by gloo, for ZeRO stages 0-3 (bf16 and fp32, the elastic ZeRO-1/2
layout, round-robin gradient partitioning, ZeRO-3 sub-groups), and saves
with `engine.save_checkpoint`. With 3 ranks the partitions split inside
parameters and whole partitions of a small group are padding. Every tensor
is compared bit-exact with what DeepSpeed itself gives:
`zero_to_fp32.get_fp32_state_dict_from_zero_checkpoint` on the same
directory, the live engine's parameters, and its fp32 master weights and
Adam moments (`safe_get_full_fp32_param`, `safe_get_full_optimizer_state`).
A missing deepspeed fails the tests; nothing is skipped.
"""

from __future__ import annotations

import datetime
import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import shardsafe
from deepspeed_train import CLIENT_STATE, STEPS
from shardsafe import foreign
from shardsafe.foreign import common as _common, deepspeed as _deepspeed
from shardsafe.errors import (CheckpointNotFoundError, CorruptCheckpointError, InvalidStateError,
                              StorageError)

DEEPSPEED_VERSION = "0.19.8"
WORLD = 3
TAG = f"global_step{STEPS}"
VARIANTS = [
    {"name": "z0", "stage": 0, "dtype": "bf16"},
    {"name": "z1", "stage": 1, "dtype": "bf16"},
    {"name": "z2", "stage": 2, "dtype": "bf16"},
    {"name": "z3", "stage": 3, "dtype": "bf16"},
    {"name": "z1_elastic", "stage": 1, "dtype": "fp32", "zero": {"elastic_checkpoint": True}},
    {"name": "z2_round_robin", "stage": 2, "dtype": "bf16",
     "zero": {"round_robin_gradients": True}},
    {"name": "z3_sub_groups", "stage": 3, "dtype": "fp32",
     "zero": {"sub_group_size": 50, "stage3_param_persistence_threshold": 0}},
    {"name": "z2_wide", "stage": 2, "dtype": "bf16", "model": "wide"},
    {"name": "z3_wide", "stage": 3, "dtype": "bf16", "model": "wide"},
]
SMALL = [v["name"] for v in VARIANTS if "model" not in v]
ZERO = [v["name"] for v in VARIANTS if "model" not in v and v["stage"] > 0]
# Parameter groups of deepspeed_train.param_groups, by name (head.weight is
# tied to emb.weight, frozen.* is not trained).
GROUPS = [["emb.weight", "lin1.weight", "norm.weight", "lin2.weight"],
          ["lin1.bias", "norm.bias", "lin2.bias"], ["tiny"]]
PREFIXES = ("module.", "optimizer.", "client_state.")


def variant(name: str) -> dict:
    return next(v for v in VARIANTS if v["name"] == name)


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory) -> Path:
    """The checkpoints, written once: ROOT/<variant>/ and ROOT/<variant>.ref.pt."""
    assert importlib.metadata.version("deepspeed") == DEEPSPEED_VERSION, \
        f"pip install deepspeed=={DEEPSPEED_VERSION}"
    root = tmp_path_factory.mktemp("deepspeed")
    script = Path(__file__).with_name("deepspeed_train.py")
    env = {**os.environ, "DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, str(script), str(root), str(WORLD), json.dumps(VARIANTS)],
        env=env, capture_output=True, text=True, errors="replace", timeout=400)
    assert proc.returncode == 0, \
        f"deepspeed_train.py failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    return root


def ref(ckpts: Path, name: str) -> dict:
    return torch.load(ckpts / f"{name}.ref.pt", weights_only=True)


def bare(keys) -> list[str]:
    return [k for k in keys if not k.startswith(PREFIXES)]


def same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)




# ------------------------------------------------------- the real thing --

@pytest.mark.parametrize("name", ZERO)
def test_matches_zero_to_fp32(ckpts, name):
    expected = ref(ckpts, name)["zero_to_fp32"]
    ck = _deepspeed.open(ckpts / name)
    listed = ck.tensors()
    assert bare(listed) == list(expected)  # the same names, in zero_to_fp32's order
    assert ck.format == f"DeepSpeed ZeRO-{variant(name)['stage']}"
    for key, want in expected.items():
        got = ck.read(key)
        assert same(got, want), key
        assert listed[key] == (want.dtype, tuple(want.shape))
    assert "head.weight" in expected and same(ck.read("head.weight"), ck.read("emb.weight"))  # tied
    # ZeRO-1 saves no frozen parameters, so zero_to_fp32 has none
    assert ("frozen.weight" in expected) == (variant(name)["stage"] > 1)


@pytest.mark.parametrize("name", [n for n in ZERO if "round_robin" not in n])
def test_master_weights_and_moments_match_the_live_engine(ckpts, name):
    r = ref(ckpts, name)
    ck = _deepspeed.open(ckpts / name)
    listed = ck.tensors()
    for param in sum(GROUPS, []):
        assert same(ck.read(param), r["fp32"][param]), param
        for state in ("exp_avg", "exp_avg_sq"):
            key = f"optimizer.state.{param}.{state}"
            assert listed[key] == (torch.float32, tuple(r[state][param].shape))
            assert same(ck.read(key), r[state][param]), key
            assert r[state][param].abs().sum() > 0  # real state, not zeros
        step = ck.read(f"optimizer.state.{param}.step")
        assert step.dim() == 0 and step.item() == STEPS


@pytest.mark.parametrize("name", SMALL)
def test_module_weights_match_the_live_engine(ckpts, name):
    """module.* is the module's state dict as saved; under ZeRO the 16-bit
    weights are the fp32 master weights rounded, bit for bit. This also holds
    with round_robin_gradients, where deepspeed 0.19.8's own live accessors
    (safe_get_full_fp32_param) disagree with its saved layout: the saved
    weights side with zero_to_fp32's reading, which is ours."""
    r, stage = ref(ckpts, name), variant(name)["stage"]
    ck = _deepspeed.open(ckpts / name)
    keys = ck.tensors()
    for buf, want in r["buffers"].items():
        assert same(ck.read(f"module.{buf}"), want), buf
    for param, lp in r["lp"].items():
        if stage < 3:
            assert same(ck.read(f"module.{param}"), lp), param
        else:
            assert f"module.{param}" not in keys  # ZeRO-3 saves only fp32 partitions
        if stage > 0 and (param in sum(GROUPS, []) or stage >= 2):  # ZeRO-1 keeps no frozen ones
            assert same(ck.read(param).to(lp.dtype), lp), param
    if stage == 3:
        module = sorted(k for k in keys if k.startswith("module."))
        assert module == ["module.count", "module.scale"]


def test_values(ckpts):
    ck = _deepspeed.open(ckpts / "z2")
    v = ck.values()
    assert v["step"] == STEPS
    ds = v["deepspeed"]
    assert (ds["tag"], ds["zero_stage"], ds["zero_dp_world_size"]) == (TAG, 2, WORLD)
    assert ds["lr_scheduler"] == {"last_batch_iteration": STEPS - 1}
    assert ds["ds_config"]["zero_optimization"] == {"stage": 2}
    assert ds["ds_version"] == DEEPSPEED_VERSION and ds["loss_scaler"]["cur_scale"] == 1.0
    assert ds["not_imported"] == {}
    groups = v["optimizer"]["param_groups"]
    assert [g["params"] for g in groups] == GROUPS
    assert [g["weight_decay"] for g in groups] == [0.1, 0.0, 0.01]
    assert v["client_state"] == {"epoch": 1, "note": "hi", "ema": {"decay": 0.5}}
    assert same(ck.read("client_state.ema.w"), CLIENT_STATE["ema"]["w"])
    json.dumps(v)  # JSON holds it all


@pytest.mark.parametrize("name", ZERO)
def test_param_groups_name_their_parameters(ckpts, name):
    groups = _deepspeed.open(ckpts / name).values()["optimizer"]["param_groups"]
    # in param_shapes order, which round_robin_gradients reorders
    assert [sorted(g["params"]) for g in groups] == [sorted(g) for g in GROUPS]


def test_without_zero(ckpts):
    r = ref(ckpts, "z0")
    ck = _deepspeed.open(ckpts / "z0")
    keys = ck.tensors()
    assert bare(keys) == [] and not any(k.startswith("optimizer.") for k in keys)
    assert ck.format == "DeepSpeed"
    assert same(ck.read("module.lin1.weight"), r["lp"]["lin1.weight"])
    assert "optimizer" in ck.values()["deepspeed"]["not_imported"]
    assert ck.not_imported() == ["optimizer: without ZeRO the optimizer state is indexed by "
                                 "parameter position, not by name"]


def test_detect_and_open_the_tag_directory(ckpts, tmp_path):
    root = ckpts / "z3"
    assert _deepspeed.FORMAT.detect(str(root)) and _deepspeed.FORMAT.detect(str(root / TAG))
    assert not _deepspeed.FORMAT.detect(str(tmp_path))
    (tmp_path / "latest").write_text("global_step9")
    assert not _deepspeed.FORMAT.detect(str(tmp_path))
    whole, tag = _deepspeed.FORMAT.open(str(root)), _deepspeed.FORMAT.open(str(root / TAG))
    assert whole.tensors() == tag.tensors()
    assert same(whole.read("lin1.weight"), tag.read("lin1.weight"))
    with pytest.raises(CheckpointNotFoundError, match="global_step9"):
        _deepspeed.open(tmp_path)


def peak_rss_mib() -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:")) / 1024


@pytest.mark.parametrize("name", ["z2_wide", "z3_wide"])
def test_reading_one_tensor_costs_about_that_tensor(ckpts, name):
    """The peak resident memory while reading one 4 MiB tensor of a 4.2M
    parameter model (optimizer files of 3 x 17 MiB) stays near its size:
    only the partitions covering it are touched (memory-mapped). Unpickling
    the optimizer files whole adds over 30 MiB. The code paths are warmed on
    the small checkpoint of the same stage first: their first run maps
    library pages, which count as resident too."""
    warm = _deepspeed.open(ckpts / name.replace("_wide", ""))
    for key in warm.tensors():
        warm.read(key)
    ck = _deepspeed.open(ckpts / name)
    for key in ("2.weight", "optimizer.state.2.weight.exp_avg_sq", "3.bias"):
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # resets the peak (VmHWM) to the current resident size
        before = peak_rss_mib()
        t = ck.read(key)
        size = t.numel() * t.element_size() / 2**20
        assert peak_rss_mib() - before < 3 * size + 12, (key, size, peak_rss_mib() - before)
        del t


# ------------------------------------------------------ hostile inputs --

def rewrite(path: Path, change) -> None:
    """Loads a file DeepSpeed wrote in this test run (trusted: weights_only
    off, which needs deepspeed's classes), changes it and saves it back."""
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    state = torch.load(path, weights_only=False)
    change(state)
    torch.save(state, path)


def copy(ckpts: Path, name: str, tmp_path: Path) -> tuple[Path, Path]:
    dst = tmp_path / name
    shutil.copytree(ckpts / name, dst)
    return dst, dst / TAG


def optim(tag: Path, rank: int) -> Path:
    return tag / f"bf16_zero_pp_rank_{rank}_mp_rank_00_optim_states.pt"


def one_line(e: pytest.ExceptionInfo) -> str:
    text = str(e.value)
    assert "\n" not in text
    return text


def test_missing_rank_file(ckpts, tmp_path):
    root, tag = copy(ckpts, "z2", tmp_path)
    optim(tag, 1).unlink()
    with pytest.raises(CheckpointNotFoundError) as e:
        _deepspeed.open(root)
    assert str(optim(tag, 1)) in one_line(e) and "rank 1 of 3" in str(e.value)


def test_missing_zero3_model_states(ckpts, tmp_path):
    root, tag = copy(ckpts, "z3", tmp_path)
    (tag / "zero_pp_rank_2_mp_rank_00_model_states.pt").unlink()
    with pytest.raises(CheckpointNotFoundError, match="zero_pp_rank_2_mp_rank_00_model_states.pt"):
        _deepspeed.open(root)


def test_truncated_rank_file_fails_only_the_keys_it_holds(ckpts, tmp_path):
    """Group 1 (25 elements) is cut into partitions of 10: lin1.bias lies in
    rank 0's, lin2.bias in ranks 1 and 2's."""
    root, tag = copy(ckpts, "z2", tmp_path)
    data = optim(tag, 2).read_bytes()
    optim(tag, 2).write_bytes(data[: len(data) // 2])
    ck = _deepspeed.open(root)
    assert same(ck.read("lin1.bias"), ref(ckpts, "z2")["zero_to_fp32"]["lin1.bias"])
    with pytest.raises(CorruptCheckpointError) as e:
        ck.read("optimizer.state.lin2.bias.exp_avg")
    assert str(optim(tag, 2)) in one_line(e) and "optimizer.state.lin2.bias.exp_avg" in str(e.value)


def test_mismatched_partition_sizes(ckpts, tmp_path):
    root, tag = copy(ckpts, "z2", tmp_path)

    def shorten(state):
        groups = state["optimizer_state_dict"]["single_partition_of_fp32_groups"]
        groups[1] = groups[1][:-1].clone()
    rewrite(optim(tag, 1), shorten)
    ck = _deepspeed.open(root)
    with pytest.raises(CorruptCheckpointError) as e:
        ck.read("norm.bias")  # elements 9..18 of group 1: ranks 0 and 1
    assert str(optim(tag, 1)) in one_line(e) and "norm.bias" in str(e.value)
    assert "mismatched partition sizes" in str(e.value)


def test_mismatched_zero3_pieces(ckpts, tmp_path):
    root, tag = copy(ckpts, "z3", tmp_path)

    def grow(state):
        groups = state["optimizer_state_dict"]["fp32_flat_groups"]
        groups[0] = torch.cat([groups[0], groups[0][:1]])
    rewrite(optim(tag, 2), grow)
    with pytest.raises(CorruptCheckpointError) as e:
        _deepspeed.open(root).read("emb.weight")
    assert str(optim(tag, 2)) in one_line(e) and "emb.weight" in str(e.value)


@pytest.mark.parametrize("how", ["second mp rank file", "mp_world_size"])
def test_tensor_parallel_is_refused(ckpts, tmp_path, how):
    root, tag = copy(ckpts, "z1", tmp_path)
    model = tag / "mp_rank_00_model_states.pt"
    if how == "mp_world_size":
        rewrite(model, lambda s: s.update(mp_world_size=2))
    else:
        shutil.copy(model, tag / "mp_rank_01_model_states.pt")
    with pytest.raises(InvalidStateError, match="model.parallel") as e:
        _deepspeed.open(root)
    one_line(e)


def test_pipeline_and_stale_files_are_refused(ckpts, tmp_path):
    root, tag = copy(ckpts, "z1", tmp_path)
    shutil.copy(optim(tag, 0), optim(tag, 3))
    with pytest.raises(CorruptCheckpointError, match="rank 3 beyond"):
        _deepspeed.open(root)
    optim(tag, 3).unlink()
    (tag / "layer_01-model_00-model_states.pt").write_bytes(b"")
    with pytest.raises(InvalidStateError, match="pipeline"):
        _deepspeed.open(root)


def test_pickles_are_weights_only_unless_unsafe(ckpts, tmp_path):
    root, tag = copy(ckpts, "z2", tmp_path)
    rewrite(tag / "mp_rank_00_model_states.pt", lambda s: s.update(when=datetime.date(2024, 1, 2)))
    with pytest.raises(InvalidStateError, match="unsafe_pickle=True") as e:
        _deepspeed.open(root)
    assert "mp_rank_00_model_states.pt" in one_line(e)
    ck = _deepspeed.open(root, unsafe_pickle=True)
    assert ck.values()["client_state"]["when"] == datetime.date(2024, 1, 2)  # as saved
    assert same(ck.read("lin1.bias"), ref(ckpts, "z2")["zero_to_fp32"]["lin1.bias"])
    # The importer drops (and reports) what JSON cannot hold: the date, and
    # DeepSpeed's own LossScaler object, which unsafe_pickle unpickles as is.
    done = foreign.import_checkpoint(root, tmp_path / "out", unsafe_pickle=True, progress=False)
    assert done["dropped"] == ["deepspeed.loss_scaler", "client_state.when"]
    assert done["not_imported"] == []


def test_a_damaged_pickle_is_corrupt_not_refused(ckpts, tmp_path):
    """torch's weights_only unpickler words every failure "Weights only load
    failed", garbage bytes included: a damaged file, never "pass
    unsafe_pickle"."""
    root, tag = copy(ckpts, "z2", tmp_path)
    optim(tag, 1).write_bytes(b"\xff" * 64)  # not a zip: read as a legacy pickle, an unknown opcode
    ck = _deepspeed.open(root)
    with pytest.raises(CorruptCheckpointError) as e:
        ck.read("norm.bias")  # elements 9..18 of group 1: ranks 0 and 1
    msg = one_line(e)
    assert str(optim(tag, 1)) in msg and "norm.bias" in msg and "unreadable pickle" in msg
    assert "unsafe_pickle" not in msg and e.value.code == "DATA_LOSS"


def test_an_io_error_is_a_storage_error(ckpts, tmp_path, monkeypatch):
    """A rank file whose read fails with EIO is an I/O failure, not a damaged
    checkpoint. torch reads the checked descriptor through the path
    _files.fd_path gives it, here /proc/self/mem for that file (its offset 0
    is never mapped); a link to it in the checkpoint would be refused as
    leading outside before any read."""
    root, tag = copy(ckpts, "z2", tmp_path)
    failing, real = str(optim(tag, 2)), _common.fd_path
    monkeypatch.setattr(_common, "fd_path",
                        lambda f: "/proc/self/mem" if f.name == failing else real(f))
    ck = _deepspeed.open(root)
    with pytest.raises(StorageError) as e:
        ck.read("optimizer.state.lin2.bias.exp_avg")  # in ranks 1 and 2's partitions
    msg = one_line(e)
    assert str(optim(tag, 2)) in msg and "lin2.bias" in msg and "Input/output error" in msg


def test_a_list_in_the_client_state_keeps_its_items_in_place(ckpts, tmp_path):
    """A tensor in a list stays in the list (taken out as its own key, the
    items after it would shift); tensors reached through dicts are keys."""
    root, tag = copy(ckpts, "z2", tmp_path)
    buf, inner = torch.arange(3.0), torch.ones(2, dtype=torch.int64)
    rewrite(tag / "mp_rank_00_model_states.pt",
            lambda s: s.update(buf=[buf, 5], deep={"t": inner, "l": [1, {"x": inner * 2}]}))
    ck = _deepspeed.open(root)
    keys = [k for k in ck.tensors() if k.startswith("client_state.")]
    assert sorted(keys) == ["client_state.deep.t", "client_state.ema.w"]
    client = ck.values()["client_state"]
    assert len(client["buf"]) == 2 and same(client["buf"][0], buf) and client["buf"][1] == 5
    assert client["deep"]["l"][0] == 1 and same(client["deep"]["l"][1]["x"], inner * 2)
    assert same(ck.read("client_state.deep.t"), inner)
    done = foreign.import_checkpoint(root, tmp_path / "out", progress=False)
    assert done["dropped"] == []
    got = {"client_state": {"buf": [torch.zeros(3), 0],
                            "deep": {"t": torch.zeros(2, dtype=torch.int64),
                                     "l": [0, {"x": torch.zeros(2, dtype=torch.int64)}]}}}
    shardsafe.load(got, tmp_path / "out", strict=False)
    assert same(got["client_state"]["buf"][0], buf) and got["client_state"]["buf"][1] == 5
    assert same(got["client_state"]["deep"]["t"], inner)
    assert got["client_state"]["deep"]["l"][0] == 1
    assert same(got["client_state"]["deep"]["l"][1]["x"], inner * 2)


def _renamed(d, old: str, new: str):
    """The dict with key `old` renamed `new`, in place of the old key."""
    return type(d)((new if k == old else k, v) for k, v in d.items())


def test_only_a_real_key_collision_is_refused(ckpts, tmp_path):
    """A model whose parameter is named module.lin1.weight (a submodule
    named `module`) lists it, and module.module.lin1.weight; a module entry
    that would be listed under the same key as a parameter is refused."""
    root, tag = copy(ckpts, "z2", tmp_path)
    r = ref(ckpts, "z2")

    def rename(state):
        state["param_shapes"][0] = _renamed(state["param_shapes"][0], "lin1.weight",
                                            "module.lin1.weight")
        state["module"] = _renamed(state["module"], "lin1.weight", "module.lin1.weight")
    rewrite(tag / "mp_rank_00_model_states.pt", rename)
    ck = _deepspeed.open(root)
    assert same(ck.read("module.lin1.weight"), r["zero_to_fp32"]["lin1.weight"])
    assert same(ck.read("module.module.lin1.weight"), r["lp"]["lin1.weight"])
    assert "lin1.weight" not in ck.tensors()
    rewrite(tag / "mp_rank_00_model_states.pt",
            lambda s: s.update(module=_renamed(s["module"], "module.lin1.weight", "lin1.weight")))
    with pytest.raises(InvalidStateError, match="both be listed as 'module.lin1.weight'") as e:
        _deepspeed.open(root)
    one_line(e)


def test_a_parameter_in_two_groups_is_corrupt(ckpts, tmp_path):
    root, tag = copy(ckpts, "z2", tmp_path)
    rewrite(tag / "mp_rank_00_model_states.pt", lambda s: s["param_shapes"].__setitem__(
        1, _renamed(s["param_shapes"][1], "lin1.bias", "lin1.weight")))
    with pytest.raises(CorruptCheckpointError,
                       match="parameter 'lin1.weight' in param_shapes groups 0 and 1") as e:
        _deepspeed.open(root)
    assert "mp_rank_00_model_states.pt" in one_line(e)


def test_malformed_metadata(ckpts, tmp_path):
    root, tag = copy(ckpts, "z3", tmp_path)
    rewrite(tag / "zero_pp_rank_0_mp_rank_00_model_states.pt", lambda s: s.update(param_shapes="x"))
    with pytest.raises(CorruptCheckpointError, match="param_shapes") as e:
        _deepspeed.open(root)
    assert "zero_pp_rank_0_mp_rank_00_model_states.pt" in one_line(e)
