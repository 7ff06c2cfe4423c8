"""The Python package with CUDA tensors, on a real GPU.

Not part of the CPU CI run (which collects tests/python only): run it on a
machine with a CUDA GPU, see tests/gpu/README.md. Without CUDA every test
FAILS (a GPU suite that silently skips proves nothing).

Covers save / async_save / load / CheckpointManager with CUDA tensors of
many dtypes, non-contiguous CUDA views (as sources and as load targets), a
CUDA model + AdamW round trip (bit-exact, and the next training step too),
CPU-saved -> CUDA and CUDA-saved -> CPU loads, FP8 block dequantisation
into CUDA targets, a 1-rank DTensor on a CUDA mesh, the DCP Writer; how
device tensors reach the disk (shardsafe._device): a sync save through
bounded buffers (peak resident memory measured), an async save's staging
arena page-locked once and the only host copy, copies ordered after the work
queued on the caller's current stream; and the pinned host buffer loads
read through (`shardsafe._device.STAGING`): pinned, reused across calls.
"""

from __future__ import annotations

import copy
import gc
import os
import threading

import pytest
import torch

import shardsafe
from shardsafe import _device
from bench_cuda import peak_rss_growth  # tests/gpu, beside this file
from shardsafe._state import DTYPE_NAMES

CUDA = torch.device("cuda")


@pytest.fixture(autouse=True)
def _require_cuda():
    if not torch.cuda.is_available():
        pytest.fail("CUDA is not available: tests/gpu must run on a machine with a CUDA GPU "
                    f"(torch {torch.__version__}, built with CUDA {torch.version.cuda})",
                    pytrace=False)
    yield
    torch.cuda.synchronize()


# ----------------------------------------------------------------- helpers --

def raw(t: torch.Tensor) -> torch.Tensor:
    """The tensor's bytes (in logical order) as a CPU uint8 vector."""
    t = t.detach().resolve_conj().resolve_neg().cpu().contiguous().reshape(-1)
    return t.view(torch.uint8) if t.dtype != torch.uint8 else t


def assert_same_bytes(got: torch.Tensor, want: torch.Tensor, key: str = "") -> None:
    assert got.dtype == want.dtype, (key, got.dtype, want.dtype)
    assert tuple(got.shape) == tuple(want.shape), (key, got.shape, want.shape)
    assert torch.equal(raw(got), raw(want)), f"{key}: bytes differ"


def assert_state_equal(got, want, key: str = "") -> None:
    """Nested dicts / lists / tuples / tensors / values, tensors bit-exact."""
    if isinstance(want, torch.Tensor):
        assert isinstance(got, torch.Tensor), key
        assert_same_bytes(got, want, key)
    elif isinstance(want, dict):
        assert set(got) == set(want), (key, set(got) ^ set(want))
        for k in want:
            assert_state_equal(got[k], want[k], f"{key}.{k}")
    elif isinstance(want, (list, tuple)):
        assert len(got) == len(want), key
        for i, (g, w) in enumerate(zip(got, want)):
            assert_state_equal(g, w, f"{key}.{i}")
    else:
        assert got == want or (got != got and want != want), (key, got, want)


def random_bytes_tensor(dtype: torch.dtype, shape: tuple, gen: torch.Generator) -> torch.Tensor:
    """A CPU tensor of `dtype` with random bytes (bool: 0/1; floats: finite)."""
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=gen).bool()
    if dtype.is_floating_point and dtype.itemsize >= 2:
        return (torch.randn(shape, generator=gen) * 3).to(dtype)
    if dtype in (torch.float8_e4m3fn, torch.float8_e5m2, torch.float8_e4m3fnuz,
                 torch.float8_e5m2fnuz):
        return (torch.randn(shape, generator=gen) * 3).to(dtype)
    if dtype.is_complex:
        return torch.randn(shape, generator=gen, dtype=dtype)
    n = int(torch.Size(shape).numel()) * dtype.itemsize
    b = torch.randint(0, 256, (n,), dtype=torch.uint8, generator=gen)
    if dtype == torch.float8_e8m0fnu:
        b[b == 255] = 127  # 0xFF is NaN
    return b.view(dtype).reshape(shape)


