"""Resuming a live PEFT model from adapter files saved by peft itself
(peft 0.21.2, transformers 5), with shardsafe.hf.load_adapter.

peft saves keys without the adapter name (``...q_proj.lora_A.weight``,
``lm_head.weight`` for modules_to_save) while the live model has
``...q_proj.lora_A.default.weight`` / ``lm_head.modules_to_save.default.weight``:
load_adapter maps them without a hand-written rename. Each test trains a
LoRA a few steps, saves it with peft's save_pretrained, loads it into a
fresh model and compares bit-exact with the trained model and with peft's
own set_peft_model_state_dict.
"""

from __future__ import annotations

import json
import os
import shutil

import pytest
import torch
from safetensors.torch import load_file

import shardsafe
import shardsafe.hf
from dist_util import run_workers
from hf_models import TINY, logits, tiny_llama


def lora_config(**overrides):
    from peft import LoraConfig

    args = dict(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"],
                modules_to_save=["lm_head"])
    args.update(overrides)
    return LoraConfig(**args)


def fresh(config=None, seed: int = 0):
    from peft import get_peft_model

    return get_peft_model(tiny_llama(seed), config or lora_config())


def train(model, steps: int = 3, seed: int = 11):
    """A few AdamW steps on random tokens (lora_B leaves zero, so the
    adapter matters)."""
    torch.manual_seed(seed)
    optim = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    model.train()
    for _ in range(steps):
        ids = torch.randint(0, TINY["vocab_size"], (2, 9))
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        optim.step()
        optim.zero_grad()
    return model.eval()


def assert_same_state(a, b) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for k in sa:
        assert torch.equal(sa[k], sb[k]), k


def test_peft_saved_adapter_resumes_bit_exact_as_peft_loads_it(tmp_path):
    from peft import set_peft_model_state_dict

    trained = train(fresh())
    trained.save_pretrained(tmp_path / "adapter")
    saved = load_file(tmp_path / "adapter" / "adapter_model.safetensors")
    # peft's own names: no adapter name, modules_to_save as the plain module.
    assert "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight" in saved
    assert "base_model.model.lm_head.weight" in saved

    ours = fresh()
    assert not torch.equal(logits(ours), logits(trained))
    res = shardsafe.hf.load_adapter(ours, tmp_path / "adapter")
    assert res.missing_keys == [] and res.unexpected_keys == []
    assert_same_state(ours, trained)
    assert torch.equal(logits(ours), logits(trained))
    live = dict(ours.named_parameters())
    assert torch.equal(live["base_model.model.lm_head.modules_to_save.default.weight"],
                       saved["base_model.model.lm_head.weight"])

    theirs = fresh()
    set_peft_model_state_dict(theirs, saved)
    assert_same_state(ours, theirs)

    # Training goes on from there the same way (the same next loss).
    assert torch.equal(train(ours, 1, seed=5).state_dict()["base_model.model.model.layers.1"
                                                            ".self_attn.v_proj.lora_B.default"
                                                            ".weight"],
                       train(theirs, 1, seed=5).state_dict()["base_model.model.model.layers.1"
                                                             ".self_attn.v_proj.lora_B.default"
                                                             ".weight"])


def test_named_adapter_targeted_embeddings_and_hub_cache(tmp_path, monkeypatch):
    from peft import set_peft_model_state_dict

    config = lora_config(target_modules=["q_proj", "embed_tokens"], modules_to_save=None)
    trained = train(fresh(config))
    trained.save_pretrained(tmp_path / "adapter")
    saved = load_file(tmp_path / "adapter" / "adapter_model.safetensors")
    assert "base_model.model.model.embed_tokens.lora_embedding_A" in saved
    assert "base_model.model.model.embed_tokens.base_layer.weight" in saved  # peft saves it

    # Into a second adapter "resumed" of a model whose "default" differs:
    # only "resumed" changes, and it equals peft's own load.
    ours = fresh(lora_config())
    ours.add_adapter("resumed", config)
    default_before = {k: v.clone() for k, v in ours.state_dict().items() if ".default" in k}
    res = shardsafe.hf.load_adapter(ours, tmp_path / "adapter", adapter_name="resumed")
    assert res.missing_keys == [] and res.unexpected_keys == []
    for k, v in default_before.items():
        assert torch.equal(ours.state_dict()[k], v), k
    theirs = fresh(lora_config())
    theirs.add_adapter("resumed", config)
    set_peft_model_state_dict(theirs, saved, adapter_name="resumed")
    assert_same_state(ours, theirs)
    ours.set_adapter("resumed")
    assert torch.equal(logits(ours), logits(trained))

    # A hub repo id of the adapter in the local cache (no network).
    cache = tmp_path / "hub"
    snap = cache / "models--org--tiny-lora" / "snapshots" / ("ab" * 20)
    shutil.copytree(tmp_path / "adapter", snap)
    (cache / "models--org--tiny-lora" / "refs").mkdir()
    (cache / "models--org--tiny-lora" / "refs" / "main").write_text("ab" * 20)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    again = fresh(config)
    shardsafe.hf.load_adapter(again, "org/tiny-lora")
    assert torch.equal(logits(again), logits(trained))


