"""torch DCP checkpoints read through torch's own DCP reader.

A torch DCP checkpoint is a directory with ``.metadata`` and
``__R_N.distcp`` files, as torch.distributed.checkpoint, torchtitan, NeMo
AutoModel and Megatron's ``torch_dist`` write it. ``shardsafe.load`` reads
it through DCP's own reader and planner (load_dcp, the format's own_load),
or, for targets DCP does not know (shardsafe.Sharded parts, skip_keys),
through shardsafe's loader of foreign checkpoints (shardsafe.foreign.loader)
and DcpCheckpoint. Either way its files are opened by
shardsafe._files.open_read, inside the checkpoint directory.

DcpCheckpoint is the ForeignCheckpoint (shardsafe.foreign.reader) of a DCP
directory: `read(key)` and `read_box(key, offset, size)` load one tensor (or
one box of it) through DCP's reader and planner, reading only the chunks
that hold it; `values()` are the saved non-tensor items. ``.metadata`` is a
pickle that torch's reader opens (read once per DcpCheckpoint); saved values
are unpickled with ``torch.load(weights_only=True)`` (tensors, containers
and plain types only) unless ``unsafe_pickle=True``. The C++ engine never
reads a pickle.
"""

from __future__ import annotations

import contextlib
import io
import os
import time
import warnings
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint._nested_dict import unflatten_state_dict
from torch.distributed.checkpoint._traverse import set_element
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.filesystem import FileSystem
from torch.distributed.checkpoint.metadata import (ChunkStorageMetadata, Metadata, StorageMeta,
                                                   TensorStorageMetadata)
from torch.distributed.checkpoint.planner import LoadPlan
from torch.distributed.checkpoint.planner_helpers import create_read_items_for_chunk_list

from .._files import FileRefusedError, open_read
from ..errors import CorruptCheckpointError, InvalidStateError, ShardsafeError
from . import dcp_metadata
from .common import refused_global
from .dcp_metadata import DCP_METADATA
from .reader import Format


def is_dcp(path: str | os.PathLike) -> bool:
    """True for a torch DCP checkpoint directory (and not a shardsafe one)."""
    path = os.fspath(path)
    return (os.path.isfile(os.path.join(path, DCP_METADATA))
            and not os.path.exists(os.path.join(path, "shardsafe.json")))


class _Planner(DefaultLoadPlanner):
    """DCP's default load planner, whose saved values are unpickled with
    weights_only=True unless unsafe_pickle."""

    def __init__(self, strict: bool, unsafe_pickle: bool) -> None:
        super().__init__(allow_partial_load=not strict)
        self._unsafe_pickle = unsafe_pickle
        self.error: ShardsafeError | None = None  # raised here; DCP wraps what it catches

    def load_bytes(self, read_item: Any, value: Any) -> None:
        key = read_item.dest_index.fqn
        try:
            obj = torch.load(value, weights_only=not self._unsafe_pickle)
        except Exception as e:
            cls = InvalidStateError if refused_global(e) else CorruptCheckpointError
            info = (self.metadata.storage_data or {}).get(read_item.storage_index)
            where = f" in {info.relative_path}" if info is not None else ""
            self.error = cls(f"value {key!r}{where}: {unpickle_error(e)}")
            raise self.error from None
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[key], obj)
        else:
            self.state_dict[key] = obj


class _BoxPlanner(_Planner):
    """Reads one box (offset, size) of one saved tensor into the state's
    only tensor (DCP's resharding reads: only the chunks that overlap it)."""

    def __init__(self, key: str, offset: tuple[int, ...], size: tuple[int, ...]) -> None:
        super().__init__(strict=False, unsafe_pickle=False)
        self._box = (key, offset, size)

    def create_local_plan(self) -> LoadPlan:
        key, offset, size = self._box
        chunk = ChunkStorageMetadata(offsets=torch.Size(offset), sizes=torch.Size(size))
        return LoadPlan(create_read_items_for_chunk_list(key, self.metadata.state_dict_metadata[key],
                                                         [chunk]))

    def lookup_tensor(self, index: Any) -> torch.Tensor:
        # The box itself (read items address it by the box's global offset).
        return self.state_dict[index.fqn]


