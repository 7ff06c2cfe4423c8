"""Save / load bandwidth of a CUDA state through shardsafe vs. plain copies.

    python3 tests/gpu/bench_cuda.py [--gib 2] [--dirs /dev/shm/ssb,/tmp/ssb] [--repeat 3]

Baselines: device->host `tensor.to("cpu")` (pageable, allocating), a copy
into reused (already faulted) pageable tensors and into preallocated pinned
memory; host->device `copy_` from pageable and from pinned memory; per
directory, the raw storage (the same bytes written from pinned memory to one
file + fsync, read back) and torch.save (+fsync) / torch.load to CUDA.
shardsafe: reserve_async_save (allocates and page-locks the staging arena
once), save (durable: written and fsynced), async_save (time blocked and
total), load into CUDA tensors from the page cache and, where the caches can
be dropped, from the disk; the peak host memory a save adds (VmHWM, reset
through /proc/self/clear_refs); and ratios against the baselines of the same
run. GB = 1e9 bytes. Prints one JSON object last.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import statistics
import subprocess
import time

import torch

import shardsafe
from shardsafe import _device


def sync() -> None:
    torch.cuda.synchronize()


def timed(fn, repeat: int) -> list[float]:
    out = []
    for _ in range(repeat):
        sync()
        t = time.perf_counter()
        fn()
        sync()
        out.append(time.perf_counter() - t)
    return out


def _vm(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise AssertionError(f"no {field} in /proc/self/status")


def peak_rss_growth(fn) -> int:
    """Bytes the process's resident set peaked above where it stood before
    `fn` ran (VmHWM reset through /proc/self/clear_refs, as root: OSError
    otherwise). Also used by test_cuda.py."""
    gc.collect()
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5\n")
    before = _vm("VmRSS")
    fn()
    return _vm("VmHWM") - before


def peak_rss_growth_mib(fn) -> int:
    """peak_rss_growth in MiB; -1 where VmHWM cannot be reset (not root)."""
    try:
        return peak_rss_growth(fn) >> 20
    except OSError:
        return -1


def drop_caches() -> bool:
    try:
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return True
    except OSError:
        return False


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gib", type=float, default=2.0)
    ap.add_argument("--tensors", type=int, default=16)
    ap.add_argument("--dirs", default="/dev/shm/ss-bench,/tmp/ss-bench")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--torch-save", type=int, default=1, help="also time torch.save / torch.load")
    a = ap.parse_args()
    assert torch.cuda.is_available(), "CUDA is not available"

    total = int(a.gib * (1 << 30))
    per = total // a.tensors
    state = {}
    for i in range(a.tensors):  # half bf16 (weights), half fp32 (optimizer moments)
        dt = torch.bfloat16 if i % 2 == 0 else torch.float32
        state[f"layer{i}.w"] = torch.randn(per // dt.itemsize, device="cuda", dtype=dt)
    nbytes = sum(v.numel() * v.element_size() for v in state.values())
    gb = nbytes / 1e9
    res: dict = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                 "bytes": nbytes, "tensors": len(state)}

    def rate(ts: list[float]) -> dict:
        return {"best_GBps": round(gb / min(ts), 2), "median_GBps": round(gb / statistics.median(ts), 2),
                "best_s": round(min(ts), 4)}

    # ---- baselines
    def to_cpu():
        return {k: v.to("cpu") for k, v in state.items()}

    to_cpu()
    res["baseline_d2h_to_cpu_pageable"] = rate(timed(to_cpu, a.repeat))
    pinned = {k: torch.empty(v.shape, dtype=v.dtype, pin_memory=True) for k, v in state.items()}

    def to_pinned():
        for k, v in state.items():
            pinned[k].copy_(v, non_blocking=True)

    to_pinned()
    d2h_pinned = timed(to_pinned, a.repeat)
    res["baseline_d2h_into_pinned"] = rate(d2h_pinned)
    pageable = to_cpu()
    targets = {k: torch.empty_like(v) for k, v in state.items()}

    def h2d(src, nb):
        def f():
            for k, v in targets.items():
                v.copy_(src[k], non_blocking=nb)
        return f

    reused = to_cpu()

    def to_reused():
        for k, v in state.items():
            reused[k].copy_(v)

    res["baseline_d2h_into_reused_pageable"] = rate(timed(to_reused, a.repeat))
    del reused
    h2d(pageable, False)()
    res["baseline_h2d_from_pageable"] = rate(timed(h2d(pageable, False), a.repeat))
    res["baseline_h2d_from_pinned"] = rate(timed(h2d(pinned, True), a.repeat))
    del pageable, pinned

    # ---- shardsafe: the async staging arena, allocated and page-locked once
    sync()
    t = time.perf_counter()
    held = shardsafe.reserve_async_save(state)
    res["shardsafe_reserve_async_save_s"] = round(time.perf_counter() - t, 4)
    res["staging_bytes"] = held
    res["staging_page_locked"] = any(locked for _, locked in _device.registered().values())

    for d in a.dirs.split(","):
        if not os.path.isdir(os.path.dirname(d.rstrip("/")) or "/"):
            continue
        shutil.rmtree(d, ignore_errors=True)
        os.makedirs(d)
        fs = subprocess.run(["df", "-hT", d], capture_output=True, text=True).stdout.split("\n")[1]
        r: dict = {"fs": " ".join(fs.split())}
        saves, blocked, async_total, first, loads, cold = [], [], [], [], [], []
        target = {k: torch.zeros_like(v) for k, v in state.items()}
        # Peak host memory a save adds, once warm: sync (bounded buffers) and
        # async (its arena is already held: what the call adds beyond it).
        shardsafe.save(state, f"{d}/warm")
        r["save_peak_rss_growth_MiB"] = peak_rss_growth_mib(
            lambda: shardsafe.save(state, f"{d}/rss-sync"))
        r["async_save_peak_rss_growth_MiB"] = peak_rss_growth_mib(
            lambda: shardsafe.async_save(state, f"{d}/rss-async").result())
        for p in ("warm", "rss-sync", "rss-async"):
            shutil.rmtree(f"{d}/{p}")
        for i in range(a.repeat):
            p = f"{d}/sync-{i}"
            sync()
            t = time.perf_counter()
            shardsafe.save(state, p)
            saves.append(time.perf_counter() - t)
            # right after the save (O_DIRECT writes leave little in the page
            # cache, except on tmpfs), then again (page cache hot)
            for out in (first, loads):
                sync()
                t = time.perf_counter()
                shardsafe.load(target, p)
                sync()
                out.append(time.perf_counter() - t)
            if i == 0:
                assert all(torch.equal(target[k], state[k]) for k in state), "load mismatch"
            if drop_caches():
                sync()
                t = time.perf_counter()
                shardsafe.load(target, p)
                sync()
                cold.append(time.perf_counter() - t)
            shutil.rmtree(p)
            p = f"{d}/async-{i}"
            sync()
            t = time.perf_counter()
            fut = shardsafe.async_save(state, p)
            blocked.append(time.perf_counter() - t)
            fut.result()
            async_total.append(time.perf_counter() - t)
            shutil.rmtree(p)
        # Raw storage: the same bytes (from a pinned host buffer) written to one
        # file and fsynced, then read back into a pre-faulted buffer.
        host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
        host.fill_(1)
        mv = memoryview(host.numpy())
        raw_w, raw_r, raw_cold, tsave, tload = [], [], [], [], []
        for i in range(a.repeat):
            p = f"{d}/raw-{i}"
            t = time.perf_counter()
            fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            off = 0
            while off < nbytes:
                off += os.write(fd, mv[off:off + (64 << 20)])
            os.fsync(fd)
            os.close(fd)
            raw_w.append(time.perf_counter() - t)
            for out in (raw_r, raw_cold):
                if out is raw_cold and not drop_caches():
                    break
                t = time.perf_counter()
                with open(p, "rb", buffering=0) as f:
                    off = 0
                    while off < nbytes:
                        off += f.readinto(mv[off:off + (64 << 20)])
                out.append(time.perf_counter() - t)
            os.remove(p)
            if not a.torch_save:
                continue
            p = f"{d}/torch-{i}.pt"
            sync()
            t = time.perf_counter()
            with open(p, "wb") as f:
                torch.save(state, f)
                f.flush()
                os.fsync(f.fileno())
            tsave.append(time.perf_counter() - t)
            sync()
            t = time.perf_counter()
            torch.load(p, map_location="cuda", weights_only=True)
            sync()
            tload.append(time.perf_counter() - t)
            os.remove(p)
        del host, mv
        r["raw_write_fsync_from_pinned"] = rate(raw_w)
        r["raw_read_page_cache"] = rate(raw_r)
        if raw_cold:
            r["raw_read_cold"] = rate(raw_cold)
        if tsave:
            r["torch_save_fsync"] = rate(tsave)
            r["torch_load_to_cuda_page_cache"] = rate(tload)
        r["save"] = rate(saves)
        r["async_save_blocked"] = rate(blocked)
        r["async_save_total"] = rate(async_total)
        r["load_right_after_save"] = rate(first)
        r["load_page_cache"] = rate(loads)
        r["load_cold" if cold else "load_cold_unavailable"] = rate(cold) if cold else True
        med = statistics.median
        r["ratios"] = {
            "save_vs_raw_write (GB/s)": round(med(raw_w) / med(saves), 2),
            "async_blocked_vs_d2h_into_pinned (time)": round(med(blocked) / med(d2h_pinned), 2),
            "async_total_vs_save (time)": round(med(async_total) / med(saves), 2),
            "load_page_cache_vs_raw_read_page_cache (GB/s)": round(med(raw_r) / med(loads), 2),
        }
        if cold and raw_cold:
            r["ratios"]["load_cold_vs_raw_read_cold (GB/s)"] = round(med(raw_cold) / med(cold), 2)
        if tsave:
            r["ratios"]["save_vs_torch_save (GB/s)"] = round(med(tsave) / med(saves), 2)
            r["ratios"]["load_vs_torch_load (GB/s)"] = round(med(tload) / med(loads), 2)
        res[d] = r
        shutil.rmtree(d, ignore_errors=True)
    print(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