REQUIRED_DTYPES = [torch.bfloat16, torch.float32, torch.int64, torch.bool, torch.float8_e4m3fn]
OTHER_DTYPES = [dt for dt in DTYPE_NAMES if dt not in REQUIRED_DTYPES]
SHAPES = {"mat": (33, 17), "vec": (1001,), "scalar": (), "empty": (0, 5), "cube": (4, 3, 130)}


def cuda_state(dtypes, seed: int = 0) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    out = {}
    for dt in dtypes:
        for label, shape in SHAPES.items():
            out[f"{DTYPE_NAMES[dt].lower()}.{label}"] = random_bytes_tensor(dt, shape, gen).to(CUDA)
    return out


def zeros_like(state: dict, device=None) -> dict:
    return {k: torch.zeros_like(v, device=device) for k, v in state.items()}


def snapshot(state: dict) -> dict:
    return {k: v.detach().cpu().clone() for k, v in state.items()}


# ------------------------------------------------------------- round trips --

def _save_by(mode: str, state, tmp_path):
    """Saves `state` with one of the four entry points; returns the path."""
    if mode == "save":
        path = tmp_path / "step-1"
        stats = shardsafe.save(state, path)
        assert stats["bytes_written"] > 0
        return path
    if mode == "async_save":
        fut = shardsafe.async_save(state, tmp_path / "step-1")
        return fut.result(timeout=120)
    mgr = shardsafe.CheckpointManager(tmp_path / "root", keep_last=2)
    if mode == "manager.save":
        mgr.save(7, state)
    else:
        assert mode == "manager.async_save"
        assert mgr.async_save(7, state).result(timeout=120) == mgr.path(7)
    assert mgr.latest_step() == 7
    return mgr.path(7)


SAVE_MODES = ["save", "async_save", "manager.save", "manager.async_save"]


@pytest.mark.parametrize("mode", SAVE_MODES)
def test_required_dtypes_round_trip_bit_exact(mode, tmp_path):
    state = cuda_state(REQUIRED_DTYPES)
    before = snapshot(state)
    path = _save_by(mode, state, tmp_path)
    # The sources are untouched and still on the GPU.
    for k, v in state.items():
        assert v.is_cuda, k
        assert_same_bytes(v, before[k], k)
    desc = shardsafe.describe(path)
    for k, v in state.items():
        assert desc["tensors"][k][0] == DTYPE_NAMES[v.dtype], k
        assert list(desc["tensors"][k][1]) == list(v.shape), k
    got = zeros_like(state)
    if mode.startswith("manager"):
        res = shardsafe.CheckpointManager(tmp_path / "root").load(got)
    else:
        res = shardsafe.load(got, path)
    assert res.missing_keys == [] and res.unexpected_keys == []
    for k, v in got.items():
        assert v.is_cuda, k
        assert_same_bytes(v, before[k], k)


@pytest.mark.parametrize("dtype", OTHER_DTYPES, ids=lambda d: DTYPE_NAMES[d])
def test_other_dtypes_round_trip_bit_exact(dtype, tmp_path):
    try:
        state = cuda_state([dtype], seed=1)
        got = zeros_like(state)
    except (RuntimeError, NotImplementedError) as e:  # torch itself, not shardsafe
        pytest.skip(f"torch cannot hold {dtype} on CUDA: {e}")
    before = snapshot(state)
    shardsafe.save(state, tmp_path / "a")
    shardsafe.load(got, tmp_path / "a")
    for k in state:
        assert_same_bytes(got[k], before[k], k)


def test_async_save_sources_may_change_right_away(tmp_path):
    """async_save returns once staged: changing the CUDA tensors afterwards
    does not reach the checkpoint."""
    state = cuda_state([torch.float32, torch.bfloat16], seed=2)
    before = snapshot(state)
    fut = shardsafe.async_save(state, tmp_path / "step-1")
    for v in state.values():
        v.fill_(7)
    # A second async save right behind it, of the changed state.
    fut2 = shardsafe.async_save(state, tmp_path / "step-2")
    assert fut.result(timeout=120).endswith("step-1")
    fut2.result(timeout=120)
    got = zeros_like(state)
    shardsafe.load(got, tmp_path / "step-1")
    for k in state:
        assert_same_bytes(got[k], before[k], k)
    shardsafe.load(got, tmp_path / "step-2")
    for k in state:
        assert_same_bytes(got[k], state[k], k)


