"""Tiny Hugging Face models built by the real transformers from configs
(nothing downloaded), shared by the HF load and export tests."""

from __future__ import annotations

import re

import torch
from torch.distributed.tensor import Replicate, Shard

TINY = dict(vocab_size=51, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, head_dim=8,
            max_position_embeddings=64, tie_word_embeddings=False)
SMALL_SHARDS = "20KB"  # decimal: several model-000NN-of-000MM.safetensors files


def tiny_llama(seed: int = 0):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    return LlamaForCausalLM(LlamaConfig(**TINY)).eval()


def tiny_moe(kind: str = "qwen3_moe", seed: int = 1):
    """A tiny MoE model with 3 experts (an uneven expert-parallel split at world 2)."""
    import transformers as tf

    cfg = dict(TINY, num_experts_per_tok=2, intermediate_size=40)
    if kind == "qwen3_moe":
        model_cls, config = tf.Qwen3MoeForCausalLM, tf.Qwen3MoeConfig(
            **cfg, num_experts=3, moe_intermediate_size=24)
    else:
        model_cls, config = tf.MixtralForCausalLM, tf.MixtralConfig(**cfg, num_local_experts=3)
    torch.manual_seed(seed)
    return model_cls(config).eval()


def state_of(model) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def logits(model, seed: int = 7) -> torch.Tensor:
    torch.manual_seed(seed)
    ids = torch.randint(0, TINY["vocab_size"], (2, 11))
    with torch.no_grad():
        return model(input_ids=ids).logits


def tp_placement(key: str):
    """Megatron-style tensor parallelism of a Llama state, by key suffix."""
    if re.search(r"(q_proj|k_proj|v_proj|gate_proj|up_proj|wq|wk|wv|w1|w3)\.weight$", key):
        return [Shard(0)]  # column parallel
    if re.search(r"(o_proj|down_proj|wo|w2)\.weight$", key):
        return [Shard(1)]  # row parallel
    if re.search(r"(embed_tokens|tok_embeddings|lm_head|output)\.weight$", key):
        return [Shard(0)]  # vocab parallel, 51 rows: uneven 26 / 25
    return [Replicate()]
