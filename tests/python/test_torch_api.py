"""The Python API in one process: round trips, values, errors, async, manager.

Every test goes through the installed package (`pip install .`): the C++
engine writes real files with fsync, and loads read them back.
"""

from __future__ import annotations

import collections
import dataclasses
import gc
import json
import math
import os
import re
import signal
import threading
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

import shardsafe
from shardsafe._state import DTYPE_NAMES
from test_interop import SUPPORTED, assert_bit_identical, random_tensor

STORABLE = {n: dt for n, dt in SUPPORTED.items() if dt in DTYPE_NAMES}
Point = collections.namedtuple("Point", "x y")


def zeros_like_state(state: dict) -> dict:
    return {k: torch.zeros_like(v) for k, v in state.items()}


def every_dtype_state(seed: int = 0) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    out = {}
    for name, dt in sorted(STORABLE.items()):
        for label, shape in {"mat": (3, 5), "vec": (7,), "scalar": (), "empty": (0, 4)}.items():
            out[f"{name.lower()}.{label}"] = random_tensor(dt, shape, gen)
    return out


def test_every_safetensors_dtype_round_trips_bit_exact(tmp_path):
    assert {"F32", "BF16", "F16", "F8_E4M3", "F8_E5M2", "I64", "U8", "BOOL"} <= set(STORABLE)
    state = every_dtype_state()
    shardsafe.save(state, tmp_path / "step-1")
    got = zeros_like_state(state)
    shardsafe.load(got, tmp_path / "step-1")
    assert_bit_identical(got, state)


def test_nested_state_with_module_optimizer_and_values(tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.GELU(), torch.nn.Linear(8, 3))
    optim = torch.optim.AdamW(model.parameters(), lr=3e-3, betas=(0.8, 0.95))
    model(torch.randn(4, 6)).square().sum().backward()
    optim.step()
    values = {"step": 12, "best": float("inf"), "worst": float("-inf"), "nan": math.nan,
              "pair": (1, 2.5), "point": Point(3, "a"), "ids": {0: "zero", 7: None},
              "note": "ünïcode", "flag": True, "big": 2**63 + 5, "lr_list": [1e-3, 2e-4]}
    state = {"model": model, "optim": optim, "extra": {"buf": [torch.arange(5), {"x": 1.5}]},
             **values}
    shardsafe.save(state, tmp_path / "step-12")

    model2 = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.GELU(), torch.nn.Linear(8, 3))
    optim2 = torch.optim.AdamW(model2.parameters(), lr=1.0)  # no state yet: created by load
    target = {"model": model2, "optim": optim2, "extra": {"buf": [torch.zeros(5, dtype=torch.int64),
                                                                  {"x": 0.0}]},
              "step": 0, "best": 0.0, "worst": 0.0, "nan": 0.0, "pair": (0, 0.0),
              "point": Point(0, ""), "ids": {0: "", 7: ""}, "note": "", "flag": False, "big": 0,
              "lr_list": []}
    result = shardsafe.load(target, tmp_path / "step-12")
    assert result.missing_keys == [] and result.unexpected_keys == []

    for (k, a), (_, b) in zip(model.state_dict().items(), model2.state_dict().items()):
        assert torch.equal(a, b), k
    sd1, sd2 = optim.state_dict(), optim2.state_dict()
    assert sd1["param_groups"] == sd2["param_groups"]
    assert isinstance(sd2["param_groups"][0]["betas"], tuple)
    for i in sd1["state"]:
        for name in ("step", "exp_avg", "exp_avg_sq"):
            assert torch.equal(sd1["state"][i][name], sd2["state"][i][name]), (i, name)
    assert torch.equal(target["extra"]["buf"][0], torch.arange(5))
    assert target["extra"]["buf"][1] == {"x": 1.5}
    for key, want in values.items():
        got = target[key]
        if key == "nan":
            assert math.isnan(got)
        else:
            assert got == want and type(got) is type(want), key
    assert target["ids"] == {0: "zero", 7: None}


