"""nanotron checkpoints read by shardsafe.foreign.nanotron as global tensors.

nanotron's own save code cannot run here: its ParallelContext requires CUDA
and the nccl backend (nanotron 0.4 `parallel/context.py` asserts
backend == "nccl"), and the PyPI wheel nanotron==0.4 does not import at all
(a circular import between nanotron.logging and nanotron.config). So these
tests write the files exactly as nanotron's serialize code lays them out,
with the real safetensors and torch packages, following huggingface/nanotron
`src/nanotron/` (read in the nanotron 0.4 wheel, CHECKPOINT_VERSION 1.2, and
in newer repository copies, CHECKPOINT_VERSION 1.4 / 1.5, which add the
exp-rank suffix):

- serialize/weights.py `save_weights`: only DP rank 0 writes; one file per
  parameter and shard, `save_file({"data": shard}, path, metadata)`, with
  metadata `{}` for an unsharded parameter; a tied parameter is written once,
  under its tie group's name, by the group's first rank.
- serialize/utils.py `get_path`: the name split on ".", its parts as
  directories under model/, the file `model_<leaf>.safetensors` or
  `model_<leaf>_pp-rank-P-of-PP_tp-rank-T-of-TT[_exp-rank-E-of-EE].safetensors`.
- serialize/metadata.py `TensorMetadata.to_str_dict`: "version",
  "local_global_slices_pairs" (`SlicesPair.tuple_to_str`,
  parallel/parameters.py: "start,stop,step" slices joined by "|", local#global,
  pairs joined by ";") and "unsharded_shape" = `str(tuple(shape))`.
- parallel/sharded_parameters.py `create_sharded_parameter_from_config` (the
  slices, including `contiguous_chunks`, computed with numpy as there, so the
  unsharded shape of a chunked parameter is written as `np.int64(N)`) and
  parallel/tensor_parallel/nn.py (column linear and embedding split dim 0,
  row linear split dim 1).
- serialize/metadata.py `save_meta` (checkpoint_metadata.json, indent=2,
  sort_keys); serialize/optimizer.py `save_optimizer` / `optimizer_filename`
  / `save_lr_scheduler`; optim/named_optimizer.py (the "names" the state dict
  carries), optim/optimizer_from_gradient_accumulator.py (the fp32
  "gradient_accumulator"), optim/zero.py `_partition_parameters` (ZeRO-1 dp
  pieces) and serialize/random.py (per-rank random state files).
"""

from __future__ import annotations

import json
import math
import os
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from conftest import EXIT_OK, describe
from shardsafe import foreign
from shardsafe.foreign import nanotron as _nanotron, nanotron_weights as _nanotron_weights
from shardsafe.errors import CheckpointNotFoundError, CorruptCheckpointError, InvalidStateError

VERSION = "1.4"
EMB = "model.token_position_embeddings.pp_block.token_embedding.weight"
LM_HEAD = "model.lm_head.pp_block.weight"  # tied to EMB: never written
LN0 = "model.decoder.0.pp_block.input_layernorm.weight"
QKV = "model.decoder.0.pp_block.attn.qkv_proj.weight"
O_PROJ = "model.decoder.0.pp_block.attn.o_proj.weight"
LN1 = "model.decoder.1.pp_block.post_attention_layernorm.weight"
GATE_UP = "model.decoder.1.pp_block.mlp.gate_up_proj.weight"
DOWN = "model.decoder.1.pp_block.mlp.down_proj.weight"
FINAL_LN = "model.final_layer_norm.pp_block.weight"
A_LOG = "model.decoder.1.pp_block.mixer.A_log"  # a Mamba-style parameter with _no_weight_decay

# name -> (global shape, dtype, split dim or None, contiguous chunks, pipeline stage)
SPEC = {
    EMB: ((48, 32), torch.bfloat16, 0, None, 0),
    LN0: ((32,), torch.float32, None, None, 0),
    QKV: ((64, 32), torch.bfloat16, 0, (32, 16, 16), 0),
    O_PROJ: ((32, 32), torch.bfloat16, 1, None, 0),
    LN1: ((32,), torch.float32, None, None, 1),
    GATE_UP: ((80, 32), torch.bfloat16, 0, (40, 40), 1),
    DOWN: ((32, 40), torch.bfloat16, 1, None, 1),
    FINAL_LN: ((32,), torch.float32, None, None, 1),
    A_LOG: ((6, 4), torch.float32, None, None, 1),
}
# the parameters each pipeline stage holds (lm_head on the last, under EMB's tied name)
STAGE_PARAMS = {0: [EMB, LN0, QKV, O_PROJ], 1: [LN1, GATE_UP, DOWN, FINAL_LN, A_LOG, EMB]}


# ------------------------------------------------ nanotron's encoding --

def _slice_str(s: slice) -> str:
    return ",".join(str(x) if x is not None else "None" for x in (s.start, s.stop, s.step))


def _pairs_str(pairs) -> str:
    return ";".join("|".join(map(_slice_str, loc)) + "#" + "|".join(map(_slice_str, glo))
                    for loc, glo in pairs)


