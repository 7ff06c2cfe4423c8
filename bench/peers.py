#!/usr/bin/env python3
"""shardsafe against the physical limits and its peers, in one run, on the same data.

    python3 bench/peers.py                          # 2 GiB, 3 reps, every mix, ./bench-out
    python3 bench/peers.py --size-gib 0.25 --reps 1 # smoke test
    python3 bench/peers.py --mix llm --ranks 2 --dir /mnt/x --json out.json

For each mix of tensors (large: 256 MiB F32 matrices; llm: a small transformer's BF16
weights; small: 20,000 F32 tensors) it measures, interleaved rep by rep:

  raw        fio sequential O_DIRECT write (+ fdatasync) and cold reads of the same number
             of bytes in the same directory; a copy_ of the state into a pre-touched state
  shardsafe  save, async_save (time blocked, time to durable), load cold / hot, and (with 2
             gloo processes, or --ranks >= 2) a load resharded from Shard(0) to Shard(1)
  peers      torch.distributed.checkpoint save (thread_count 1 and 4) / load / async_save,
             torch.save / torch.load(mmap=False), safetensors save_file / load_file; every
             load ends with the bytes in the same pre-allocated state (copy_ where the peer
             returns new tensors), every save is made durable (fsync where the peer does not)
  compute    1-thread matmul loop alone, and while shardsafe / DCP async saves persist

and prints one table of GB/s (median and min-max over --reps) and one of ratios against
the targets of the performance issue. Progress goes to stderr. Run as root so that cold
rows can drop the page cache; otherwise they are labelled WARM.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import gc
import json
import math
import os
import platform
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
import warnings
import zlib

import torch
import torch.distributed as dist

import shardsafe

warnings.filterwarnings("ignore", message=".*torch.distributed is disabled.*")
warnings.filterwarnings("ignore", message=".*TypedStorage is deprecated.*")

MIB = 1 << 20
GIB = 1 << 30
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MIXES = ("large", "llm", "small")
# Short CPU-bound rows (memcpy, hot loads) take this many samples per rep: one sample swung
# 2-3x on the 2-core VM.
HOT_SAMPLES = 3
# Hot loads of the small and the large mix taken alternately (their per-byte ratio).
PAIRED_MIXES = {"small", "large"}
PAIRED_ROUNDS = 5


def log(msg: str) -> None:
    print(f"[peers {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# ------------------------------------------------------------------ mixes --

def mix_specs(mix: str, size: int) -> list[tuple[str, tuple[int, ...], torch.dtype]]:
    """(key, global shape, dtype) of every tensor of a mix of about `size` bytes.
    Every split dimension is a multiple of 4 (Shard(0)/Shard(1) over 1, 2 or 4 ranks)."""
    if mix == "large":
        cols = 4096
        rows = max(8, min(256 * MIB, size) // (cols * 4) // 8 * 8)  # 16384 -> 256 MiB
        n = max(1, round(size / (rows * cols * 4)))
        return [(f"large.{i:03d}", (rows, cols), torch.float32) for i in range(n)]
    if mix == "llm":
        bf = torch.bfloat16
        h, ffn, vocab = 1024, 2816, 8192
        emb = vocab * h * 2
        layer = (4 * h * h + 3 * ffn * h + 2 * h) * 2
        n_layers = max(1, round((size - 2 * emb) / layer))
        specs = [("model.embed_tokens.weight", (vocab, h), bf)]
        for i in range(n_layers):
            p = f"model.layers.{i}."
            specs += [(p + "input_layernorm.weight", (h,), bf),
                      (p + "self_attn.q_proj.weight", (h, h), bf),
                      (p + "self_attn.k_proj.weight", (h, h), bf),
                      (p + "self_attn.v_proj.weight", (h, h), bf),
                      (p + "self_attn.o_proj.weight", (h, h), bf),
                      (p + "post_attention_layernorm.weight", (h,), bf),
                      (p + "mlp.gate_proj.weight", (ffn, h), bf),
                      (p + "mlp.up_proj.weight", (ffn, h), bf),
                      (p + "mlp.down_proj.weight", (h, ffn), bf)]
        return specs + [("model.norm.weight", (h,), bf), ("lm_head.weight", (vocab, h), bf)]
    if mix == "small":
        n, cols = 20_000, 64
        avg_rows = size / n / (cols * 4)
        rng = random.Random(1234)
        return [(f"small.{i:05d}", (max(4, int(avg_rows * rng.uniform(0.75, 1.25)) // 4 * 4), cols),
                 torch.float32) for i in range(n)]
    raise ValueError(mix)


def describe_mix(mix: str, specs: list) -> str:
    nbytes = sum(math.prod(s) * torch.empty((), dtype=d).element_size() for _, s, d in specs)
    if mix == "large":
        return f"{len(specs)} x F32 {list(specs[0][1])} ({nbytes / len(specs) / MIB:.0f} MiB each)"
    if mix == "llm":
        layers = sum(1 for k, _, _ in specs if k.endswith("q_proj.weight"))
        return f"{layers} layers h=1024 ffn=2816 vocab=8192, {len(specs)} BF16 tensors"
    return f"{len(specs)} F32 [rows, 64] tensors of ~{nbytes / len(specs) / 1e3:.0f} KB (75-125%)"


def spec_bytes(specs: list) -> int:
    return sum(math.prod(s) * torch.empty((), dtype=d).element_size() for _, s, d in specs)


def pattern(key: str, shape: tuple, dtype: torch.dtype, offset: tuple, size: tuple) -> torch.Tensor:
    """The slice [offset, offset + size) of a deterministic, non-constant global tensor
    G[i, j] = a[i] + b[j] (a, b seeded by the key): any rank can rebuild any box of it."""
    g = torch.Generator().manual_seed(zlib.crc32(key.encode()))
    a = torch.rand(shape[0], generator=g) * 64
    if len(shape) == 1:
        return a[offset[0]:offset[0] + size[0]].to(dtype).contiguous()
    b = torch.rand(shape[1], generator=g)
    out = a[offset[0]:offset[0] + size[0], None] + b[None, offset[1]:offset[1] + size[1]]
    return out.to(dtype).contiguous()


# ------------------------------------------------------------- run context --

class Ctx:
    """Rank, world, process groups, options and the rows measured so far (rank 0)."""

    def __init__(self, args, rank: int = 0, world: int = 1):
        self.args = args
        self.rank, self.world = rank, world
        self.reps = args.reps
        self.workdir = args.workdir
        self.rows: dict[tuple[str, str], dict] = {}
        self.reserved: dict[str, dict] = {}  # mix -> reserve_async_save: seconds, bytes
        self.cold_error: str | None = None
        self.mesh = None
        self.ss_pg = self.dcp_pg = None
        if world > 1:
            from torch.distributed.device_mesh import init_device_mesh
            self.mesh = init_device_mesh("cpu", (world,))
            self.ss_pg = dist.new_group(backend="gloo")   # shardsafe async_save's collectives
            self.dcp_pg = dist.new_group(backend="gloo")  # DCP async_save's background thread

    def barrier(self) -> None:
        if self.world > 1:
            dist.barrier()

    def timed(self, fn):
        """Wall time of a collective step: all ranks enter together, the last one out."""
        self.barrier()
        t0 = time.perf_counter()
        r = fn()
        self.barrier()
        return time.perf_counter() - t0, r

    def max_all(self, *xs: float) -> list[float]:
        if self.world == 1:
            return list(xs)
        t = torch.tensor(xs, dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return t.tolist()

    def sum_all(self, x: int) -> int:
        if self.world == 1:
            return x
        t = torch.tensor([x], dtype=torch.int64)
        dist.all_reduce(t)
        return int(t.item())

    def timed_n(self, fn, n: int) -> list[float]:
        """`timed` n times in a row: the samples of one rep of a short, CPU-bound step."""
        return [self.timed(fn)[0] for _ in range(n)]

    def record(self, mix: str, op: str, nbytes: int, secs: float | list[float], note: str = "",
               extra: dict | None = None) -> None:
        """One rep of a row: its seconds, or the samples taken in that rep (their median
        is the rep's value; all of them are kept as `samples`)."""
        if self.rank != 0:
            return
        row = self.rows.setdefault((mix, op), {"mix": mix, "op": op, "bytes": nbytes, "secs": [],
                                               "notes": [], "extra": []})
        samples = secs if isinstance(secs, list) else [secs]
        if len(samples) > 1:
            row.setdefault("samples", []).append(samples)
            log(f"{mix:5s} {op:38s} samples {' '.join(f'{x:.3f}' for x in samples)} s")
        secs = statistics.median(samples)
        row["secs"].append(secs)
        if note and note not in row["notes"]:
            row["notes"].append(note)
        row["extra"].append(extra or {})
        if extra and "slowdown" in extra:
            log(f"{mix:5s} {op:38s} {secs * 1e3:8.3f} ms/iter  slowdown {extra['slowdown']:+.1%}")
        else:
            log(f"{mix:5s} {op:38s} {nbytes / secs / 1e9:7.2f} GB/s  {secs:7.3f} s  {note}")

    def path(self, mix: str, name: str) -> str:
        return os.path.join(self.workdir, mix, name)

    def fresh_dir(self, p: str, create: bool) -> None:
        """Removes `p` (rank 0); creates it when `create`; all ranks leave together."""
        self.barrier()
        if self.rank == 0:
            shutil.rmtree(p, ignore_errors=True)
            os.makedirs(os.path.dirname(p), exist_ok=True)
            if create:
                os.makedirs(p)
        self.barrier()

    def remove(self, p: str) -> None:
        self.barrier()
        if self.rank == 0:
            shutil.rmtree(p, ignore_errors=True)
        self.barrier()

    def drop_caches(self) -> None:
        self.barrier()
        if self.rank == 0:
            self.drop_caches_here()
        self.barrier()

    def drop_caches_here(self) -> None:
        """sync; echo 3 > /proc/sys/vm/drop_caches, from this rank alone."""
        os.sync()
        try:
            with open("/proc/sys/vm/drop_caches", "w") as f:
                f.write("3\n")
        except OSError as e:
            if self.cold_error is None:
                log(f"WARNING: cannot drop the page cache ({e}); 'cold' rows are WARM")
            self.cold_error = f"{type(e).__name__}: {e}"

    @property
    def cold(self) -> str:
        return "cold" if self.cold_error is None else "WARM (drop_caches not permitted)"


def local(t: torch.Tensor) -> torch.Tensor:
    return t._local_tensor if hasattr(t, "_local_tensor") else t


def box_of(ctx: Ctx, shape: tuple, dim: int) -> tuple[tuple, tuple]:
    if ctx.world == 1:
        return (0,) * len(shape), tuple(shape)
    from torch.distributed.tensor import Shard
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset
    size, offset = compute_local_shape_and_global_offset(
        torch.Size(shape), ctx.mesh, [Shard(min(dim, len(shape) - 1))])
    return tuple(offset), tuple(size)


def make_state(ctx: Ctx, specs: list, dim: int, fill: bool) -> dict[str, torch.Tensor]:
    """The mix as plain tensors (1 rank) or DTensors sharded on `dim` (1-D: dim 0); `fill`:
    the pattern, else zeros (every page written either way)."""
    state = {}
    for key, shape, dtype in specs:
        offset, size = box_of(ctx, shape, dim)
        t = pattern(key, shape, dtype, offset, size) if fill else torch.zeros(size, dtype=dtype)
        if ctx.world > 1:
            from torch.distributed.tensor import DTensor, Shard
            stride = torch.empty(shape, device="meta").stride()
            t = DTensor.from_local(t, ctx.mesh, [Shard(min(dim, len(shape) - 1))],
                                   run_check=False, shape=torch.Size(shape), stride=stride)
        state[key] = t
    return state


def zero_state(state: dict) -> None:
    for t in state.values():
        local(t).zero_()


def verify(ctx: Ctx, specs: list, state: dict, dim: int, what: str) -> str:
    """'' when every byte of `state` is what was saved, else a loud note."""
    bad = 0
    for key, shape, dtype in specs:
        offset, size = box_of(ctx, shape, dim)
        if not torch.equal(local(state[key]), pattern(key, shape, dtype, offset, size)):
            bad += 1
    bad = ctx.sum_all(bad)
    if bad:
        log(f"ERROR: {what}: {bad} tensor(s) differ from what was saved")
        return f"VERIFY FAILED ({bad} tensors)"
    return ""


def cached_fraction(paths: list[str]) -> float | None:
    """Share of the files' bytes in the page cache (util-linux fincore), None if unknown."""
    files = []
    for p in paths:
        if os.path.isdir(p):
            files += [os.path.join(d, f) for d, _, fs in os.walk(p) for f in fs]
        elif os.path.exists(p):
            files.append(p)
    if not files or not shutil.which("fincore"):
        return None
    r = subprocess.run(["fincore", "-b", "-n", "-o", "RES,SIZE", *files], capture_output=True,
                       text=True)
    if r.returncode:
        return None
    res = size = 0
    for line in r.stdout.split("\n"):
        parts = line.split()
        if len(parts) == 2:
            res, size = res + int(parts[0]), size + int(parts[1])
    return res / size if size else None


def fsync_path(p: str) -> None:
    fd = os.open(p, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# -------------------------------------------------------------- baselines --

FIO_STREAMS = 4  # the engine's default io_threads per rank


def fio_cmd(rw: str, direct: bool, directory: str, prefix: str, files: int, per: int) -> list:
    """fio: `files` jobs, each a sequential stream over its own file <prefix>.<n> of `per`
    bytes, 16 MiB requests (libaio, 4 in flight, for O_DIRECT; psync for buffered); writes
    end with an fsync."""
    cmd = ["fio", "--name=raw", f"--directory={directory}", f"--filename_format={prefix}.$jobnum",
           f"--rw={rw}", "--bs=16M", f"--size={per}", f"--numjobs={files}",
           "--group_reporting", "--output-format=json", f"--direct={int(direct)}"]
    cmd += ["--ioengine=libaio", "--iodepth=4"] if direct else ["--ioengine=psync"]
    if rw == "write":
        cmd.append("--end_fsync=1")
    return cmd


def fio(rw: str, direct: bool, directory: str, prefix: str, files: int, per: int) -> tuple[int, float]:
    """Runs fio_cmd(...); (bytes, seconds of I/O as fio reports it)."""
    cmd = fio_cmd(rw, direct, directory, prefix, files, per)
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode:
        raise RuntimeError(f"fio failed ({r.returncode}): {' '.join(cmd)}\n{r.stderr}{r.stdout}")
    j = json.loads(r.stdout[r.stdout.index("{"):])
    job = j["jobs"][0][rw if rw == "write" else "read"]
    return int(job["io_bytes"]), job["runtime"] / 1e3


def raw_rows(ctx: Ctx, mix: str, nbytes: int) -> None:
    """fio baselines over the mix's bytes: one stream per rank (one file each, like the
    engine's one data file per rank), and FIO_STREAMS streams per rank (a file each); the
    'best' rows, the faster of the two in each rep, are the ceilings the ratios use."""
    d = ctx.path(mix, "raw")
    ctx.fresh_dir(d, create=True)
    if ctx.rank == 0:
        w, k = ctx.world, FIO_STREAMS
        per4 = max(16 * MIB, nbytes // (w * k) // (16 * MIB) * (16 * MIB))
        layouts = (("one", w, per4 * k, f"{w} stream(s)"), ("many", w * k, per4, f"{w * k} streams"))
        for op, direct in (("write O_DIRECT", True), ("read O_DIRECT", True),
                           ("read buffered", False)):
            got = []
            for prefix, files, per, label in layouts:
                if op.startswith("read"):
                    ctx.drop_caches_here()
                b, secs = fio("write" if op.startswith("write") else "read", direct, d, prefix,
                              files, per)
                eng = "libaio qd4" if direct else "psync"
                note = (f"{'' if op.startswith('write') else ctx.cold + '; '}fio, a file per "
                        f"stream, 16 MiB requests, {eng}" + (", end_fsync (fdatasync)" if op.startswith("write") else ""))
                ctx.record(mix, f"raw {op}, {label}", b, secs, note)
                got.append((b / secs, b, secs))
            _, b, secs = max(got)
            ctx.record(mix, f"raw {op} (best)", b, secs, "the faster of the two rows above, per rep")
    ctx.remove(d)


# ----------------------------------------------------------- compute loop --

class Compute:
    """A fixed 1-thread CPU load: 512x512 F32 matmuls (1 MiB operands)."""

    def __init__(self):
        g = torch.Generator().manual_seed(0)
        self.a = torch.randn(512, 512, generator=g)
        self.b = torch.randn(512, 512, generator=g)
        self.c = torch.empty(512, 512)
        self.n = 0

    @contextlib.contextmanager
    def one_thread(self):
        before = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            yield
        finally:
            torch.set_num_threads(before)

    def calibrate(self, seconds: float) -> None:
        with self.one_thread():
            for _ in range(5):
                torch.mm(self.a, self.b, out=self.c)
            t0 = time.perf_counter()
            for _ in range(20):
                torch.mm(self.a, self.b, out=self.c)
            per = (time.perf_counter() - t0) / 20
        self.n = max(50, int(seconds / per))

    def alone(self) -> float:
        """Seconds per iteration over the fixed count."""
        with self.one_thread():
            t0 = time.perf_counter()
            for _ in range(self.n):
                torch.mm(self.a, self.b, out=self.c)
            return (time.perf_counter() - t0) / self.n

    def until(self, fut) -> tuple[float, int, dict]:
        """Seconds per iteration while `fut` is not done, the iteration count, and
        what else ran meanwhile: CPU seconds of this process's other threads (the
        save's), and CPU seconds the host stole from this machine (all vCPUs)."""
        with self.one_thread():
            cpu0, own0, steal0 = time.process_time(), time.thread_time(), steal_seconds()
            t0 = time.perf_counter()
            n = 0
            while not fut.done() or n == 0:
                torch.mm(self.a, self.b, out=self.c)
                n += 1
            per = (time.perf_counter() - t0) / n
            others = (time.process_time() - cpu0) - (time.thread_time() - own0)
            return per, n, {"other threads' CPU": others, "host steal": steal_seconds() - steal0}


class Exited:
    """A child process seen as a future: done once it has exited."""

    def __init__(self, proc: subprocess.Popen):
        self.proc = proc

    def done(self) -> bool:
        return self.proc.poll() is not None


def compute_during_raw_write(compute: Compute, directory: str, files: int, per: int):
    """compute.until(...) while fio writes `files` x `per` bytes with O_DIRECT and fsyncs:
    what the disk write alone does to the loop (fio's start-up included)."""
    cmd = fio_cmd("write", True, directory, "cw", files, per)
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    got = compute.until(Exited(proc))
    _, err = proc.communicate()
    if proc.returncode:
        raise RuntimeError(f"fio failed ({proc.returncode}): {' '.join(cmd)}\n{err}")
    return got


def steal_seconds() -> float:
    """CPU time the hypervisor gave to others while this machine wanted it
    (/proc/stat, all CPUs)."""
    with open("/proc/stat") as f:
        fields = f.readline().split()
    return int(fields[8]) / os.sysconf("SC_CLK_TCK")


# ------------------------------------------------------------- operations --

def ss_async(ctx: Ctx, state: dict, path: str, during=None):
    """shardsafe.async_save: (seconds blocked, seconds to durable, engine blocked_seconds,
    what `during(fut)` returned)."""
    ctx.barrier()
    t0 = time.perf_counter()
    fut = shardsafe.async_save(state, path, process_group=ctx.ss_pg)
    blocked = time.perf_counter() - t0
    extra = during(fut) if during is not None and ctx.rank == 0 else None
    fut.result()
    durable = time.perf_counter() - t0
    blocked, durable = ctx.max_all(blocked, durable)
    return blocked, durable, fut.blocked_seconds, extra


def dcp_async(ctx: Ctx, state: dict, path: str, during=None):
    import torch.distributed.checkpoint as dcp
    ctx.barrier()
    t0 = time.perf_counter()
    fut = dcp.async_save(state, storage_writer=dcp.FileSystemWriter(path),
                         process_group=ctx.dcp_pg)
    blocked = time.perf_counter() - t0
    extra = during(fut) if during is not None and ctx.rank == 0 else None
    fut.result()
    durable = time.perf_counter() - t0
    blocked, durable = ctx.max_all(blocked, durable)
    return blocked, durable, extra


def copy_into(dst: dict, loaded: dict) -> None:
    for k, t in dst.items():
        local(t).copy_(loaded[k])


def file_peer_rows(ctx: Ctx, mix: str, specs: list, src: dict, dst: dict, nbytes: int,
                   check: bool, name: str) -> None:
    """torch.save / torch.load or safetensors save_file / load_file, one file per rank,
    saved durably (fsync file + directory), loaded whole then copied into `dst`."""
    from safetensors.torch import load_file, save_file
    d = ctx.path(mix, name.replace(".", "_"))
    ctx.fresh_dir(d, create=True)
    f = os.path.join(d, f"rank{ctx.rank}" + (".pt" if name == "torch" else ".safetensors"))
    mine = {k: local(v) for k, v in src.items()}

    def save():
        if name == "torch":
            torch.save(mine, f)
        else:
            save_file(mine, f)
        fsync_path(f)
        fsync_path(d)

    def load():
        if name == "torch":
            loaded = torch.load(f, mmap=False, weights_only=True)
        else:
            loaded = load_file(f)
        copy_into(dst, loaded)
        del loaded

    label = "torch.save" if name == "torch" else "safetensors save_file"
    s, _ = ctx.timed(save)
    ctx.record(mix, label, nbytes, s, "buffered write + fsync (file, dir)")
    ctx.drop_caches()
    if check:
        zero_state(dst)
    s, _ = ctx.timed(load)
    note = verify(ctx, specs, dst, 0, label) if check else ""
    label = "torch.load" if name == "torch" else "safetensors load_file"
    how = "mmap=False" if name == "torch" else "default (mmap)"
    ctx.record(mix, f"{label} cold", nbytes, s, note or f"{ctx.cold}; {how}, then copy_ into state")
    s, _ = ctx.timed(load)
    ctx.record(mix, f"{label} hot", nbytes, s, f"{how}, then copy_ into state")
    del mine
    ctx.remove(d)


def mix_rep(ctx: Ctx, mix: str, specs: list, src: dict, dst: dict, nbytes: int, rep: int,
            compute: Compute) -> None:
    import torch.distributed.checkpoint as dcp
    check = rep == 0
    tag = f"rep{rep}"

    # --- raw baselines
    raw_rows(ctx, mix, nbytes)
    s = ctx.timed_n(lambda: copy_into(dst, {k: local(v) for k, v in src.items()}), HOT_SAMPLES)
    ctx.record(mix, "memcpy (copy_ into state)", nbytes, s,
               f"per tensor, {torch.get_num_threads()} torch thread(s) per rank, pre-touched; "
               f"median of {HOT_SAMPLES} per rep")

    # --- shardsafe sync save, cold and hot load
    p = ctx.path(mix, f"ss-{tag}")
    ctx.fresh_dir(p, create=False)
    s, stats = ctx.timed(lambda: shardsafe.save(src, p))
    ctx.record(mix, "shardsafe save", nbytes, s, f"durable; {stats['files']} data file(s)")
    ctx.drop_caches()
    if check:
        zero_state(dst)
    frac = cached_fraction([p]) if ctx.rank == 0 else None
    s, res = ctx.timed(lambda: shardsafe.load(dst, p))
    note = verify(ctx, specs, dst, 0, "shardsafe load") if check else ""
    ctx.record(mix, "shardsafe load cold", nbytes, s, note or f"{ctx.cold}; O_DIRECT (default)",
               {"resident before": frac} if frac is not None else None)
    ctx.drop_caches()
    if check:
        zero_state(dst)
    s, _ = ctx.timed(lambda: shardsafe.load(dst, p, direct_io=False))
    note = verify(ctx, specs, dst, 0, "shardsafe load direct_io=False") if check else ""
    ctx.record(mix, "shardsafe load cold direct_io=False", nbytes, s,
               note or f"{ctx.cold}; buffered reads (fills the page cache)")
    frac = cached_fraction([p]) if ctx.rank == 0 else None
    s = ctx.timed_n(lambda: shardsafe.load(dst, p), HOT_SAMPLES)
    ctx.record(mix, "shardsafe load hot", nbytes, s,
               f"page cache, right after the buffered load; median of {HOT_SAMPLES} per rep",
               {"resident before": frac} if frac is not None else None)
    ctx.remove(p)

    # --- shardsafe async save
    p = ctx.path(mix, f"ssa-{tag}")
    ctx.fresh_dir(p, create=False)
    blocked, durable, eng, _ = ss_async(ctx, src, p)
    ctx.record(mix, "shardsafe async blocked", nbytes, blocked, "time until the call returns",
               {"engine blocked_seconds": eng})
    ctx.record(mix, "shardsafe async durable", nbytes, durable, "call to future done")
    ctx.remove(p)

    # --- compute loop alone / during background persists
    def bg(fut):
        return compute.until(fut)

    ctx.barrier()
    per_alone = compute.alone() if ctx.rank == 0 else 0.0  # other ranks idle, as below
    ctx.barrier()
    p = ctx.path(mix, f"ssc-{tag}")
    ctx.fresh_dir(p, create=False)
    _, _, _, got = ss_async(ctx, src, p, during=bg)
    ctx.remove(p)
    p = ctx.path(mix, f"rawc-{tag}")  # the same bytes written by fio, from rank 0
    ctx.fresh_dir(p, create=True)
    got_raw = (compute_during_raw_write(compute, p, ctx.world, nbytes // ctx.world)
               if ctx.rank == 0 else None)
    ctx.remove(p)
    p = ctx.path(mix, f"dcpc-{tag}")
    ctx.fresh_dir(p, create=False)
    _, _, got_dcp = dcp_async(ctx, src, p, during=bg)
    ctx.remove(p)
    if ctx.rank == 0:
        ctx.record(mix, "compute alone", 0, per_alone,
                   f"{compute.n} x mm 512x512 F32, 1 thread", {"slowdown": 0.0})
        for op, (per, n, meanwhile), how in (
                ("compute + shardsafe async", got, "loop runs from the call's return until durable"),
                ("compute + raw write (fio)", got_raw,
                 "loop runs while fio writes the same bytes (O_DIRECT, fsync)"),
                ("compute + dcp async", got_dcp, "loop runs from the call's return until durable")):
            ctx.record(mix, op, 0, per, how,
                       {"slowdown": per / per_alone - 1, "iterations": n, **meanwhile})

    # --- DCP
    p = ctx.path(mix, f"dcp-{tag}")
    ctx.fresh_dir(p, create=False)
    s, _ = ctx.timed(lambda: dcp.save(src, storage_writer=dcp.FileSystemWriter(p)))
    ctx.record(mix, "dcp save (thread_count 1)", nbytes, s, "FileSystemWriter defaults (sync_files)")
    ctx.drop_caches()
    if check:
        zero_state(dst)
    s, _ = ctx.timed(lambda: dcp.load(dst, storage_reader=dcp.FileSystemReader(p)))
    note = verify(ctx, specs, dst, 0, "dcp load") if check else ""
    ctx.record(mix, "dcp load cold", nbytes, s, note or f"{ctx.cold}; FileSystemReader, in place")
    s, _ = ctx.timed(lambda: dcp.load(dst, storage_reader=dcp.FileSystemReader(p)))
    ctx.record(mix, "dcp load hot", nbytes, s, "page cache")
    ctx.remove(p)
    p = ctx.path(mix, f"dcp4-{tag}")
    ctx.fresh_dir(p, create=False)
    s, _ = ctx.timed(lambda: dcp.save(src, storage_writer=dcp.FileSystemWriter(p, thread_count=4)))
    ctx.record(mix, "dcp save (thread_count 4)", nbytes, s, "FileSystemWriter(thread_count=4)")
    ctx.remove(p)
    p = ctx.path(mix, f"dcpa-{tag}")
    ctx.fresh_dir(p, create=False)
    blocked, durable, _ = dcp_async(ctx, src, p)
    ctx.record(mix, "dcp async blocked", nbytes, blocked, "thread async_save, default stager")
    ctx.record(mix, "dcp async durable", nbytes, durable, "call to future done")
    ctx.remove(p)

    # --- torch.save, safetensors
    file_peer_rows(ctx, mix, specs, src, dst, nbytes, check, "torch")
    file_peer_rows(ctx, mix, specs, src, dst, nbytes, check, "safetensors")


def run_mix(ctx: Ctx, mix: str, compute: Compute) -> None:
    specs = mix_specs(mix, ctx.args.size)
    nbytes = spec_bytes(specs)
    if ctx.rank == 0:
        log(f"{mix}: {describe_mix(mix, specs)}, {nbytes / 1e9:.3f} GB; building state")
    src = make_state(ctx, specs, 0, fill=True)
    dst = make_state(ctx, specs, 0, fill=False)
    # The staging that every async save reuses, allocated and pre-faulted once, as a trainer
    # does at startup (the steady state of a training job).
    t0 = time.perf_counter()
    held = shardsafe.reserve_async_save(src, process_group=ctx.ss_pg)
    secs = time.perf_counter() - t0
    if ctx.rank == 0:
        log(f"{mix}: reserve_async_save: {held / GIB:.2f} GiB of staging in {secs:.3f} s")
        ctx.reserved[mix] = {"seconds": secs, "bytes": held}
    for rep in range(ctx.reps):
        if ctx.rank == 0:
            log(f"{mix}: rep {rep + 1}/{ctx.reps}")
        mix_rep(ctx, mix, specs, src, dst, nbytes, rep, compute)
    del src, dst
    gc.collect()


def run_mixes(ctx: Ctx) -> None:
    """Every row but the resharded loads: each mix's reps, then the paired hot loads."""
    compute = Compute()
    compute.calibrate(1.0)
    for mix in ctx.args.mixes:
        run_mix(ctx, mix, compute)
    if PAIRED_MIXES <= set(ctx.args.mixes):
        run_paired_hot(ctx, tuple(sorted(PAIRED_MIXES, reverse=True)))


def run_paired_hot(ctx: Ctx, mixes: tuple[str, ...]) -> None:
    """Hot loads of `mixes` taken in turn, PAIRED_ROUNDS each, every checkpoint in the page
    cache: their per-byte ratio, without the minutes between the mixes' own rows (in which
    this VM's speed swings 2-3x)."""
    dsts, paths, nbytes, failed = {}, {}, {}, {}
    for mix in mixes:
        specs = mix_specs(mix, ctx.args.size)
        nbytes[mix] = spec_bytes(specs)
        src = make_state(ctx, specs, 0, fill=True)
        paths[mix] = ctx.path(mix, "paired")
        ctx.fresh_dir(paths[mix], create=False)
        shardsafe.save(src, paths[mix])
        del src
        dsts[mix] = make_state(ctx, specs, 0, fill=False)
        shardsafe.load(dsts[mix], paths[mix], direct_io=False)  # fills the page cache
        failed[mix] = verify(ctx, specs, dsts[mix], 0, "paired hot load")
    if ctx.rank == 0:
        log(f"paired hot loads: {', '.join(mixes)} in turn, {PAIRED_ROUNDS} rounds")
    for _ in range(PAIRED_ROUNDS):
        for mix in mixes:
            s, _ = ctx.timed(lambda: shardsafe.load(dsts[mix], paths[mix]))
            ctx.record(mix, "shardsafe load hot, paired", nbytes[mix], s, failed[mix] or
                       f"page cache; {' and '.join(mixes)} loaded in turn, a sample per round")
    for p in paths.values():
        ctx.remove(p)
    del dsts
    gc.collect()


def run_reshard(ctx: Ctx, mix: str) -> None:
    """Same-layout and resharded cold loads over ctx.world ranks: saved Shard(0), loaded
    Shard(0) and Shard(1); shardsafe and DCP on the same data."""
    import torch.distributed.checkpoint as dcp
    specs = mix_specs(mix, ctx.args.size)
    nbytes = spec_bytes(specs)
    w = ctx.world
    if ctx.rank == 0:
        log(f"{mix}: reshard rows over {w} gloo ranks; building state")
    dev = block_device(ctx.args.dir)
    src = make_state(ctx, specs, 0, fill=True)
    same = make_state(ctx, specs, 0, fill=False)
    other = make_state(ctx, specs, 1, fill=False)
    for rep in range(ctx.reps):
        check = rep == 0
        for who in ("shardsafe", "dcp"):
            p = ctx.path(mix, f"rs-{who}-rep{rep}")
            ctx.fresh_dir(p, create=False)
            if who == "shardsafe":
                save = lambda: shardsafe.save(src, p)  # noqa: E731
                load = lambda st, **o: shardsafe.load(st, p, **o)  # noqa: E731
            else:
                save = lambda: dcp.save(src, storage_writer=dcp.FileSystemWriter(p))  # noqa: E731
                load = lambda st: dcp.load(st, storage_reader=dcp.FileSystemReader(p))  # noqa: E731
            s, _ = ctx.timed(save)
            ctx.record(mix, f"{who} save [{w}r]", nbytes, s, "Shard(0)")
            cases = [(0, same, "load cold same", {}), (1, other, "load cold resharded", {})]
            if who == "shardsafe":
                cases.append((1, other, "load cold resharded share_reads=False",
                              {"share_reads": False}))
            for dim, st, op, opts in cases:
                ctx.drop_caches()
                if check:
                    zero_state(st)
                disk0 = disk_read_bytes(dev)
                s, _ = ctx.timed(lambda: load(st, **opts))
                disk = (disk_read_bytes(dev) - disk0) / nbytes
                note = verify(ctx, specs, st, dim, f"{who} {op}") if check else ""
                ctx.record(mix, f"{who} {op} [{w}r]", nbytes, s,
                           note or f"{ctx.cold}; Shard(0) -> Shard({dim}), 1-D stay Shard(0); "
                           f"disk read {disk:.2f}x the state")
            ctx.remove(p)
    del src, same, other
    gc.collect()


# ---------------------------------------------------------------- workers --

def worker(rank: int, world: int, args, init_file: str, out_file: str, what: str) -> None:
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank,
                            world_size=world, timeout=datetime.timedelta(minutes=30))
    try:
        ctx = Ctx(args, rank, world)
        if what == "all":
            run_mixes(ctx)
        for mix in args.mixes:
            run_reshard(ctx, mix)
        if rank == 0:
            with open(out_file, "w") as f:
                json.dump({"rows": list(ctx.rows.values()), "reserved": ctx.reserved,
                           "cold_error": ctx.cold_error}, f)
        dist.barrier()
    finally:
        dist.destroy_process_group()


def spawn(args, world: int, what: str) -> dict:
    import torch.multiprocessing as mp
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "rows.json")
        mp.spawn(worker, args=(world, args, os.path.join(d, "init"), out, what), nprocs=world,
                 join=True)
        with open(out) as f:
            return json.load(f)


# ----------------------------------------------------------------- report --

def stats_of(row: dict) -> dict:
    secs = row["secs"]
    if row["bytes"]:
        g = [row["bytes"] / s / 1e9 for s in secs]
        return {"gbps": statistics.median(g), "gbps_min": min(g), "gbps_max": max(g),
                "sec": statistics.median(secs)}
    return {"gbps": None, "sec": statistics.median(secs), "sec_min": min(secs),
            "sec_max": max(secs)}


def ratio(rows: dict, name: str, mix: str, num: tuple, den: tuple, kind: str, target: str,
          ok) -> dict | None:
    """kind 'tp': throughput num / den; 'time': seconds num / den; 'slow': slowdown of num.
    Value: from the medians; min-max: over the reps paired by index."""
    a, b = rows.get(num), rows.get(den)
    if a is None or b is None:
        return None
    if kind == "tp":
        per = [(a["bytes"] / x) / (b["bytes"] / y) for x, y in zip(a["secs"], b["secs"])]
        value = (a["bytes"] / statistics.median(a["secs"])) / (b["bytes"] / statistics.median(b["secs"]))
    elif kind == "time":
        per = [x / y for x, y in zip(a["secs"], b["secs"])]
        value = statistics.median(a["secs"]) / statistics.median(b["secs"])
    elif kind == "perbyte":  # seconds per byte, num / den
        per = [(x / a["bytes"]) / (y / b["bytes"]) for x, y in zip(a["secs"], b["secs"])]
        value = (statistics.median(a["secs"]) / a["bytes"]) / (statistics.median(b["secs"]) / b["bytes"])
    else:  # slowdown of num vs den (compute alone)
        per = [x / y - 1 for x, y in zip(a["secs"], b["secs"])]
        value = statistics.median(per)  # each rep's loop is paired with the alone run before it
    return {"mix": mix, "ratio": name, "value": value, "min": min(per), "max": max(per),
            "target": target, "ok": None if ok is None else bool(ok(value))}


def ratios(rows: dict, mixes: list[str], world: int) -> list[dict]:
    out = []
    R = lambda *a: out.append(ratio(rows, *a))  # noqa: E731
    ge = lambda x: (lambda v: v >= x)  # noqa: E731
    le = lambda x: (lambda v: v <= x)  # noqa: E731
    wr = f"[{2 if world == 1 else world}r]"
    for m in mixes:
        k = lambda op: (m, op)  # noqa: E731
        R("save / raw write", m, k("shardsafe save"), k("raw write O_DIRECT (best)"), "tp",
          ">= 0.85", ge(0.85))
        R("cold load / raw read O_DIRECT", m, k("shardsafe load cold"), k("raw read O_DIRECT (best)"),
          "tp", ">= 0.85", ge(0.85))
        R("cold load direct_io=False / raw read buffered", m,
          k("shardsafe load cold direct_io=False"), k("raw read buffered (best)"), "tp", "(info)",
          None)
        R("hot load / memcpy", m, k("shardsafe load hot"), k("memcpy (copy_ into state)"), "tp",
          ">= 0.7", ge(0.7))
        R("async blocked / memcpy (time)", m, k("shardsafe async blocked"),
          k("memcpy (copy_ into state)"), "time", "<= 1.25", le(1.25))
        R("async durable / sync save (time)", m, k("shardsafe async durable"),
          k("shardsafe save"), "time", "<= 1.15", le(1.15))
        R(f"resharded / same-layout load (time) {wr}", m, k(f"shardsafe load cold resharded {wr}"),
          k(f"shardsafe load cold same {wr}"), "time", "<= 1.15", le(1.15))
        R(f"resharded share_reads=False / same-layout (time) {wr}", m,
          k(f"shardsafe load cold resharded share_reads=False {wr}"),
          k(f"shardsafe load cold same {wr}"), "time", "(info)", None)
        R("save vs dcp save (1 thread)", m, k("shardsafe save"), k("dcp save (thread_count 1)"),
          "tp", ">= 1.5 (never < 1)", ge(1.5))
        R("save vs dcp save (4 threads)", m, k("shardsafe save"), k("dcp save (thread_count 4)"),
          "tp", ">= 1.5 (never < 1)", ge(1.5))
        R("cold load vs dcp cold load", m, k("shardsafe load cold"), k("dcp load cold"), "tp",
          ">= 1.5 (never < 1)", ge(1.5))
        R("hot load vs dcp hot load", m, k("shardsafe load hot"), k("dcp load hot"), "tp",
          "(info)", None)
        R(f"resharded load vs dcp resharded {wr}", m, k(f"shardsafe load cold resharded {wr}"),
          k(f"dcp load cold resharded {wr}"), "tp", ">= 1.5 (never < 1)", ge(1.5))
        R("async durable vs dcp async durable", m, k("shardsafe async durable"),
          k("dcp async durable"), "time", "(info, time)", None)
        R("async blocked / dcp async blocked (time)", m, k("shardsafe async blocked"),
          k("dcp async blocked"), "time", "<= 0.5", le(0.5))
        R("save vs torch.save", m, k("shardsafe save"), k("torch.save"), "tp", "(info)", None)
        R("cold load vs torch.load", m, k("shardsafe load cold"), k("torch.load cold"), "tp",
          "(info)", None)
        R("save vs safetensors", m, k("shardsafe save"), k("safetensors save_file"), "tp",
          "(info)", None)
        R("cold load vs safetensors", m, k("shardsafe load cold"), k("safetensors load_file cold"),
          "tp", "(info)", None)
        R("hot load vs safetensors", m, k("shardsafe load hot"), k("safetensors load_file hot"),
          "tp", "(info)", None)
        R("compute slowdown, shardsafe async", m, k("compute + shardsafe async"),
          k("compute alone"), "slow", "<= 10%", le(0.10))
        R("compute slowdown, raw write (fio)", m, k("compute + raw write (fio)"),
          k("compute alone"), "slow", "(info)", None)
        R("compute slowdown, dcp async", m, k("compute + dcp async"), k("compute alone"), "slow",
          "(info)", None)
    if "small" in mixes and "large" in mixes:
        for op in ("shardsafe save", "shardsafe load cold"):
            R(f"small / large, time per byte: {op.split(' ', 1)[1]}", "small", ("small", op),
              ("large", op), "perbyte", "<= 2.0", le(2.0))
        # The hot rows of the two mixes are minutes apart; the paired rows are taken in turn.
        op = "shardsafe load hot"
        R("small / large, time per byte: load hot", "small", ("small", op), ("large", op),
          "perbyte", "(info: minutes apart)", None)
        op = "shardsafe load hot, paired"
        R("small / large, time per byte: load hot, paired", "small", ("small", op),
          ("large", op), "perbyte", "<= 2.0", le(2.0))
    return [r for r in out if r is not None]


def extras(row: dict) -> str:
    """Medians of the per-rep extra numbers of a row, as text."""
    out = []
    for name in sorted({k for e in row["extra"] for k in e}):
        vals = [e[name] for e in row["extra"] if e.get(name) is not None]
        if not vals or name == "slowdown":
            continue
        v = statistics.median(vals)
        if name == "resident before":
            out.append(f"{v:.0%} of files in page cache before")
        elif name == "iterations":
            out.append(f"{v:.0f} iterations")
        else:
            out.append(f"{name} {v:.3f} s")
    return "; ".join(out)


def fmt_table(rows: dict, mixes: list[str]) -> str:
    lines = ["| mix   | op                                     |   GB/s | min-max       |      s | notes |",
             "|-------|----------------------------------------|--------|---------------|--------|-------|"]
    for (mix, op), row in rows.items():
        if mix not in mixes:
            continue
        st = stats_of(row)
        notes = "; ".join(x for x in ["; ".join(row["notes"]), extras(row)] if x)
        if st["gbps"] is None:
            sl = [e.get("slowdown", 0.0) for e in row["extra"]]
            notes = (f"{st['sec'] * 1e3:.2f} ms/iter" +
                     (f", slowdown {statistics.median(sl):+.1%} ({min(sl):+.1%}..{max(sl):+.1%})"
                      if op != "compute alone" else "") + f"; {notes}")
            lines.append(f"| {mix:5s} | {op:38s} |      - |               |      - | {notes} |")
        else:
            rng = f"{st['gbps_min']:.2f}-{st['gbps_max']:.2f}"
            lines.append(f"| {mix:5s} | {op:38s} | {st['gbps']:6.2f} | {rng:13s} | {st['sec']:6.3f} | {notes} |")
    return "\n".join(lines)


def fmt_ratios(rs: list[dict]) -> str:
    lines = ["| mix   | ratio                                        |  value | min-max         | target             | ok   |",
             "|-------|----------------------------------------------|--------|-----------------|--------------------|------|"]
    for r in rs:
        pct = "slowdown" in r["ratio"]
        v = f"{r['value']:+.1%}" if pct else f"{r['value']:.2f}"
        rng = (f"{r['min']:+.1%}..{r['max']:+.1%}" if pct else f"{r['min']:.2f}-{r['max']:.2f}")
        ok = "" if r["ok"] is None else ("yes" if r["ok"] else "NO")
        lines.append(f"| {r['mix']:5s} | {r['ratio']:44s} | {v:>6s} | {rng:15s} | {r['target']:18s} | {ok:4s} |")
    return "\n".join(lines)


def block_device(directory: str) -> str:
    """The /sys/block name of the disk under `directory` ('' if none is found)."""
    src = subprocess.run(["findmnt", "-n", "-o", "SOURCE", "-T", directory],
                         capture_output=True, text=True).stdout.strip()
    name = os.path.basename(os.path.realpath(src)) if src.startswith("/dev/") else ""
    while name and not os.path.exists(f"/sys/block/{name}"):
        name = name[:-1]  # vda1 -> vda
    return name


def disk_read_bytes(dev: str) -> int:
    """Bytes read from the whole disk so far (every process): /sys/block/DEV/stat."""
    if not dev:
        return 0
    with open(f"/sys/block/{dev}/stat") as f:
        return int(f.read().split()[2]) * 512


def machine_note(args) -> str:
    mem = 0
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                mem = int(line.split()[1]) * 1024
    fs = " on ".join(subprocess.run(["findmnt", "-n", "-o", "FSTYPE,SOURCE", "-T", args.dir],
                                    capture_output=True, text=True).stdout.split()) or "?"
    fiov = subprocess.run(["fio", "--version"], capture_output=True, text=True).stdout.strip()
    import safetensors
    return (f"{os.cpu_count()} cpus, {mem / GIB:.1f} GiB RAM, kernel {platform.release()}, "
            f"{fs} at {args.dir}; torch {torch.__version__}, safetensors {safetensors.__version__}, "
            f"{fiov}; load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


def report(meta: dict, rows: dict) -> dict:
    """Prints the run's header, table and ratios; returns the rows in table order."""
    a = meta["args"]
    mixes, size = a["mixes"], a["size"]
    ordered = {}  # by mix, in measurement order within a mix
    for m in mixes:
        ordered.update({k: v for k, v in rows.items() if k[0] == m})
    print(f"shardsafe vs raw I/O and peers: {size / GIB:.2f} GiB per mix, {a['ranks']} rank(s), "
          f"{a['reps']} rep(s), dir {a['dir']}\n{meta['machine']}")
    for m in mixes:
        print(f"mix {m:5s}: {describe_mix(m, mix_specs(m, size))}")
    for m, w in meta["async_reserved"].items():
        print(f"async save staging of {m} (reserve_async_save, not in the table): "
              f"{w['bytes'] / GIB:.2f} GiB in {w['seconds']:.3f} s")
    if meta["cold_error"]:
        print(f"WARNING: drop_caches failed ({meta['cold_error']}); every 'cold' row is WARM")
    else:
        print("cold rows: page cache dropped (sync; echo 3 > /proc/sys/vm/drop_caches)")
    print()
    print(fmt_table(ordered, mixes))
    print()
    print(fmt_ratios(ratios(ordered, mixes, a["ranks"])))
    end = meta.get("load_average_end")
    print(f"\nelapsed {meta['elapsed_s'] / 60:.1f} min" +
          (f"; load average at the end {' '.join(f'{x:.2f}' for x in end)}" if end else ""))
    return ordered


# ------------------------------------------------------------------- main --

def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size-gib", type=float, default=2.0, help="bytes per mix (default 2)")
    ap.add_argument("--dir", default=os.path.join(REPO, "bench-out"),
                    help="directory for checkpoints and fio files (default <repo>/bench-out)")
    ap.add_argument("--ranks", type=int, default=1, choices=(1, 2, 4),
                    help="1: this process; 2, 4: gloo processes holding DTensor Shard(0) shards")
    ap.add_argument("--mix", default="all", choices=(*MIXES, "all"))
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--no-reshard", action="store_true", help="skip the resharded-load rows")
    ap.add_argument("--only-reshard", action="store_true",
                    help="measure only the resharded-load rows (same-layout and resharded "
                    "cold loads, shardsafe and DCP)")
    ap.add_argument("--json", metavar="FILE", help="also write rows and ratios as JSON")
    ap.add_argument("--report", metavar="FILE", help="measure nothing: print the tables of a "
                    "run saved with --json")
    args = ap.parse_args()
    if args.report:
        with open(args.report) as f:
            saved = json.load(f)
        keep = ("mix", "op", "bytes", "secs", "notes", "extra", "samples")
        report(saved, {(r["mix"], r["op"]): {k: r[k] for k in keep if k in r}
                       for r in saved["rows"]})
        return 0
    args.size = int(args.size_gib * GIB)
    args.mixes = list(MIXES) if args.mix == "all" else [args.mix]
    args.dir = os.path.abspath(args.dir)

    if shutil.which("fio") is None:
        sys.exit("peers.py: ERROR: `fio` is not installed (Debian package fio); it measures the raw "
                 "write/read baselines. Run scripts/deps.sh (or apt-get install fio) first.")
    if args.reps < 1:
        sys.exit("peers.py: --reps must be >= 1")
    os.makedirs(args.dir, exist_ok=True)
    free = shutil.disk_usage(args.dir).free
    need = int(2 * args.size + 2 * GIB)  # one checkpoint (or fio file set) at a time + slack
    if free < need:
        sys.exit(f"peers.py: ERROR: {args.dir} has {free / GIB:.1f} GiB free; --size-gib "
                 f"{args.size_gib} needs {need / GIB:.1f} GiB. Use a smaller --size-gib or --dir.")
    with open("/proc/meminfo") as f:
        avail = next(int(l.split()[1]) * 1024 for l in f if l.startswith("MemAvailable:"))
    if avail < 4.5 * args.size:
        sys.exit(f"peers.py: ERROR: {avail / GIB:.1f} GiB of memory available; --size-gib "
                 f"{args.size_gib} needs ~{4.5 * args.size / GIB:.1f} GiB (state, destination, "
                 f"staging copies). Use a smaller --size-gib.")
    args.workdir = os.path.join(args.dir, f"peers-{os.getpid()}")
    os.makedirs(args.workdir)
    note = machine_note(args)
    log(f"{note}")
    log(f"size {args.size / GIB:.2f} GiB per mix, ranks {args.ranks}, reps {args.reps}, "
        f"mixes {','.join(args.mixes)}, work dir {args.workdir}")
    t_start = time.time()
    rows: dict = {}
    reserved: dict = {}
    cold_error = None
    try:
        if args.only_reshard:
            got = spawn(args, max(args.ranks, 2), "reshard")
            rows.update({(r["mix"], r["op"]): r for r in got["rows"]})
            cold_error = got["cold_error"]
        elif args.ranks == 1:
            ctx = Ctx(args)
            run_mixes(ctx)
            rows.update(ctx.rows)
            reserved.update(ctx.reserved)
            cold_error = ctx.cold_error
            if not args.no_reshard:
                del ctx
                gc.collect()
                got = spawn(args, 2, "reshard")
                rows.update({(r["mix"], r["op"]): r for r in got["rows"]})
                cold_error = cold_error or got["cold_error"]
        else:
            got = spawn(args, args.ranks, "all")
            rows.update({(r["mix"], r["op"]): r for r in got["rows"]})
            reserved.update(got["reserved"])
            cold_error = got["cold_error"]
    finally:
        shutil.rmtree(args.workdir, ignore_errors=True)
    elapsed = time.time() - t_start

    meta = {"args": {k: v for k, v in vars(args).items() if k != "workdir"}, "machine": note,
            "cold_error": cold_error, "async_reserved": reserved, "elapsed_s": elapsed,
            "load_average_end": list(os.getloadavg())}
    ordered = report(meta, rows)
    if args.json:
        out = {**meta, "rows": [{**r, **stats_of(r)} for r in ordered.values()],
               "ratios": ratios(ordered, meta["args"]["mixes"], meta["args"]["ranks"])}
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
        log(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        sys.exit(130)
    except Exception:  # noqa: BLE001 - print the traceback, fail loudly
        traceback.print_exc()
        sys.exit(1)
