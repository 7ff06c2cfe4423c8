"""The extension's device path, on the CPU: shards the engine may not read
itself, whose bytes it asks a Python copier for (src/python/device_memory.h
PyDeviceMemory, shardsafe._device). Here the "device" is host memory at
addresses with bit 47 flipped, which no CPU load accepts: a save that read a
device shard directly would crash the test. The real copier, on CUDA
tensors, is tested in tests/gpu.

Covered: sync saves (the engine's writer threads call back into Python, a
few MiB at a time) and async saves (the staging arena registered through
shardsafe._device.pin_host once and unregistered when the saver goes), the
copier released when the call returns, a failing copier's exception
reaching the caller with nothing committed, and loads into device targets
(copy_to_device from two registered staging buffers, bounded by
device_staging_bytes).
"""

from __future__ import annotations

import gc
import os
import weakref

import pytest
import torch

import shardsafe
from shardsafe import _C, _device
from shardsafe._options import LoadOptions, SaveOptions
from shardsafe.errors import ShardsafeError

FLIP = 1 << 47


STAGING_4MIB = LoadOptions(device_staging_bytes=4 << 20).engine()


def _device_call(device, **options) -> _C.SaveCall:
    """A save of nothing but `device`'s tensors ((copier, specs) or None)."""
    return _C.SaveCall([], [], "{}", "", None, SaveOptions(**options).engine(), None, device)


class FlippedDevice:
    """A copier for tensors whose addresses the engine got with bit 47
    flipped; records the copies it made."""

    def __init__(self, tensors: dict[str, torch.Tensor], fail_after: int | None = None):
        self.tensors = tensors
        self.copies: list[tuple[int, int, int]] = []
        self.fail_after = fail_after

    def specs(self) -> list[tuple]:
        return [(k, "F32" if t.dtype == torch.float32 else "BF16", tuple(t.shape),
                 (0,) * t.dim(), tuple(t.shape), t.data_ptr() ^ FLIP)
                for k, t in self.tensors.items()]

    def copy_to_host(self, copies: list[tuple[int, int, int]]) -> None:
        for dst, src, n in copies:
            if self.fail_after is not None and len(self.copies) >= self.fail_after:
                raise RuntimeError("device fell off the bus (injected)")
            host = _device._host_view(dst, n)
            host.copy_(_device._host_view(src ^ FLIP, n))
            self.copies.append((dst, src, n))


def state() -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    return {"big": torch.randn(3000, 1024),  # 12 MiB: several write buffers
            "half": torch.randn(100, 7).to(torch.bfloat16),
            "last": torch.randn(33)}


