"""The engine's collectives over a torch.distributed process group.

The C++ engine calls these methods (with the GIL re-acquired) from the thread
that called save or load, so every rank enters them in the same order. Byte
payloads travel as uint8 tensors: on the CPU for gloo, on the current CUDA
device for nccl.
"""

from __future__ import annotations

import functools
import json
from typing import Any, Callable

import torch
import torch.distributed as dist

from . import errors
from .errors import ShardsafeError, StorageError


def _collective(op: str) -> Callable:
    """A TorchComm method whose torch.distributed failure (a dead peer, a
    timeout) becomes a one-line StorageError naming the collective and rank."""
    def wrap(method: Callable) -> Callable:
        @functools.wraps(method)
        def call(self: "TorchComm", *args: Any) -> Any:
            try:
                return method(self, *args)
            except ShardsafeError:
                raise
            except Exception as e:  # noqa: BLE001 - torch raises RuntimeError subclasses
                first = str(e).strip().split("\n", 1)[0]
                raise StorageError(f"torch.distributed {op} failed on rank {self.rank} of "
                                   f"{self.size} (a peer may have died or timed out): "
                                   f"{type(e).__name__}: {first}", "UNAVAILABLE") from None
        return call
    return wrap


class TorchComm:
    def __init__(self, group: dist.ProcessGroup):
        self.group = group
        self.rank = dist.get_rank(group)
        self.size = dist.get_world_size(group)
        backend = str(dist.get_backend(group)).lower()
        if "nccl" in backend:
            self.device = torch.device("cuda", torch.cuda.current_device())
        else:
            self.device = torch.device("cpu")

    def _tensor(self, data: bytes, length: int) -> torch.Tensor:
        t = torch.zeros(max(length, 1), dtype=torch.uint8)
        if data:
            t[: len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
        return t.to(self.device)

    @_collective("all_gather")
    def all_gather(self, data: bytes) -> list[bytes]:
        size = torch.tensor([len(data)], dtype=torch.int64, device=self.device)
        sizes = [torch.empty_like(size) for _ in range(self.size)]
        dist.all_gather(sizes, size, group=self.group)
        lengths = [int(s.item()) for s in sizes]
        mine = self._tensor(data, max(lengths))
        parts = [torch.empty_like(mine) for _ in range(self.size)]
        dist.all_gather(parts, mine, group=self.group)
        return [p[:n].cpu().numpy().tobytes() for p, n in zip(parts, lengths)]

    @_collective("broadcast")
    def broadcast(self, data: bytes, root: int) -> bytes:
        src = dist.get_global_rank(self.group, root)
        size = torch.tensor([len(data) if self.rank == root else 0], dtype=torch.int64,
                            device=self.device)
        dist.broadcast(size, src=src, group=self.group)
        n = int(size.item())
        buf = self._tensor(data if self.rank == root else b"", n)
        dist.broadcast(buf, src=src, group=self.group)
        return buf[:n].cpu().numpy().tobytes()

    @_collective("barrier")
    def barrier(self) -> None:
        dist.barrier(group=self.group)

    @_collective("gather")
    def gather(self, data: bytes, root: int) -> list[bytes]:
        """Every rank's bytes on `root` (by rank); [] on the other ranks."""
        dst = dist.get_global_rank(self.group, root)
        size = torch.tensor([len(data)], dtype=torch.int64, device=self.device)
        longest = size.clone()
        dist.all_reduce(longest, op=dist.ReduceOp.MAX, group=self.group)
        sizes = [torch.empty_like(size) for _ in range(self.size)] if self.rank == root else None
        dist.gather(size, sizes, dst=dst, group=self.group)
        mine = self._tensor(data, int(longest.item()))
        parts = [torch.empty_like(mine) for _ in range(self.size)] if self.rank == root else None
        dist.gather(mine, parts, dst=dst, group=self.group)
        if self.rank != root:
            return []
        return [p[: int(n.item())].cpu().numpy().tobytes() for p, n in zip(parts, sizes)]

    @_collective("scatter")
    def scatter(self, parts: list[bytes] | None, root: int) -> bytes:
        """parts[r] from `root` to rank r (`parts` is read on the root only,
        one per rank); returns this rank's."""
        src = dist.get_global_rank(self.group, root)
        if self.rank == root and (parts is None or len(parts) != self.size):
            sizes = [-1] * self.size  # every rank raises
        else:
            sizes = [len(p) for p in parts] if self.rank == root else [0] * self.size
        both = torch.tensor(sizes + [max(sizes)], dtype=torch.int64, device=self.device)
        dist.broadcast(both, src=src, group=self.group)
        n, longest = int(both[self.rank]), int(both[-1])
        if n < 0:
            raise ShardsafeError(f"scatter: the root did not pass one part per rank of "
                                 f"{self.size}")
        out = torch.empty(max(longest, 1), dtype=torch.uint8, device=self.device)
        chunks = [self._tensor(p, longest) for p in parts] if self.rank == root else None
        dist.scatter(out, chunks, src=src, group=self.group)
        return out[:n].cpu().numpy().tobytes()

    @_collective("all_to_all")
    def all_to_all(self, parts: list[bytes]) -> list[bytes]:
        """parts[r] to rank r, one per rank; returns what each rank sent
        this one, by rank (all_to_all_single: the sizes first, then the
        bytes, each rank sending and receiving only its own)."""
        bad = len(parts) != self.size
        sizes = [-1] * self.size if bad else [len(p) for p in parts]
        send = torch.tensor(sizes, dtype=torch.int64, device=self.device)
        got = torch.empty_like(send)
        dist.all_to_all_single(got, send, group=self.group)
        lengths = [int(n) for n in got.cpu().tolist()]
        if bad or min(lengths) < 0:
            raise ShardsafeError(f"all_to_all: a rank did not pass one part per rank of "
                                 f"{self.size}")
        out = torch.empty(sum(lengths), dtype=torch.uint8, device=self.device)
        data = b"".join(parts)
        dist.all_to_all_single(out, self._tensor(data, len(data))[: len(data)],
                               output_split_sizes=lengths, input_split_sizes=sizes,
                               group=self.group)
        flat = out.cpu().numpy().tobytes()
        offsets = [0]
        for n in lengths:
            offsets.append(offsets[-1] + n)
        return [flat[a:b] for a, b in zip(offsets, offsets[1:])]

    @_collective("all_reduce_max")
    def all_reduce_max(self, values: list[int]) -> list[int]:
        """The elementwise maximum over all ranks of unsigned 64-bit
        `values` (int64 on the wire, the sign bit flipped to keep the
        order); every rank passes as many."""
        count = torch.tensor([len(values), -len(values)], dtype=torch.int64, device=self.device)
        dist.all_reduce(count, op=dist.ReduceOp.MAX, group=self.group)
        if int(count[0]) != -int(count[1]):
            raise ShardsafeError(f"all_reduce_max: ranks passed between {-int(count[1])} and "
                                 f"{int(count[0])} values")
        if not values:
            return []
        flip = 1 << 63
        signed = [(v ^ flip) - (1 << 64) if v ^ flip >= flip else v ^ flip for v in values]
        t = torch.tensor(signed, dtype=torch.int64, device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self.group)
        return [(int(v) + (1 << 64)) % (1 << 64) ^ flip for v in t.cpu().tolist()]


def resolve(process_group: dist.ProcessGroup | None) -> TorchComm | None:
    """The Comm for a call: the given group, else the default group when
    torch.distributed is initialised; None (one process) otherwise."""
    if process_group is None:
        if not (dist.is_available() and dist.is_initialized()):
            return None
        process_group = dist.group.WORLD
    if dist.get_world_size(process_group) == 1:
        return None
    return TorchComm(process_group)


def agree(comm: TorchComm | None, error: BaseException | None, extra: Any = None) -> list[Any]:
    """Every rank learns whether any rank failed before a collective engine
    call (so no rank is left waiting in it), and what each rank reported in
    `extra`. Re-raises this rank's own error, or names the failed rank."""
    if comm is None:
        if error is not None:
            raise error
        return [extra]
    mine = json.dumps({"error": None if error is None else _describe_error(error),
                       "extra": extra})
    reports = [json.loads(r) for r in comm.all_gather(mine.encode())]
    if error is not None:
        raise error
    for rank, r in enumerate(reports):
        if r["error"] is not None:
            raise _rank_error(rank, r["error"])
    return [r["extra"] for r in reports]


def _describe_error(error: BaseException) -> dict[str, str]:
    """What the other ranks need to raise the same class as this rank."""
    return {"message": str(error), "class": type(error).__name__,
            "code": getattr(error, "code", ""), "detail": getattr(error, "detail", "")}


def _rank_error(rank: int, e: dict[str, str]) -> ShardsafeError:
    """Rank `rank`'s failure, raised on another rank: the same shardsafe
    error class with its code and detail (a KeyMismatchError, whose
    fields are not sent, and any other exception as a ShardsafeError)."""
    message = f"rank {rank} failed: {e['message']}"
    cls = getattr(errors, e["class"], None)
    if (isinstance(cls, type) and issubclass(cls, ShardsafeError)
            and not issubclass(cls, errors.KeyMismatchError)):
        return cls(message, e["code"] or None, e["detail"])
    return ShardsafeError(message)
