"""Crash-safe, bit-exact resumable training with shardsafe.CheckpointManager.

A tiny causal transformer language model (2 blocks, CPU) trains on a
synthetic, deterministic token stream with AdamW and a warmup + cosine LR
schedule. Every K steps (and after the last step) it checkpoints everything
that the rest of the run depends on, with ``CheckpointManager.async_save``
(keep_last=2):

    model, optimizer, LR scheduler, the step counter, the torch RNG state
    (dropout draws from it) and the data position (epoch, batch index).

On start it resumes from the latest committed checkpoint under --ckpt-dir if
there is one. Training is deterministic, so a run that is killed and resumed
logs exactly the same losses (bit for bit) as a run that was never stopped.

Run it:

    python examples/train_resume.py --ckpt-dir /tmp/ckpt --steps 40 --save-every 5 \\
        --log /tmp/straight.log

Kill / resume demonstration: --kill-at-step S makes the process SIGKILL
itself right after step S (when S is a save step, the save of step S is
usually still in flight: it is lost, and the previous committed checkpoint
must still load). Running again without the flag resumes where the last
committed checkpoint left off and re-runs the lost steps:

    rm -rf /tmp/ckpt2
    python examples/train_resume.py --ckpt-dir /tmp/ckpt2 --steps 40 --save-every 5 \\
        --kill-at-step 20 --log /tmp/resumed.log      # dies with SIGKILL (exit -9 / 137)
    python examples/train_resume.py --ckpt-dir /tmp/ckpt2 --steps 40 --save-every 5 \\
        --log /tmp/resumed.log   # "resumed from step 15" (20 if that save beat the kill)
    diff <(sort -n -u /tmp/straight.log) <(sort -n -u /tmp/resumed.log)   # no output

--log appends one line per step, "STEP LOSS", with the loss as repr(float).

Several processes (optional): when WORLD_SIZE is set (torchrun) the script
joins a gloo process group, wraps the model in DistributedDataParallel, gives
each rank its slice of every global batch, and saves collectively; each rank
keeps its own RNG state under its own key, so resume with the same number of
processes:

    torchrun --nproc_per_node 2 -- examples/train_resume.py --ckpt-dir /tmp/ckpt3 \\
        --steps 40 --save-every 5 --log /tmp/ddp.log

(the "--" keeps torchrun from reading --log as an abbreviation of its own
--log-dir / --logs-specs options).
"""

from __future__ import annotations

import argparse
import bisect
import math
import os
import signal
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

import shardsafe

# ------------------------------------------------------------------ data --


class SyntheticTokens:
    """A deterministic token stream (a fixed random Markov chain) cut into
    windows; each epoch visits the windows in a seeded random order. The
    position in that order is the loader's whole state, so it is a stateful
    object shardsafe saves as the plain value {"epoch": E, "batch": B}."""

    def __init__(self, vocab: int, seq_len: int, global_batch: int, rank: int, world: int,
                 seed: int = 1234, n_tokens: int = 1 << 14):
        assert global_batch % world == 0, "the global batch must split evenly over the ranks"
        g = torch.Generator().manual_seed(seed)
        # Each token has a few likely successors: learnable, not trivial.
        probs = torch.softmax(3.0 * torch.randn(vocab, vocab, generator=g), dim=-1)
        cdf = torch.cumsum(probs, dim=-1).tolist()
        draws = torch.rand(n_tokens, generator=g).tolist()
        toks, t = [], 0
        for u in draws:
            t = min(bisect.bisect_left(cdf[t], u), vocab - 1)
            toks.append(t)
        self.tokens = torch.tensor(toks, dtype=torch.long)
        self.seq_len, self.global_batch, self.rank, self.world = seq_len, global_batch, rank, world
        self.seed = seed
        self.n_windows = (n_tokens - 1) // seq_len
        self.batches_per_epoch = self.n_windows // global_batch
        self.epoch, self.batch = 0, 0

    def _order(self) -> torch.Tensor:
        g = torch.Generator().manual_seed(self.seed * 1000 + self.epoch)
        return torch.randperm(self.n_windows, generator=g)

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self.batch == self.batches_per_epoch:
            self.epoch, self.batch = self.epoch + 1, 0
        per_rank = self.global_batch // self.world
        first = self.batch * self.global_batch + self.rank * per_rank
        starts = self._order()[first:first + per_rank] * self.seq_len
        idx = starts[:, None] + torch.arange(self.seq_len + 1)
        chunk = self.tokens[idx]
        self.batch += 1
        return chunk[:, :-1], chunk[:, 1:]

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "batch": self.batch}

    def load_state_dict(self, sd: dict) -> None:
        self.epoch, self.batch = int(sd["epoch"]), int(sd["batch"])


# ----------------------------------------------------------------- model --


class Block(nn.Module):
    def __init__(self, d: int, heads: int, dropout: float):
        super().__init__()
        self.heads, self.dropout = heads, dropout
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, d // self.heads).unbind(2)
        q, k, v = (z.transpose(1, 2) for z in (q, k, v))
        # Explicit causal attention (deterministic, and dropout draws from the torch RNG).
        att = (q @ k.transpose(-2, -1)) / math.sqrt(d // self.heads)
        mask = torch.ones(t, t, dtype=torch.bool).triu(1)
        att = self.drop(att.masked_fill(mask, float("-inf")).softmax(-1))
        y = (att @ v).transpose(1, 2).reshape(b, t, d)
        x = x + self.drop(self.proj(y))
        return x + self.drop(self.mlp(self.ln2(x)))


class TinyLM(nn.Module):
    def __init__(self, vocab: int = 64, d: int = 64, heads: int = 4, layers: int = 2,
                 seq_len: int = 32, dropout: float = 0.1):
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Parameter(0.02 * torch.randn(seq_len, d))
        self.blocks = nn.ModuleList(Block(d, heads, dropout) for _ in range(layers))
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.tok(x) + self.pos[: x.shape[1]]
        for blk in self.blocks:
            h = blk(h)
        return self.head(self.ln(h))


def warmup_cosine(warmup: int, total: int):
    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = (step - warmup) / max(1, total - warmup)
        return 0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))
    return factor


