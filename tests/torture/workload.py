"""The torture campaign's workload: what a writer job saves, and the writer.

Every checkpoint holds the same four global tensors; their bytes are a pure
function of (key, step), whatever the number of ranks that saved them, so any
committed checkpoint can be compared bit-exact with `expected(step)`:

  emb    f32  [1200, 1024]  rows split over the ranks (Sharded boxes)
  w      bf16 [1024, 1200]  columns split over the ranks (Sharded boxes)
  flat   f32  [1000003]     ZeRO-style flat ranges, the last one shorter
  bias   f32  [4096]        replicated: every rank passes the same bytes

plus the value "step" and a PerRank value {"rank", "step"}. About 11 MiB per
checkpoint, written as files of at most 2 MiB (several files per rank, so a
kill can land between any two of them).

`writer_main` is the body of one writer process: it joins a gloo group,
saves step after step into ROOT with a CheckpointManager (sync: save; async:
async_save; memory: async_save with a memory tier in ROOT.mem, every
PERSIST_EVERY-th save of the job persisted to ROOT by rank 0 in the
background) until it is killed, and acknowledges each save that returned
(sync) or whose Future resolved (async, memory) by appending "STEP TIME" to
JOBDIR/acks (rank 0 only). An acknowledged checkpoint is committed (in
memory mode, in the memory tier): the campaign checks that it is never lost.
"""

from __future__ import annotations

import datetime
import faulthandler
import math
import os
import signal
import sys
import time
import zlib

import torch

KEEP_LAST = 2  # retention of the root (and of the memory tier, memory mode)
MODES = ("sync", "async", "memory")
PERSIST_EVERY = 2  # memory mode: the 2nd, 4th, ... save of a job goes to the root too
TAG_FORMAT = "step-{step:08d}"
MAX_FILE_BYTES = 2 << 20
ROWS, COLS = 1200, 1024  # 1200 splits evenly over 1, 2, 3 and 4 ranks
FLAT = 1_000_003  # odd: uneven flat partitions
BIAS = 4096
SHAPES = {
    "emb": ((ROWS, COLS), torch.float32),
    "w": ((COLS, ROWS), torch.bfloat16),
    "flat": ((FLAT,), torch.float32),
    "bias": ((BIAS,), torch.float32),
}
_INT_VIEW = {torch.float32: torch.int32, torch.bfloat16: torch.int16}

_base_cache: dict[str, torch.Tensor] = {}


