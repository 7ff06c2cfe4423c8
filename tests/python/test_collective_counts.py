"""How many torch.distributed calls a save and a load make on a 2-rank gloo
job, counted on every rank by wrapping torch.distributed's functions (the
sequence each step makes is in docs/design.md, "Collectives per call").
Every call is latency the whole job waits for at thousands of ranks."""

from __future__ import annotations

import collections

import torch
import torch.distributed as dist

import shardsafe
from dist_util import run_workers

COUNTED = ("all_gather", "all_gather_object", "all_gather_into_tensor", "all_reduce",
           "all_to_all", "all_to_all_single", "barrier", "broadcast", "broadcast_object_list",
           "gather", "gather_object", "recv", "reduce", "scatter", "scatter_object_list",
           "send")
# docs/design.md's targets: a save that plans a new layout, a save of an
# unchanged one (its plan cached), a load without shared page-cache rings.
TARGETS = {"save, new layout": 8, "save, same layout": 6, "load": 4}


class _Counter:
    """Wraps torch.distributed's collective and point-to-point functions,
    counting calls by name (a test double that counts, nothing else)."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        for name in COUNTED:
            real = getattr(dist, name)

            def counted(*args, _real=real, _name=name, **kwargs):
                self.calls.append(_name)
                return _real(*args, **kwargs)
            setattr(dist, name, counted)

    def during(self, fn) -> list[str]:
        self.calls.clear()
        fn()
        return list(self.calls)


def _counts_body(rank, world, tmp):
    counter = _Counter()
    state = {"w": shardsafe.Sharded(torch.full((4, 8), float(rank)), shape=(8, 8),
                                    offset=(4 * rank, 0)),
             "b": torch.arange(8.0), "step": 3, "names": ["a", "b"]}
    seen = {
        "save, new layout": counter.during(lambda: shardsafe.save(state, f"{tmp}/one")),
        "save, same layout": counter.during(lambda: shardsafe.save(state, f"{tmp}/two")),
    }
    mine = torch.zeros(4, 8)
    loaded = {"w": shardsafe.Sharded(mine, shape=(8, 8), offset=(4 * rank, 0)),
              "b": torch.zeros(8), "step": 0, "names": []}
    seen["load"] = counter.during(lambda: shardsafe.load(loaded, f"{tmp}/one",
                                                         share_reads=False))
    assert torch.equal(mine, torch.full((4, 8), float(rank)))
    assert loaded["step"] == 3 and loaded["names"] == ["a", "b"]
    for what, calls in seen.items():
        assert calls, f"rank {rank}: {what} made no torch.distributed call"
        assert len(calls) <= TARGETS[what], (
            f"rank {rank}: {what}: {len(calls)} torch.distributed calls, target "
            f"{TARGETS[what]}: {collections.Counter(calls)} in order {calls}")


def test_save_and_load_stay_within_their_torch_distributed_call_targets(tmp_path):
    run_workers(_counts_body, 2, str(tmp_path))