def loaded(path: str, like: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    out = {k: torch.zeros_like(v) for k, v in like.items()}
    shardsafe.load(out, path)
    return out


@pytest.mark.parametrize("direct_io", [True, False])
def test_sync_save_reads_device_shards_through_the_copier(tmp_path, direct_io):
    tensors = state()
    device = FlippedDevice(tensors)
    path = str(tmp_path / "ckpt")
    _C.save(_device_call((device, device.specs()), direct_io=direct_io,
                         io_buffer_bytes=4 << 20, max_file_bytes=4 << 20), path)
    got = loaded(path, tensors)
    for k, v in tensors.items():
        assert torch.equal(got[k], v), k
    # Every byte once, a write buffer (or the default's bounce buffer) at a time.
    assert sum(n for _, _, n in device.copies) == sum(v.numel() * v.element_size()
                                                      for v in tensors.values())
    assert max(n for _, _, n in device.copies) <= 4 << 20
    assert len(device.copies) >= 3


def test_async_save_registers_its_staging_once_and_drops_the_copier(tmp_path):
    tensors = state()
    saver = _C.AsyncSaver()
    regions = None
    for step in (1, 2):
        device = FlippedDevice(tensors)
        copier = weakref.ref(device)
        handle = saver.save(_device_call((device, device.specs())), str(tmp_path), f"s{step}")
        before = {k: v.clone() for k, v in tensors.items()}
        for v in tensors.values():
            v.fill_(7)  # the caller's memory may change once the call returns
        handle.wait()
        assert device.copies, "the engine copied nothing through the copier"
        if regions is None:  # the first save registered the arena (and keeps its DeviceMemory)
            regions = _device.registered()
            assert [v.numel() for v, _ in regions.values()] == [saver.staging_bytes]
        del device
        gc.collect()
        assert copier() is None, "the saver kept the call's copier"
        got = loaded(str(tmp_path / f"s{step}"), before)
        for k, v in before.items():
            assert torch.equal(got[k], v), (step, k)
        for k, v in before.items():
            tensors[k].copy_(v + step)
        assert _device.registered().keys() == regions.keys(), "registered again"
    del saver
    gc.collect()
    assert not _device.registered(), "the saver did not unregister its staging"


def test_a_failing_copier_fails_the_save_and_commits_nothing(tmp_path):
    tensors = state()
    device = FlippedDevice(tensors, fail_after=1)
    with pytest.raises(ShardsafeError, match="device fell off the bus") as failed:
        _C.save(_device_call((device, device.specs()), io_buffer_bytes=4 << 20),
                str(tmp_path / "sync"))
    # One line naming the tensor and the exception, not a traceback.
    assert "\n" not in str(failed.value)
    assert ('copying tensor "big" from the device: device copy failed: RuntimeError: '
            'device fell off the bus (injected)') in str(failed.value)
    saver = _C.AsyncSaver()
    device = FlippedDevice(tensors, fail_after=0)
    handle = saver.save(_device_call((device, device.specs())),
                        str(tmp_path), "async")
    with pytest.raises(ShardsafeError, match="device fell off the bus"):
        handle.wait()
    assert [n for n in os.listdir(tmp_path) if not n.startswith(".")] == [], "committed"


def test_device_copier_maps_addresses_to_the_calls_tensors():
    a, b = torch.arange(10, dtype=torch.float32), torch.arange(6, dtype=torch.int64) * 3
    copier = _device.DeviceCopier([a, b, torch.zeros(0)])
    out = torch.zeros(16, dtype=torch.uint8)
    copier.copy_to_host([(out.data_ptr(), a.data_ptr() + 4, 8),
                         (out.data_ptr() + 8, b.data_ptr() + 8, 8)])
    assert torch.equal(out[:8].view(torch.float32), a[1:3])
    assert torch.equal(out[8:].view(torch.int64), b[1:2])
    with pytest.raises(ValueError, match="no device tensor"):
        copier.copy_to_host([(out.data_ptr(), a.data_ptr() + 36, 8)])  # past a's end


@pytest.mark.parametrize("how", ["sync", "async"])
def test_tensors_back_to_back_in_one_storage_are_copied_apart(tmp_path, how):
    """Two tensors adjacent in one allocation (as CUDA's caching allocator
    places them) through the real copier, here over CPU tensors: each copy
    the engine asks for lies within one tensor, which the copier checks."""
    block = torch.randn(1000 * 1000 + 3000)
    tensors = {"p": block[:1000 * 1000].view(1000, 1000), "q": block[1000 * 1000:]}
    specs = [(k, "F32", tuple(t.shape), (0,) * t.dim(), tuple(t.shape), t.data_ptr())
             for k, t in tensors.items()]
    device = (_device.DeviceCopier(list(tensors.values())), specs)
    if how == "sync":
        _C.save(_device_call(device), str(tmp_path / how))
    else:
        _C.AsyncSaver().save(_device_call(device),
                             str(tmp_path), how).wait()
    got = loaded(str(tmp_path / how), tensors)
    for k, v in tensors.items():
        assert torch.equal(got[k], v), k


class FlippedTargets(FlippedDevice):
    """A load's copier into "device" tensors at flipped addresses; records
    the most host memory registered (pin_host) while a copy ran."""

    def __init__(self, tensors: dict[str, torch.Tensor], fail_after: int | None = None):
        super().__init__(tensors, fail_after)
        self.peak_registered = 0
        self.before = set(_device.registered())  # others' (an async saver still alive)

    def copy_to_device(self, copies: list[tuple[int, int, int]]) -> None:
        registered = {a: r for a, r in _device.registered().items() if a not in self.before}
        self.peak_registered = max(self.peak_registered,
                                   sum(v.numel() for v, _ in registered.values()))
        for dst, src, n in copies:
            if self.fail_after is not None and len(self.copies) >= self.fail_after:
                raise RuntimeError("device fell off the bus (injected)")
            assert any(a <= src and src + n <= a + v.numel() for a, (v, _) in registered.items()), \
                "a copy to the device from host memory that is not the registered staging"
            _device._host_view(dst ^ FLIP, n).copy_(_device._host_view(src, n))
            self.copies.append((dst, src, n))


def test_load_into_device_targets_streams_through_bounded_registered_staging(tmp_path):
    tensors = state()
    shardsafe.save(tensors, tmp_path / "ckpt")
    targets = {k: torch.zeros_like(v) for k, v in tensors.items()}
    device = FlippedTargets(targets)
    source = _C.open_source(str(tmp_path / "ckpt"), None)
    result = _C.load_source([], source, None, STAGING_4MIB, None,
                            (device, device.specs()))
    for k, v in tensors.items():
        assert torch.equal(targets[k], v), k
    total = sum(v.numel() * v.element_size() for v in tensors.values())
    assert sum(n for _, _, n in device.copies) == total  # every byte once
    assert 0 < device.peak_registered <= 4 << 20  # "big" alone is 12 MiB
    assert max(n for _, _, n in device.copies) <= 2 << 20
    assert set(_device.registered()) == device.before, "the load left its staging registered"
    assert result.bytes_read >= total


def test_a_failing_device_copy_fails_the_load_naming_it(tmp_path):
    tensors = state()
    shardsafe.save(tensors, tmp_path / "ckpt")
    targets = {k: torch.zeros_like(v) for k, v in tensors.items()}
    device = FlippedTargets(targets, fail_after=2)
    source = _C.open_source(str(tmp_path / "ckpt"), None)
    with pytest.raises(ShardsafeError, match="device fell off the bus"):
        _C.load_source([], source, None, STAGING_4MIB, None,
                       (device, device.specs()))
    assert set(_device.registered()) == device.before


def test_a_load_into_device_targets_stages_in_the_memory_its_copier_lends(tmp_path):
    tensors = state()
    shardsafe.save(tensors, tmp_path / "ckpt")
    source = _C.open_source(str(tmp_path / "ckpt"), None)
    raw = torch.empty((4 << 20) + 4096, dtype=torch.uint8)
    skip = -raw.data_ptr() % 4096
    lent = raw[skip:skip + (4 << 20)]  # 4 KiB aligned, as the engine asks
    start, end = lent.data_ptr(), lent.data_ptr() + lent.numel()
    for _ in range(2):  # lent again to the next load
        targets = {k: torch.zeros_like(v) for k, v in tensors.items()}
        device = FlippedTargets(targets)
        device.staging = (start, lent.numel())
        _device.pin_host(start, lent.numel())
        try:
            _C.load_source([], source, None, STAGING_4MIB, None,
                           (device, device.specs()))
        finally:
            _device.unpin_host(start, lent.numel())
        for k, v in tensors.items():
            assert torch.equal(targets[k], v), k
        assert device.peak_registered == lent.numel(), "the load registered staging of its own"
        assert all(start <= src and src + n <= end for _, src, n in device.copies)
