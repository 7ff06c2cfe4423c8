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

from . import _C
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
    """One torch.distributed call per collective for messages that fit a
    slot: each rank's bytes travel framed (an int64 length, then up to
    `slot` bytes) in a tensor of fixed size, so no round of sizes comes
    first. A message longer than the slot sends its rest in a second step
    that only the lengths in the first one decide: another all_gather or
    broadcast that every rank knows it needs, or point-to-point sends
    between the root and the ranks with a longer part (gather, scatter).
    The slot shrinks as the group grows, so that a gathered round holds at
    most SLOT_BUDGET bytes (64 KiB for up to 128 ranks, 512 bytes at 16,384)."""

    SLOT_BUDGET = 8 << 20
    SLOT_MAX = 64 << 10
    SLOT_MIN = 512
    # all_reduce_max sends up to this many values with their count in one call.
    REDUCE_SLOT = 32

    def __init__(self, group: dist.ProcessGroup, slot: int | None = None):
        self.group = group
        self.rank = dist.get_rank(group)
        self.size = dist.get_world_size(group)
        backend = str(dist.get_backend(group)).lower()
        if "nccl" in backend:
            self.device = torch.device("cuda", torch.cuda.current_device())
        else:
            self.device = torch.device("cpu")
        self.slot = slot if slot is not None else min(
            self.SLOT_MAX, max(self.SLOT_MIN, self.SLOT_BUDGET // self.size))

    def _global(self, rank: int) -> int:
        return dist.get_global_rank(self.group, rank)

    def _tensor(self, data: bytes, length: int) -> torch.Tensor:
        t = torch.zeros(max(length, 1), dtype=torch.uint8)
        if data:
            t[: len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
        return t.to(self.device)

    def _framed(self, data: bytes, length: int | None = None) -> torch.Tensor:
        """`length` (default len(data); -1 tells every receiver to raise)
        and the first `slot` bytes of `data`, in 8 + slot bytes."""
        n = len(data) if length is None else length
        return self._tensor(n.to_bytes(8, "little", signed=True) + data[: self.slot],
                            8 + self.slot)

    def _unframed(self, t: torch.Tensor) -> tuple[int, bytes]:
        """A framed message's length and the bytes of it that the slot holds."""
        raw = t.cpu().numpy().tobytes()
        n = int.from_bytes(raw[:8], "little", signed=True)
        return n, raw[8: 8 + max(0, min(n, self.slot))]

    def _rest(self, data: bytes) -> bytes:
        return data[self.slot:]

    def _received(self, length: int, src: int) -> bytes:
        buf = torch.empty(length, dtype=torch.uint8, device=self.device)
        dist.recv(buf, src=self._global(src), group=self.group)
        return buf.cpu().numpy().tobytes()

    def _send(self, data: bytes, dst: int) -> None:
        dist.send(self._tensor(data, len(data)), dst=self._global(dst), group=self.group)

    @_collective("all_gather")
    def all_gather(self, data: bytes) -> list[bytes]:
        mine = self._framed(data)
        parts = [torch.empty_like(mine) for _ in range(self.size)]
        dist.all_gather(parts, mine, group=self.group)
        got = [self._unframed(p) for p in parts]
        longest = max(n for n, _ in got) - self.slot
        if longest <= 0:
            return [head for _, head in got]
        rest = self._tensor(self._rest(data), longest)
        rests = [torch.empty_like(rest) for _ in range(self.size)]
        dist.all_gather(rests, rest, group=self.group)
        return [head + r[: max(0, n - self.slot)].cpu().numpy().tobytes()
                for (n, head), r in zip(got, rests)]

    @_collective("broadcast")
    def broadcast(self, data: bytes, root: int) -> bytes:
        buf = self._framed(data if self.rank == root else b"")
        dist.broadcast(buf, src=self._global(root), group=self.group)
        n, head = self._unframed(buf)
        if n <= self.slot:
            return head
        rest = self._tensor(self._rest(data) if self.rank == root else b"", n - self.slot)
        dist.broadcast(rest, src=self._global(root), group=self.group)
        return head + rest.cpu().numpy().tobytes()

    @_collective("barrier")
    def barrier(self) -> None:
        dist.barrier(group=self.group)

    @_collective("gather")
    def gather(self, data: bytes, root: int) -> list[bytes]:
        """Every rank's bytes on `root` (by rank); [] on the other ranks."""
        mine = self._framed(data)
        parts = [torch.empty_like(mine) for _ in range(self.size)] if self.rank == root else None
        dist.gather(mine, parts, dst=self._global(root), group=self.group)
        if self.rank != root:
            if len(data) > self.slot:
                self._send(self._rest(data), root)
            return []
        out = []
        for r, p in enumerate(parts):
            n, head = self._unframed(p)
            if n > self.slot:
                head += self._rest(data) if r == root else self._received(n - self.slot, r)
            out.append(head)
        return out

    @_collective("scatter")
    def scatter(self, parts: list[bytes] | None, root: int) -> bytes:
        """parts[r] from `root` to rank r (`parts` is read on the root only,
        one per rank); returns this rank's."""
        out = torch.empty(8 + self.slot, dtype=torch.uint8, device=self.device)
        chunks = None
        bad = self.rank == root and (parts is None or len(parts) != self.size)
        if self.rank == root:
            chunks = ([self._framed(b"", -1)] * self.size if bad
                      else [self._framed(p) for p in parts])
        dist.scatter(out, chunks, src=self._global(root), group=self.group)
        n, head = self._unframed(out)
        if n < 0:
            raise ShardsafeError(f"scatter: the root did not pass one part per rank of "
                                 f"{self.size}")
        if self.rank == root:
            for r, p in enumerate(parts):
                if r != root and len(p) > self.slot:
                    self._send(self._rest(p), r)
            return parts[root]
        return head + (self._received(n - self.slot, root) if n > self.slot else b"")

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
        order); every rank passes as many. One all_reduce carries the
        count (checked) and the first REDUCE_SLOT values; a second one the
        rest, if any."""
        n = len(values)
        flip = 1 << 63
        signed = [(v ^ flip) - (1 << 64) if v ^ flip >= flip else v ^ flip for v in values]
        head = signed[: self.REDUCE_SLOT]
        first = torch.tensor([n, -n] + head + [-flip] * (self.REDUCE_SLOT - len(head)),
                             dtype=torch.int64, device=self.device)
        dist.all_reduce(first, op=dist.ReduceOp.MAX, group=self.group)
        top = first.cpu().tolist()
        if top[0] != -top[1]:
            raise ShardsafeError(f"all_reduce_max: ranks passed between {-top[1]} and "
                                 f"{top[0]} values")
        reduced = top[2: 2 + min(n, self.REDUCE_SLOT)]
        if n > self.REDUCE_SLOT:
            rest = torch.tensor(signed[self.REDUCE_SLOT:], dtype=torch.int64, device=self.device)
            dist.all_reduce(rest, op=dist.ReduceOp.MAX, group=self.group)
            reduced += rest.cpu().tolist()
        return [(int(v) + (1 << 64)) % (1 << 64) ^ flip for v in reduced]


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
    `extra` (JSON), in one engine collective (AllGatherOrFail). Re-raises
    this rank's own error, or raises the lowest failing rank's on the
    others, as its shardsafe.errors class, named "rank N: "."""
    if comm is None:
        if error is not None:
            raise error
        return [extra]
    try:
        raw = _C.agree(comm, json.dumps(extra).encode(),
                       None if error is None else failure_of(error))
    except ShardsafeError:
        if error is not None:
            raise error from None
        raise
    return [json.loads(r) for r in raw]


def failure_of(error: BaseException) -> tuple[str, str, str]:
    """What the other ranks need to raise the same class as this rank
    (code, detail, message): an error outside shardsafe.errors as
    INVALID_ARGUMENT, its message naming its type."""
    code = getattr(error, "code", None) or "INVALID_ARGUMENT"
    detail = getattr(error, "detail", "") or ""
    message = str(error) if isinstance(error, ShardsafeError) else (
        f"{type(error).__name__}: {error}")
    return code, detail, message