def test_non_contiguous_sources_and_targets(tmp_path):
    base = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    state = {"t": base.t(), "every_other": base[:, ::2], "conj": torch.randn(3, dtype=torch.complex64).conj()}
    shardsafe.save(state, tmp_path / "c")
    got = {"t": torch.zeros(4, 6).t(), "every_other": torch.zeros(4, 6)[:, ::2],
           "conj": torch.zeros(3, dtype=torch.complex64)}
    shardsafe.load(got, tmp_path / "c")
    for k in state:
        assert torch.equal(got[k], state[k].resolve_conj()), k
    assert not got["t"].is_contiguous()


def test_lazily_conjugated_and_negated_views_as_sources_and_targets(tmp_path):
    c, x = torch.randn(5, dtype=torch.complex64), torch.randn(6)
    shardsafe.save({"c": c.conj(), "n": torch._neg_view(x)}, tmp_path / "v")
    plain = {"c": torch.zeros_like(c), "n": torch.zeros_like(x)}
    shardsafe.load(plain, tmp_path / "v")
    assert torch.equal(plain["c"], c.conj().resolve_conj()) and torch.equal(plain["n"], -x)
    # Contiguous targets whose conj/neg bit is set are filled through the view.
    views = {"c": torch.zeros_like(c).conj(), "n": torch._neg_view(torch.zeros_like(x))}
    shardsafe.load(views, tmp_path / "v")
    assert torch.equal(views["c"].resolve_conj(), plain["c"])
    assert torch.equal(views["n"].resolve_neg(), plain["n"])


def test_threads_loading_into_staged_targets_get_their_own_data(tmp_path):
    """Strided targets go through the shared host staging buffer: two
    threads at once must not see each other's bytes."""
    for i in range(2):
        shardsafe.save({"w": torch.full((512, 256), float(i + 1))}, tmp_path / f"c{i}")
    errors = []

    def run(i: int) -> None:
        try:
            for _ in range(20):
                target = {"w": torch.zeros(256, 512).t()}  # non-contiguous: staged
                shardsafe.load(target, tmp_path / f"c{i}")
                if not bool((target["w"] == i + 1).all()):
                    errors.append(f"thread {i} got another thread's data")
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(repr(e))

    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


def test_calls_leave_the_garbage_collector_as_they_found_it(tmp_path):
    # save, async_save and load pause the cyclic collector; it must come back
    # on (also after an error), and stay off for a caller who turned it off.
    state = {"w": torch.arange(6.0), "step": 3}
    assert gc.isenabled()
    shardsafe.save(state, tmp_path / "a")
    shardsafe.load(zeros_like_state({"w": state["w"]}) | {"step": 0}, tmp_path / "a")
    with pytest.raises(shardsafe.KeyMismatchError):
        shardsafe.load({"other": torch.zeros(1)}, tmp_path / "a")
    shardsafe.async_save(state, tmp_path / "b").result()
    assert gc.isenabled()
    gc.disable()
    try:
        shardsafe.save(state, tmp_path / "c")
        shardsafe.load({"w": torch.zeros(6), "step": 0}, tmp_path / "c")
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_no_collection_scans_a_calls_objects(tmp_path):
    # A call over 5,000 tensors creates an object or more per tensor. With
    # the collector paused only around the walks, a collection started as
    # soon as it came back on and scanned them all (15,000-35,000 objects);
    # with the walks' closures in reference cycles, the one after the call
    # still found 5,000 (flatten's leaves, alive until collected). Now every
    # collection around these calls finds only a few young objects.
    state = {f"t{i}": torch.zeros(4) for i in range(5000)}
    young = []

    def seen(phase: str, info: dict) -> None:
        if phase == "start" and info["generation"] == 0:
            young.append(len(gc.get_objects(0)))

    gc.collect()
    gc.callbacks.append(seen)
    try:
        shardsafe.save(state, tmp_path / "a")
        shardsafe.load(state, tmp_path / "a")
        shardsafe.async_save(state, tmp_path / "b").result()
        [object() for _ in range(2000)]  # a collection now would see what the calls left
        gc.collect(0)
    finally:
        gc.callbacks.remove(seen)
    assert young and max(young) < 500, young


