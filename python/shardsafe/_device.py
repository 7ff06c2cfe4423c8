"""Device (GPU) tensors and host memory: the copier a save hands the engine
for its device shards, and the page-locking of the engine's staging memory.

A save passes each device tensor's address to the engine, which asks
DeviceCopier.copy_to_host for the bytes as it needs them: a synchronous save
straight into the data file's write buffers (a few MiB at a time, so the
state is never copied whole), an async save into its staging arena, which
the engine registers once through pin_host (cudaHostRegister: page-locked
memory takes device copies at the link's full rate) and unregisters through
unpin_host before freeing it. Both run on engine threads, with the GIL.
"""

from __future__ import annotations

import bisect
import contextlib
import ctypes
import threading

import torch


def _host_view(address: int, nbytes: int) -> torch.Tensor:
    """A uint8 tensor over `nbytes` of host memory at `address` (no copy)."""
    return torch.frombuffer((ctypes.c_char * nbytes).from_address(address), dtype=torch.uint8)


class _Pinned:
    """Host regions the engine registered: their views and whether CUDA
    page-locked them."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.regions: dict[int, tuple[int, torch.Tensor, bool]] = {}  # address -> (size, view, locked)
        self.starts: list[int] = []  # sorted addresses

    def find(self, address: int, nbytes: int) -> torch.Tensor | None:
        """A view of [address, address + nbytes) in a registered region, or None."""
        with self.lock:
            i = bisect.bisect_right(self.starts, address) - 1
            if i < 0:
                return None
            start = self.starts[i]
            size, view, _ = self.regions[start]
            if address + nbytes > start + size:
                return None
            return view[address - start:address - start + nbytes]


_PINNED = _Pinned()


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
    with _PINNED.lock:
        _PINNED.regions[address] = (nbytes, _host_view(address, nbytes), locked)
        bisect.insort(_PINNED.starts, address)


def unpin_host(address: int, nbytes: int) -> None:
    """Called by the engine before it frees memory it passed to pin_host."""
    with _PINNED.lock:
        entry = _PINNED.regions.pop(address, None)
        if entry is None:
            return
        _PINNED.starts.remove(address)
    if entry[2]:
        cudart = _cudart()
        if cudart is not None:
            cudart.cudaHostUnregister(address)


def is_pinned(address: int) -> bool:
    """Whether the region registered at `address` is page-locked (tests)."""
    with _PINNED.lock:
        entry = _PINNED.regions.get(address)
    return entry is not None and entry[2]


class DeviceCopier:
    """Copies the bytes of one save call's device tensors, which the engine
    names by address, into host memory. CUDA copies are queued on the stream
    that was current on the calling thread when the save began, so they
    follow the work that produced the tensors, and are waited for before
    copy_to_host returns."""

    def __init__(self, tensors: list[torch.Tensor]) -> None:
        # Each tensor (contiguous, held by the caller until the engine
        # returns) as bytes, by start address.
        spans = sorted((t.data_ptr(), t.reshape(-1).view(torch.uint8)) for t in tensors
                       if t.numel() > 0)
        self._starts = [a for a, _ in spans]
        self._bytes = [b for _, b in spans]
        self._streams = {b.device: torch.cuda.current_stream(b.device)
                         for b in self._bytes if b.device.type == "cuda"}

    def _source(self, address: int, nbytes: int) -> torch.Tensor:
        i = bisect.bisect_right(self._starts, address) - 1
        if i < 0 or address + nbytes > self._starts[i] + self._bytes[i].numel():
            raise ValueError(f"no device tensor of this save holds [{address:#x}, "
                             f"+{nbytes}) (engine bug)")
        off = address - self._starts[i]
        return self._bytes[i][off:off + nbytes]

    def copy_to_host(self, copies: list[tuple[int, int, int]]) -> None:
        by_device: dict[torch.device, list[tuple[torch.Tensor, torch.Tensor]]] = {}
        for dst, src, nbytes in copies:
            source = self._source(src, nbytes)
            host = _PINNED.find(dst, nbytes)
            if host is None:
                host = _host_view(dst, nbytes)
            by_device.setdefault(source.device, []).append((host, source))
        with torch.no_grad():
            for device, pairs in by_device.items():
                stream = self._streams.get(device)
                with torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext():
                    for host, source in pairs:
                        host.copy_(source, non_blocking=stream is not None)
                if stream is not None:
                    stream.synchronize()