def test_mismatches_are_clear_errors_and_change_nothing(tmp_path):
    trained = train(fresh(lora_config(modules_to_save=None)))
    trained.save_pretrained(tmp_path / "adapter")
    narrow = train(fresh(lora_config(target_modules=["q_proj"], modules_to_save=None)))
    narrow.save_pretrained(tmp_path / "narrow")

    model = fresh(lora_config(modules_to_save=None))
    before = {k: v.clone() for k, v in model.state_dict().items()}

    def unchanged():
        for k, v in model.state_dict().items():
            assert torch.equal(v, before[k]), k

    # adapter_config.json disagrees with the live config on what it computes.
    alpha16 = fresh(lora_config(lora_alpha=16, modules_to_save=None))
    with pytest.raises(shardsafe.InvalidStateError,
                       match=r"adapter_config\.json: lora_alpha is 8, but the live adapter "
                             r"'default' has 16"):
        shardsafe.hf.load_adapter(alpha16, tmp_path / "adapter")
    with pytest.raises(shardsafe.InvalidStateError, match=r"target_modules"):
        shardsafe.hf.load_adapter(model, tmp_path / "narrow")
    unchanged()
    # Without a config (the weights file named), strict key checking names
    # the keys the file lacks.
    with pytest.raises(shardsafe.KeyMismatchError, match=r"missing keys.*v_proj\.lora_A\.weight"):
        shardsafe.hf.load_adapter(model, tmp_path / "narrow" / "adapter_model.safetensors")
    unchanged()
    res = shardsafe.hf.load_adapter(model, tmp_path / "narrow" / "adapter_model.safetensors",
                                    strict=False)
    assert res.missing_keys and all("v_proj" in k for k in res.missing_keys)
    q = "base_model.model.model.layers.0.self_attn.q_proj.lora_B.default.weight"
    assert torch.equal(model.state_dict()[q], narrow.state_dict()[q])
    # An adapter that is not there, a model without adapters, a pickle.
    with pytest.raises(shardsafe.InvalidStateError, match=r"no adapter 'other'"):
        shardsafe.hf.load_adapter(model, tmp_path / "adapter", adapter_name="other")
    with pytest.raises(shardsafe.InvalidStateError, match=r"not a peft model"):
        shardsafe.hf.load_adapter(tiny_llama(), tmp_path / "adapter")
    trained.save_pretrained(tmp_path / "pickled", safe_serialization=False)
    assert os.path.exists(tmp_path / "pickled" / "adapter_model.bin")
    with pytest.raises(shardsafe.InvalidStateError, match=r"adapter_model\.bin"):
        shardsafe.hf.load_adapter(model, tmp_path / "pickled")


# ------------------------------------------------------- world-2 (FSDP2) --

def _load_adapter_fsdp(rank, world, tmp):
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor

    model = fresh()
    for layer in model.base_model.model.model.layers:
        fully_shard(layer)
    fully_shard(model)
    res = shardsafe.hf.load_adapter(model, f"{tmp}/adapter")
    assert res.missing_keys == [] and res.unexpected_keys == []
    want = torch.load(f"{tmp}/trained.pt")
    sharded = 0
    for k, v in model.state_dict().items():
        if isinstance(v, DTensor):
            sharded += "lora_" in k
            v = v.full_tensor()
        assert torch.equal(v, want[k]), k
    assert sharded > 0


def test_fsdp2_sharded_model_loads_peft_adapter_at_world_2(tmp_path):
    trained = train(fresh())
    trained.save_pretrained(tmp_path / "adapter")
    torch.save({k: v.clone() for k, v in trained.state_dict().items()}, tmp_path / "trained.pt")
    run_workers(_load_adapter_fsdp, 2, str(tmp_path))
    assert json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())["r"] == 4