def _mix(x: int) -> int:
    """SplitMix64 finaliser: a well-spread 64-bit value of x."""
    x = (x + 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
    return x ^ (x >> 31)


def _base(key: str) -> torch.Tensor:
    """Random bits of `key`'s shape (as the integer view of its dtype), made once."""
    if key not in _base_cache:
        shape, dtype = SHAPES[key]
        ity = _INT_VIEW[dtype]
        bits = 32 if ity == torch.int32 else 16
        g = torch.Generator().manual_seed(zlib.crc32(key.encode()))
        _base_cache[key] = torch.randint(-(2 ** (bits - 1)), 2 ** (bits - 1), shape,
                                         dtype=ity, generator=g)
    return _base_cache[key]


def tensor_at(key: str, step: int) -> torch.Tensor:
    """The whole tensor `key` of checkpoint `step`: the key's random bits
    XOR a step constant, so every element differs from one step to the next."""
    shape, dtype = SHAPES[key]
    base = _base(key)
    bits = 32 if base.dtype == torch.int32 else 16
    c = _mix(step * 1_000_003 + zlib.crc32(key.encode())) & ((1 << bits) - 1)
    if c >= 1 << (bits - 1):
        c -= 1 << bits
    return (base ^ c).view(dtype)


def expected(step: int) -> dict[str, torch.Tensor]:
    return {k: tensor_at(k, step) for k in SHAPES}


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bit-exact equality (NaN payloads included)."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    ity = _INT_VIEW[a.dtype]
    return torch.equal(a.contiguous().view(ity), b.contiguous().view(ity))


def flat_range(rank: int, world: int) -> tuple[int, int]:
    part = math.ceil(FLAT / world)
    return min(rank * part, FLAT), min((rank + 1) * part, FLAT)


def rank_state(step: int, rank: int, world: int) -> dict:
    """What rank `rank` of `world` passes to save for checkpoint `step`."""
    import shardsafe

    full = expected(step)
    rows = ROWS // world
    b, e = flat_range(rank, world)
    return {
        "emb": shardsafe.Sharded(full["emb"][rank * rows:(rank + 1) * rows], shape=(ROWS, COLS),
                                 offset=(rank * rows, 0)),
        "w": shardsafe.Sharded(full["w"][:, rank * rows:(rank + 1) * rows].contiguous(),
                               shape=(COLS, ROWS), offset=(0, rank * rows)),
        "flat": shardsafe.Sharded(full["flat"][b:e], shape=(FLAT,), flat=(b, e)),
        "bias": full["bias"],
        "step": step,
        "who": shardsafe.PerRank({"rank": rank, "step": step}),
    }


def whole_state(step: int) -> dict:
    """The same checkpoint saved by one process (the campaign's fresh saves)."""
    import shardsafe

    return {**expected(step), "step": step, "who": shardsafe.PerRank({"rank": 0, "step": step})}


def load_target() -> dict:
    """A state to load a whole checkpoint into (sentinel bytes everywhere)."""
    import shardsafe

    out = {}
    for k, (shape, dtype) in SHAPES.items():
        out[k] = torch.full(shape, 0x5A5A if dtype == torch.bfloat16 else 0x5A5A5A5A,
                            dtype=_INT_VIEW[dtype]).view(dtype)
    out["step"] = -1
    out["who"] = shardsafe.PerRank(None)
    return out


def memory_dir(root: str) -> str:
    """Memory mode: the memory tier's folder (an ordinary folder next to the root)."""
    return root + ".mem"


def manager(root: str, mode: str, persist_every: int = PERSIST_EVERY):
    """The CheckpointManager of `mode` for `root`: in memory mode with the
    memory tier in memory_dir(root) (replicas=0, keep_last=KEEP_LAST)."""
    import shardsafe

    if mode != "memory":
        return shardsafe.CheckpointManager(root, keep_last=KEEP_LAST, tag_format=TAG_FORMAT)
    return shardsafe.CheckpointManager(
        root, keep_last=KEEP_LAST, tag_format=TAG_FORMAT, persist_every=persist_every,
        memory=shardsafe.MemoryTier(memory_dir(root), replicas=0, keep_last=KEEP_LAST))


# ----------------------------------------------------------------- writer --

MAX_STEPS = 100_000  # a writer is always killed long before this


def writer_main(rank: int, world: int, root: str, mode: str, start_step: int, jobdir: str,
                store: str, peer_timeout: float) -> None:
    """One writer process (target of a multiprocessing Process)."""
    log = os.open(os.path.join(jobdir, f"rank{rank}.log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND,
                  0o644)
    os.dup2(log, 1)
    os.dup2(log, 2)
    sys.stdout = os.fdopen(1, "w", buffering=1, closefd=False)
    sys.stderr = os.fdopen(2, "w", buffering=1, closefd=False)
    faulthandler.enable()
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # the campaign's hang dump
    torch.set_num_threads(1)
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=3 * peer_timeout))
    mgr = manager(root, mode)
    opts = dict(max_file_bytes=MAX_FILE_BYTES)
    if mode != "sync":
        opts["peer_timeout"] = peer_timeout
    acks = open(os.path.join(jobdir, "acks"), "a", buffering=1) if rank == 0 else None

    def ack(step: int) -> None:
        if acks is not None:
            acks.write(f"{step} {time.time():.6f}\n")
            acks.flush()

    dist.barrier()
    if rank == 0:
        with open(os.path.join(jobdir, "ready"), "w") as f:
            f.write(f"{time.time():.6f}\n")
    print(f"rank {rank}/{world}: {mode} saves from step {start_step} into {root}", flush=True)
    prev = None
    for step in range(start_step, start_step + MAX_STEPS):
        state = rank_state(step, rank, world)
        if mode == "sync":
            mgr.save(step, state, **opts)
            ack(step)
        else:
            fut = mgr.async_save(step, state, **opts)
            if prev is not None:
                prev[1].result()
                ack(prev[0])
            prev = (step, fut)
    if prev is not None:
        prev[1].result()
        ack(prev[0])
    dist.destroy_process_group()