def test_load_while_async_save_in_flight(tmp_path):
    """A load (which stages through the pinned load buffer) right after an
    async_save returned must not change what that save writes."""
    a = {"x": torch.randn(4096, 1024, device=CUDA), "y": torch.arange(10**6, device=CUDA)}
    shardsafe.save(a, tmp_path / "a")
    b = {"x": torch.randn(4096, 1024, device=CUDA), "y": torch.arange(10**6, device=CUDA) * 3}
    want = snapshot(b)
    fut = shardsafe.async_save(b, tmp_path / "b")
    target = zeros_like(a)
    shardsafe.load(target, tmp_path / "a")
    fut.result(timeout=120)
    assert_same_bytes(target["x"], a["x"])
    got = zeros_like(b)
    shardsafe.load(got, tmp_path / "b")
    for k in want:
        assert_same_bytes(got[k], want[k], k)


def test_checkpoint_manager_steps_latest_and_retention(tmp_path):
    mgr = shardsafe.CheckpointManager(tmp_path / "run", keep_last=2)
    assert mgr.latest_step() is None
    w = torch.randn(256, 256, device=CUDA, dtype=torch.bfloat16)
    history = {}
    for step in (10, 20, 30):
        w.add_(1)
        state = {"w": w, "step": step, "mask": w > 0}
        history[step] = (w.cpu().clone(), (w > 0).cpu())
        if step == 20:
            mgr.save(step, state)
        else:
            mgr.async_save(step, state)
    mgr.wait()
    assert mgr.latest_step() == 30
    steps = sorted(d for d in os.listdir(tmp_path / "run") if d.startswith("step-"))
    assert steps == ["step-00000020", "step-00000030"], os.listdir(tmp_path / "run")
    for step in (None, 20):
        got = {"w": torch.zeros_like(w), "step": 0, "mask": torch.zeros_like(w, dtype=torch.bool)}
        mgr.load(got, step=step)
        s = step or 30
        assert got["step"] == s
        assert_same_bytes(got["w"], history[s][0])
        assert_same_bytes(got["mask"], history[s][1])


def test_mixed_cpu_and_cuda_state_with_values(tmp_path):
    state = {"gpu": {"a": torch.randn(100, 7, device=CUDA), "b": torch.ones(3, device=CUDA,
                                                                             dtype=torch.int64)},
             "cpu": [torch.randn(5, 5), torch.arange(9, dtype=torch.int32)],
             "step": 5, "lr": 1e-3, "name": "run"}
    before = {"gpu.a": state["gpu"]["a"].cpu(), "gpu.b": state["gpu"]["b"].cpu(),
              "cpu.0": state["cpu"][0].clone(), "cpu.1": state["cpu"][1].clone()}
    shardsafe.save(state, tmp_path / "m")
    got = {"gpu": {"a": torch.zeros(100, 7, device=CUDA),
                   "b": torch.zeros(3, device=CUDA, dtype=torch.int64)},
           "cpu": [torch.zeros(5, 5), torch.zeros(9, dtype=torch.int32)],
           "step": 0, "lr": 0.0, "name": ""}
    shardsafe.load(got, tmp_path / "m")
    assert (got["step"], got["lr"], got["name"]) == (5, 1e-3, "run")
    assert got["gpu"]["a"].is_cuda and not got["cpu"][0].is_cuda
    assert_same_bytes(got["gpu"]["a"], before["gpu.a"])
    assert_same_bytes(got["gpu"]["b"], before["gpu.b"])
    assert_same_bytes(got["cpu"][0], before["cpu.0"])
    assert_same_bytes(got["cpu"][1], before["cpu.1"])


# --------------------------------------------------------- non-contiguous --