class _CheckedFiles(FileSystem):
    """DCP's local file system for reading, each data file opened by
    shardsafe._files.open_read (a regular file inside the checkpoint
    directory: a FIFO never blocks the read, and a `..` or a link in the
    metadata's file names never leads out of it). `error` keeps the refusal
    that DCP wraps in its own exception."""

    def __init__(self, within: str) -> None:
        super().__init__()
        self.within = within
        self.error: FileRefusedError | None = None

    @contextlib.contextmanager
    def create_stream(self, path: str | os.PathLike, mode: str) -> Iterator[io.IOBase]:
        if mode != "rb":
            raise InvalidStateError(f"{path}: a DCP checkpoint is opened to be read only")
        try:
            f = open_read(path, within=self.within)
        except FileRefusedError as e:
            self.error = e
            raise
        with f:
            yield f


class _Reader(dcp.FileSystemReader):
    """DCP's file system reader with its metadata read once, with globals
    restricted (shardsafe.foreign.dcp_metadata: torch's reader would unpickle it
    with a plain pickle.load) and checked, and its data files opened
    checked (_CheckedFiles). A DcpCheckpoint reads key by key: one DCP load
    each."""

    def __init__(self, path: str, unsafe_pickle: bool = False) -> None:
        super().__init__(path)
        self.fs = _CheckedFiles(path)
        self.metadata = dcp_metadata.read(path, unsafe_pickle=unsafe_pickle)
        if getattr(self.metadata, "storage_meta", None) is None:
            self.metadata.storage_meta = StorageMeta()
        self.metadata.storage_meta.load_id = self.load_id

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        return self.metadata


def unpickle_error(e: BaseException) -> str:
    """torch.load's failure in one line: what weights_only refused (and the
    way out), or the first line of any other error."""
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    if refused_global(e):
        cause = next((ln.removeprefix("WeightsUnpickler error:").split(". Please")[0].strip()
                      for ln in lines
                      if ln.startswith(("WeightsUnpickler error:", "Trying to load"))),
                     "a type weights_only does not allow")
        return f"torch.load(weights_only=True) refused it: {cause} (unsafe_pickle=True " \
               f"unpickles any object: only for checkpoints you trust)"
    return f"{type(e).__name__}: {lines[0] if lines else ''}"


def _one_line(e: BaseException) -> str:
    """The cause, in one line: a CheckpointException's message is every
    failed rank's traceback, whose last line names the exception."""
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    last = lines[-1] if lines else ""
    return last if isinstance(e, CheckpointException) else f"{type(e).__name__}: {last}"


