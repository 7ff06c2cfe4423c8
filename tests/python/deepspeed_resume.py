"""Trains and resumes live DeepSpeed engines for test_integration_deepspeed.py.

    python deepspeed_resume.py OUT WORLD ACTIONS VARIANTS_JSON

Runs WORLD processes joined by gloo on the CPU (DeepSpeed's CPU accelerator)
and, for each comma-separated action and each variant {"name", "stage",
"dtype": "bf16"|"fp16"|"fp32", "zero": {...}}, builds deepspeed_train.Net
under deepspeed.initialize. BASE is OUT/name.wW, W the saving run's WORLD.

- "train": STEPS steps, saving at step SAVE_AT with
  shardsafe.integrations.deepspeed.save (BASE.ss) and with
  engine.save_checkpoint (BASE.ds, converted by DeepSpeed's ds_to_universal
  into BASE.uni). Rank 0 writes BASE.train.pt: every rank's loss of every
  step, and at SAVE_AT the full fp32 masters and Adam moments
  (deepspeed.utils.safe_get_full_*), the module state, the counters, the
  optimizer's hyperparameters and the loss scale.
- "resumeW" / "resumeWds": a fresh engine (other initial weights) loads
  BASE.ss of W with shardsafe.integrations.deepspeed.load and trains steps
  SAVE_AT..STEPS-1; rank 0 writes BASE.toWORLD.pt with the same records
  after the load, the losses and the returned client_state; with "ds" also
  the records and losses of a fresh engine that DeepSpeed itself resumed
  from BASE.uni (load_universal; ZeRO-0: BASE.ds, which needs no conversion).
- "error": for the variants with "expect_error", builds the engine and
  writes the error of shardsafe.integrations.deepspeed.save (or of load of
  OUT/LOAD, where the variant has "load") to OUT/name.error.txt.

Each step's batch depends only on the step and the rank, so a resumed run
sees the batches the uninterrupted one saw.
"""

from __future__ import annotations

import gc
import importlib
import json
import os
import socket
import subprocess
import sys

import torch
import torch.multiprocessing as mp

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from deepspeed_train import CLIENT_STATE, Net, param_groups  # noqa: E402

STEPS, SAVE_AT = 6, 3


def _engine(variant: dict, seed: int, universal: bool = False):
    import deepspeed

    torch.manual_seed(seed)
    model = Net()
    config = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1,
              "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "torch_adam": True}},
              "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 10}},
              "zero_optimization": {"stage": variant["stage"], **variant.get("zero", {})}}
    if variant["dtype"] == "bf16":
        config["bf16"] = {"enabled": True}
    if variant["dtype"] == "fp16":
        config["fp16"] = {"enabled": True, "initial_scale_power": 15, "hysteresis": 1,
                          "loss_scale_window": 2}
    if universal:
        config["checkpoint"] = {"load_universal": True}
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=param_groups(model),
                                           config=config)
    return engine


def _step(engine, step: int, rank: int) -> float:
    gen = torch.Generator().manual_seed(1000 * step + rank)
    loss = engine(torch.randint(0, 11, (2, 4), generator=gen)).float().pow(2).mean()
    engine.backward(loss)
    engine.step()
    return loss.item()


def _losses(engine, steps: range, rank: int) -> list[list[float]]:
    """Every rank's loss of each step: [step][rank]."""
    out = []
    for s in steps:
        mine = _step(engine, s, rank)
        every = [None] * torch.distributed.get_world_size()
        torch.distributed.all_gather_object(every, mine)
        out.append(every)
    return out


def _record(engine, variant: dict) -> dict:
    """The engine's full state as DeepSpeed's own accessors see it."""
    from deepspeed.utils import safe_get_full_fp32_param, safe_get_full_optimizer_state

    import deepspeed

    base = getattr(engine.optimizer, "optimizer", engine.optimizer)  # ZeRO-0: torch's
    if variant["stage"] == 3:
        with deepspeed.zero.GatheredParameters(list(engine.module.parameters())):
            module = {k: v.detach().clone() for k, v in engine.module.state_dict().items()}
    else:
        module = {k: v.detach().clone() for k, v in engine.module.state_dict().items()}
    rec = {"module": module,
           "counters": [engine.global_steps, engine.global_samples, engine.skipped_steps],
           "loss_scale": float(engine.optimizer.loss_scaler.cur_scale) if variant["stage"] else 1.0,
           "hyper": [{k: v for k, v in g.items() if k != "params"}
                     for g in engine.optimizer.param_groups],
           "steps": sorted(float(st["step"]) for st in base.state.values() if "step" in st)}
    if variant.get("zero", {}).get("round_robin_gradients"):
        return rec
    if variant["stage"] == 0:  # the torch optimizer steps the module's own parameters
        params = [(n, p) for n, p in engine.module.named_parameters() if p.requires_grad]
        rec["fp32"] = {n: p.detach().clone() for n, p in params}
        for key in ("exp_avg", "exp_avg_sq"):
            rec[key] = {n: base.state[p][key].clone() for n, p in params}
        return rec  # the accessors map round-robin buffers wrongly (deepspeed_train.py)
    if variant["stage"] < 3:
        # deepspeed 0.19.8 links the accessors after the first group's step only
        engine.optimizer._hp_optimizer_states_linked = False
        engine.optimizer._lazy_init_hp_params_optimizer_state()
    for key in ("fp32", "exp_avg", "exp_avg_sq"):
        rec[key] = {}
    for n, p in engine.module.named_parameters():
        if p.requires_grad:
            rec["fp32"][n] = safe_get_full_fp32_param(p).clone()
            rec["exp_avg"][n] = safe_get_full_optimizer_state(p, "exp_avg").clone()
            rec["exp_avg_sq"][n] = safe_get_full_optimizer_state(p, "exp_avg_sq").clone()
    return rec


