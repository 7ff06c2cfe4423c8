"""Checkpoints written by other tools, read through those tools' own readers.

torch DCP (a directory with ``.metadata`` and ``__R_N.distcp`` files, as
torch.distributed.checkpoint, torchtitan, NeMo AutoModel and Megatron's
``torch_dist`` write it): ``shardsafe.load(state, path)`` loads one into
any layout (DCP's own reader and planner reshard it), and
``import_checkpoint(src, dst)`` (``shardsafe import SRC DST``, ``python -m
shardsafe import SRC DST``) converts it into a shardsafe checkpoint. Its
``.metadata`` and saved values are pickles: torch's DCP reader opens them,
and values are unpickled with ``torch.load(weights_only=True)`` (tensors,
containers and plain types only) unless ``unsafe_pickle=True``. The C++
engine never reads a pickle.
"""

from __future__ import annotations

import os
import time
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint._traverse import set_element
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.metadata import TensorStorageMetadata

from ._save import save
from .errors import CheckpointExistsError, CheckpointNotFoundError, ShardsafeError

DCP_METADATA = ".metadata"


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

    def load_bytes(self, read_item: Any, value: Any) -> None:
        key = read_item.dest_index.fqn
        try:
            obj = torch.load(value, weights_only=not self._unsafe_pickle)
        except Exception as e:  # torch's unpickler refuses a type
            raise ShardsafeError(f"value {key!r}: {type(e).__name__}: {str(e).splitlines()[0]} "
                                 f"(unsafe_pickle=True unpickles any object)") from None
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[key], obj)
        else:
            self.state_dict[key] = obj


def _one_line(e: BaseException) -> str:
    """The cause, in one line: a CheckpointException's message is every
    failed rank's traceback, whose last line names the exception."""
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    last = lines[-1] if lines else ""
    return last if isinstance(e, CheckpointException) else f"{type(e).__name__}: {last}"


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
    no_dist = not (dist.is_available() and dist.is_initialized())
    try:
        dcp.load(state_dict, storage_reader=dcp.FileSystemReader(path), planner=planner,
                 process_group=process_group, no_dist=no_dist)
    except ShardsafeError:
        raise
    except (Exception, CheckpointException) as e:  # the latter: every rank's failure
        raise ShardsafeError(f"loading DCP checkpoint {path}: {_one_line(e)}") from None
    saved = set(planner.metadata.state_dict_metadata)
    wanted = set(planner.state_dict)
    return sorted(wanted - saved), sorted(saved - wanted), time.monotonic() - start


def _nest(flat: dict[str, Any], paths: Any) -> dict[str, Any]:
    """The state DCP flattened, nested again along the paths its planner
    recorded (metadata.planner_data: key -> path of dict keys), so that a
    saved dict value ("extra": {"lr": ...}) is one value again, as
    shardsafe.save and load see it. Keys without a path of strings stay flat."""
    out: dict[str, Any] = {}
    for key, value in flat.items():
        path = paths.get(key) if isinstance(paths, dict) else None
        if not path or not all(isinstance(p, str) for p in path):
            path = (key,)
        node = out
        for p in path[:-1]:
            node = node.setdefault(p, {})
        node[path[-1]] = value
    return out


def import_checkpoint(src: str | os.PathLike, dst: str | os.PathLike, *,
                      unsafe_pickle: bool = False, overwrite: bool = False) -> dict:
    """Converts the DCP checkpoint at `src` into a one-rank shardsafe
    checkpoint at `dst`: every tensor whole (under its DCP key), every saved
    value as a value. Returns {"tensors", "values", "bytes"}. Reads the whole
    state into memory."""
    src, dst = os.fspath(src), os.fspath(dst)
    if not is_dcp(src):
        raise CheckpointNotFoundError(f"no torch DCP checkpoint ({DCP_METADATA}) in {src}")
    if os.path.exists(dst) and not overwrite:
        raise CheckpointExistsError(f"checkpoint {dst} already exists")
    metadata = dcp.FileSystemReader(src).read_metadata()
    state: dict[str, Any] = {}
    nbytes = 0
    for key, m in metadata.state_dict_metadata.items():
        if isinstance(m, TensorStorageMetadata):
            state[key] = torch.empty(m.size, dtype=m.properties.dtype)
            nbytes += state[key].numel() * state[key].element_size()
        else:
            state[key] = None  # a saved value: the load puts it here
    missing, _, _ = load_dcp(state, src, unsafe_pickle=unsafe_pickle)
    assert not missing, missing  # every key came from the metadata
    state = _nest(state, metadata.planner_data)
    save(state, dst, overwrite=overwrite)
    tensors = sum(isinstance(m, TensorStorageMetadata)
                  for m in metadata.state_dict_metadata.values())
    return {"tensors": tensors, "values": len(metadata.state_dict_metadata) - tensors,
            "bytes": nbytes}
