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
    # A CheckpointManager's load: the step loaded; with a memory tier, the
    # bytes read by the tier read from ("memory", "root") and why a tier's
    # copy or the latest step was passed over (each also a UserWarning).
    step: int | None = None
    bytes_by_tier: dict[str, int] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