def shard_slices(shape, split_dim, chunks, tp, ntp):
    """(local shape, local_global_slices_pairs, unsharded_shape) of TP rank
    `tp`, computed as create_sharded_parameter_from_config does."""
    local_shape = tuple(n // ntp if d == split_dim else n for d, n in enumerate(shape))
    ndim = len(shape)
    if chunks is None:
        length = local_shape[split_dim]
        glob = slice(tp * length, (tp + 1) * length)
        pairs = [(tuple(slice(None) for _ in range(ndim)),
                  tuple(glob if d == split_dim else slice(None) for d in range(ndim)))]
        unsharded = tuple(ntp * n if d == split_dim else n for d, n in enumerate(local_shape))
        return local_shape, pairs, unsharded
    global_offsets = np.cumsum((0,) + chunks)
    local_offsets = global_offsets // ntp
    pairs = []
    bounds = zip(chunks, global_offsets[:-1], local_offsets[:-1], local_offsets[1:])
    for chunk, g0, l0, l1 in bounds:
        length = chunk // ntp
        loc, glo = slice(l0, l1), slice(tp * length + g0, (tp + 1) * length + g0)
        pairs.append((tuple(loc if d == split_dim else slice(None) for d in range(ndim)),
                      tuple(glo if d == split_dim else slice(None) for d in range(ndim))))
    unsharded = tuple(global_offsets[-1] if d == split_dim else n
                      for d, n in enumerate(local_shape))
    return local_shape, pairs, unsharded


def local_shard(full: torch.Tensor, local_shape, pairs) -> torch.Tensor:
    out = torch.empty(local_shape, dtype=full.dtype)
    for loc, glo in pairs:
        out[loc] = full[glo]
    return out


def weight_path(root: Path, name: str, suffix: str = "") -> Path:
    parts = name.split(".")
    return root.joinpath("model", *parts[:-1], f"model_{parts[-1]}{suffix}.safetensors")


def write_shard(root: Path, name: str, full: torch.Tensor, split_dim, chunks, pp, npp, tp, ntp,
                ep=None, nep=None, extra: dict | None = None) -> None:
    local_shape, pairs, unsharded = shard_slices(tuple(full.shape), split_dim, chunks, tp, ntp)
    suffix = f"_pp-rank-{pp}-of-{npp}_tp-rank-{tp}-of-{ntp}"
    if ep is not None:
        suffix += f"_exp-rank-{ep}-of-{nep}"
    metadata = {"version": VERSION, "local_global_slices_pairs": _pairs_str(pairs),
                "unsharded_shape": str(tuple(unsharded))}
    path = weight_path(root, name, suffix)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = local_shard(full, local_shape, pairs)
    save_file({"data": data, **(extra or {})}, str(path), metadata=metadata)


def write_unsharded(root: Path, name: str, full: torch.Tensor, extra: dict | None = None) -> None:
    path = weight_path(root, name)
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file({"data": full.contiguous(), **(extra or {})}, str(path), metadata={})


def write_meta(root: Path, tp: int, dp: int, step: int = 40, samples: int = 320) -> None:
    meta = {"version": VERSION, "tp": tp, "dp": dp, "cp": 1, "custom_metas": None,
            "metas": {"consumed_train_samples": samples, "last_train_step": step,
                      "consumed_tokens_total": samples * 64, "last_stage_idx": 0,
                      "data_stages": [{"name": "stable", "start_training_step": 1,
                                       "consumed_train_samples": samples, "sequence_length": 64,
                                       "consumed_tokens_per_dataset_folder": {}}]}}
    with open(root / _nanotron.CHECKPOINT_FILE, "w") as f:
        json.dump(meta, f, indent=2, sort_keys=True)


def bits(t: torch.Tensor) -> torch.Tensor:
    """The raw bytes, so that the comparison is bit-exact."""
    return t.contiguous().view(torch.uint8)


def random_tensor(shape, dtype, gen) -> torch.Tensor:
    return torch.randn(shape, generator=gen).to(dtype)


# ------------------------------------------------ a TP=2, PP=2 checkpoint --

def write_weights(root: Path, weights: dict[str, torch.Tensor], npp=2, ntp=2) -> None:
    """save_weights of a TP=2 x PP=2 run: sharded parameters once per TP
    rank of their stage, unsharded ones once (tied across TP), EMB by pp 0
    (its tie group's first rank)."""
    for name, (_, _, split_dim, chunks, stage) in SPEC.items():
        extra = {"_no_weight_decay": torch.tensor(True)} if name == A_LOG else None
        if split_dim is None:
            write_unsharded(root, name, weights[name], extra)
        else:
            for tp in range(ntp):
                write_shard(root, name, weights[name], split_dim, chunks, stage, npp, tp, ntp,
                            extra=extra)


def rank_locals(name: str, full: torch.Tensor, tp: int, ntp: int = 2) -> torch.Tensor:
    _, _, split_dim, chunks, _ = SPEC[name]
    if split_dim is None:
        return full.clone()
    local_shape, pairs, _ = shard_slices(tuple(full.shape), split_dim, chunks, tp, ntp)
    return local_shard(full, local_shape, pairs)


def adamw_skeleton(locals_: list[torch.Tensor]) -> dict:
    """A real torch AdamW state dict over these local fp32 shards after one step."""
    params = [torch.nn.Parameter(t.clone()) for t in locals_]
    for p in params:
        p.grad = torch.ones_like(p)
    opt = torch.optim.AdamW(params, lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1)
    opt.step()
    return opt.state_dict()


def optimizer_state(names: list[str], per_name: dict[str, dict[str, torch.Tensor]]) -> dict:
    """The NamedOptimizer + OptimizerFromGradientAccumulator state dict of one
    process: AdamW state with exp_avg / exp_avg_sq set to `per_name`'s local
    shards, "names", and the fp32 master shards under "gradient_accumulator"."""
    sd = adamw_skeleton([per_name[n]["fp32"] for n in names])
    for i, n in enumerate(names):
        sd["state"][i]["exp_avg"].copy_(per_name[n]["exp_avg"])
        sd["state"][i]["exp_avg_sq"].copy_(per_name[n]["exp_avg_sq"])
    sd["names"] = dict(enumerate(names))
    sd["gradient_accumulator"] = {n: per_name[n]["fp32"].clone() for n in names}
    return sd


def write_optimizer_zero0(root: Path, opt_globals: dict, npp=2, ntp=2) -> None:
    odir = root / "optimizer"
    odir.mkdir(parents=True, exist_ok=True)
    with open(odir / "optimizer_config.json", "w") as f:
        json.dump({"type": "OptimizerFromGradientAccumulator",
                   "parallelism": {"tp_size": str(ntp), "dp_size": "1", "pp_size": str(npp),
                                   "expert_parallel_size": "1"}, "configs": {}}, f)
    for pp in range(npp):
        for tp in range(ntp):
            names = STAGE_PARAMS[pp]
            per_name = {n: {k: rank_locals(n, opt_globals[k][n], tp, ntp) for k in opt_globals}
                        for n in names}
            torch.save(optimizer_state(names, per_name),
                       odir / f"optimizer_pp-{pp}-of-{npp}_tp-{tp}-of-{ntp}_exp-0-of-1.pt")


def write_lr_scheduler(root: Path) -> dict:
    opt = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=3e-4)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda=lambda step: min(1.0, (step + 1) / 10))
    for _ in range(4):
        opt.step()
        sched.step()
    (root / "lr_scheduler").mkdir()
    torch.save(sched.state_dict(), root / "lr_scheduler" / "lr_scheduler.pt")
    return sched.state_dict()


