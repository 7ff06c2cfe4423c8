"""Device (GPU) tensors and host memory: the copier a save or load hands the
engine for its device tensors, and the page-locking of the engine's staging
memory.

A save passes each device tensor's address to the engine, which asks
DeviceCopier.copy_to_host for the bytes as it needs them: a synchronous save
straight into the data file's write buffers (a few MiB at a time, so the
state is never copied whole), an async save into its staging arena, which
the engine registers once through pin_host (cudaHostRegister: page-locked
memory takes device copies at the link's full rate) and unregisters through
unpin_host before freeing it. A load passes each device target's address:
the engine reads their bytes into two staging buffers in turn
(LoadOptions.device_staging_bytes in all, carved from LOAD_STAGING's
page-locked memory, which is kept for the next load) and hands each to
DeviceCopier.copy_to_device while it fills the other. Both run on engine
threads, with the GIL.
"""

from __future__ import annotations

import bisect
import contextlib
import ctypes
import threading
from collections.abc import Iterable, Iterator

import torch


def _host_view(address: int, nbytes: int) -> torch.Tensor:
    """A uint8 tensor over `nbytes` of host memory at `address` (no copy)."""
    return torch.frombuffer((ctypes.c_char * nbytes).from_address(address), dtype=torch.uint8)


class _Spans:
    """uint8 views of memory (host or device) by start address: finds the
    view of a range that lies within one of them."""

    def __init__(self, views: Iterable[torch.Tensor] = ()) -> None:
        self._starts: list[int] = []
        self._views: list[torch.Tensor] = []
        for v in views:
            self.add(v)

    def add(self, view: torch.Tensor) -> None:
        i = bisect.bisect_right(self._starts, view.data_ptr())
        self._starts.insert(i, view.data_ptr())
        self._views.insert(i, view)

    def remove(self, address: int) -> torch.Tensor | None:
        """Removes the view that starts at `address`, if any, and returns it."""
        i = bisect.bisect_left(self._starts, address)
        if i == len(self._starts) or self._starts[i] != address:
            return None
        del self._starts[i]
        return self._views.pop(i)

    def find(self, address: int, nbytes: int) -> torch.Tensor | None:
        i = bisect.bisect_right(self._starts, address) - 1
        if i < 0 or address + nbytes > self._starts[i] + self._views[i].numel():
            return None
        off = address - self._starts[i]
        return self._views[i][off:off + nbytes]

    def items(self) -> list[tuple[int, torch.Tensor]]:
        return list(zip(self._starts, self._views))


# What the engine registered (pin_host), and which of it CUDA page-locked.
_LOCK = threading.Lock()
_REGISTERED = _Spans()
_LOCKED: set[int] = set()


def _cudart():
    return torch.cuda.cudart() if torch.cuda.is_available() else None


def pin_host(address: int, nbytes: int) -> None:
    """Called by the engine for memory that will take device copies again
    and again. Best effort: unlocked memory still takes copies, slower."""
    locked = False
    cudart = _cudart()
    if cudart is not None:
        try:
            locked = int(cudart.cudaHostRegister(address, nbytes, 0)) == 0
        except (RuntimeError, TypeError, ValueError):
            locked = False
    with _LOCK:
        _REGISTERED.add(_host_view(address, nbytes))
        if locked:
            _LOCKED.add(address)


def unpin_host(address: int, nbytes: int) -> None:
    """Called by the engine before it frees memory it passed to pin_host."""
    with _LOCK:
        if _REGISTERED.remove(address) is None:
            return
        locked = address in _LOCKED
        _LOCKED.discard(address)
    cudart = _cudart()
    if locked and cudart is not None:
        cudart.cudaHostUnregister(address)


def registered() -> dict[int, tuple[torch.Tensor, bool]]:
    """address -> (its view, page-locked) of each region registered now
    (tests and benchmarks)."""
    with _LOCK:
        return {a: (v, a in _LOCKED) for a, v in _REGISTERED.items()}