def _dcp_load(state: dict, reader: dcp.FileSystemReader, planner: DefaultLoadPlanner,
              process_group: dist.ProcessGroup | None = None, alone: bool = True) -> None:
    """dcp.load, without its warning that a process loads alone."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        dcp.load(state, storage_reader=reader, planner=planner, process_group=process_group,
                 no_dist=alone)


def load_dcp(state_dict: dict, path: str | os.PathLike, *, strict: bool = True,
             process_group: dist.ProcessGroup | None = None,
             unsafe_pickle: bool = False) -> tuple[list[str], list[str], float]:
    """Loads the DCP checkpoint at `path` into `state_dict` in place, through
    torch's DCP reader and planner (any layout DCP reshards to). Returns
    (missing keys, unexpected keys, seconds). Collective over
    `process_group` when torch.distributed is initialised."""
    path = os.fspath(path)
    start = time.monotonic()
    planner = _Planner(strict, unsafe_pickle)
    alone = not (dist.is_available() and dist.is_initialized())
    reader = _Reader(path, unsafe_pickle)
    try:
        _dcp_load(state_dict, reader, planner, process_group, alone)
    except (Exception, CheckpointException) as e:  # the latter: every rank's failure
        if planner.error is not None:
            raise type(planner.error)(f"{path}: {planner.error}") from None
        if reader.fs.error is not None:
            raise reader.fs.error from None
        if isinstance(e, ShardsafeError):
            raise
        raise ShardsafeError(f"loading DCP checkpoint {path}: {_one_line(e)}") from None
    saved = set(planner.metadata.state_dict_metadata)
    wanted = set(planner.state_dict)
    return sorted(wanted - saved), sorted(saved - wanted), time.monotonic() - start


class DcpCheckpoint:
    """A torch DCP checkpoint as a ForeignCheckpoint (shardsafe.foreign.reader)."""

    format = "torch DCP"

    def __init__(self, path: str | os.PathLike, *, unsafe_pickle: bool = False) -> None:
        self.path = os.fspath(path)
        self._unsafe_pickle = unsafe_pickle
        self._reader = _Reader(self.path, unsafe_pickle)
        self.metadata = self._reader.metadata
        self._tensors = {k: (m.properties.dtype, tuple(m.size))
                         for k, m in self.metadata.state_dict_metadata.items()
                         if isinstance(m, TensorStorageMetadata)}

    def tensors(self) -> dict[str, tuple[torch.dtype, tuple[int, ...]]]:
        return dict(self._tensors)

    def read(self, key: str) -> torch.Tensor:
        dtype, shape = self._tensor(key)
        out = torch.empty(shape, dtype=dtype)
        self._load({key: out}, _Planner(strict=False, unsafe_pickle=False), [key])
        return out

    def read_box(self, key: str, offset: tuple[int, ...], size: tuple[int, ...]) -> torch.Tensor:
        """The box (offset, size) of tensor `key`, reading only its chunks."""
        dtype, shape = self._tensor(key)
        if len(offset) != len(shape) or any(o + s > n for o, s, n in zip(offset, size, shape)):
            raise InvalidStateError(f"{self.path}: tensor {key!r} of shape {list(shape)} has no "
                                    f"box at {list(offset)} of size {list(size)}")
        out = torch.empty(size, dtype=dtype)
        if out.numel():
            self._load({key: out}, _BoxPlanner(key, tuple(offset), tuple(size)), [key])
        return out

    def value_keys(self) -> list[str]:
        """The DCP keys of the saved non-tensor items."""
        return [k for k in self.metadata.state_dict_metadata if k not in self._tensors]

    def values(self, keys: list[str] | None = None) -> dict[str, Any]:
        """The saved non-tensor items (all, or those of `keys`), nested again
        along the paths DCP's planner recorded (metadata.planner_data), as
        the state that was saved held them."""
        keys = self.value_keys() if keys is None else keys
        flat: dict[str, Any] = {k: None for k in keys}
        if flat:
            self._load(flat, _Planner(strict=False, unsafe_pickle=self._unsafe_pickle), keys)
        paths = self.metadata.planner_data if isinstance(self.metadata.planner_data, dict) else {}
        return unflatten_state_dict(flat, {k: tuple(paths.get(k) or (k,)) for k in flat})

    def close(self) -> None:
        pass

    def _tensor(self, key: str) -> tuple[torch.dtype, tuple[int, ...]]:
        found = self._tensors.get(key)
        if found is None:
            raise InvalidStateError(f"{self.path}: no tensor {key!r} in this DCP checkpoint")
        return found

    def _load(self, state: dict, planner: DefaultLoadPlanner, keys: list[str]) -> None:
        self._reader.fs.error = None
        try:
            _dcp_load(state, self._reader, planner)
        except (Exception, CheckpointException) as e:
            if isinstance(planner, _Planner) and planner.error is not None:
                raise type(planner.error)(f"{self.path}: {planner.error}") from None
            if self._reader.fs.error is not None:
                raise self._reader.fs.error from None
            raise CorruptCheckpointError(
                f"{self.path}: reading {', '.join(map(repr, keys[:4]))}"
                f"{' and more' if len(keys) > 4 else ''} from {self._files(keys)}: "
                f"{_one_line(e)}", "DATA_LOSS") from None

    def _files(self, keys: list[str]) -> str:
        """The data files that hold `keys`."""
        wanted = set(keys)
        files = sorted({info.relative_path for index, info in self.metadata.storage_data.items()
                        if index.fqn in wanted})
        return ", ".join(files) if files else "(no data file)"


def _detect(path: str) -> bool:
    return is_dcp(path)


FORMAT = Format("torch DCP", _detect, DcpCheckpoint, own_load=load_dcp)