def test_value_that_is_not_json_names_its_key(tmp_path):
    state = {"w": torch.ones(2), "sched": {"fn": object()}}
    with pytest.raises(shardsafe.InvalidStateError, match=r"'sched.fn'.*unsafe_pickle"):
        shardsafe.save(state, tmp_path / "x")
    assert not (tmp_path / "x").exists()


def test_unsafe_pickle_is_an_explicit_opt_in_on_both_sides(tmp_path):
    state = {"w": torch.ones(2), "obj": {1, 2, 3}}
    shardsafe.save(state, tmp_path / "p", unsafe_pickle=True)
    target = {"w": torch.zeros(2), "obj": None}
    with pytest.raises(shardsafe.InvalidStateError, match=r"'obj'.*pickle"):
        shardsafe.load(target, tmp_path / "p")
    shardsafe.load(target, tmp_path / "p", unsafe_pickle=True)
    assert target["obj"] == {1, 2, 3}


def test_missing_key_raises_before_changing_anything(tmp_path):
    shardsafe.save({"a": torch.ones(3)}, tmp_path / "s")
    target = {"a": torch.zeros(3), "b": torch.zeros(2)}
    with pytest.raises(shardsafe.KeyMismatchError, match=r"missing keys \['b'\]") as info:
        shardsafe.load(target, tmp_path / "s")
    assert info.value.missing_keys == ["b"]
    assert isinstance(info.value, KeyError)
    assert torch.equal(target["a"], torch.zeros(3)), "strict failure must not load anything"


def test_non_strict_reports_missing_and_unexpected_and_loads_the_rest(tmp_path):
    shardsafe.save({"a": torch.ones(3), "old": torch.ones(1), "epoch": 4}, tmp_path / "s")
    target = {"a": torch.zeros(3), "new": torch.zeros(2), "lr": 0.5}
    with pytest.raises(shardsafe.KeyMismatchError, match="unexpected keys"):
        shardsafe.load(target, tmp_path / "s")
    result = shardsafe.load(target, tmp_path / "s", strict=False)
    assert result.missing_keys == ["lr", "new"]
    assert result.unexpected_keys == ["epoch", "old"]
    assert torch.equal(target["a"], torch.ones(3))
    assert torch.equal(target["new"], torch.zeros(2)) and target["lr"] == 0.5


def test_shape_mismatch_names_key_and_both_shapes(tmp_path):
    shardsafe.save({"w": torch.ones(4, 3)}, tmp_path / "s")
    with pytest.raises(shardsafe.ShapeMismatchError, match=r'"w".*\[4, 3\].*\[3, 4\]') as info:
        shardsafe.load({"w": torch.zeros(3, 4)}, tmp_path / "s")
    assert isinstance(info.value, ValueError)


def test_dtype_mismatch_is_an_error_unless_conversion_is_asked_for(tmp_path):
    w = torch.randn(4, 3)
    shardsafe.save({"w": w}, tmp_path / "s")
    with pytest.raises(shardsafe.DTypeMismatchError, match=r'"w".*F32.*BF16') as info:
        shardsafe.load({"w": torch.zeros(4, 3, dtype=torch.bfloat16)}, tmp_path / "s")
    assert isinstance(info.value, TypeError)
    got = {"w": torch.zeros(4, 3, dtype=torch.bfloat16)}
    shardsafe.load(got, tmp_path / "s", convert_dtypes=True)
    assert torch.equal(got["w"], w.bfloat16())


