"""The engine's long-lived objects in Python: made per process (fork-safe),
waited for at exit, and the Futures of async saves; and the call wrapper
that pauses the cyclic garbage collector."""

from __future__ import annotations

import atexit
import functools
import gc
import os
import threading
import weakref
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from . import _C


def without_gc(fn: Callable) -> Callable:
    """Runs the whole call with Python's cyclic garbage collector paused. A
    call over a large state creates a few small objects per tensor, none in
    reference cycles (reference counting frees them): with 20,000 tensors
    the collector's repeated scans of them took a fifth of the call, and
    pausing only the walks was not enough: the objects alive until the call
    returns (the plan's entries, the engine's targets) made the first
    allocation after re-enabling start a collection that scanned them all,
    20-50 ms per call. They are freed when the call returns, so the
    re-enabled collector has nothing to scan. Other threads' cycles wait for
    the call to end; a collector the caller had disabled stays disabled."""

    @functools.wraps(fn)
    def paused(*args: Any, **kwargs: Any) -> Any:
        was_enabled = gc.isenabled()
        gc.disable()
        try:
            return fn(*args, **kwargs)
        finally:
            if was_enabled:
                gc.enable()

    return paused


class PerProcess:
    """An engine object made on first use in each process. The engine's
    objects own threads (the staging copy's, a save's background writer); a
    child forked from the process that made one has its memory but not its
    threads, so a save would wait on them forever, and so would destroying
    it. The child makes a new one; the inherited one is parked in
    _INHERITED, never used nor destroyed there. The object is destroyed with
    its holder (a dropped CheckpointManager frees its threads and staging
    memory, once any save in flight is durable); at exit, each live one made
    in this process finishes its save in flight."""

    def __init__(self, make: Callable[[], Any], wait: Callable[[Any], None]):
        self._make, self._wait = make, wait
        self._lock = threading.Lock()
        self._obj: Any = None
        _LIVE.add(self)

    def get(self) -> Any:
        with self._lock:
            if self._obj is None:
                self._obj = self._make()
            return self._obj

    def release(self) -> None:
        """Drops this process's object once its save in flight is over
        (raising that save's failure); the next get() makes a new one."""
        with self._lock:
            obj, self._obj = self._obj, None
        if obj is not None:
            self._wait(obj)

    def _forked(self) -> None:
        self._lock = threading.Lock()  # another thread of the parent may have held it
        if self._obj is not None:
            _INHERITED.append(self._obj)
            self._obj = None

    def _wait_at_exit(self) -> None:
        if self._obj is not None:
            self._wait(self._obj)


# Hooks for every PerProcess alive (a hook per object would keep each alive).
_LIVE: weakref.WeakSet[PerProcess] = weakref.WeakSet()
_INHERITED: list[Any] = []  # engine objects of the parent, in a forked child
os.register_at_fork(after_in_child=lambda: [p._forked() for p in list(_LIVE)])
atexit.register(lambda: [p._wait_at_exit() for p in list(_LIVE)])


SAVER = PerProcess(_C.AsyncSaver, _C.AsyncSaver.wait_pending)


def saver() -> _C.AsyncSaver:
    return SAVER.get()


def future(handle: _C.AsyncHandle, result: Any, owner: PerProcess | None = None) -> Future:
    """A Future completed (from a helper thread) when `handle` is durable.
    `owner` (a CheckpointManager's engine holder) is kept alive until then,
    so a manager dropped mid-save neither blocks nor is skipped at exit."""
    fut: Future = Future()
    fut.set_running_or_notify_cancel()
    fut.blocked_seconds = handle.blocked_seconds  # type: ignore[attr-defined]

    def wait(owner: Any) -> None:  # holds `owner` until the save is over
        try:
            handle.wait()
            fut.set_result(result)
        except BaseException as e:  # noqa: BLE001 - handed to the caller
            fut.set_exception(e)

    threading.Thread(target=wait, args=(owner,), name="shardsafe-async-wait", daemon=True).start()
    return fut


