"""The one interface over other tools' checkpoint readers (shardsafe.foreign).

Each reader module (foreign.dcp, foreign.megatron, foreign.deepspeed,
foreign.nanotron) exports a Format as `FORMAT`: `detect(path)` says whether
a directory is one of its checkpoints (cheaply: file names and small
metadata files, never tensor data), `open(path, unsafe_pickle=...)` returns
a ForeignCheckpoint, and an optional `own_load` is the tool's own resharding
load (torch DCP's), used where it knows every target. shardsafe.load and
`shardsafe import` use nothing else of a reader.

Contract of ForeignCheckpoint:
- `tensors()` lists every tensor of the checkpoint as a global tensor:
  key -> (torch dtype, global shape), without reading tensor data. Keys are
  the names the peer's own consolidation gives them (DeepSpeed's
  zero_to_fp32, nanotron's parameter names, DCP's flattened keys).
- `read(key)` returns that whole global tensor, contiguous, on the CPU,
  bit-exact as the peer's own tools reconstruct it. It may read only the
  files that hold the key. Memory: the tensor plus a bounded overhead
  (never the whole checkpoint).
- optional `read_box(key, offset, size)`: only that box of the global
  tensor, read from the files that hold it; shardsafe.load uses it where a
  rank's targets of a key are boxes smaller than the tensor.
- `values()` returns the checkpoint's non-tensor state (step, config, RNG
  states, ...) as a nested dict of the values as saved (attribute holders
  such as argparse.Namespace as dicts: as_dicts) and small tensors. Readers
  do not clean values for JSON: the importer (shardsafe.foreign.importer) is the one
  place that drops, and reports, what JSON cannot hold.
- optional `not_imported()`: what the reader could not carry over (state it
  cannot place with certainty, files it does not read), one line each;
  `shardsafe import` prints every line.
- Errors are shardsafe.errors exceptions whose one-line message names the
  file, the key and the problem (CorruptCheckpointError for a damaged or
  inconsistent checkpoint, CheckpointNotFoundError for a missing part).
- Pickles (`.pt` files) are unpickled with torch.load(weights_only=True)
  unless the caller passed unsafe_pickle=True; never with a raw pickle.load.
  torch_load does it for every reader, with one mapping of its failures:
  a missing file is CheckpointNotFoundError, another OSError StorageError,
  a type weights_only refuses PickleRefusedError (an InvalidStateError
  naming the way out), anything else CorruptCheckpointError.
- Every file a reader reads is opened by shardsafe._files.open_read (never
  a plain open(), nor a path handed to another reader unchecked): a FIFO,
  device or directory where a file should be is an InvalidStateError
  naming it, never a read that blocks for ever; files of a checkpoint are
  opened with `within` its directory (a symbolic link leading outside it
  is refused).

checked(fc, key, t, shape, dtype) is the check every caller of `read` and
`read_box` makes: a tensor that does not have the dtype and shape listed
is a CorruptCheckpointError naming the key.

A leaf: it imports nothing of the package but shardsafe.errors.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from ..errors import CorruptCheckpointError


class ForeignCheckpoint(Protocol):
    format: str  # e.g. "DeepSpeed ZeRO-2", shown in messages
    path: str

    def tensors(self) -> dict[str, tuple[torch.dtype, tuple[int, ...]]]: ...

    def read(self, key: str) -> torch.Tensor: ...

    def values(self) -> dict[str, Any]: ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class Format:
    name: str
    detect: Callable[[str], bool]
    # open(path, unsafe_pickle=...) -> ForeignCheckpoint
    open: Callable[..., ForeignCheckpoint]
    # The tool's own load of a checkpoint into a state of any layout, where
    # every target is one it knows (no shardsafe.Sharded parts, no
    # skip_keys): own_load(state_dict, path, *, strict, process_group,
    # unsafe_pickle) -> (missing keys, unexpected keys, seconds); collective.
    # None: shardsafe's loader of foreign checkpoints (foreign.loader) reads
    # it through `open`.
    own_load: Callable[..., tuple[list[str], list[str], float]] | None = None


def checked(fc: ForeignCheckpoint, key: str, t: torch.Tensor, shape: tuple[int, ...],
             dtype: torch.dtype) -> torch.Tensor:
    """`t` as read, if it has the dtype and shape the checkpoint lists."""
    if t.dtype != dtype or tuple(t.shape) != tuple(shape):
        raise CorruptCheckpointError(f"{fc.path}: tensor {key!r} reads as {t.dtype} "
                                     f"{list(t.shape)}, its checkpoint lists {dtype} "
                                     f"{list(shape)}", "DATA_LOSS")
    return t