def make_checkpoint(root: Path, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    weights = {n: random_tensor(s, dt, gen) for n, (s, dt, *_) in SPEC.items()}
    opt_globals = {k: {n: random_tensor(SPEC[n][0], torch.float32, gen) for n in SPEC}
                   for k in ("fp32", "exp_avg", "exp_avg_sq")}
    root.mkdir(parents=True)
    write_meta(root, tp=2, dp=1)
    write_weights(root, weights)
    write_optimizer_zero0(root, opt_globals)
    sched = write_lr_scheduler(root)
    (root / "random").mkdir()
    for pp in range(2):
        for tp in range(2):
            # the content of these files is not read (see the module doc)
            torch.save({"placeholder": torch.zeros(1)},
                       root / "random" / f"tp-{tp}-of-2_dp-0-of-1_pp-{pp}-of-2.pt")
    config = {"hidden_size": 32, "tie_word_embeddings": True}
    (root / "model_config.json").write_text(json.dumps(config))
    return weights, opt_globals, sched


@pytest.fixture()
def ckpt(tmp_path):
    root = tmp_path / "checkpoints" / "40"
    weights, opt_globals, sched = make_checkpoint(root)
    (tmp_path / "checkpoints" / "latest.txt").write_text("40")
    return root, weights, opt_globals, sched


def opened(root) -> _nanotron.NanotronCheckpoint:
    return _nanotron.FORMAT.open(str(root))


# ------------------------------------------------------------- weights --

def test_the_format_detects_a_checkpoint_and_its_latest_txt(ckpt, tmp_path):
    root = ckpt[0]
    assert _nanotron.FORMAT.name == "nanotron"
    assert _nanotron.FORMAT.detect(str(root)) and _nanotron.FORMAT.detect(str(root.parent))
    assert not _nanotron.FORMAT.detect(str(tmp_path))
    assert not _nanotron.FORMAT.detect(str(root / "model"))
    assert opened(root.parent).path == str(root)
    with pytest.raises(CheckpointNotFoundError, match="not a nanotron checkpoint"):
        _nanotron.FORMAT.open(str(tmp_path))
    ck = opened(root)
    assert ck.format == "nanotron"
    assert all(callable(getattr(ck, m)) for m in ("tensors", "read", "values", "close"))


def test_tensors_lists_every_parameter_with_its_unsharded_shape(ckpt):
    root, weights, opt_globals, _ = ckpt
    ck = opened(root)
    listed = ck.tensors()
    weights_listed = {k: v for k, v in listed.items()
                      if not k.startswith(("optimizer.", "__shardsafe__/"))}
    assert weights_listed == {n: (t.dtype, tuple(t.shape)) for n, t in weights.items()}
    assert LM_HEAD not in listed  # the tie's other name is not in the files
    for n in SPEC:
        for state in ("exp_avg", "exp_avg_sq"):
            assert listed[f"optimizer.state.{n}.{state}"] == (torch.float32, SPEC[n][0])
        assert listed[f"optimizer.gradient_accumulator.{n}"] == (torch.float32, SPEC[n][0])
    # + the four processes' random states (tp 2 x pp 2), one grouped per-rank tensor each
    assert len(listed) == len(SPEC) * 4 + 4
    assert all(listed[f"__shardsafe__/group/{g}/random"][0] == torch.uint8 for g in range(4))


def test_read_assembles_tp_and_pp_shards_bit_exact(ckpt):
    root, weights, _, _ = ckpt
    ck = opened(root)
    for name, full in weights.items():
        got = ck.read(name)
        assert got.dtype == full.dtype and got.is_contiguous()
        assert torch.equal(bits(got), bits(full)), name
    # the chunked column (q, k, v) really is interleaved per rank: rank 1's
    # file starts with q rows 16:32, not rows 32:64
    tp1_file = weight_path(root, QKV, "_pp-rank-0-of-2_tp-rank-1-of-2")
    tp1 = _nanotron_weights.read_tensor(str(tp1_file), QKV, ck.path)
    assert torch.equal(bits(tp1[:16]), bits(weights[QKV][16:32]))
    assert torch.equal(bits(tp1[16:24]), bits(weights[QKV][40:48]))
    ck.close()


def test_the_chunked_shape_is_written_as_numpy_ints_and_parsed(ckpt):
    from safetensors import safe_open
    root = ckpt[0]
    with safe_open(str(weight_path(root, GATE_UP, "_pp-rank-1-of-2_tp-rank-0-of-2")), "pt") as f:
        meta = f.metadata()
    assert meta["unsharded_shape"] == "(np.int64(80), 32)"
    assert meta["local_global_slices_pairs"] == (
        "0,20,None|None,None,None#0,20,None|None,None,None;"
        "20,40,None|None,None,None#40,60,None|None,None,None")
    assert opened(root).tensors()[GATE_UP] == (torch.bfloat16, (80, 32))


def test_read_box_reads_another_layouts_piece(ckpt):
    root, weights, opt_globals, _ = ckpt
    ck = opened(root)
    # a TP=4 column piece and a row piece that straddle the TP=2 shards
    assert torch.equal(bits(ck.read_box(QKV, (24, 0), (24, 32))), bits(weights[QKV][24:48]))
    assert torch.equal(bits(ck.read_box(O_PROJ, (3, 10), (5, 12))),
                       bits(weights[O_PROJ][3:8, 10:22]))
    assert torch.equal(ck.read_box(f"optimizer.state.{DOWN}.exp_avg", (0, 15), (32, 10)),
                       opt_globals["exp_avg"][DOWN][:, 15:25])
    assert ck.read_box(LN0, (5,), (0,)).shape == (0,)
    with pytest.raises(InvalidStateError, match="has no box"):
        ck.read_box(O_PROJ, (30, 0), (5, 32))
    with pytest.raises(InvalidStateError, match="no tensor 'model.nothing'"):
        ck.read("model.nothing")


def test_optimizer_state_and_fp32_master_assemble_globally(ckpt):
    root, _, opt_globals, _ = ckpt
    ck = opened(root)
    for n in SPEC:
        assert torch.equal(ck.read(f"optimizer.state.{n}.exp_avg"), opt_globals["exp_avg"][n]), n
        assert torch.equal(ck.read(f"optimizer.state.{n}.exp_avg_sq"),
                           opt_globals["exp_avg_sq"][n]), n
        assert torch.equal(ck.read(f"optimizer.gradient_accumulator.{n}"),
                           opt_globals["fp32"][n]), n


def test_values_carry_step_metadata_scheduler_and_what_was_not_read(ckpt):
    root, _, _, sched = ckpt
    v = opened(root).values()
    assert v["step"] == 40 and v["consumed_train_samples"] == 320
    nano = v["nanotron"]
    assert nano["checkpoint_metadata"]["tp"] == 2
    assert nano["checkpoint_metadata"]["version"] == VERSION
    assert nano["model_config"]["tie_word_embeddings"] is True
    assert nano["no_weight_decay"] == {A_LOG: True}
    assert "tie group" in nano["tied_parameters"]
    # the random states are carried (grouped per-rank tensors): nothing is left out
    assert nano["not_imported"] == {}
    assert opened(root).not_imported() == []
    assert v["optimizer"]["type"] == "OptimizerFromGradientAccumulator"
    assert v["optimizer"]["step"] == 1.0
    assert v["optimizer"]["param_groups"][0]["betas"] == (0.9, 0.95)  # as saved
    assert v["lr_scheduler"]["last_epoch"] == sched["last_epoch"] == 4
    assert v["lr_scheduler"]["_last_lr"] == sched["_last_lr"]


def test_bad_naming_files_read_as_their_fixed_name(tmp_path):
    """Files named with the duplicated prefix that nanotron's
    scripts/fix_checkpoint_bad_naming.py repairs."""
    root = tmp_path / "ck"
    root.mkdir()
    write_meta(root, tp=2, dp=1)
    full = torch.arange(64, dtype=torch.float32).reshape(8, 8)
    for tp in range(2):
        local_shape, pairs, unsharded = shard_slices((8, 8), 0, None, tp, 2)
        path = weight_path(root, O_PROJ).parent / \
            f"model_model_weight.safetensors_pp-rank-0-of-1_tp-rank-{tp}-of-2.safetensors"
        path.parent.mkdir(parents=True, exist_ok=True)
        save_file({"data": local_shard(full, local_shape, pairs)}, str(path),
                  metadata={"version": "1.3", "local_global_slices_pairs": _pairs_str(pairs),
                            "unsharded_shape": str(unsharded)})
    ln = weight_path(root, LN0).parent / "model_model_weight.safetensors.safetensors"
    ln.parent.mkdir(parents=True)
    save_file({"data": torch.ones(4)}, str(ln), metadata={})
    ck = opened(root)
    assert set(ck.tensors()) == {O_PROJ, LN0}
    assert torch.equal(ck.read(O_PROJ), full) and torch.equal(ck.read(LN0), torch.ones(4))
    save_file({"data": torch.ones(4)}, str(weight_path(root, LN0)), metadata={})
    with pytest.raises(CorruptCheckpointError, match="two files claim the whole tensor"):
        opened(root).tensors()


# ------------------------------------------------------ hostile inputs --

def test_a_missing_shard_file_is_named(ckpt):
    root = ckpt[0]
    gone = weight_path(root, O_PROJ, "_pp-rank-0-of-2_tp-rank-1-of-2")
    gone.unlink()
    ck = opened(root)
    with pytest.raises(CheckpointNotFoundError) as info:
        ck.read(O_PROJ)
    msg = str(info.value)
    assert "\n" not in msg and str(gone) in msg and O_PROJ in msg and "1 of 2 shard files" in msg
    assert torch.equal(ck.read(QKV).float(), ckpt[1][QKV].float())  # other tensors still read


ROW_SHARD = "None,None,None|None,None,None#None,None,None|{}"  # a row-linear shard's pair
COL_SHARD = "{}|None,None,None#{}|None,None,None"  # a column-linear shard's pair


def _rewrite_meta(path: Path, **changes) -> None:
    from safetensors import safe_open
    with safe_open(str(path), "pt") as f:
        meta, data = f.metadata(), f.get_tensor("data")
    meta.update(changes)
    save_file({"data": data}, str(path), metadata=meta)


def test_a_slice_outside_the_shape_is_refused(ckpt):
    root = ckpt[0]
    path = weight_path(root, O_PROJ, "_pp-rank-0-of-2_tp-rank-1-of-2")
    _rewrite_meta(path, local_global_slices_pairs=ROW_SHARD.format("16,48,None"))
    with pytest.raises(CorruptCheckpointError) as info:
        opened(root).read(O_PROJ)
    msg = str(info.value)
    assert "\n" not in msg and str(path) in msg and O_PROJ in msg
    assert "outside the dimension of size 32" in msg


def test_two_files_claiming_one_region_are_refused(ckpt):
    root = ckpt[0]
    rank0 = weight_path(root, O_PROJ, "_pp-rank-0-of-2_tp-rank-0-of-2")
    rank1 = weight_path(root, O_PROJ, "_pp-rank-0-of-2_tp-rank-1-of-2")
    _rewrite_meta(rank1, local_global_slices_pairs=ROW_SHARD.format("0,16,None"))
    with pytest.raises(CorruptCheckpointError) as info:
        opened(root).tensors()
    msg = str(info.value)
    assert "\n" not in msg and str(rank0) in msg and str(rank1) in msg and "[0:32, 0:16]" in msg


def test_a_gap_and_a_shape_disagreement_are_refused(ckpt):
    root = ckpt[0]
    for tp in range(2):
        _rewrite_meta(weight_path(root, DOWN, f"_pp-rank-1-of-2_tp-rank-{tp}-of-2"),
                      unsharded_shape="(32, 48)")
    with pytest.raises(CorruptCheckpointError, match=r"cover 1280 of the 1536 elements"):
        opened(root).read(DOWN)
    _rewrite_meta(weight_path(root, DOWN, "_pp-rank-1-of-2_tp-rank-0-of-2"),
                  unsharded_shape="(32, 40)")
    with pytest.raises(CorruptCheckpointError, match="disagree: unsharded shapes"):
        opened(root).read(DOWN)


def test_local_and_global_slices_of_different_sizes_are_refused(ckpt):
    root = ckpt[0]
    path = weight_path(root, QKV, "_pp-rank-0-of-2_tp-rank-0-of-2")
    _rewrite_meta(path, local_global_slices_pairs=COL_SHARD.format("0,32,None", "0,16,None"))
    with pytest.raises(CorruptCheckpointError, match="differ in shape"):
        opened(root).read(QKV)
    _rewrite_meta(path, local_global_slices_pairs=COL_SHARD.format("0,16,None", "0,16,None"))
    with pytest.raises(CorruptCheckpointError, match="local slices do not cover the stored shard"):
        opened(root).read(QKV)
    _rewrite_meta(path, local_global_slices_pairs=COL_SHARD.format("0,32,2", "0,32,2"))
    with pytest.raises(CorruptCheckpointError, match="step 2"):
        opened(root).read(QKV)


def test_a_tp_size_other_than_the_metadatas_and_odd_names_are_refused(ckpt, tmp_path):
    root = ckpt[0]
    write_meta(root, tp=4, dp=1)
    with pytest.raises(CorruptCheckpointError, match="says tp=4"):
        opened(root).read(O_PROJ)
    write_meta(root, tp=2, dp=1)
    stray = weight_path(root, O_PROJ).parent / "weights.safetensors"
    save_file({"data": torch.zeros(1)}, str(stray))
    with pytest.raises(CorruptCheckpointError, match="not a nanotron weight file name"):
        opened(root)


def test_expert_shards_claiming_one_region_are_refused(tmp_path):
    """Expert-parallel files (exp-rank suffix) whose metadata gives only the
    TP split: which experts each exp-rank holds is not recorded."""
    root = tmp_path / "ep"
    root.mkdir()
    write_meta(root, tp=1, dp=1)
    name = "model.decoder.0.pp_block.mlp.experts.0.down_proj.weight"
    full = torch.randn(8, 4)
    for ep in range(2):
        write_shard(root, name, full, 1, None, 0, 1, 0, 1, ep=ep, nep=2)
    with pytest.raises(CorruptCheckpointError, match="expert-parallel shards .* by guess"):
        opened(root).tensors()


# ------------------------------------------------------ optimizer state --

def test_optimizer_copies_that_differ_are_refused(ckpt):
    root = ckpt[0]
    path = root / "optimizer" / "optimizer_pp-1-of-2_tp-0-of-2_exp-0-of-1.pt"
    sd = torch.load(path, weights_only=True)
    index = next(i for i, n in sd["names"].items() if n == EMB)  # lm_head's copy of the tied state
    sd["state"][index]["exp_avg"][0, 0] += 1
    torch.save(sd, path)
    ck = opened(root)
    assert torch.equal(ck.read(f"optimizer.state.{EMB}.exp_avg_sq"), ckpt[2]["exp_avg_sq"][EMB])
    with pytest.raises(CorruptCheckpointError) as info:
        ck.read(f"optimizer.state.{EMB}.exp_avg")
    assert str(path) in str(info.value) and "differs" in str(info.value)


OPT = "optimizer_pp-{}-of-2_tp-{}-of-2_exp-0-of-1.pt"  # a ZeRO-0 optimizer file of ckpt
STAGE0_SHARDED = [QKV, O_PROJ]  # only pp 0 holds them (EMB's tp shards: also pp 1, tied)


def optimizer_keys(listed) -> set[str]:
    return {k for k in listed if k.startswith("optimizer.")}


def all_optimizer_keys(names=SPEC) -> set[str]:
    return {f"optimizer.{kind}.{n}" + suffix for n in names
            for kind, suffix in (("state", ".exp_avg"), ("state", ".exp_avg_sq"),
                                 ("gradient_accumulator", ""))}


def test_optimizer_state_without_names_leaves_out_only_what_it_holds(ckpt):
    """pp 0 tp 1's file has no "names": its states cannot be matched with
    certainty. Only the parameters whose shards no other file holds are left
    out (QKV and O_PROJ's tp 1 shards), each reported; the tied embedding's
    tp 1 shard is also on pp 1 and the unsharded LN0 on tp 0: read."""
    root, _, opt_globals, _ = ckpt
    path = root / "optimizer" / OPT.format(0, 1)
    sd = torch.load(path, weights_only=True)
    del sd["names"]
    torch.save(sd, path)
    ck = opened(root)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # reported by not_imported(), not warned
        listed = ck.tensors()
    assert optimizer_keys(listed) == all_optimizer_keys() - all_optimizer_keys(STAGE0_SHARDED)
    for n in (EMB, LN0):
        assert torch.equal(ck.read(f"optimizer.state.{n}.exp_avg"), opt_globals["exp_avg"][n]), n
    lines = ck.not_imported()
    assert f"{path}: optimizer state not imported: no 'names'" in "\n".join(lines)
    for key in all_optimizer_keys(STAGE0_SHARDED):
        assert any(ln.startswith(f"{key}: optimizer state not imported") and str(path) in ln
                   for ln in lines), key
    assert "no 'names'" in ck.values()["nanotron"]["not_imported"][str(path)]


def test_a_pickle_weights_only_refuses_is_left_out_unless_unsafe(ckpt):
    root, _, opt_globals, _ = ckpt
    path = root / "optimizer" / OPT.format(0, 0)
    sd = torch.load(path, weights_only=True)
    sd["param_groups"][0]["schedule"] = Opaque(3)
    torch.save(sd, path)
    ck = opened(root)
    listed = ck.tensors()
    assert optimizer_keys(listed) == all_optimizer_keys() - all_optimizer_keys(STAGE0_SHARDED)
    line = next(ln for ln in ck.not_imported() if ln.startswith(str(path)))
    assert "refuses the global" in line and "Opaque" in line and "unsafe_pickle=True" in line
    ck = _nanotron.FORMAT.open(str(root), unsafe_pickle=True)
    assert optimizer_keys(ck.tensors()) == all_optimizer_keys()
    assert torch.equal(ck.read(f"optimizer.state.{QKV}.exp_avg"), opt_globals["exp_avg"][QKV])
    assert ck.not_imported() == []  # the random states are carried, not noted


class Opaque:  # an object torch.load(weights_only=True) refuses
    def __init__(self, n: int) -> None:
        self.n = n


@pytest.mark.parametrize("what", ["optimizer", "lr_scheduler"])
def test_a_damaged_pickle_is_corrupt_not_refused(ckpt, what):
    """torch's weights_only unpickler words every failure "Weights only load
    failed", a stream of garbage bytes included: that is a damaged file
    (CorruptCheckpointError naming it), never a refusal to skip."""
    root = ckpt[0]
    path = (root / "optimizer" / OPT.format(1, 0) if what == "optimizer"
            else root / "lr_scheduler" / "lr_scheduler.pt")
    path.write_bytes(b"\xff" * 64)  # not a zip: read as a legacy pickle, an unknown opcode
    with pytest.raises(CorruptCheckpointError) as info:
        opened(root).values()
    msg = str(info.value)
    assert "\n" not in msg and str(path) in msg and "unreadable pickle" in msg, msg
    assert "unsafe_pickle" not in msg, msg


def test_a_missing_optimizer_file_is_named(ckpt):
    """Every (pp, tp) process writes its optimizer file: one missing is a
    missing part of the checkpoint, named, never state quietly left out."""
    root = ckpt[0]
    gone = root / "optimizer" / OPT.format(1, 0)
    gone.unlink()
    with pytest.raises(CheckpointNotFoundError) as info:
        opened(root).tensors()
    msg = str(info.value)
    assert "\n" not in msg and msg.startswith(f"{gone}: missing optimizer file (3 of 4"), msg


def test_an_optimizer_state_missing_for_one_shard_is_corrupt(ckpt):
    root = ckpt[0]
    path = root / "optimizer" / OPT.format(0, 1)
    sd = torch.load(path, weights_only=True)
    index = next(i for i, n in sd["names"].items() if n == O_PROJ)
    del sd["state"][index]["exp_avg"]
    torch.save(sd, path)
    with pytest.raises(CorruptCheckpointError) as info:
        opened(root).tensors()
    msg = str(info.value)
    assert msg.startswith(f"{path}: no 'optimizer.state.{O_PROJ}.exp_avg' for weight shard "), msg
    assert "other shards have it" in msg


def test_opening_without_safetensors_says_how_to_install_it(ckpt, monkeypatch):
    """Detection reads file names only; opening needs the safetensors
    package (sys.modules[name] = None makes its import fail, as when it is
    not installed)."""
    root = ckpt[0]
    monkeypatch.setitem(sys.modules, "safetensors", None)
    assert _nanotron.FORMAT.detect(str(root))
    with pytest.raises(ImportError, match=r"needs the safetensors package \(pip install "
                                          r"safetensors\)"):
        opened(root)


def test_shardsafe_import_prints_what_was_not_imported(ckpt, run, tmp_path):
    """The CLI prints the reader's not_imported() lines, and any other
    warning of the import (here torch's about a pickle protocol its
    weights_only unpickler was not written for) on stderr."""
    root = ckpt[0]
    path = root / "optimizer" / OPT.format(0, 1)
    sd = torch.load(path, weights_only=True)
    del sd["names"]
    torch.save(sd, path)
    sched = root / "lr_scheduler" / "lr_scheduler.pt"
    torch.save(torch.load(sched, weights_only=True), sched, pickle_protocol=3)
    proc = run("import", root.parent, tmp_path / "out")
    assert proc.returncode == EXIT_OK, describe(proc)
    assert "from nanotron checkpoint" in proc.stdout, describe(proc)
    notes = [ln for ln in proc.stdout.splitlines() if ln.startswith("note: not imported: ")]
    assert f"note: not imported: {path}: optimizer state not imported: no 'names'" in \
        "\n".join(notes), describe(proc)
    assert len(notes) == 1 + len(all_optimizer_keys(STAGE0_SHARDED)), describe(proc)
    assert "warning: UserWarning: Detected pickle protocol 3" in proc.stderr, describe(proc)
    out = foreign.import_checkpoint(root, tmp_path / "again", progress=False)
    assert [f"note: not imported: {ln}" for ln in out["not_imported"]] == notes


# ------------------------------------------------------------- ZeRO-1 --

ZERO_SPEC = {O_PROJ: ((32, 32), 1, None), QKV: ((64, 32), 0, (32, 16, 16)), LN0: ((5,), None, None)}


def dp_offsets(numel: int, ndp: int) -> dict[int, tuple[int, int]]:
    """optim/zero.py _partition_parameters."""
    per = (numel - 1) // ndp + 1
    sizes = np.full(shape=ndp, fill_value=per)
    remainder = per * ndp - numel
    if remainder > 0:
        sizes[-remainder:] -= 1
    ends = np.cumsum(sizes)
    starts = np.concatenate([[0], ends[:-1]])
    return {d: (starts[d], ends[d]) for d in range(ndp) if starts[d] < ends[d]}


def test_zero1_dp_pieces_join_into_global_states(tmp_path):
    root = tmp_path / "z1"
    root.mkdir()
    write_meta(root, tp=2, dp=2)
    gen = torch.Generator().manual_seed(1)
    glob = {k: {n: random_tensor(s, torch.float32, gen) for n, (s, _, _) in ZERO_SPEC.items()}
            for k in ("w", "fp32", "exp_avg", "exp_avg_sq")}
    locs: dict = {}
    for n, (shape, split, chunks) in ZERO_SPEC.items():
        for tp in range(2):
            if split is None:
                locs[n, tp] = {k: glob[k][n].clone() for k in glob}
            else:
                ls, pairs, _ = shard_slices(shape, split, chunks, tp, 2)
                locs[n, tp] = {k: local_shard(glob[k][n], ls, pairs) for k in glob}
        if split is None:
            write_unsharded(root, n, glob["w"][n])
        else:
            for tp in range(2):
                write_shard(root, n, glob["w"][n], split, chunks, 0, 1, tp, 2)
    names = list(ZERO_SPEC)
    offsets = {n: dp_offsets(locs[n, 0]["w"].numel(), 2) for n in names}
    odir = root / "optimizer"
    odir.mkdir()
    # serialize/optimizer.py save_optimizer: every value converted to a string
    table = {n: {str(d): [str(a), str(b)] for d, (a, b) in o.items()} for n, o in offsets.items()}
    shapes = {n: [str(x) for x in locs[n, 0]["w"].shape] for n in names}
    config = {"type": "ZeroDistributedOptimizer",
              "parallelism": {"tp_size": "2", "dp_size": "2", "pp_size": "1",
                              "expert_parallel_size": "1"},
              "configs": {"param_name_to_dp_rank_offsets": table, "orig_param_shapes": shapes}}
    (odir / "optimizer_config.json").write_text(json.dumps(config))
    for tp in range(2):
        for dp in range(2):
            held = [n for n in names if dp in offsets[n]]
            per_name = {n: {k: locs[n, tp][k].reshape(-1)[slice(*map(int, offsets[n][dp]))]
                            for k in ("fp32", "exp_avg", "exp_avg_sq")} for n in held}
            torch.save(optimizer_state(held, per_name),
                       odir / f"optimizer_pp-0-of-1_dp-{dp}-of-2_tp-{tp}-of-2_exp-0-of-1.pt")
    ck = opened(root)
    listed = ck.tensors()
    for n, (shape, _, _) in ZERO_SPEC.items():
        assert listed[f"optimizer.state.{n}.exp_avg"] == (torch.float32, shape)
        assert torch.equal(ck.read(f"optimizer.state.{n}.exp_avg"), glob["exp_avg"][n]), n
        assert torch.equal(ck.read(f"optimizer.state.{n}.exp_avg_sq"), glob["exp_avg_sq"][n]), n
        assert torch.equal(ck.read(f"optimizer.gradient_accumulator.{n}"), glob["fp32"][n]), n
    assert math.prod(ZERO_SPEC[LN0][0]) == 5 and offsets[LN0] == {0: (0, 3), 1: (3, 5)}
    config["configs"]["param_name_to_dp_rank_offsets"][LN0] = {"0": ["0", "2"], "1": ["2", "5"]}
    (odir / "optimizer_config.json").write_text(json.dumps(config))
    with pytest.raises(CorruptCheckpointError, match="optimizer_config.json says \\[0, 2\\]"):
        opened(root).read(f"optimizer.state.{LN0}.exp_avg")
    config["configs"]["param_name_to_dp_rank_offsets"] = {}
    (odir / "optimizer_config.json").write_text(json.dumps(config))
    one = odir / "optimizer_pp-0-of-1_dp-1-of-2_tp-1-of-2_exp-0-of-1.pt"
    sd = torch.load(one, weights_only=True)
    index = next(i for i, n in sd["names"].items() if n == O_PROJ)
    for state in sd["state"][index].values():
        if state.dim():
            state.resize_(state.numel() - 1)
    torch.save(sd, one)
    with pytest.raises(CorruptCheckpointError, match=r"ranks \[0, 1\] hold 511 of the 512 "):
        opened(root).read(f"optimizer.state.{O_PROJ}.exp_avg")
    os.remove(one)
    with pytest.raises(CheckpointNotFoundError, match=f"{one}: missing optimizer file"):
        opened(root).tensors()
