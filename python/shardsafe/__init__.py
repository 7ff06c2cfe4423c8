"""shardsafe: crash-safe, resharding checkpoints for PyTorch, on a C++ engine.

    import shardsafe
    shardsafe.save({"model": model, "optim": optim, "step": step}, "/ckpt/step-100")
    shardsafe.load({"model": model, "optim": optim, "step": 0}, "/ckpt/step-100")

Tensors and DTensors (Shard / Replicate on 1-D and 2-D meshes) are saved by
pointer and loaded in place into any other layout; plain tensors that are a
rank's part of a global tensor say so with Sharded, values that differ by
rank with PerRank; see README.md, "Python".
"""

from . import peers  # other tools' checkpoints: shardsafe.peers.import_checkpoint, ...
from ._describe import describe
from ._load import load, release_load_staging
from ._manager import CheckpointManager, MemoryTier
from ._options import LoadOptions, SaveOptions
from ._save import async_save, release_async_save, reserve_async_save, save
from ._parts import PerRank, Sharded
from ._result import LoadResult
from .errors import (CheckpointExistsError, CheckpointNotFoundError, CorruptCheckpointError,
                     DTypeMismatchError, InvalidStateError, KeyMismatchError, ShapeMismatchError,
                     ShardsafeError, StorageError)

__all__ = [
    "save", "async_save", "reserve_async_save", "release_async_save", "load",
    "release_load_staging", "CheckpointManager", "MemoryTier",
    "LoadResult", "Sharded", "PerRank", "SaveOptions", "LoadOptions",
    "describe",
    "ShardsafeError", "CheckpointNotFoundError", "CheckpointExistsError", "CorruptCheckpointError",
    "ShapeMismatchError", "DTypeMismatchError", "InvalidStateError", "KeyMismatchError",
    "StorageError",
]
__version__ = "0.1.0"

