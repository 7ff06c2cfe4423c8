"""What a load hands back (shardsafe.LoadResult), for every source it reads:
shardsafe's own checkpoints, Hugging Face models and other tools'
checkpoints (shardsafe.foreign). A leaf: it imports nothing of the package."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


def as_dict(result: Any) -> dict[str, Any]:
    """An engine result (a shardsafe._C class: SaveStats, CheckpointInfo,
    ExportHfStats) as the dict the public functions return: its fields by
    name, as the binding names them (src/python/types.cc)."""
    kind = type(result)
    return {name: getattr(result, name) for name in dir(kind)
            if not name.startswith("_") and isinstance(getattr(kind, name), property)}


@dataclass
class LoadResult:
    """What load did: the checkpoint it read and the keys that did not match."""

    path: str
    tag: str
    missing_keys: list[str]
    unexpected_keys: list[str]
    metadata: Any
    bytes_read: int
    seconds: float
    # of bytes_read, read from a shared-memory ring or the page cache because
    # another rank on this machine read them too (share_reads)
    bytes_shared: int = 0
    # Every global value the checkpoint holds, by key (DeepSpeed's
    # client_state), whether or not the state asked for it.
    values: dict[str, Any] = field(default_factory=dict)
