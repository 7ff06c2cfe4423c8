"""JSON values as a checkpoint stores them (docs/format.md §6): to_json
checks and converts a value (non-finite floats as FLOAT_TAG objects),
from_json reads one back shaped after the target's value, nesting bounds
what a stored value may nest. A leaf: it imports nothing of the package
but errors."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from .errors import InvalidStateError

FLOAT_TAG = "__shardsafe_float__"  # {"__shardsafe_float__": "nan"}: a non-finite float
# What to_json writes under FLOAT_TAG (repr of each non-finite float), and
# the only tags from_json reads back.
NON_FINITE: dict[str, float] = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}


class StoredValueError(ValueError):
    """Saved JSON that no save writes (from_json); the caller names the
    checkpoint and the key (CorruptCheckpointError)."""


def join(prefix: str, name: Any) -> str:
    return f"{prefix}.{name}" if prefix else str(name)


def to_json(value: Any, key: str) -> Any:
    """`value` as JSON-able data; InvalidStateError naming `key` if it is not."""
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, int):
        if not -(2**63) <= value < 2**64:
            raise InvalidStateError(f"value at {key!r}: integer {value} does not fit in 64 bits")
        return int(value)
    if isinstance(value, float):
        return float(value) if math.isfinite(value) else {FLOAT_TAG: repr(value)}
    if isinstance(value, (list, tuple)):
        return [to_json(v, join(key, i)) for i, v in enumerate(value)]
    if isinstance(value, Mapping):
        out = {}
        for k, v in value.items():
            if not isinstance(k, (str, int)) or isinstance(k, bool):
                raise InvalidStateError(f"value at {key!r}: dict key {k!r} is not a str or int")
            out[str(k)] = to_json(v, join(key, k))
        return out
    raise InvalidStateError(
        f"value at {key!r} of type {type(value).__name__} cannot be stored as JSON; convert it, "
        f"or pass unsafe_pickle=True to store it with pickle (loading then runs pickle too)")


def from_json(stored: Any, like: Any) -> Any:
    """Saved JSON data back as Python, shaped after `like` (the target's
    value). StoredValueError for a float tag other than NON_FINITE's."""
    if isinstance(stored, dict) and set(stored) == {FLOAT_TAG}:
        return non_finite(stored[FLOAT_TAG])
    if isinstance(stored, list):
        likes = like if isinstance(like, (list, tuple)) and len(like) == len(stored) else None
        items = [from_json(s, likes[i] if likes is not None else None) for i, s in enumerate(stored)]
        if isinstance(like, tuple) and likes is not None:
            return type(like)(*items) if hasattr(like, "_fields") else type(like)(items)
        return items
    if isinstance(stored, dict):
        like_keys = {str(k): k for k in like} if isinstance(like, Mapping) else {}
        out = {}
        for k, v in stored.items():
            orig = like_keys.get(k, k)
            out[orig] = from_json(v, like[orig] if orig in like_keys.values() else None)
        return out
    if isinstance(like, float) and isinstance(stored, int) and not isinstance(stored, bool):
        return float(stored)
    return stored


def non_finite(tag: Any) -> float:
    """The float a FLOAT_TAG value names; StoredValueError for any other."""
    if isinstance(tag, str) and tag in NON_FINITE:
        return NON_FINITE[tag]
    raise StoredValueError(f"float tag {tag!r} is not one of {', '.join(map(repr, NON_FINITE))}")


MAX_NESTING = 256  # lists and dicts a stored value may nest, as in the index


def nesting(doc: Any) -> int:
    """How deeply lists and dicts nest in parsed JSON `doc` (0 for a scalar),
    counted without recursion."""
    deepest, stack = 0, [(doc, 0)]
    while stack:
        v, depth = stack.pop()
        if isinstance(v, (dict, list)):
            deepest = max(deepest, depth + 1)
            stack.extend((x, depth + 1) for x in (v.values() if isinstance(v, dict) else v))
    return deepest