def _train(rank: int, world: int, out: str, variant: dict) -> None:
    from shardsafe.integrations import deepspeed as ss_deepspeed

    engine = _engine(variant, seed=0)
    losses = _losses(engine, range(SAVE_AT), rank)
    base = os.path.join(out, f"{variant['name']}.w{world}")
    ss_deepspeed.save(engine, base + ".ss", client_state=CLIENT_STATE)
    engine.save_checkpoint(base + ".ds", client_state=CLIENT_STATE)
    torch.distributed.barrier()
    if rank == 0 and variant["stage"] > 0:
        _to_universal(base)
    torch.distributed.barrier()
    rec = _record(engine, variant)
    losses += _losses(engine, range(SAVE_AT, STEPS), rank)
    if rank == 0:
        torch.save({"losses": losses, "at_save": rec}, base + ".train.pt")


def _to_universal(base: str) -> None:
    """BASE.ds as DeepSpeed's universal checkpoint BASE.uni, which DeepSpeed
    itself loads at another DP size."""
    tag = f"global_step{SAVE_AT}"
    proc = subprocess.run(
        [sys.executable, "-m", "deepspeed.checkpoint.ds_to_universal", "--input_folder",
         os.path.join(base + ".ds", tag), "--output_folder", os.path.join(base + ".uni", tag),
         "--num_extract_workers", "1", "--num_merge_workers", "1", "--inject_missing_state"],
        capture_output=True, text=True, errors="replace", timeout=300)
    if proc.returncode != 0:
        raise RuntimeError(f"ds_to_universal failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")


def _resume(rank: int, world: int, out: str, variant: dict, saved: int, reference: bool) -> None:
    from shardsafe.integrations import deepspeed as ss_deepspeed

    base = os.path.join(out, f"{variant['name']}.w{saved}")
    engine = _engine(variant, seed=1)
    client_state = ss_deepspeed.load(engine, base + ".ss")
    rec = _record(engine, variant)
    result = {"losses": _losses(engine, range(SAVE_AT, STEPS), rank), "after_load": rec,
              "client_state": client_state}
    del engine
    gc.collect()
    if reference and not variant.get("zero", {}).get("round_robin_gradients"):
        # seed 0, the saving run's: deepspeed 0.19.8's universal load leaves
        # frozen parameters as initialised
        engine = _engine(variant, seed=0, universal=variant["stage"] > 0)
        engine.load_checkpoint(base + (".uni" if variant["stage"] > 0 else ".ds"))
        if variant["stage"] == 3:
            # deepspeed 0.19.8's ZeRO-3 universal load gives every parameter
            # group the first group's hyperparameters (the saved ones back)
            # and all groups one shared Adam `step` tensor, which each
            # group's step then increments (one each again)
            saved = torch.load(base + ".train.pt", weights_only=False)["at_save"]["hyper"]
            for group, hyper in zip(engine.optimizer.param_groups, saved):
                group.update(hyper)
            for st in engine.optimizer.optimizer.state.values():
                st["step"] = st["step"].clone()
        result["ds_after_load"] = _record(engine, variant)
        result["ds_losses"] = _losses(engine, range(SAVE_AT, STEPS), rank)
    if rank == 0:
        torch.save(result, f"{base}.to{world}.pt")


def _expect_error(rank: int, out: str, variant: dict) -> None:
    from shardsafe.integrations import deepspeed as ss_deepspeed

    engine = _engine(variant, seed=0)
    try:
        if "load" in variant:
            ss_deepspeed.load(engine, os.path.join(out, variant["load"]))
        else:
            ss_deepspeed.save(engine, os.path.join(out, variant["name"] + ".ss"))
        message = "no error"
    except Exception as e:  # noqa: BLE001 - the test checks the class and message
        message = f"{type(e).__name__}: {e}"
    if rank == 0:
        with open(os.path.join(out, variant["name"] + ".error.txt"), "w") as f:
            f.write(message)


def _worker(rank: int, world: int, port: int, out: str, phases: str,
            variants: list[dict]) -> None:
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None
    if any(v["dtype"] == "fp16" for v in variants):
        # DeepSpeed's CPU accelerator offers fp16 only where oneDNN has fp16
        # kernels; torch's own CPU kernels run the tiny model in fp16 anyway
        from deepspeed.accelerator import get_accelerator
        type(get_accelerator()).is_fp16_supported = lambda self: True
    for action in phases.split(","):
        for variant in variants:
            if variant.get("expect_error"):
                if action == "error":
                    _expect_error(rank, out, variant)
            elif action == "train":
                _train(rank, world, out, variant)
            elif action.startswith("resume"):
                saved = int(action.removeprefix("resume").removesuffix("ds"))
                _resume(rank, world, out, variant, saved, action.endswith("ds"))
            torch.distributed.barrier()
            gc.collect()


def main() -> None:
    out, world, phases = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    variants = json.loads(sys.argv[4])
    os.environ["DS_ACCELERATOR"] = "cpu"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_worker, args=(world, port, out, phases, variants), nprocs=world, join=True)


if __name__ == "__main__":
    main()