def test_corrupt_data_file_names_file_and_tensor(tmp_path):
    shardsafe.save({"w": torch.arange(4096, dtype=torch.float32)}, tmp_path / "s")
    data = next(p for p in (tmp_path / "s").iterdir() if p.suffix == ".safetensors")
    raw = bytearray(data.read_bytes())
    raw[-100] ^= 0xFF
    data.write_bytes(bytes(raw))
    with pytest.raises(shardsafe.CorruptCheckpointError, match=rf"\"w\".*{data.name}: checksum mismatch"):
        shardsafe.load({"w": torch.zeros(4096)}, tmp_path / "s")


def test_truncated_data_file_is_a_clear_error(tmp_path):
    shardsafe.save({"w": torch.arange(4096, dtype=torch.float32)}, tmp_path / "s")
    data = next(p for p in (tmp_path / "s").iterdir() if p.suffix == ".safetensors")
    os.truncate(data, data.stat().st_size // 2)
    with pytest.raises(shardsafe.CorruptCheckpointError, match=data.name):
        shardsafe.load({"w": torch.zeros(4096)}, tmp_path / "s")


def test_checkpoint_not_found(tmp_path):
    with pytest.raises(shardsafe.CheckpointNotFoundError, match="nowhere") as info:
        shardsafe.load({"w": torch.zeros(1)}, tmp_path / "nowhere")
    assert isinstance(info.value, FileNotFoundError)


def test_save_refuses_to_replace_unless_overwrite(tmp_path):
    shardsafe.save({"w": torch.ones(2)}, tmp_path / "s")
    with pytest.raises(shardsafe.CheckpointExistsError):
        shardsafe.save({"w": torch.zeros(2)}, tmp_path / "s")
    shardsafe.save({"v": torch.full((2,), 7.0)}, tmp_path / "s", overwrite=True)
    assert set(shardsafe.describe(tmp_path / "s")["tensors"]) == {"v"}


def test_unknown_option_is_an_error(tmp_path):
    with pytest.raises(shardsafe.InvalidStateError, match="io_thread"):
        shardsafe.save({"w": torch.ones(2)}, tmp_path / "s", io_thread=3)


def test_colliding_keys_are_an_error(tmp_path):
    with pytest.raises(shardsafe.InvalidStateError, match="'a.b' appears twice"):
        shardsafe.save({"a.b": torch.ones(1), "a": {"b": torch.ones(1)}}, tmp_path / "s")


def test_async_save_snapshots_at_the_call(tmp_path):
    w = torch.randn(1 << 20)
    want = w.clone()
    fut = shardsafe.async_save({"w": w, "step": 3}, tmp_path / "step-3")
    w.mul_(-1)  # the caller trains on right away
    assert fut.result(timeout=120) == str(tmp_path / "step-3")
    assert fut.blocked_seconds >= 0
    got = {"w": torch.zeros_like(w), "step": 0}
    shardsafe.load(got, tmp_path / "step-3")
    assert torch.equal(got["w"], want) and got["step"] == 3


@pytest.fixture
def fresh_saver(monkeypatch):
    """A process-wide saver of this test's own: no staging from other tests."""
    from shardsafe import _C, _engine
    monkeypatch.setattr(_engine, "SAVER",
                        _engine.PerProcess(_C.AsyncSaver, _C.AsyncSaver.wait_pending))


def _eventually(condition, seconds: float = 60.0) -> bool:
    """Polls `condition` until it holds or `seconds` pass; its last value."""
    deadline = time.monotonic() + seconds
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.05)
    return condition()


