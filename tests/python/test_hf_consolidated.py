"""Consolidated Hugging Face output written at save time by all ranks
(NeMo's save_consolidated, torchtitan's last_save_in_hf), with real
torch.distributed (gloo, 2 ranks) and the real transformers.

A tiny Llama, tensor-parallel over 2 ranks, is saved by a CheckpointManager;
CheckpointManager.export_hf (shardsafe.hf.export with a process group)
then writes the HF directory with each rank writing its share of the
weight files. The output is byte-identical to the one-process export,
holds every tensor bit-exact, and from_pretrained computes the same
logits. A rank that fails (a corrupt
chunk only its files read) leaves no output and the previous output intact,
with the error raised on every rank.
"""

from __future__ import annotations

import json
import os
import shutil

import pytest
import torch
import torch.distributed as dist
from safetensors.torch import load_file
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import distribute_tensor

import shardsafe
import shardsafe.hf
from dist_util import run_workers
from hf_models import SMALL_SHARDS, logits, state_of, tiny_llama, tp_placement


def read(path) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def snapshot(directory) -> dict[str, bytes]:
    return {n: read(os.path.join(directory, n)) for n in sorted(os.listdir(directory))}


def leftovers(directory) -> list[str]:
    return [n for n in os.listdir(directory) if n.startswith(".tmp-export-")]


# ------------------------------------------------------- world-2 workers --

def _save_and_export(rank, world, tmp):
    """Saves a tensor-parallel training state at step 5, then exports it
    collectively at save time."""
    mesh = init_device_mesh("cpu", (world,))
    model = tiny_llama()
    state = {k: distribute_tensor(v.detach().clone(), mesh, tp_placement(k))
             for k, v in model.state_dict().items()}
    mgr = shardsafe.CheckpointManager(f"{tmp}/root", keep_last=2)
    mgr.save(5, {"model": state, "step": 5}, files=shardsafe.hf.model_files(model))
    stats = mgr.export_hf(f"{tmp}/hf", prefix="model.", max_shard_size=SMALL_SHARDS)
    with open(f"{tmp}/stats{rank}.json", "w") as f:
        json.dump(stats, f)


def _failing_exports(rank, world, tmp):
    """Two exports onto the existing output that must fail on every rank:
    without overwrite (rank 0's check), and with a chunk that only rank 1's
    files read corrupted (rank 1's failure)."""
    mgr = shardsafe.CheckpointManager(f"{tmp}/root")
    errors = {}
    with pytest.raises(shardsafe.ShardsafeError) as info:
        mgr.export_hf(f"{tmp}/hf", prefix="model.", max_shard_size=SMALL_SHARDS)
    errors["exists"] = [type(info.value).__name__, str(info.value)]
    with pytest.raises(shardsafe.ShardsafeError) as info:
        shardsafe.hf.export(mgr.path(5), f"{tmp}/hf", prefix="model.",
                            max_shard_size=SMALL_SHARDS, dtype=torch.bfloat16, overwrite=True,
                            process_group=dist.group.WORLD)
    errors["corrupt"] = [type(info.value).__name__, str(info.value)]
    del info
    with open(f"{tmp}/errors{rank}.json", "w") as f:
        json.dump(errors, f)


# ------------------------------------------------------------------ tests --

def corrupt_a_chunk_of(ckpt: str, key: str) -> None:
    """Flips one byte of the first chunk of tensor `key` in its data file."""
    index = json.loads(read(os.path.join(ckpt, "shardsafe.json")))
    chunk = index["tensors"][key]["chunks"][0]
    path = os.path.join(ckpt, index["files"][chunk["file"]]["name"])
    data = bytearray(read(path))
    data[chunk["at"]] ^= 0x40
    with open(path, "wb") as f:
        f.write(data)


