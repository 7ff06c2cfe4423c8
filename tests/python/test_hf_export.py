"""Hugging Face export and PEFT adapters with the real libraries.

The round trip of issue "Hugging Face interop": a tiny Llama and a tiny MoE
model built by transformers from a config -> save_pretrained -> loaded
sharded with shardsafe at world 2 (gloo) -> saved as a shardsafe checkpoint
with the model's config -> `shardsafe export-hf` (the CLI) and
shardsafe.hf.export (Python) -> from_pretrained gives identical logits, and
the exported model.safetensors is byte-identical to transformers' own. The
reference safetensors package reads every file written. PEFT adapters saved
by shardsafe.hf.save_adapter are byte-identical to peft's save_pretrained
and load with PeftModel.from_pretrained.
"""

from __future__ import annotations

import json
import os
import subprocess

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Replicate, Shard, distribute_tensor

import shardsafe
from shardsafe.hf import MIXTRAL_EXPERTS, QWEN2_MOE_EXPERTS
from dist_util import run_workers
from hf_models import SMALL_SHARDS, logits, state_of, tiny_llama, tiny_moe, tp_placement


def read(path) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def export_cli(shardsafe_bin, src, out, *args) -> dict:
    r = subprocess.run([str(shardsafe_bin), "export-hf", str(src), str(out), "--json", *args],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def assert_reference_reads(out) -> dict[str, torch.Tensor]:
    """Every weights file of `out` loads with the reference safetensors
    package, with {"format": "pt"} metadata; returns all tensors."""
    tensors = {}
    for name in sorted(os.listdir(out)):
        if name.endswith(".safetensors"):
            with safe_open(os.path.join(out, name), framework="pt") as f:
                assert f.metadata() == {"format": "pt"}
            tensors.update(load_file(os.path.join(out, name)))
    return tensors


# ------------------------------------------------------- world-2 workers --

def _reshard_llama(rank, world, tmp):
    """HF directory -> tensor-parallel DTensors at world 2 -> a shardsafe
    checkpoint holding a training state with the model's files."""
    mesh = init_device_mesh("cpu", (world,))
    ref = torch.load(f"{tmp}/ref.pt")
    model = {k: distribute_tensor(torch.zeros_like(v), mesh, tp_placement(k))
             for k, v in ref.items()}
    res = shardsafe.load({"model": model}, f"{tmp}/hf_sharded", rename=[(r"^", "model.")])
    assert res.missing_keys == [] and res.unexpected_keys == []
    optim = {k: distribute_tensor(torch.ones_like(v), mesh, tp_placement(k))
             for k, v in ref.items() if k.endswith("q_proj.weight")}
    files = {n: f"{tmp}/hf_single/{n}" for n in ("config.json", "generation_config.json")}
    shardsafe.save({"model": model, "optim": optim, "step": 7}, f"{tmp}/ckpt", files=files)


def _reshard_moe(rank, world, tmp):
    """Per-expert HF checkpoint -> grouped expert-parallel DTensors (Shard(0)
    on the expert dim: 2 + 1 experts) -> a shardsafe checkpoint."""
    mesh = init_device_mesh("cpu", (world,))
    ref = torch.load(f"{tmp}/ref.pt")
    state = {k: distribute_tensor(torch.zeros_like(v), mesh,
                                  [Shard(0)] if ".mlp.experts." in k else [Replicate()])
             for k, v in ref.items()}
    res = shardsafe.load(state, f"{tmp}/hf_sharded", experts=QWEN2_MOE_EXPERTS)
    assert res.missing_keys == [] and res.unexpected_keys == []
    shardsafe.save(state, f"{tmp}/ckpt", files={"config.json": f"{tmp}/hf_single/config.json"})


# ------------------------------------------------------------------ Llama --

def test_llama_resharded_at_world_2_exports_to_identical_weights_and_logits(
        tmp_path, shardsafe_bin):
    from transformers import LlamaForCausalLM

    model = tiny_llama()
    want = logits(model)
    model.save_pretrained(tmp_path / "hf_single")
    model.save_pretrained(tmp_path / "hf_sharded", max_shard_size=SMALL_SHARDS)
    torch.save(state_of(model), tmp_path / "ref.pt")
    run_workers(_reshard_llama, 2, str(tmp_path))

    # One file: byte-identical to transformers' save_pretrained.
    stats = export_cli(shardsafe_bin, tmp_path / "ckpt", tmp_path / "out", "--prefix", "model.")
    assert stats["files"] == ["model.safetensors"]
    assert sorted(stats["copied"]) == ["config.json", "generation_config.json"]
    assert stats["chunks_verified"] > 0
    assert read(tmp_path / "out" / "model.safetensors") == \
        read(tmp_path / "hf_single" / "model.safetensors")
    assert read(tmp_path / "out" / "config.json") == read(tmp_path / "hf_single" / "config.json")
    assert torch.equal(logits(LlamaForCausalLM.from_pretrained(tmp_path / "out")), want)

    # Shards, as transformers splits them, through the Python API.
    stats = shardsafe.hf.export(tmp_path / "ckpt", tmp_path / "out_sharded", prefix="model.",
                                max_shard_size=SMALL_SHARDS)
    assert len(stats["files"]) >= 4 and stats["files"][-1] == "model.safetensors.index.json"
    index = json.loads(read(tmp_path / "out_sharded" / "model.safetensors.index.json"))
    tensors = assert_reference_reads(tmp_path / "out_sharded")
    assert set(index["weight_map"]) == set(tensors) == set(model.state_dict())
    assert index["metadata"] == {"total_size": sum(t.nbytes for t in tensors.values()),
                                 "total_parameters": sum(t.numel() for t in tensors.values())}
    for name in set(index["weight_map"].values()):
        with safe_open(tmp_path / "out_sharded" / name, framework="pt") as f:
            size = sum(f.get_tensor(k).nbytes for k in f.keys())
            assert size <= 20_000 or len(list(f.keys())) == 1, name
    assert torch.equal(logits(LlamaForCausalLM.from_pretrained(tmp_path / "out_sharded")), want)

    # --dtype bf16: float weights cast with round-to-nearest-even, as torch does.
    export_cli(shardsafe_bin, tmp_path / "ckpt", tmp_path / "out_bf16", "--prefix", "model.",
               "--dtype", "bf16")
    got = assert_reference_reads(tmp_path / "out_bf16")
    for k, v in model.state_dict().items():
        assert got[k].dtype == torch.bfloat16 and torch.equal(got[k], v.bfloat16()), k
    # ... and the model computes as transformers' own bf16 load of the original.
    bf16 = LlamaForCausalLM.from_pretrained(tmp_path / "out_bf16", dtype=torch.bfloat16)
    theirs = LlamaForCausalLM.from_pretrained(tmp_path / "hf_single", dtype=torch.bfloat16)
    assert torch.equal(logits(bf16), logits(theirs))


def test_export_renames_filters_and_refuses_to_clobber(tmp_path, shardsafe_bin):
    model = tiny_llama()
    shardsafe.save({"model": model.state_dict(), "step": 3}, tmp_path / "ckpt")
    titan = [(r"^model\.", ""), (r"\.self_attn\.([qkvo])_proj\.", r".attention.w\1.")]
    shardsafe.hf.export(tmp_path / "ckpt", tmp_path / "py", prefix="model.", rename=titan,
                        exclude=[r"norm"])
    stats = export_cli(shardsafe_bin, tmp_path / "ckpt", tmp_path / "cli", "--prefix", "model.",
                       "--rename", r"^model\.=",
                       "--rename", r"\.self_attn\.([qkvo])_proj\.=.attention.w\1.",
                       "--exclude", "norm")
    py = load_file(tmp_path / "py" / "model.safetensors")
    assert py.keys() == load_file(tmp_path / "cli" / "model.safetensors").keys()
    assert "layers.1.attention.wk.weight" in py and not any("norm" in k for k in py)
    assert torch.equal(py["layers.1.attention.wk.weight"],
                       model.state_dict()["model.layers.1.self_attn.k_proj.weight"])
    assert stats["tensors"] == len(py)
    # An existing directory is never overwritten without --overwrite.
    r = subprocess.run([str(shardsafe_bin), "export-hf", str(tmp_path / "ckpt"),
                        str(tmp_path / "cli")], capture_output=True, text=True)
    assert r.returncode == 2 and "already exists" in r.stderr
    with pytest.raises(shardsafe.CheckpointExistsError):
        shardsafe.hf.export(tmp_path / "ckpt", tmp_path / "py")
    # A bad rule is a clear error and writes nothing.
    with pytest.raises(shardsafe.ShardsafeError, match=r"two tensors would be exported as"):
        shardsafe.hf.export(tmp_path / "ckpt", tmp_path / "bad", prefix="model.",
                            rename=[(r"layers\.\d+\.", "")])
    assert not (tmp_path / "bad").exists()


# -------------------------------------------------------------------- MoE --

def test_moe_expert_parallel_at_world_2_exports_per_expert_weights(tmp_path, shardsafe_bin):
    from transformers import Qwen3MoeForCausalLM

    model = tiny_moe("qwen3_moe")
    want = logits(model)
    model.save_pretrained(tmp_path / "hf_single")
    model.save_pretrained(tmp_path / "hf_sharded", max_shard_size=SMALL_SHARDS)
    torch.save(state_of(model), tmp_path / "ref.pt")
    run_workers(_reshard_moe, 2, str(tmp_path))
    # The checkpoint holds the grouped tensors; export splits them back.
    saved = shardsafe.describe(tmp_path / "ckpt")["tensors"]
    assert "model.layers.0.mlp.experts.gate_up_proj" in saved
    export_cli(shardsafe_bin, tmp_path / "ckpt", tmp_path / "out", "--experts", "qwen2_moe")
    assert read(tmp_path / "out" / "model.safetensors") == \
        read(tmp_path / "hf_single" / "model.safetensors")
    assert torch.equal(logits(Qwen3MoeForCausalLM.from_pretrained(tmp_path / "out")), want)
    # Without the rules the grouped names are written as they are, and
    # transformers loads those too.
    export_cli(shardsafe_bin, tmp_path / "ckpt", tmp_path / "grouped")
    assert "model.layers.1.mlp.experts.down_proj" in load_file(
        tmp_path / "grouped" / "model.safetensors")
    assert torch.equal(logits(Qwen3MoeForCausalLM.from_pretrained(tmp_path / "grouped")), want)


def test_mixtral_export_restores_block_sparse_moe_names(tmp_path):
    from transformers import MixtralForCausalLM

    model = tiny_moe("mixtral")
    model.save_pretrained(tmp_path / "hf")
    state = {k: torch.zeros_like(v) for k, v in model.state_dict().items()}
    shardsafe.load(state, tmp_path / "hf", rename=[(r"\.block_sparse_moe\.", ".mlp.")],
                   experts=MIXTRAL_EXPERTS)
    shardsafe.save(state, tmp_path / "ckpt", files=shardsafe.hf.model_files(model))
    shardsafe.hf.export(tmp_path / "ckpt", tmp_path / "out", experts=MIXTRAL_EXPERTS,
                        rename=[(r"\.mlp\.(experts|gate)\.", r".block_sparse_moe.\1.")])
    assert read(tmp_path / "out" / "model.safetensors") == \
        read(tmp_path / "hf" / "model.safetensors")
    assert torch.equal(logits(MixtralForCausalLM.from_pretrained(tmp_path / "out")), logits(model))


# ------------------------------------------------------------------- PEFT --

def lora_model():
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(tiny_llama(), LoraConfig(r=4, lora_alpha=8,
                                                    target_modules=["q_proj", "v_proj"]))
    torch.manual_seed(3)
    with torch.no_grad():  # lora_B starts at zero; make the adapter matter
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_()
    return model.eval()


def _save_adapter_fsdp(rank, world, tmp):
    from torch.distributed.fsdp import fully_shard

    model = lora_model()
    for layer in model.base_model.model.model.layers:
        fully_shard(layer)
    fully_shard(model)
    sd = model.state_dict()
    assert any(type(v).__name__ == "DTensor" for k, v in sd.items() if "lora_A" in k)
    shardsafe.hf.save_adapter(model, f"{tmp}/ours_fsdp")


def test_peft_adapter_matches_peft_and_loads(tmp_path):
    from peft import PeftModel

    model = lora_model()
    model.save_pretrained(tmp_path / "theirs")
    stats = shardsafe.hf.save_adapter(model, tmp_path / "ours")
    assert sorted(os.listdir(tmp_path / "ours")) == ["adapter_config.json",
                                                     "adapter_model.safetensors"]
    assert stats["files"] == ["adapter_model.safetensors"]
    assert read(tmp_path / "ours" / "adapter_model.safetensors") == \
        read(tmp_path / "theirs" / "adapter_model.safetensors")
    # peft writes target_modules (a set) in hash order: compare as sets.
    ours, theirs = (json.loads(read(tmp_path / d / "adapter_config.json"))
                    for d in ("ours", "theirs"))
    assert set(ours.pop("target_modules")) == set(theirs.pop("target_modules"))
    assert ours == theirs
    assert all("lora_" in k for k in load_file(tmp_path / "ours" / "adapter_model.safetensors"))
    loaded = PeftModel.from_pretrained(tiny_llama(), tmp_path / "ours").eval()
    assert torch.equal(logits(loaded), logits(model))
    assert not any(n.startswith(".tmp-adapter") for n in os.listdir(tmp_path))

    # FSDP2-sharded at world 2: each rank saves its shards, rank 0 writes.
    run_workers(_save_adapter_fsdp, 2, str(tmp_path))
    assert read(tmp_path / "ours_fsdp" / "adapter_model.safetensors") == \
        read(tmp_path / "theirs" / "adapter_model.safetensors")
    assert not any(n.startswith(".tmp-adapter") for n in os.listdir(tmp_path))


def test_a_hugging_face_directory_imported_and_exported_again_keeps_its_side_files(
        tmp_path, shardsafe_bin):
    """`shardsafe import HF CKPT` carries config.json and the other files
    beside the weights (saved files, docs/format.md §6), so the directory
    `export-hf` writes back opens with from_pretrained."""
    from transformers import LlamaForCausalLM

    model = tiny_llama()
    model.save_pretrained(tmp_path / "hf", max_shard_size=SMALL_SHARDS)
    (tmp_path / "hf" / "tokenizer_config.json").write_text('{"model_max_length": 64}')
    (tmp_path / "hf" / ".cache").mkdir()
    r = subprocess.run([str(shardsafe_bin), "import", str(tmp_path / "hf"), str(tmp_path / "ckpt"),
                        "--json"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert sorted(json.loads(r.stdout)["side_files"]) == [
        "config.json", "generation_config.json", "tokenizer_config.json"]
    stats = export_cli(shardsafe_bin, tmp_path / "ckpt", tmp_path / "out")
    assert sorted(stats["copied"]) == ["config.json", "generation_config.json",
                                       "tokenizer_config.json"]
    for name in stats["copied"]:
        assert read(tmp_path / "out" / name) == read(tmp_path / "hf" / name), name
    assert torch.equal(logits(LlamaForCausalLM.from_pretrained(tmp_path / "out")), logits(model))