def test_reserve_async_save_sizes_the_staging_the_saves_use(tmp_path, monkeypatch, fresh_saver):
    from shardsafe import _engine
    monkeypatch.chdir(tmp_path)  # where a stray relative write would land
    state = {"w": torch.randn(1 << 20), "b": torch.randn(3, 5), "step": 1}
    nbytes = (state["w"].numel() + state["b"].numel()) * 4
    held = shardsafe.reserve_async_save(state)
    assert nbytes <= held <= nbytes * 11 // 10 + 2 * 4096
    assert not any(tmp_path.iterdir())
    assert shardsafe.CheckpointManager(tmp_path / "root").reserve_async_save(state) == held
    for step in (1, 2):
        state["step"] = step
        shardsafe.async_save(state, tmp_path / f"step-{step}").result(timeout=120)
        assert _engine.saver().staging_bytes == held
    assert shardsafe.reserve_async_save(state) == held
    got = {"w": torch.zeros(1 << 20), "b": torch.zeros(3, 5), "step": 0}
    shardsafe.load(got, tmp_path / "step-2")
    assert torch.equal(got["w"], state["w"]) and got["step"] == 2


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_release_async_save_frees_the_staging_after_the_save_in_flight(tmp_path, fresh_saver):
    state = {"w": torch.randn(32 << 20)}  # 128 MiB
    shardsafe.release_async_save()  # nothing to release: a no-op
    before = _rss()
    assert shardsafe.reserve_async_save(state) >= 128 << 20
    assert _rss() - before >= 120 << 20  # pre-faulted
    fut = shardsafe.async_save(state, tmp_path / "a")
    shardsafe.release_async_save()  # waits for the save in flight
    assert fut.result(timeout=120) == str(tmp_path / "a")
    assert _eventually(lambda: _rss() - before < 64 << 20), \
        f"{(_rss() - before) >> 20} MiB still held"
    state["w"].mul_(2)
    shardsafe.async_save(state, tmp_path / "b").result(timeout=120)  # staging again
    got = {"w": torch.zeros(32 << 20)}
    shardsafe.load(got, tmp_path / "b")
    assert torch.equal(got["w"], state["w"])
    shardsafe.load(got, tmp_path / "a")
    assert torch.equal(got["w"], state["w"] / 2)


def test_async_save_error_at_the_call(tmp_path):
    shardsafe.save({"w": torch.ones(2)}, tmp_path / "s")
    with pytest.raises(shardsafe.ShardsafeError):
        shardsafe.async_save({"w": torch.ones(2)}, tmp_path / "s").result(timeout=60)


def test_the_async_peer_timeout_is_an_option(tmp_path):
    path = shardsafe.async_save({"w": torch.ones(2)}, tmp_path / "p",
                                peer_timeout=30).result(timeout=60)
    assert shardsafe.describe(path)["tensors"]["w"][1] == (2,)
    with pytest.raises(shardsafe.InvalidStateError, match="peer_timeout: a positive number"):
        shardsafe.async_save({"w": torch.ones(2)}, tmp_path / "q", peer_timeout="soon")


def test_checkpoint_manager_keeps_the_newest_and_loads_latest(tmp_path):
    mgr = shardsafe.CheckpointManager(tmp_path / "root", keep_last=2)
    assert mgr.latest_step() is None
    with pytest.raises(shardsafe.CheckpointNotFoundError):
        mgr.load({"w": torch.zeros(2)})
    for step in range(1, 5):
        state = {"w": torch.full((2,), float(step)), "step": step}
        if step % 2:
            mgr.save(step, state)
        else:
            assert mgr.async_save(step, state).result(timeout=120) == mgr.path(step)
    assert mgr.latest_step() == 4
    assert [c["step"] for c in mgr.list()] == [3, 4]
    got = {"w": torch.zeros(2), "step": 0}
    mgr.load(got)
    assert got["step"] == 4 and torch.equal(got["w"], torch.full((2,), 4.0))
    mgr.load(got, step=3)
    assert got["step"] == 3


def test_loads_a_safetensors_file_and_a_hugging_face_directory(tmp_path):
    tensors = {"embed.weight": torch.randn(10, 4), "head.bias": torch.randn(10)}
    save_file(tensors, tmp_path / "model.safetensors", metadata={"format": "pt"})
    got = zeros_like_state(tensors)
    shardsafe.load(got, tmp_path / "model.safetensors")
    assert_bit_identical(got, tensors)
    got = zeros_like_state(tensors)
    shardsafe.load(got, tmp_path)
    assert_bit_identical(got, tensors)