def test_non_contiguous_cuda_views_as_sources(tmp_path):
    base = torch.randn(64, 96, device=CUDA)
    c = torch.randn(512, 512, device=CUDA, dtype=torch.complex64)  # big enough to see races
    state = {
        "transposed": base.t(),
        "strided": base[::3, 1::2],
        "column": base[:, 5],
        "expanded": torch.arange(7, device=CUDA).view(7, 1).expand(7, 11),  # stride 0
        "channels_last": torch.randn(2, 3, 8, 8, device=CUDA).to(
            memory_format=torch.channels_last),
        "bf16_slice": base.to(torch.bfloat16)[10:20, 40:],
        "conj": c.conj(),  # lazy conjugate bit
        "neg": c.conj().imag,  # real view with the negative bit
        "bool_t": (base > 0).t(),
        "offset_view": base.view(-1)[17:17 + 500],  # storage offset, contiguous
    }
    assert not state["transposed"].is_contiguous() and not state["strided"].is_contiguous()
    want = {k: v.detach().cpu().resolve_conj().resolve_neg().contiguous()
            for k, v in state.items()}
    shardsafe.save(state, tmp_path / "nc")
    got = {k: torch.zeros(v.shape, dtype=v.dtype, device=CUDA) for k, v in want.items()}
    shardsafe.load(got, tmp_path / "nc")
    for k in want:
        assert_same_bytes(got[k], want[k], k)


def test_non_contiguous_cuda_views_as_load_targets(tmp_path):
    src = {"t": torch.randn(40, 24, device=CUDA), "s": torch.randn(16, 10, device=CUDA),
           "h": torch.randn(6, 5, device=CUDA).to(torch.bfloat16)}
    shardsafe.save(src, tmp_path / "src")
    big = torch.full((24, 40), -1.0, device=CUDA)
    wide = torch.full((16, 30), -2.0, device=CUDA)
    bf = torch.full((5, 6), -3.0, device=CUDA, dtype=torch.bfloat16)
    targets = {"t": big.t(), "s": wide[:, ::3][:, :10], "h": bf.t()}
    assert all(not v.is_contiguous() for v in targets.values())
    shardsafe.load(targets, tmp_path / "src")
    assert_same_bytes(big.t(), src["t"])
    assert_same_bytes(bf.t(), src["h"])
    assert_same_bytes(wide[:, ::3][:, :10], src["s"])
    # Elements outside the view are untouched.
    mask = torch.ones_like(wide, dtype=torch.bool)
    mask[:, 0:30:3] = False
    assert bool((wide[mask] == -2.0).all())


def test_conj_and_neg_views_as_load_targets(tmp_path):
    src = {"c": torch.randn(512, 512, device=CUDA, dtype=torch.complex64),
           "n": torch.randn(512, 512, device=CUDA)}
    shardsafe.save(src, tmp_path / "src")
    c = torch.zeros(512, 512, device=CUDA, dtype=torch.complex64)
    base = torch.zeros(512, 512, device=CUDA, dtype=torch.complex64)
    targets = {"c": c.conj(), "n": base.conj().imag}
    assert targets["c"].is_conj() and targets["n"].is_neg()
    shardsafe.load(targets, tmp_path / "src")
    assert_same_bytes(c.conj(), src["c"], "c")
    assert_same_bytes(base.conj().imag, src["n"], "n")
    assert_same_bytes(base.imag, -src["n"], "n (storage)")


# ------------------------------------------------- CPU <-> CUDA, HF, FP8 --

def test_cpu_saved_checkpoint_loads_into_cuda(tmp_path):
    gen = torch.Generator().manual_seed(3)
    cpu = {f"{DTYPE_NAMES[dt]}": random_bytes_tensor(dt, (31, 9), gen) for dt in REQUIRED_DTYPES}
    cpu["nested.t"] = torch.randn(8, 8, generator=gen).t()  # non-contiguous CPU source
    shardsafe.save({**cpu, "step": 3}, tmp_path / "cpu")
    got = {k: torch.zeros(v.shape, dtype=v.dtype, device=CUDA) for k, v in cpu.items()}
    got["step"] = 0
    got["nested.t"] = torch.zeros(16, 8, device=CUDA)[::2].t()  # non-contiguous CUDA target
    shardsafe.load(got, tmp_path / "cpu")
    assert got["step"] == 3
    for k, v in cpu.items():
        assert got[k].is_cuda
        assert_same_bytes(got[k], v, k)


