"""The memory tier against its baselines, on one process and one node.

    python3 bench/tier_benchmark.py                    # 2 GiB in 16 F32 tensors, 3 reps
    python3 bench/tier_benchmark.py --gib 0.25 --reps 1 --json out.json

A CheckpointManager with a memory tier (a folder in /dev/shm) and a root
(`--dir`, default ./bench-out/tier-root): what a save stalls training, what
a restart costs from memory and from the root, against a memcpy of the
state (torch `copy_` into pre-touched tensors) and a raw cold read of the
root's files (1 MiB buffered reads after dropping the page cache). Every
restart is compared bit for bit with the saved state. Rows, medians over
`--reps`:

- save (sync), stall: `mgr.save` into the memory tier ÷ memcpy;
- async save, stall: `mgr.async_save` returning (staging reserved) ÷ memcpy;
- persist: `mgr.wait()` after a save that persists (the copy to the root,
  verified and committed, in the background) ÷ a raw write of the bytes;
- restart from memory: a new manager's `load` of the latest ÷ memcpy;
- restart from root, cold: the memory folder gone, the page cache dropped,
  `load` ÷ the raw cold read; and restart from root ÷ restart from memory.

Goals (issue 50): stall <= 1.1x memcpy; restart from memory <= 1.5x memcpy
and >= 5x faster than from the root on a cold cache.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import time

import torch

import shardsafe


def state_of(gib: float, tensors: int, fill: bool) -> dict:
    n = int(gib * (1 << 30)) // 4 // tensors
    out = {}
    for i in range(tensors):
        t = torch.empty(n, dtype=torch.float32)
        if fill:
            t.copy_(torch.arange(n, dtype=torch.float32) * 0.5 + i)
        else:
            t.zero_()  # touched: the pages exist, as a training state's do
        out[f"t{i:03d}"] = t
    return out


def drop_caches() -> bool:
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return True
    except OSError:
        return False


def timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def memcpy(src: dict, dst: dict) -> float:
    def run():
        for k, t in src.items():
            dst[k].copy_(t)
    return timed(run)


def raw_write(directory: str, nbytes: int) -> float:
    block = os.urandom(1 << 20) * 16
    path = os.path.join(directory, "raw.bin")

    def run():
        with open(path, "wb") as f:
            left = nbytes
            while left > 0:
                left -= f.write(block[:min(left, len(block))])
            f.flush()
            os.fsync(f.fileno())
    secs = timed(run)
    os.unlink(path)
    return secs


def raw_cold_read(checkpoint: str) -> float:
    files = [os.path.join(checkpoint, n) for n in sorted(os.listdir(checkpoint))
             if n.endswith(".safetensors")]
    drop_caches()

    def run():
        buf = bytearray(1 << 20)
        for p in files:
            with open(p, "rb", buffering=0) as f:
                while f.readinto(buf):
                    pass
    return timed(run)


def same(a: dict, b: dict) -> bool:
    return all(torch.equal(a[k], b[k]) for k in a)


def manager(args, memory_dir: str) -> shardsafe.CheckpointManager:
    return shardsafe.CheckpointManager(args.dir, keep_last=2, persist_every=2,
                                       memory=shardsafe.MemoryTier(memory_dir, keep_last=2))


def one_rep(args, src: dict, dst: dict, memory_dir: str, step: int) -> dict:
    rows = {}
    nbytes = sum(t.numel() * t.element_size() for t in src.values())
    rows["memcpy"] = memcpy(src, dst)
    mgr = manager(args, memory_dir)
    rows["save stall"] = timed(lambda: mgr.save(step, src))  # the 1st of 2: no persist
    rows["save+persist stall"] = timed(lambda: mgr.save(step + 1, src))
    rows["persist"] = timed(mgr.wait)
    mgr.reserve_async_save(src)
    fut = None

    def start():
        nonlocal fut
        fut = mgr.async_save(step + 2, src)
    rows["async stall"] = timed(start)
    fut.result()
    mgr.wait()
    del mgr
    rows["raw write"] = raw_write(args.dir, nbytes)

    fresh = manager(args, memory_dir)
    rows["restart memory"] = timed(lambda: fresh.load(dst))
    assert same(src, dst), "restart from memory: not the saved bytes"
    for t in dst.values():
        t.zero_()
    rows["raw cold read"] = raw_cold_read(fresh.path(step + 1))
    shutil.rmtree(memory_dir)  # the node restarted: the root's copy
    cold = drop_caches()
    fresh = manager(args, memory_dir)
    rows["restart root"] = timed(lambda: fresh.load(dst, step=step + 1))
    assert same(src, dst), "restart from the root: not the saved bytes"
    rows["cold"] = cold
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--gib", type=float, default=2.0)
    p.add_argument("--tensors", type=int, default=16)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--dir", default="bench-out/tier-root")
    p.add_argument("--json", help="write the rows here")
    args = p.parse_args()
    memory_dir = f"/dev/shm/shardsafe-tier-bench-{os.getpid()}"
    src, dst = state_of(args.gib, args.tensors, True), state_of(args.gib, args.tensors, False)
    nbytes = sum(t.numel() * t.element_size() for t in src.values())
    reps = []
    try:
        for rep in range(args.reps):
            shutil.rmtree(args.dir, ignore_errors=True)
            shutil.rmtree(memory_dir, ignore_errors=True)
            reps.append(one_rep(args, src, dst, memory_dir, 10 * rep + 1))
            print(f"rep {rep + 1}: " + ", ".join(f"{k} {v:.3f}" for k, v in reps[-1].items()
                                                 if k != "cold"), flush=True)
    finally:
        shutil.rmtree(memory_dir, ignore_errors=True)
    med = {k: statistics.median(r[k] for r in reps) for k in reps[0] if k != "cold"}
    cold = "cold" if all(r["cold"] for r in reps) else "WARM (drop_caches not permitted)"
    gb = nbytes / 1e9
    rows = [
        ("save (sync), stall", "save stall", "memcpy", "into /dev/shm"),
        ("save that persists, stall", "save+persist stall", "memcpy", "the copy starts after"),
        ("async save, stall", "async stall", "memcpy", "staging reserved"),
        ("persist to the root", "persist", "raw write", "verified, committed; background"),
        ("restart from memory", "restart memory", "memcpy", "a new manager's load"),
        ("restart from root", "restart root", "raw cold read", cold + "; memory folder gone"),
    ]
    print(f"\n{gb:.2f} GB in {args.tensors} F32 tensors, {args.reps} reps, medians\n")
    print("| row | s | GB/s | vs | ratio (time) | notes |\n|---|---|---|---|---|---|")
    out = []
    for name, key, base, note in rows:
        ratio = med[key] / med[base]
        out.append({"row": name, "seconds": med[key], "baseline": base,
                    "baseline_seconds": med[base], "ratio": ratio})
        print(f"| {name} | {med[key]:.3f} | {gb / med[key]:.2f} | {base} {med[base]:.3f} s "
              f"| {ratio:.2f} | {note} |")
    speedup = med["restart root"] / med["restart memory"]
    print(f"\nrestart from root / from memory (time): {speedup:.1f}x")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"gb": gb, "reps": reps, "rows": out, "root_over_memory": speedup}, f,
                      indent=1)


if __name__ == "__main__":
    main()