def test_metadata_round_trips(tmp_path):
    shardsafe.save({"w": torch.ones(1)}, tmp_path / "s", metadata={"run": "abc", "tp": 2})
    assert shardsafe.load({"w": torch.zeros(1)}, tmp_path / "s").metadata == {"run": "abc", "tp": 2}
    assert json.dumps(shardsafe.describe(tmp_path / "s")["metadata"]) == '{"run": "abc", "tp": 2}'


def test_resumed_training_follows_the_uninterrupted_loss_curve(tmp_path):
    def make():
        torch.manual_seed(1)
        model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
        optim = torch.optim.AdamW(model.parameters(), lr=1e-2)
        sched = torch.optim.lr_scheduler.StepLR(optim, step_size=2, gamma=0.5)
        return model, optim, sched

    def step(model, optim, sched, i):
        g = torch.Generator().manual_seed(100 + i)
        x, y = torch.randn(16, 8, generator=g), torch.randn(16, 1, generator=g)
        optim.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        optim.step()
        sched.step()
        return loss.item()

    model, optim, sched = make()
    straight = [step(model, optim, sched, i) for i in range(8)]

    model, optim, sched = make()
    resumed = [step(model, optim, sched, i) for i in range(4)]
    shardsafe.save({"model": model, "optim": optim, "sched": sched, "step": 4}, tmp_path / "step-4")
    model, optim, sched = make()  # a fresh process would start here
    state = {"model": model, "optim": optim, "sched": sched, "step": 0}
    before = [p.detach().clone() for p in model.parameters()]
    shardsafe.load(state, tmp_path / "step-4")
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))
    resumed += [step(model, optim, sched, i) for i in range(state["step"], 8)]
    assert resumed == straight


@pytest.mark.parametrize("damage", ["missing", "corrupt index"])
def test_a_checkpoint_that_cannot_be_opened_leaves_a_fresh_optimizer_as_it_was(tmp_path, damage):
    # One process walks the state while the index is opened on another thread:
    # the walk must wait for the open before it creates the optimizer's state.
    model = torch.nn.Linear(5, 4)
    optim = torch.optim.AdamW(model.parameters(), lr=0.1)
    path = tmp_path / "ck"
    if damage == "corrupt index":
        shardsafe.save({"model": model, "optim": optim}, path)
        optim.state.clear()
        (path / "shardsafe.json").write_text("{")
    error = shardsafe.CheckpointNotFoundError if damage == "missing" else shardsafe.CorruptCheckpointError
    with pytest.raises(error):
        shardsafe.load({"model": model, "optim": optim}, path)
    assert not optim.state  # no step taken, so a later first step starts from scratch


def test_loading_into_a_fresh_optimizer_creates_its_state_without_touching_parameters(tmp_path):
    from shardsafe._state import init_optimizer_state

    torch.manual_seed(3)
    model = torch.nn.Linear(5, 4)
    optim = torch.optim.AdamW(model.parameters(), lr=0.1, weight_decay=0.5)
    model.weight.grad = torch.ones_like(model.weight)
    before = [p.detach().clone() for p in model.parameters()]
    init_optimizer_state(optim)
    assert len(optim.state) == 2 and optim.param_groups[0]["lr"] == 0.1
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    assert torch.equal(model.weight.grad, torch.ones_like(model.weight)) and model.bias.grad is None