def test_cuda_saved_checkpoint_loads_into_cpu(tmp_path):
    state = cuda_state(REQUIRED_DTYPES, seed=4)
    shardsafe.save(state, tmp_path / "gpu")
    contiguous = zeros_like(state, device="cpu")
    shardsafe.load(contiguous, tmp_path / "gpu")
    for k, v in state.items():
        assert contiguous[k].device.type == "cpu"
        assert_same_bytes(contiguous[k], v, k)
    # Non-contiguous CPU targets (staged, then copied in).
    mats = {k: v for k, v in state.items() if v.dim() == 2 and v.numel()}
    targets = {k: torch.zeros(v.shape[1], v.shape[0], dtype=v.dtype).t() for k, v in mats.items()}
    shardsafe.load(targets, tmp_path / "gpu", strict=False)
    for k, v in mats.items():
        assert_same_bytes(targets[k], v, k)


def test_safetensors_file_loads_into_cuda(tmp_path):
    from safetensors.torch import save_file

    gen = torch.Generator().manual_seed(5)
    tensors = {"a.weight": torch.randn(64, 32, generator=gen).to(torch.bfloat16),
               "b.bias": torch.randn(17, generator=gen)}
    save_file(tensors, str(tmp_path / "model.safetensors"))
    got = {k: torch.zeros_like(v, device=CUDA) for k, v in tensors.items()}
    shardsafe.load(got, tmp_path / "model.safetensors")
    for k, v in tensors.items():
        assert_same_bytes(got[k], v, k)


def test_fp8_block_dequantisation_into_cuda_targets(tmp_path):
    from safetensors.torch import save_file

    gen = torch.Generator().manual_seed(6)
    w = (torch.randn(200, 300, generator=gen) * 2).to(torch.float8_e4m3fn)
    s = torch.rand(2, 3, generator=gen) + 0.5
    save_file({"w": w, "w_scale_inv": s}, str(tmp_path / "fp8.safetensors"))
    ref = w.float() * s.repeat_interleave(128, 0).repeat_interleave(128, 1)[:200, :300]
    for dtype in (torch.bfloat16, torch.float32):
        got = {"w": torch.zeros(200, 300, device=CUDA, dtype=dtype)}
        shardsafe.load(got, tmp_path / "fp8.safetensors")
        assert_same_bytes(got["w"], ref.to(dtype))
    # Without dequantisation, into an FP8 CUDA target: the raw bytes.
    got = {"w": torch.zeros(200, 300, device=CUDA, dtype=torch.float8_e4m3fn)}
    shardsafe.load(got, tmp_path / "fp8.safetensors", strict=False)
    assert_same_bytes(got["w"], w)


# --------------------------------------------------- model + optimizer --