def test_all_ranks_write_their_share_and_one_commit_publishes(tmp_path):
    from transformers import LlamaForCausalLM

    model = tiny_llama()
    want = logits(model)
    run_workers(_save_and_export, 2, str(tmp_path))
    out = tmp_path / "hf"

    # Both ranks report the same result; each wrote its share, alternating.
    stats = [json.loads(read(tmp_path / f"stats{r}.json")) for r in range(2)]
    for s in stats:
        s.pop("seconds")
    assert stats[0] == stats[1]
    stats = stats[0]
    weights = [f for f in stats["files"] if f.endswith(".safetensors")]
    assert len(weights) >= 4 and stats["files"][-1] == "model.safetensors.index.json"
    assert stats["files_by_rank"] == [weights[0::2], weights[1::2]]
    assert all(stats["files_by_rank"]) and stats["chunks_verified"] > 0
    assert sorted(stats["copied"]) == ["config.json", "generation_config.json"]
    assert stats["source"] == str(tmp_path / "root" / "step-00000005")
    assert leftovers(tmp_path) == []

    # Byte-identical to the one-process export of the same checkpoint, with
    # the files saved with it.
    ours = snapshot(out)
    assert sorted(ours) == sorted(stats["files"] + stats["copied"])
    shardsafe.hf.export(stats["source"], tmp_path / "one", prefix="model.",
                        max_shard_size=SMALL_SHARDS)
    assert snapshot(tmp_path / "one") == ours
    assert ours["config.json"] == shardsafe.hf.model_files(model)["config.json"]

    # transformers loads it and computes the same; every tensor bit-exact.
    loaded = LlamaForCausalLM.from_pretrained(out)
    assert torch.equal(logits(loaded), want)
    tensors = {}
    for name in weights:
        tensors.update(load_file(out / name))
    ref = state_of(model)
    assert tensors.keys() == ref.keys()
    for k, v in ref.items():
        assert torch.equal(tensors[k], v), k

    # A failure on one rank: no new output, the previous one intact.
    before = snapshot(out)
    ckpt = stats["source"]
    # The failing export casts to bf16 (so a wrong publish would show): a
    # tensor of its second file, which rank 1 writes, is corrupted.
    bf16 = shardsafe.hf.export(ckpt, tmp_path / "bf16", prefix="model.",
                               max_shard_size=SMALL_SHARDS, dtype=torch.bfloat16)
    weight_map = json.loads(read(tmp_path / "bf16" / "model.safetensors.index.json"))["weight_map"]
    key = next(k for k, f in sorted(weight_map.items()) if f == bf16["files"][1])
    corrupt_a_chunk_of(ckpt, "model." + key)
    run_workers(_failing_exports, 2, str(tmp_path))
    errors = [json.loads(read(tmp_path / f"errors{r}.json")) for r in range(2)]

    kind, message = errors[0]["exists"]
    assert kind == "CheckpointExistsError" and "already exists" in message
    kind, message = errors[1]["exists"]  # the same class on every rank
    assert kind == "CheckpointExistsError" and message.startswith("rank 0: ")
    assert "already exists" in message

    kind, message = errors[1]["corrupt"]
    assert kind == "CorruptCheckpointError", message
    assert "checksum mismatch" in message and f"model.{key}" in message
    assert "part 1 of 2" in message
    kind, message = errors[0]["corrupt"]
    assert kind == "CorruptCheckpointError" and message.startswith("rank 1: ")
    assert "checksum mismatch" in message

    assert snapshot(out) == before  # still the float32 export, untouched
    assert leftovers(tmp_path) == []
    assert torch.equal(logits(LlamaForCausalLM.from_pretrained(out)), want)


def test_export_hf_of_an_empty_root_and_single_process_manager(tmp_path):
    mgr = shardsafe.CheckpointManager(tmp_path / "root")
    with pytest.raises(shardsafe.CheckpointNotFoundError, match="no committed checkpoint"):
        mgr.export_hf(tmp_path / "hf")
    # Without torch.distributed the manager's export runs in this process.
    model = tiny_llama()
    mgr.save(1, {"model": model.state_dict()})
    mgr.save(2, {"model": {k: v + 1 for k, v in model.state_dict().items()}})
    stats = mgr.export_hf(tmp_path / "hf", step=1, prefix="model.")
    assert stats["files"] == ["model.safetensors"] and "files_by_rank" not in stats
    got = load_file(tmp_path / "hf" / "model.safetensors")
    for k, v in model.state_dict().items():
        assert torch.equal(got[k], v), k
    shutil.rmtree(tmp_path / "hf")
    mgr.export_hf(tmp_path / "hf", prefix="model.")  # the latest: step 2
    got = load_file(tmp_path / "hf" / "model.safetensors")
    assert torch.equal(got["lm_head.weight"], model.state_dict()["lm_head.weight"] + 1)
