"""Writes real DeepSpeed checkpoints for test_peer_deepspeed.py.

    python deepspeed_train.py OUT WORLD VARIANTS_JSON

Runs WORLD processes joined by gloo on the CPU (DeepSpeed's CPU accelerator),
and for each variant {"name", "stage", "dtype": "bf16"|"fp32", "zero": {...}}
trains a small model three steps (a "model": "wide" variant: a 4.2M-parameter
model one step, no reference) with deepspeed.initialize, then
`engine.save_checkpoint(OUT/name, client_state=...)`. Rank 0 writes
OUT/name.ref.pt with what the checks compare against:

- "zero_to_fp32": deepspeed.utils.zero_to_fp32.get_fp32_state_dict_from_zero_checkpoint(OUT/name)
  (ZeRO stages only);
- "lp": the live 16-bit (or fp32) parameters, gathered under ZeRO-3;
- "fp32", "exp_avg", "exp_avg_sq": the live fp32 master weights and Adam
  moments from deepspeed.utils.safe_get_full_fp32_param /
  safe_get_full_optimizer_state (skipped with round_robin_gradients: in
  deepspeed 0.19.8 those accessors map the reordered flat buffer wrongly;
  the module's saved weights agree with zero_to_fp32 there, see the test);
- "buffers": the live buffers.

The model has a tied weight (shared_params), a frozen layer, float and int
buffers and three parameter groups, one holding a 3-element tensor alone so
that with 3+ ranks whole partitions are padding.

DeepSpeed's optional shared-memory allreduce kernel is not built
(build_shm_op returns None): it is a JIT C++ compile of minutes, and gloo
runs the same collectives; the checkpoint layout does not depend on it.
"""

from __future__ import annotations

import gc
import importlib
import json
import os
import socket
import sys

import torch
import torch.multiprocessing as mp

STEPS = 3
CLIENT_STATE = {"epoch": 1, "note": "hi",
                "ema": {"decay": 0.5, "w": torch.arange(6.0).reshape(2, 3)}}


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(11, 7)
        self.lin1 = torch.nn.Linear(7, 9)
        self.norm = torch.nn.LayerNorm(9)
        self.register_buffer("scale", torch.linspace(0.5, 1.5, 9))
        self.register_buffer("count", torch.arange(3))
        self.frozen = torch.nn.Linear(9, 5)
        self.frozen.requires_grad_(False)
        self.lin2 = torch.nn.Linear(5, 7)
        self.head = torch.nn.Linear(7, 11, bias=False)
        self.head.weight = self.emb.weight  # tied: saved once, listed in shared_params
        self.tiny = torch.nn.Parameter(torch.full((3,), 0.5))

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        h = self.emb(idx).mean(1)
        h = torch.relu(self.norm(self.lin1(h)) * self.scale.to(h.dtype))
        h = self.lin2(self.frozen(h))
        return self.head(torch.tanh(h)) * self.tiny.sum()


def wide() -> torch.nn.Module:
    """4.2M parameters: big enough that reading one tensor must not load the rest."""
    return torch.nn.Sequential(*[torch.nn.Linear(1024, 1024) for _ in range(4)])


def param_groups(model: Net) -> list[dict]:
    trained = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    decay = [p for n, p in trained if n.endswith("weight")]
    no_decay = [p for n, p in trained if not n.endswith("weight") and n != "tiny"]
    return [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0},
            {"params": [model.tiny], "lr": 1e-3}]


def _run_variant(rank: int, out: str, variant: dict) -> None:
    import deepspeed
    from deepspeed.utils import safe_get_full_fp32_param, safe_get_full_optimizer_state

    stage, dtype = variant["stage"], variant["dtype"]
    torch.manual_seed(0)
    if variant.get("model") == "wide":
        _save_wide(rank, out, variant)
        return
    model = Net()
    config = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1,
              "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "torch_adam": True}},
              "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 10}},
              "zero_optimization": {"stage": stage, **variant.get("zero", {})}}
    if dtype == "bf16":
        config["bf16"] = {"enabled": True}
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=param_groups(model),
                                           config=config)
    gen = torch.Generator().manual_seed(100 + rank)
    for _ in range(STEPS):
        loss = engine(torch.randint(0, 11, (2, 4), generator=gen)).float().pow(2).mean()
        engine.backward(loss)
        engine.step()
    path = os.path.join(out, variant["name"])
    engine.save_checkpoint(path, client_state=CLIENT_STATE)

    ref: dict = {"lp": {}, "buffers": {}}
    named = list(engine.module.named_parameters())
    if stage == 3:
        with deepspeed.zero.GatheredParameters([p for _, p in named]):
            ref["lp"] = {n: p.detach().clone() for n, p in named}
    else:
        ref["lp"] = {n: p.detach().clone() for n, p in named}
    ref["buffers"] = {n: b.detach().clone() for n, b in engine.module.named_buffers()}
    live = stage > 0 and not variant.get("zero", {}).get("round_robin_gradients")
    if live:
        if stage < 3:
            # deepspeed 0.19.8 links the accessors to the optimizer state after
            # the first parameter group's step only; link again for all groups.
            engine.optimizer._hp_optimizer_states_linked = False
            engine.optimizer._lazy_init_hp_params_optimizer_state()
        for key in ("fp32", "exp_avg", "exp_avg_sq"):
            ref[key] = {}
        for n, p in named:
            if p.requires_grad:
                ref["fp32"][n] = safe_get_full_fp32_param(p).clone()
                ref["exp_avg"][n] = safe_get_full_optimizer_state(p, "exp_avg").clone()
                ref["exp_avg_sq"][n] = safe_get_full_optimizer_state(p, "exp_avg_sq").clone()
    torch.distributed.barrier()
    if rank == 0:
        if stage > 0:
            from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint
            ref["zero_to_fp32"] = get_fp32_state_dict_from_zero_checkpoint(path)
        torch.save(ref, path + ".ref.pt")
    torch.distributed.barrier()
    del engine
    gc.collect()


def _save_wide(rank: int, out: str, variant: dict) -> None:
    import deepspeed

    model = wide()
    config = {"train_micro_batch_size_per_gpu": 2,
              "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "torch_adam": True}},
              "zero_optimization": {"stage": variant["stage"]}, "bf16": {"enabled": True}}
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                           config=config)
    loss = engine(torch.randn(2, 1024, dtype=torch.bfloat16)).float().pow(2).mean()
    engine.backward(loss)
    engine.step()
    engine.save_checkpoint(os.path.join(out, variant["name"]))
    del engine
    gc.collect()


def _worker(rank: int, world: int, port: int, out: str, variants: list[dict]) -> None:
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    # see the module docstring; `import deepspeed.comm.torch as m` would give
    # torch itself (deepspeed.comm re-exports the name torch)
    importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None
    for variant in variants:
        _run_variant(rank, out, variant)


def main() -> None:
    out, world, variants = sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3])
    os.environ["DS_ACCELERATOR"] = "cpu"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_worker, args=(world, port, out, variants), nprocs=world, join=True)


if __name__ == "__main__":
    main()