def _in_forked_child(work, timeout: float = 120.0) -> int:
    """Runs `work()` in a child forked from this process; its exit status
    (0: returned, 1: raised), or a failure if it has not exited in time."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            work()
            code = 0
        finally:
            os._exit(code)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.05)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    pytest.fail(f"the forked child hung for {timeout:.0f} s")


def test_a_forked_child_saves_with_engine_objects_of_its_own(tmp_path):
    # The parent's saver and manager own threads the child does not have:
    # the child must get its own instead of waiting on them forever.
    state = {"w": torch.arange(4096, dtype=torch.float32), "step": 1}
    shardsafe.async_save(state, tmp_path / "parent").result(timeout=120)
    mgr = shardsafe.CheckpointManager(tmp_path / "root")
    mgr.async_save(1, state).result(timeout=120)
    held = {"mgr": shardsafe.CheckpointManager(tmp_path / "other")}
    held["mgr"].async_save(1, state).result(timeout=120)

    def child():
        shardsafe.async_save(state, tmp_path / "child").result(timeout=60)
        mgr.async_save(2, state).result(timeout=60)
        mgr.wait()
        held.clear()  # a manager dropped in the child must not destroy the parent's object
        gc.collect()

    assert _in_forked_child(child) == 0
    got = {"w": torch.zeros(4096), "step": 0}
    shardsafe.load(got, tmp_path / "child")
    assert torch.equal(got["w"], state["w"])
    assert mgr.latest_step() == 2


def _threads() -> int:
    """This process's threads once the async-save futures' helper threads
    (one per save, gone soon after it) have ended and the count is steady
    (an ended Python thread leaves /proc/self/task a moment later): what
    remains is the engine's."""
    assert _eventually(lambda: not any(t.name == "shardsafe-async-wait"
                                       for t in threading.enumerate()))
    count = -1
    for _ in range(600):  # up to a minute
        now = len(os.listdir("/proc/self/task"))
        if now == count:
            return now
        count = now
        time.sleep(0.1)
    return count


def test_a_dropped_manager_frees_its_engine_object(tmp_path):
    # The engine object (copy threads, staging memory) goes with its manager,
    # once a save in flight is durable; before, exit hooks kept every one.
    # Seen by its threads (staging this small returns to the buffer cache).
    state = {"w": torch.arange(1 << 20, dtype=torch.float32)}
    shardsafe.CheckpointManager(tmp_path / "warm").async_save(0, state).result(timeout=120)
    gc.collect()
    before = _threads()
    futures = []
    for i in range(6):
        mgr = shardsafe.CheckpointManager(tmp_path / f"r{i}", keep_last=1)
        mgr.reserve_async_save(state)
        futures.append(mgr.async_save(i, state))  # the manager is dropped in flight
        del mgr
        gc.collect()
    for i, fut in enumerate(futures):
        assert fut.result(timeout=120) == str(tmp_path / f"r{i}" / f"step-{i:08d}")
    assert _eventually(lambda: _threads() <= before), \
        f"{_threads() - before} thread(s) left by dropped managers"
    got = {"w": torch.zeros(1 << 20)}
    shardsafe.CheckpointManager(tmp_path / "r5").load(got)
    assert torch.equal(got["w"], state["w"])


def test_a_manager_releases_its_engine_object_and_saves_again(tmp_path):
    state = {"w": torch.arange(1 << 20, dtype=torch.float32)}
    mgr = shardsafe.CheckpointManager(tmp_path / "root", keep_last=0)
    mgr.async_save(0, state).result(timeout=120)
    gc.collect()
    before = _threads()  # the manager's copy threads among them
    fut = mgr.async_save(1, state)
    mgr.release_async_save()  # waits for step 1
    assert mgr.latest_step() == 1 and fut.result(timeout=120) == mgr.path(1)
    assert _eventually(lambda: _threads() < before), \
        "the released engine object's threads are still there"
    state["w"].neg_()
    mgr.async_save(2, state).result(timeout=120)
    got = {"w": torch.zeros(1 << 20)}
    mgr.load(got)
    assert torch.equal(got["w"], state["w"]) and mgr.latest_step() == 2


