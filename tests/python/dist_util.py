"""Runs a test body on N processes with torch.distributed (gloo, CPU).

    def _body(rank, world, tmp):     # module level, so spawn can import it
        ...                          # dist is initialised here
    def test_x(tmp_path):
        run_workers(_body, 4, str(tmp_path))

A failure on any rank fails the test with that rank's traceback; the other
ranks are terminated, and a collective that never completes times out.
"""

from __future__ import annotations

import datetime
import faulthandler
import gc
import os
import tempfile
from typing import Any, Callable

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

COLLECTIVE_TIMEOUT = datetime.timedelta(seconds=180)


def _entry(rank: int, fn: Callable, world: int, init_file: str, args: tuple) -> None:
    faulthandler.enable()  # a rank killed by a signal prints where it was
    torch.set_num_threads(1)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank,
                            world_size=world, timeout=COLLECTIVE_TIMEOUT)
    try:
        fn(rank, world, *args)
        dist.barrier()
    finally:
        dist.destroy_process_group()
        # A group stays alive while something refers to it, and a test's
        # `pytest.raises(...) as info` is a reference cycle (the traceback
        # holds the frames, their locals the Comm, the Comm the group) that
        # only the collector frees. Left to interpreter exit, gloo's worker
        # thread may drop its last tensor there and abort taking the GIL
        # ("terminate called without an active exception"); collected here,
        # the group's destructor joins its threads first.
        gc.collect()


def run_workers(fn: Callable, world: int, *args: Any) -> None:
    """Calls fn(rank, world, *args) in `world` processes joined by gloo."""
    with tempfile.TemporaryDirectory() as d:
        mp.spawn(_entry, args=(fn, world, os.path.join(d, "init"), args), nprocs=world, join=True)
