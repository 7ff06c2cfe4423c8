"""shardsafe.describe: what a checkpoint holds, read from its index alone.
A leaf over the extension: it imports nothing else of the package."""

from __future__ import annotations

import json
import os

from . import _C


def describe(path: str | os.PathLike) -> dict:
    """What a checkpoint (or safetensors file / HF directory) holds, without
    reading tensor data: {"path", "tag", "tensors": {key: (dtype, shape)}, ...}."""
    d = _C.describe(os.fspath(path))
    d["values"] = json.loads(d["values"])
    d["metadata"] = json.loads(d["metadata"])
    return d