class DeviceCopier:
    """Copies bytes between one call's device tensors, which the engine
    names by address, and host memory: a save's copy_to_host, a load's
    copy_to_device. CUDA copies are queued on the stream that was current on
    the calling thread when the call began, so they follow the work that
    produced the tensors (a save) or precede the work that uses them (a
    load), and are waited for before the method returns."""

    def __init__(self, tensors: list[torch.Tensor],
                 staging: tuple[int, int] | None = None) -> None:
        # Page-locked host memory (address, bytes) a load stages in.
        self.staging = staging
        # Each tensor (contiguous, held by the caller until the engine
        # returns) as bytes.
        self._tensors = _Spans(t.reshape(-1).view(torch.uint8) for t in tensors if t.numel() > 0)
        self._streams = {t.device: torch.cuda.current_stream(t.device)
                         for t in tensors if t.device.type == "cuda"}

    def copy_to_host(self, copies: list[tuple[int, int, int]]) -> None:
        self._copy([(self._host(dst, n), self._device(src, n)) for dst, src, n in copies])

    def copy_to_device(self, copies: list[tuple[int, int, int]]) -> None:
        self._copy([(self._device(dst, n), self._host(src, n)) for dst, src, n in copies])

    def _device(self, address: int, nbytes: int) -> torch.Tensor:
        view = self._tensors.find(address, nbytes)
        if view is None:
            raise ValueError(f"no device tensor of this call holds [{address:#x}, +{nbytes}) "
                             f"(engine bug)")
        return view

    @staticmethod
    def _host(address: int, nbytes: int) -> torch.Tensor:
        with _LOCK:
            view = _REGISTERED.find(address, nbytes)
        return view if view is not None else _host_view(address, nbytes)

    def _copy(self, pairs: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        """dst.copy_(src) for each (dst, src), grouped by device."""
        by_device: dict[torch.device, list[tuple[torch.Tensor, torch.Tensor]]] = {}
        for dst, src in pairs:
            device = dst.device if dst.device.type != "cpu" else src.device
            by_device.setdefault(device, []).append((dst, src))
        with torch.no_grad():
            for device, group in by_device.items():
                stream = self._streams.get(device)
                with torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext():
                    for dst, src in group:
                        dst.copy_(src, non_blocking=stream is not None)
                if stream is not None:
                    stream.synchronize()


class HostStaging:
    """Host memory that a load reads into for CPU targets the engine cannot
    fill in place (strided, lazily negated or conjugated), allocated once and
    grown when a call needs more, reused across calls (never re-faulted).
    Device targets do not come here: the engine stages them itself, bounded
    (DeviceCopier.copy_to_device)."""

    ALIGN = 64

    def __init__(self) -> None:
        self._buf: torch.Tensor | None = None
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def borrow(self, tensors: list[torch.Tensor]) -> Iterator[list[torch.Tensor]]:
        """A host view per tensor (same shape and dtype), contiguous, backed
        by the pinned buffer, which no other thread gets until the block
        ends: keep it open until the engine is done with the views."""
        if not tensors:
            yield []
            return
        with self._lock:
            yield self._views(tensors)

    def _views(self, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
        offsets, total = [], 0
        for t in tensors:
            offsets.append(total)
            total += -(-t.numel() * t.element_size() // self.ALIGN) * self.ALIGN
        if self._buf is None or self._buf.numel() < total:
            self._buf = torch.empty(total, dtype=torch.uint8)
        out = []
        for t, off in zip(tensors, offsets):
            n = t.numel() * t.element_size()
            out.append(self._buf[off:off + n].view(t.dtype).view(t.shape))
        return out


STAGING = HostStaging()


class LoadStaging:
    """Page-locked host memory that loads into CUDA tensors stage their bytes
    in (device_staging_bytes), allocated by the first such load and kept for
    the next: page-locking it again on every load costs about as much as
    reading a third of what it stages (0.08 s of a 2 GiB load on an H200).
    One load at a time uses it; a load that finds it in use, or that cannot
    allocate it, gets None (the engine then allocates and registers its
    own). release() frees it."""

    def __init__(self) -> None:
        self._buf: torch.Tensor | None = None
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def borrow(self, nbytes: int) -> Iterator[tuple[int, int] | None]:
        """(address, bytes) of at least `nbytes`, page-locked, for the block."""
        if not self._lock.acquire(blocking=False):
            yield None
            return
        try:
            if self._buf is None or self._buf.numel() < nbytes:
                self._drop()
                try:
                    self._buf = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
                except RuntimeError:  # no page-locked memory to be had
                    self._buf = None
            yield None if self._buf is None else (self._buf.data_ptr(), self._buf.numel())
        finally:
            self._lock.release()

    def release(self) -> None:
        """Frees the memory, once a load in progress has ended."""
        with self._lock:
            self._drop()

    def _drop(self) -> None:
        """Drops the buffer and empties torch's cache of page-locked blocks,
        where it went, so that the memory goes back to the system."""
        if self._buf is None:
            return
        self._buf = None
        empty = (getattr(torch._C, "_accelerator_emptyHostCache", None)
                 or getattr(torch._C, "_host_emptyCache", None))
        if empty is not None:
            empty()

    @property
    def nbytes(self) -> int:
        buf = self._buf
        return 0 if buf is None else buf.numel()


LOAD_STAGING = LoadStaging()