def _model(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    m = torch.nn.Sequential(torch.nn.Linear(48, 256), torch.nn.BatchNorm1d(256), torch.nn.GELU(),
                            torch.nn.Linear(256, 256), torch.nn.GELU(), torch.nn.Linear(256, 10))
    m[3].to(torch.bfloat16)  # a bf16 layer: bf16 params and bf16 optimizer state
    return m.to(CUDA)


def _forward(m: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    h = m[2](m[1](m[0](x)))
    h = m[4](m[3](h.to(torch.bfloat16)).float())
    return m[5](h)


def _train_step(m, opt, sched, seed: int) -> None:
    g = torch.Generator(device=CUDA).manual_seed(seed)
    x = torch.randn(64, 48, device=CUDA, generator=g)
    y = torch.randint(0, 10, (64,), device=CUDA, generator=g)
    opt.zero_grad(set_to_none=True)
    torch.nn.functional.cross_entropy(_forward(m, x), y).backward()
    opt.step()
    sched.step()


def _make(seed: int, variant: str):
    m = _model(seed)
    kw = {"foreach": {"foreach": True}, "fused": {"fused": True},
          "capturable": {"capturable": True, "foreach": True}}[variant]
    opt = torch.optim.AdamW(m.parameters(), lr=1e-3, betas=(0.9, 0.95), weight_decay=0.1, **kw)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    return m, opt, sched


@pytest.mark.parametrize("variant", ["foreach", "fused", "capturable"])
@pytest.mark.parametrize("how", ["save", "async_save"])
def test_cuda_model_and_adamw_round_trip_bit_exact(variant, how, tmp_path):
    m, opt, sched = _make(0, variant)
    for i in range(5):
        _train_step(m, opt, sched, i)
    # The reference: deep copies of the step-5 state, on the GPU.
    want_model = copy.deepcopy(m.state_dict())
    want_optim = copy.deepcopy(opt.state_dict())
    want_sched = copy.deepcopy(sched.state_dict())
    state = {"model": m, "optim": opt, "sched": sched, "step": 5}
    if how == "save":
        shardsafe.save(state, tmp_path / "ck")
    else:
        fut = shardsafe.async_save(state, tmp_path / "ck")
        _train_step(m, opt, sched, 99)  # train on at once; the checkpoint is of step 5
        fut.result(timeout=120)

    m2, opt2, sched2 = _make(123, variant)  # different init, optimizer never stepped
    got = {"model": m2, "optim": opt2, "sched": sched2, "step": 0}
    shardsafe.load(got, tmp_path / "ck")
    assert got["step"] == 5
    assert sched2.state_dict() == want_sched
    assert_state_equal(dict(m2.state_dict()), dict(want_model), "model")
    osd = opt2.state_dict()
    assert set(osd["state"]) == set(want_optim["state"])
    for p, s in want_optim["state"].items():
        assert set(osd["state"][p]) == set(s), p
        for k, v in s.items():
            got_v = osd["state"][p][k]
            if torch.is_tensor(v):
                assert got_v.device == v.device, (p, k, got_v.device, v.device)
            assert_state_equal(got_v, v, f"optim.state.{p}.{k}")
    assert osd["param_groups"] == want_optim["param_groups"]
    assert all(p.is_cuda for p in m2.parameters())

    # Training on from the shardsafe-loaded state is bit-identical to training
    # on from the same state restored with torch's own load_state_dict.
    m3, opt3, sched3 = _make(7, variant)
    m3.load_state_dict(want_model)
    opt3.load_state_dict(copy.deepcopy(want_optim))
    sched3.load_state_dict(want_sched)
    for i in range(5, 8):
        _train_step(m3, opt3, sched3, i)
        _train_step(m2, opt2, sched2, i)
    for (k, a), b in zip(m3.state_dict().items(), m2.state_dict().values()):
        assert_same_bytes(b, a, k)


# ------------------------------------------------------ DTensor, 1 rank --

def test_dtensor_on_one_rank_cuda_mesh(tmp_path):
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    started = not dist.is_initialized()
    if started:
        store = dist.FileStore(str(tmp_path / "store"), 1)
        dist.init_process_group("nccl", store=store, rank=0, world_size=1)
    try:
        mesh = init_device_mesh("cuda", (1,))
        full = torch.randn(64, 32, device=CUDA, dtype=torch.bfloat16)
        state = {"s": distribute_tensor(full, mesh, [Shard(0)]),
                 "r": distribute_tensor(full.t().contiguous(), mesh, [Replicate()])}
        shardsafe.save(state, tmp_path / "dt")
        plain = {"s": torch.zeros_like(full), "r": torch.zeros_like(full.t().contiguous())}
        shardsafe.load(plain, tmp_path / "dt")
        assert_same_bytes(plain["s"], full)
        assert_same_bytes(plain["r"], full.t())
        back = {"s": distribute_tensor(torch.zeros_like(full), mesh, [Shard(1)]),
                "r": distribute_tensor(torch.zeros_like(full.t()), mesh, [Shard(0)])}
        shardsafe.load(back, tmp_path / "dt")
        assert_same_bytes(back["s"].full_tensor(), full)
        assert_same_bytes(back["r"].full_tensor(), full.t())
    finally:
        if started:
            dist.destroy_process_group()


# ------------------------------------- device copies and host memory --

def test_sync_save_streams_cuda_tensors_through_bounded_buffers(tmp_path, monkeypatch):
    """A synchronous save copies device tensors into the data files' write
    buffers a buffer at a time: nothing of the state is staged whole, so the
    save's extra host memory stays within the engine's 256 MiB bound."""
    n = 256 << 20  # 1 GiB of float32 in 4 tensors
    state = {f"w{i}": torch.randn(n // 4, device=CUDA) for i in range(4)}
    before = snapshot(state)
    largest = []
    copy = _device.DeviceCopier.copy_to_host

    def recording(self, copies):
        largest.append(max(c[2] for c in copies))
        return copy(self, copies)

    monkeypatch.setattr(_device.DeviceCopier, "copy_to_host", recording)
    shardsafe.save(state, tmp_path / "warm")  # file buffers and CUDA paths warmed up
    grew = peak_rss_growth(lambda: shardsafe.save(state, tmp_path / "s"))
    assert max(largest) <= 16 << 20, f"a copy of {max(largest)} bytes"
    assert grew <= (256 + 64) << 20, f"a 1 GiB save grew the resident set by {grew >> 20} MiB"
    got = zeros_like(state)
    shardsafe.load(got, tmp_path / "s")
    for k in state:
        assert_same_bytes(got[k], before[k], k)


def test_async_staging_is_page_locked_once_and_is_the_only_copy(tmp_path):
    """The async saver's staging arena is registered with CUDA (page-locked)
    once, takes the device copies directly (no second host copy: the peak
    extra memory of the first save is one arena), is kept across saves and
    is unregistered when released."""
    shardsafe.release_async_save()
    gc.collect()  # managers of earlier tests free their engines (and arenas)
    others = set(_device.registered())
    n = 128 << 20  # 512 MiB of float32
    state = {"a": torch.randn(n // 2, device=CUDA), "b": torch.randn(n // 2, device=CUDA)}
    nbytes = n * 4
    grew = peak_rss_growth(
        lambda: shardsafe.async_save(state, tmp_path / "s1").result(timeout=120))
    assert grew <= nbytes * 1.1 + (64 << 20), \
        f"the first async save of {nbytes >> 20} MiB grew the resident set by {grew >> 20} MiB"
    regions = {a: r for a, r in _device.registered().items() if a not in others}
    assert len(regions) == 1, f"{len(regions)} regions registered by the first async save"
    (address, (view, locked)), = regions.items()
    size = view.numel()
    assert locked, "cudaHostRegister failed on the staging arena"
    assert view.is_pinned(), "torch does not see the staging arena as pinned"
    assert nbytes <= size <= nbytes * 1.1
    for step in (2, 3):
        for v in state.values():
            v.add_(1)
        want = snapshot(state)
        shardsafe.async_save(state, tmp_path / f"s{step}").result(timeout=120)
        assert set(_device.registered()) - others == set(regions), "staging re-registered"
        got = zeros_like(state)
        shardsafe.load(got, tmp_path / f"s{step}")
        for k in state:
            assert_same_bytes(got[k], want[k], k)
    shardsafe.release_async_save()
    assert address not in _device.registered(), "the released arena is still registered"


@pytest.mark.parametrize("how", ["save", "async_save"])
def test_copies_follow_the_work_queued_on_the_current_stream(tmp_path, how):
    """Tensors still being written by kernels queued on a side stream are
    saved as those kernels leave them: the copies run on the stream current
    when the save was called."""
    x = torch.zeros(64 << 20, device=CUDA)  # 256 MiB
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        torch.cuda._sleep(200_000_000)  # ~0.1 s of GPU time before the fill
        x.fill_(5.0)
        if how == "save":
            shardsafe.save({"x": x}, tmp_path / "c")
        else:
            shardsafe.async_save({"x": x}, tmp_path / "c").result(timeout=120)
    torch.cuda.synchronize()
    got = {"x": torch.zeros_like(x)}
    shardsafe.load(got, tmp_path / "c")
    assert bool((got["x"] == 5.0).all()), "the save copied the tensor before the fill"


def test_dcp_writer_saves_cuda_chunks_through_the_copier(tmp_path):
    import torch.distributed.checkpoint as dcp

    import shardsafe.dcp

    state = {"w": torch.randn(1000, 300, device=CUDA), "b": torch.arange(7, device=CUDA)}
    want = snapshot(state)
    dcp.save(state, storage_writer=shardsafe.dcp.Writer(tmp_path / "d"))
    got = zeros_like(state)
    shardsafe.load(got, tmp_path / "d")
    for k in state:
        assert_same_bytes(got[k], want[k], k)


# ---------------------------------------------- pinned load staging --

def test_loads_into_cuda_stream_through_bounded_pinned_staging(tmp_path, monkeypatch):
    """Loads into CUDA tensors go through two buffers of
    device_staging_bytes / 2 in page-locked memory the package allocates on
    the first such load and keeps for the next (_device.LOAD_STAGING): no
    load page-locks memory of its own; the state is never staged whole (the
    Python staging buffer takes nothing); release_load_staging frees it."""
    pinned: list[int] = []
    pin_host = _device.pin_host
    monkeypatch.setattr(_device, "pin_host", lambda a, n: (pinned.append(n), pin_host(a, n)))
    staged: list[torch.Tensor] = []  # what the load put in the Python staging buffer
    borrow = _device.STAGING.borrow
    monkeypatch.setattr(_device.STAGING, "borrow", lambda ts: (staged.extend(ts), borrow(ts))[1])
    n = 8 << 20  # 32 MiB of float32
    state = {"a": torch.randn(n, device=CUDA), "b": torch.randn(n // 2, device=CUDA),
             "t": torch.randn(64, 48, device=CUDA).t()}  # a strided target too
    shardsafe.save(state, tmp_path / "s1")
    shardsafe.release_load_staging()
    before = set(_device.registered())  # an async save's arena stays registered
    addresses = []
    for _ in range(2):
        got = zeros_like(state)
        got["t"] = torch.zeros(64, 48, device=CUDA).t()
        shardsafe.load(got, tmp_path / "s1",
                       options=shardsafe.LoadOptions(device_staging_bytes=8 << 20))
        for k in state:
            assert_same_bytes(got[k], state[k], k)
        assert _device.LOAD_STAGING.nbytes == 8 << 20
        assert _device.LOAD_STAGING._buf.is_pinned()
        addresses.append(_device.LOAD_STAGING._buf.data_ptr())
    assert addresses[0] == addresses[1], "the second load allocated its staging again"
    assert not pinned, "a load page-locked memory of its own"
    assert set(_device.registered()) == before, "a load left memory registered"
    assert not staged, "CUDA targets went through the whole-state staging"
    shardsafe.load(got, tmp_path / "s1")  # the default: 256 MiB, two buffers
    assert _device.LOAD_STAGING.nbytes == 256 << 20 and not pinned
    for k in state:
        assert_same_bytes(got[k], state[k], k)
    shardsafe.release_load_staging()
    assert _device.LOAD_STAGING.nbytes == 0


def test_concurrent_saves_from_two_threads(tmp_path):
    """Two threads saving different CUDA states of the same size at once (to
    different roots: saves into one root remove each other's temporary
    directories, see the report): each checkpoint must hold its own thread's
    data, though both copy through the same extension at once."""
    n = 64 << 20  # 256 MiB of float32 per state
    states = [{"x": torch.full((n,), float(i + 1), device=CUDA)} for i in range(2)]
    errors: list[BaseException] = []
    barrier = threading.Barrier(2)

    def work(i: int) -> None:
        try:
            for r in range(3):
                barrier.wait(timeout=120)
                shardsafe.save(states[i], tmp_path / f"t{i}" / f"r{r}")
        except threading.BrokenBarrierError:
            pass  # the other thread failed
        except BaseException as e:  # noqa: BLE001
            errors.append(e)
            barrier.abort()

    threads = [threading.Thread(target=work, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, [f"{type(e).__name__}: {e}" for e in errors]
    bad = []
    for i in range(2):
        for r in range(3):
            got = {"x": torch.zeros(n, device=CUDA)}
            shardsafe.load(got, tmp_path / f"t{i}" / f"r{r}")
            wrong = int((got["x"] != float(i + 1)).sum())
            if wrong:
                bad.append(f"t{i}-r{r}: {wrong} of {n} elements are not {float(i + 1)}")
    assert not bad, "checkpoints hold the other thread's data: " + "; ".join(bad)
