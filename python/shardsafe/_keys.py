"""How a load maps checkpoint keys to state keys (private; the public face
is shardsafe.hf): rename rules, MoE expert groups (a grouped state tensor
from per-expert checkpoint tensors and back) and FP8 block scales. The
rules are documented in shardsafe.hf."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Union

import torch

from . import _C
from .errors import InvalidStateError, ShapeMismatchError


Rename = Union[Sequence[tuple[str, str]], Mapping[str, str], Callable[[str], str], None]

FP8_BLOCK = 128  # rows and columns per scale value (DeepSeek-V3 "weight_block_size")
SCALE_SUFFIX = "_scale_inv"
_FP8_DTYPES = {"F8_E4M3"}
_SCALE_DTYPES = {"F32", "BF16", "F16"}


# ----------------------------------------------------------------- rules --

def _strip(pattern: str) -> str:
    return pattern.strip(".")


def _part_regex(pattern: str) -> re.Pattern:
    """`pattern` on whole dot-separated parts; its `*` captures the expert number."""
    body = re.escape(_strip(pattern)).replace(r"\*", r"(\d+)")
    return re.compile(r"(?:^|(?<=\.))" + body + r"(?=\.|$)")


@dataclass(frozen=True)
class ExpertGroup:
    """Per-expert tensors <-> one grouped tensor with experts on dim 0.

    ``sources``: one pattern, or several whose per-expert tensors are
    concatenated (in this order) along ``dim`` of the grouped tensor; ``*``
    stands for the expert number. ``target``: the grouped tensor's name.
    Patterns are literal text (besides ``*``) matched on whole dot-separated
    parts anywhere in a key; what comes before and after the match is kept:

        ExpertGroup(["mlp.experts.*.gate_proj.weight", "mlp.experts.*.up_proj.weight"],
                    "mlp.experts.gate_up_proj")
        # model.layers.3.mlp.experts.gate_up_proj [E, 2I, H]: [e, :I] is
        # model.layers.3.mlp.experts.<e>.gate_proj.weight [I, H], [e, I:] up_proj

    ``dim`` counts in the grouped tensor (1 = the first per-expert dim, as
    transformers' ``Concatenate(dim=1)``; negative counts from the end).
    Reading grouped -> per-expert splits ``dim`` into equal parts.
    """

    sources: str | Sequence[str]
    target: str
    dim: int = 1

    def __post_init__(self) -> None:
        sources = (self.sources,) if isinstance(self.sources, str) else tuple(self.sources)
        if not sources:
            raise InvalidStateError("ExpertGroup: no source pattern")
        for s in sources:
            if not isinstance(s, str) or _strip(s).count("*") != 1:
                raise InvalidStateError(f"ExpertGroup: source pattern {s!r} must hold exactly "
                                        f"one '*' (the expert number)")
        if not isinstance(self.target, str) or "*" in self.target or not _strip(self.target):
            raise InvalidStateError(f"ExpertGroup: target {self.target!r} must be a name "
                                    f"without '*'")
        object.__setattr__(self, "sources", sources)


# transformers 5 conversion_mapping.py: "qwen2_moe" (also qwen3_moe, deepseek_v2/v3,
# olmoe, glm4_moe, ...) and "mixtral" (also minimax; its rename .block_sparse_moe. ->
# .mlp. is a `rename` rule: (r"\.block_sparse_moe\.", ".mlp.")).
# transformers' "qwen2_moe" (also qwen3_moe, deepseek_v2/v3, olmoe, ...) and
# "mixtral" expert layouts, as the engine defines them (shardsafe/hf.h), e.g.
# ExpertGroup(["mlp.experts.*.gate_proj.weight", "mlp.experts.*.up_proj.weight"],
#             "mlp.experts.gate_up_proj").
QWEN2_MOE_EXPERTS, MIXTRAL_EXPERTS = (tuple(ExpertGroup(list(s), t, d) for s, t, d in preset)
                                      for preset in _C.expert_presets())


def renamer(rename: Rename) -> Callable[[str], str]:
    """The function from checkpoint key to state key for a `rename` argument:
    rules compiled by the engine (one regex dialect, RE2's, for loads and
    exports: shardsafe.hf), or the caller's callable."""
    if rename is None:
        return lambda key: key
    if callable(rename):
        return rename
    rules = list(rename.items()) if isinstance(rename, Mapping) else list(rename)
    for rule in rules:
        if isinstance(rule, str) or len(rule) != 2:
            raise InvalidStateError(f"rename rule {rule!r} is not a (pattern, replacement) pair")
    return _C.RenameRules([(str(p), str(r)) for p, r in rules])


# --------------------------------------------------------------- sources --

@dataclass
class Piece:
    """One engine read: a box of checkpoint tensor `key`, landing in
    `local[index]` of the state tensor (that view has shape `size`)."""

    key: str
    offset: tuple[int, ...]
    size: tuple[int, ...]
    index: tuple


class Source:
    """How one state tensor is filled from the checkpoint."""

    keys: list[str]  # every checkpoint tensor it reads (whatever the box)
    label: str  # for messages: 'tensor "state" (checkpoint "ckpt")'

    def pieces(self, offset: tuple[int, ...], size: tuple[int, ...]) -> list[Piece]:
        raise NotImplementedError


class Direct(Source):
    def __init__(self, state_key: str, key: str):
        self.keys = [key]
        self.state_key = state_key

    @property
    def label(self) -> str:  # built only for a message (one Direct per tensor per call)
        key = self.keys[0]
        return (_label(self.state_key, f"checkpoint {key!r}") if key != self.state_key
                else f'tensor "{key}"')

    def pieces(self, offset, size):
        return [Piece(self.keys[0], tuple(offset), tuple(size), ())]


class Merge(Source):
    """A grouped [E, ...] state tensor from per-expert checkpoint tensors
    keys[e][j], source j covering [lo_j, lo_j + width_j) of dim `dim`."""

    def __init__(self, state_key: str, keys: list[list[str]], widths: list[int], dim: int):
        self.grid, self.dim = keys, dim
        self.parts = [(sum(widths[:j]), w) for j, w in enumerate(widths)]
        self.keys = [k for row in keys for k in row]
        self.label = _label(state_key, "grouped from " + ", ".join(repr(k) for k in keys[0])
                            + (f" ... {keys[-1][-1]!r}" if len(keys) > 1 else ""))

    def pieces(self, offset, size):
        out = []
        n, d = len(offset), self.dim
        for e in range(offset[0], offset[0] + size[0]):
            for j, (lo, width) in enumerate(self.parts):
                o, s = list(offset[1:]), list(size[1:])
                index = [e - offset[0]] + [slice(None)] * (n - 1)
                if len(self.parts) > 1:
                    a, b = max(lo, offset[d]), min(lo + width, offset[d] + size[d])
                    if a >= b:
                        continue
                    o[d - 1], s[d - 1] = a - lo, b - a
                    index[d] = slice(a - offset[d], b - offset[d])
                out.append(Piece(self.grid[e][j], tuple(o), tuple(s), tuple(index)))
        return out


class Split(Source):
    """A per-expert state tensor from expert `expert` of a grouped checkpoint
    tensor, starting at `lo` of dim `dim` (when it is one of several parts)."""

    def __init__(self, state_key: str, key: str, expert: int, lo: int, dim: int | None):
        self.keys, self.expert, self.lo, self.dim = [key], expert, lo, dim
        self.label = _label(state_key, f"expert {expert} of {key!r}")

    def pieces(self, offset, size):
        o = [self.expert, *offset]
        if self.dim is not None:
            o[self.dim] += self.lo
        return [Piece(self.keys[0], tuple(o), (1, *size), (None,))]


def _label(state_key: str, origin: str) -> str:
    return f'tensor "{state_key}" ({origin})'


def _shape(x: Sequence[int]) -> str:
    return "[" + ", ".join(str(v) for v in x) + "]"


# --------------------------------------------------------------- key map --

class KeyMap:
    """The checkpoint's tensors seen through `rename` and `experts`."""

    def __init__(self, saved: Mapping[str, tuple], rename: Rename = None,
                 experts: Sequence[ExpertGroup] = ()):
        # {key: (dtype name, shape tuple)}: describe_source's view, or a dict.
        self.saved = saved
        self.renamed = rename is not None
        self.name = renamer(rename)
        # State key -> checkpoint key; without a rename the identity, built
        # when first used (the fast path's load never uses it).
        self._to_ckpt = None
        if self.renamed:
            self.materialize()  # every tensor takes the general path
            self._to_ckpt = self._state_keys()
        if isinstance(experts, ExpertGroup):
            experts = [experts]
        self.rules = []
        for rule in experts:
            if not isinstance(rule, ExpertGroup):
                raise InvalidStateError(f"experts: {rule!r} is not a shardsafe.hf.ExpertGroup")
            self.rules.append((rule, [_part_regex(s) for s in rule.sources],
                               _part_regex(rule.target)))

    @property
    def to_ckpt(self) -> dict[str, str]:
        if self._to_ckpt is None:
            self._to_ckpt = {k: k for k in self.saved}
        return self._to_ckpt

    def materialize(self) -> None:
        """Before the general path plans: `saved` as a dict (describe_source's
        view until then, for a load whose tensors the fast path takes all;
        the general path looks each tensor up 2-4 times)."""
        if isinstance(self.saved, _C.SavedTensors):
            self.saved = self.saved.to_dict()

    def _state_keys(self) -> dict[str, str]:
        """State key -> checkpoint key under `rename`; two keys on one name raise."""
        to_ckpt: dict[str, str] = {}
        for key in sorted(self.saved):
            new = self.name(key)
            if not isinstance(new, str) or not new:
                raise InvalidStateError(f"rename maps checkpoint key {key!r} to {new!r}")
            other = to_ckpt.setdefault(new, key)
            if other != key:
                raise InvalidStateError(f"rename maps checkpoint keys {other!r} and {key!r} both "
                                        f"to {new!r}")
        return to_ckpt

    def rename_values(self, values: Mapping[str, object]) -> dict:
        if not self.renamed:
            return dict(values)
        return {self.name(k): v for k, v in values.items()}

    def resolve(self, key: str, shape: tuple[int, ...]) -> tuple[Source | None, str | None]:
        """The source of state tensor `key` (None if the checkpoint has none)
        and, when none, a note on what was looked for. Raises
        ShapeMismatchError when a source exists but does not fit `shape`."""
        ckpt = self.to_ckpt.get(key)
        if ckpt is not None:
            src = Direct(key, ckpt)
            if ckpt != key and self.saved[ckpt][1] != shape:
                raise ShapeMismatchError(
                    f"{src.label}: shape mismatch: checkpoint has {_shape(self.saved[ckpt][1])}, "
                    f"target has {_shape(shape)}", "INVALID_ARGUMENT")
            return src, None
        for rule, source_res, target_re in self.rules:
            m = target_re.search(key)
            if m is not None and len(shape) >= 1:
                src, note = self._merge(key, shape, rule, key[:m.start()], key[m.end():])
                if src is not None or note is not None:
                    return src, note
            for j, source_re in enumerate(source_res):
                m = source_re.search(key)
                if m is not None:
                    found = self._split(key, shape, rule, j, int(m.group(1)),
                                        key[:m.start()] + _strip(rule.target) + key[m.end():])
                    if found is not None:
                        return found, None
        return None, None

    def _merge(self, key, shape, rule, prefix, suffix):
        names = [[prefix + _strip(s).replace("*", str(e)) + suffix for s in rule.sources]
                 for e in range(shape[0])]
        keys = [[self.to_ckpt.get(n) for n in row] for row in names]
        have = [k for row in keys for k in row if k is not None]
        if not have:
            return None, None
        if len(have) < len(names) * len(rule.sources):
            absent = [n for row, krow in zip(names, keys) for n, k in zip(row, krow) if k is None]
            return None, (f"{key!r}: grouped from {names[0][0]!r}...; the checkpoint lacks "
                          f"{', '.join(repr(n) for n in absent[:4])}"
                          + (f" and {len(absent) - 4} more" if len(absent) > 4 else ""))
        extra = [self.to_ckpt.get(prefix + _strip(s).replace("*", str(shape[0])) + suffix)
                 for s in rule.sources]
        d = rule.dim if rule.dim >= 0 else len(shape) + rule.dim
        multi = len(rule.sources) > 1
        src = Merge(key, keys, [0] * len(rule.sources), d)  # for its label
        if multi and not 1 <= d < len(shape):
            raise InvalidStateError(f"{src.label}: concatenation dim {rule.dim} is not a "
                                    f"per-expert dim of a {len(shape)}-d tensor")
        if any(k is not None for k in extra):
            raise ShapeMismatchError(
                f"{src.label}: shape mismatch: the checkpoint has more than {shape[0]} experts "
                f"({next(k for k in extra if k is not None)!r}), target has {_shape(shape)}",
                "INVALID_ARGUMENT")
        widths = []
        for j in range(len(rule.sources)):
            first = self.saved[keys[0][j]][1]
            for row in keys:
                if self.saved[row[j]][1] != first:
                    raise ShapeMismatchError(
                        f"{src.label}: {row[j]!r} has shape {_shape(self.saved[row[j]][1])}, "
                        f"{keys[0][j]!r} has {_shape(first)}", "INVALID_ARGUMENT")
            want = list(shape[1:])
            if multi and len(first) == len(want):
                want[d - 1] = first[d - 1]
            if list(first) != want:
                raise ShapeMismatchError(
                    f"{src.label}: shape mismatch: checkpoint has {_shape(first)} per expert for "
                    f"{keys[0][j]!r}, target has {_shape(shape)}", "INVALID_ARGUMENT")
            widths.append(first[d - 1] if multi else 0)
        if multi and sum(widths) != shape[d]:
            raise ShapeMismatchError(
                f"{src.label}: shape mismatch: the parts' dim {d - 1} sizes "
                f"{widths} add up to {sum(widths)}, target has {shape[d]} on dim {d}",
                "INVALID_ARGUMENT")
        return Merge(key, keys, widths, d), None

    def _split(self, key, shape, rule, j, expert, grouped):
        ckpt = self.to_ckpt.get(grouped)
        if ckpt is None:
            return None
        full = self.saved[ckpt][1]
        parts = len(rule.sources)
        d = rule.dim if rule.dim >= 0 else len(full) + rule.dim
        src = Split(key, ckpt, expert, 0, None)
        want = list(full[1:])
        if parts > 1:
            if not 1 <= d < len(full) or full[d] % parts:
                raise ShapeMismatchError(
                    f"{src.label}: cannot split dim {rule.dim} of {_shape(full)} into {parts} "
                    f"equal parts", "INVALID_ARGUMENT")
            want[d - 1] = full[d] // parts
        if not full or expert >= full[0] or list(shape) != want:
            raise ShapeMismatchError(
                f"{src.label}: shape mismatch: checkpoint has {_shape(full)}, target has "
                f"{_shape(shape)} as expert {expert}"
                + (f", part {j} of {parts} on dim {d}" if parts > 1 else ""),
                "INVALID_ARGUMENT")
        if parts > 1:
            return Split(key, ckpt, expert, j * want[d - 1], d)
        return src


# ------------------------------------------------------------------- FP8 --

def fp8_scale(saved: Mapping[str, tuple], key: str, target: torch.dtype) -> str | None:
    """The key of the block scales with which checkpoint tensor `key` is to be
    dequantised into a `target` tensor, or None when it is loaded as is."""
    dtype, shape = saved[key]
    if dtype not in _FP8_DTYPES or not target.is_floating_point or target.itemsize < 2:
        return None
    scale = key + SCALE_SUFFIX
    if scale not in saved:
        return None
    sdtype, sshape = saved[scale]
    want = (*shape[:-2], *(-(-n // FP8_BLOCK) for n in shape[-2:]))
    if len(shape) < 2 or tuple(sshape) != want or sdtype not in _SCALE_DTYPES:
        raise ShapeMismatchError(
            f'tensor "{key}": FP8 scales "{scale}" are {sdtype} {_shape(sshape)}; dequantising '
            f'{_shape(shape)} in {FP8_BLOCK}x{FP8_BLOCK} blocks needs F32/BF16/F16 '
            f'{_shape(want) if len(shape) >= 2 else "(a matrix)"}', "INVALID_ARGUMENT")
    return scale


def scale_box(offset: Sequence[int], size: Sequence[int]) -> tuple[tuple, tuple]:
    """The box of the scale tensor covering box (offset, size) of the weight."""
    lead_o, lead_s = list(offset[:-2]), list(size[:-2])
    o, s = [], []
    for off, n in zip(offset[-2:], size[-2:]):
        first = off // FP8_BLOCK
        o.append(first)
        s.append(-(-(off + n) // FP8_BLOCK) - first if n else 0)
    return (*lead_o, *o), (*lead_s, *s)


def dequantize(weight: torch.Tensor, scale: torch.Tensor, offset: Sequence[int]) -> torch.Tensor:
    """float32 values of an FP8 box at `offset` (of the whole weight), given
    the scale blocks that cover it (as read with scale_box)."""
    w = weight.to(torch.float32)
    if w.numel() == 0:
        return w
    s = scale.to(torch.float32)
    s = s.repeat_interleave(FP8_BLOCK, dim=-2).repeat_interleave(FP8_BLOCK, dim=-1)
    r0, c0 = offset[-2] % FP8_BLOCK, offset[-1] % FP8_BLOCK
    return w * s[..., r0:r0 + w.shape[-2], c0:c0 + w.shape[-1]]