def materialize_optimizer_state(model: nn.Module, optim: torch.optim.Optimizer) -> None:
    """A fresh optimizer has no per-parameter state (exp_avg, ...) for a load
    to fill in place; one step on zero gradients creates it. Parameters and
    optimizer state are overwritten by the load right after."""
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    optim.step()
    optim.zero_grad(set_to_none=True)


# ------------------------------------------------------------------ main --


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ckpt-dir", required=True, help="checkpoint root (step-NNNNNNNN dirs)")
    ap.add_argument("--steps", type=int, required=True, help="train until this step")
    ap.add_argument("--save-every", type=int, required=True, help="checkpoint every K steps")
    ap.add_argument("--kill-at-step", type=int, default=None,
                    help="SIGKILL this process right after finishing that step")
    ap.add_argument("--log", default=None, help="append 'STEP repr(loss)' per step to FILE")
    ap.add_argument("--keep-last", type=int, default=2, help="checkpoints to keep (default 2)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--batch", type=int, default=16, help="global batch (sequences)")
    ap.add_argument("--seq-len", type=int, default=32)
    args = ap.parse_args(argv)
    if args.steps < 1 or args.save_every < 1:
        ap.error("--steps and --save-every must be >= 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # Same result every run: one thread, deterministic kernels.
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)

    distributed = int(os.environ.get("WORLD_SIZE", "1")) > 1
    if distributed:
        dist.init_process_group("gloo")
    rank = dist.get_rank() if distributed else 0
    world = dist.get_world_size() if distributed else 1

    def say(msg: str) -> None:
        if rank == 0:
            sys.stdout.write(msg + "\n")  # one write: the save callback prints from a thread
            sys.stdout.flush()

    torch.manual_seed(args.seed)
    model = TinyLM(seq_len=args.seq_len)
    optim = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.LambdaLR(
        optim, warmup_cosine(warmup=max(1, args.steps // 10), total=args.steps))
    data = SyntheticTokens(vocab=64, seq_len=args.seq_len, global_batch=args.batch, rank=rank,
                           world=world, seed=1234 + args.seed)
    net = nn.parallel.DistributedDataParallel(model) if distributed else model

    rng_key = f"torch_rank{rank}"  # each rank's own RNG stream
    def state(step: int) -> dict:
        # The module itself (not the DDP wrapper): keys do not depend on the launch.
        return {"model": model, "optim": optim, "sched": sched, "data": data, "step": step,
                "rng": {rng_key: torch.get_rng_state()}}

    mgr = shardsafe.CheckpointManager(args.ckpt_dir, keep_last=args.keep_last)
    start = 0
    latest = mgr.latest_step()
    if latest is not None:
        materialize_optimizer_state(model, optim)
        st = state(0)
        t0 = time.perf_counter()
        res = mgr.load(st)
        start = st["step"]
        torch.set_rng_state(st["rng"][rng_key])
        say(f"resumed from step {start} ({res.path}, {res.bytes_read} bytes, "
            f"{time.perf_counter() - t0:.3f}s)")
    else:
        say(f"no checkpoint under {args.ckpt_dir}: starting from scratch")

    log = open(args.log, "a") if (args.log and rank == 0) else None
    pending = None  # the Future of the async save in flight
    for step in range(start + 1, args.steps + 1):
        net.train()
        x, y = data.next_batch()
        logits = net(x)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
        optim.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optim.step()
        sched.step()
        if distributed:  # log the mean loss over ranks
            loss = loss.detach().clone()
            dist.all_reduce(loss)
            loss /= world
        value = loss.item()
        if log is not None:
            log.write(f"{step} {value!r}\n")
            log.flush()  # reaches the kernel: survives our own SIGKILL
        say(f"step {step:4d}/{args.steps}  loss {value:.4f}  lr {sched.get_last_lr()[0]:.2e}")

        if step == start + 1:
            # Every tensor of the state exists now (the optimizer's after its first step):
            # allocate async_save's staging memory once, so no checkpoint pays for it.
            mgr.reserve_async_save(state(step))
        if step % args.save_every == 0 or step == args.steps:
            if pending is not None and pending.done():
                pending.result()  # raises a background failure of the previous save
            # Returns once the state is staged in host memory: training may go on.
            pending = mgr.async_save(step, state(step))
            pending.add_done_callback(
                lambda f, s=step: f.exception() is None and say(f"  checkpoint step {s} durable"))
            say(f"  checkpoint step {step}: saving in the background "
                f"(blocked {pending.blocked_seconds * 1e3:.1f} ms)")

        if step == args.kill_at_step:
            say(f"  --kill-at-step {step}: SIGKILL (async save in flight: "
                f"{pending is not None and not pending.done()})")
            sys.stdout.flush()
            os.kill(os.getpid(), signal.SIGKILL)

    mgr.wait()  # the last save is durable before we exit
    if pending is not None:
        pending.result(timeout=300)
    if log is not None:
        log.close()
    say(f"done: latest checkpoint step {mgr.latest_step()}, "
        f"kept {[c['step'] for c in mgr.list()]}")
    if distributed:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