def test_a_torch_distributed_failure_is_a_one_line_shardsafe_error(monkeypatch):
    from shardsafe._comm import TorchComm
    comm = object.__new__(TorchComm)  # as over a 4-rank group, without one
    comm.group, comm.rank, comm.size, comm.device = None, 1, 4, torch.device("cpu")
    comm.slot = 64

    def dead_peer(*args, **kwargs):
        raise RuntimeError("[gloo] Connection closed by peer [10.0.0.2]:4242\nException raised "
                           "from recvFromPeer at ...")

    for op in ("all_gather", "broadcast", "gather", "all_reduce", "scatter"):
        monkeypatch.setattr(torch.distributed, op, dead_peer)
    for call in (lambda: comm.all_gather(b"x"), lambda: comm.broadcast(b"x", 0),
                 lambda: comm.gather(b"x", 0), lambda: comm.all_reduce_max([1]),
                 lambda: comm.scatter([b"x"] * 4, 1)):
        with pytest.raises(shardsafe.StorageError) as info:
            call()
        message = str(info.value)
        assert "\n" not in message
        assert re.match(r"torch\.distributed (all_gather|broadcast|gather|all_reduce_max|scatter) failed on rank 1 of 4 \(a peer "
                        r"may have died or timed out\): RuntimeError: \[gloo\] Connection closed "
                        r"by peer \[10\.0\.0\.2\]:4242$", message), message


def test_a_uri_is_an_error_not_a_local_folder(tmp_path, monkeypatch):
    # "gs://bucket/run" must not become the local directory "gs:/bucket/run",
    # nor an s3:// URI without credentials a local one (tests/python/test_s3.py
    # has a bucket).
    monkeypatch.chdir(tmp_path)
    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(var, raising=False)
    state = {"w": torch.ones(2)}
    gs = r"gs://bucket/run\S*: no storage for gs://"
    s3 = r"s3://bucket/run\S*: S3 credentials missing: set AWS_ACCESS_KEY_ID"
    for uri, says in (("gs://bucket/run", gs), ("s3://bucket/run", s3)):
        for call in (lambda: shardsafe.save(state, f"{uri}/step-1"),
                     lambda: shardsafe.async_save(state, f"{uri}/step-2").result(timeout=120),
                     lambda: shardsafe.load(state, uri),
                     lambda: shardsafe.CheckpointManager(uri).save(1, state)):
            with pytest.raises(shardsafe.ShardsafeError, match=says):
                call()
    assert not list(tmp_path.iterdir()), "a URI was taken for a local path"


def test_an_unknown_option_names_the_closest_and_every_valid_one(tmp_path):
    shardsafe.save({"w": torch.ones(2)}, tmp_path / "c")
    with pytest.raises(shardsafe.InvalidStateError) as e:
        shardsafe.load({"w": torch.zeros(2)}, tmp_path / "c", per_rank_missing="keep")
    message = str(e.value)
    assert message.startswith("unknown option(s) per_rank_missing (did you mean "
                              "per_rank_strict?); load() takes strict, process_group, "), message
    assert ", per_rank_strict, and LoadOptions has: " in message, message
    assert "verify_checksums" in message, message
    with pytest.raises(shardsafe.InvalidStateError, match=r"\(did you mean overwrite\?\); "
                                                        r"save\(\) takes process_group"):
        shardsafe.save({"w": torch.ones(2)}, tmp_path / "d", overwite=True)


def test_the_option_classes_match_the_engines_and_refuse_a_wrong_type(tmp_path):
    """Each option is named once in C++ (src/python/types.cc) and once in
    its dataclass with its docstring: both name the same fields."""
    for cls in (shardsafe.SaveOptions, shardsafe.LoadOptions):
        fields = {f.name for f in dataclasses.fields(cls)} - cls._PYTHON_ONLY
        assert fields == cls.engine_names(), (cls.__name__, fields ^ cls.engine_names())
        for name in fields:
            assert f"{name}:" in cls.__doc__ or f"{name}," in cls.__doc__, (cls.__name__, name)
    engine = shardsafe.SaveOptions(io_threads=2, peer_timeout=5).engine()
    assert engine.io_threads == 2 and engine.overwrite is False  # the engine's default
    shardsafe.save({"w": torch.ones(2)}, tmp_path / "c")
    with pytest.raises(shardsafe.InvalidStateError, match=r"LoadOptions.io_threads: str 'x'"):
        shardsafe.load({"w": torch.zeros(2)}, tmp_path / "c", io_threads="x")
