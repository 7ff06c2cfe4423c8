"""nanotron's per-rank random states (random/tp-T-of-TT_dp-D-of-DD_pp-P-of-PP.pt,
serialize/random.py: a torch.save of nanotron.random.RandomStates, one per
process) as grouped shardsafe.PerRank values (docs/format.md §6).

The files are pickles of nanotron's own classes, which torch.load's
weights_only refuses and only nanotron can rebuild; they are carried as
they are, never unpickled here. Each becomes the per-rank value under key
RANDOM_KEY, group rank G = (P * DD + D) * TT + T (nanotron's process grid
(pp, dp, tp) in row-major order):

    {"file": "tp-T-of-TT_dp-D-of-DD_pp-P-of-PP.pt", "tp": [T, TT], "dp": [D, DD],
     "pp": [P, PP], "torch_save": U8 tensor of the file's bytes}

listed as the U8 tensor `__shardsafe__/group/G/random` (the encoded value),
so that `shardsafe import` carries it and a load into
PerRank(None, group=G) gives rank G its file back (restore with
torch.load(io.BytesIO(v["torch_save"].numpy().tobytes()), weights_only=False)
where nanotron is installed and the file is trusted). A set of files that
is not one whole grid (mixed sizes, a missing or unnamed file) is not
listed, and `scan_random` says why.
"""

from __future__ import annotations

import os
import re

import torch

from .._files import read_bytes
from .._parts import encode_per_rank, group_tensor_name

RANDOM_KEY = "random"
_NAME = re.compile(r"tp-(\d+)-of-(\d+)_dp-(\d+)-of-(\d+)_pp-(\d+)-of-(\d+)\.pt")


def scan_random(root: str) -> tuple[dict[str, tuple[str, tuple[int, ...]]], str | None]:
    """({tensor name: (file path, (T, TT, D, DD, P, PP))}, None), or ({},
    why not) when root/random holds files that are not one whole grid;
    ({}, None) without a random directory."""
    directory = os.path.join(root, "random")
    if not os.path.isdir(directory):
        return {}, None
    names = sorted(n for n in os.listdir(directory) if n.endswith(".pt"))
    found, sizes = {}, set()
    for name in names:
        m = _NAME.fullmatch(name)
        if m is None:
            return {}, _not_read(names, f"{name!r} is not named as nanotron names them")
        t, tt, d, dd, p, pp = map(int, m.groups())
        if t >= tt or d >= dd or p >= pp:
            return {}, _not_read(names, f"{name!r} names a rank outside its size")
        sizes.add((tt, dd, pp))
        g = (p * dd + d) * tt + t
        found[group_tensor_name(RANDOM_KEY, g)] = (os.path.join(directory, name),
                                                   (t, tt, d, dd, p, pp))
    if len(sizes) > 1 or (sizes and len(found) != _product(next(iter(sizes)))):
        return {}, _not_read(names, "they are not one whole tp x dp x pp grid of one size")
    return found, None


def _not_read(names: list[str], why: str) -> str:
    return f"{len(names)} per-rank RNG state file(s), not read: {why}"


def _product(sizes: tuple[int, ...]) -> int:
    n = 1
    for s in sizes:
        n *= s
    return n


def random_blob(path: str, ranks: tuple[int, ...]) -> torch.Tensor:
    """The encoded per-rank value of one random-state file (module doc), as
    the U8 tensor that is its grouped PerRank tensor."""
    t, tt, d, dd, p, pp = ranks
    data = read_bytes(path)
    value = {"file": os.path.basename(path), "tp": [t, tt], "dp": [d, dd], "pp": [p, pp],
             "torch_save": _u8(data)}
    return _u8(encode_per_rank(value, RANDOM_KEY))


def _u8(data: bytes) -> torch.Tensor:
    if not data:
        return torch.empty(0, dtype=torch.uint8)  # frombuffer refuses an empty buffer
    return torch.frombuffer(bytearray(data), dtype=torch.uint8)
