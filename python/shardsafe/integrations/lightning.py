"""PyTorch Lightning checkpoints as shardsafe checkpoints: CheckpointIO plugins.

    import lightning as L
    from lightning.pytorch.callbacks import ModelCheckpoint
    from shardsafe.integrations.lightning import ShardsafeAsyncCheckpointIO

    trainer = L.Trainer(plugins=[ShardsafeAsyncCheckpointIO()],
                        callbacks=[ModelCheckpoint(dirpath="/ckpt/run1", save_top_k=2, ...)])
    trainer.fit(model, ckpt_path="/ckpt/run1/epoch=0-step=100.ckpt")  # resume
    trainer.fit(model, ckpt_path="/old/epoch=3.ckpt")   # a torch.save file still loads

``ShardsafeCheckpointIO`` saves each checkpoint Lightning hands it (the dict
of ``Trainer.save_checkpoint`` / ``ModelCheckpoint``, or ``Fabric.save``) as
a shardsafe checkpoint directory at the path Lightning names (``...ckpt``
is then a directory: committed atomically, checksummed, readable with
``shardsafe.load`` / ``shardsafe describe``); a save to an existing path
replaces it, as Lightning expects. ``ShardsafeAsyncCheckpointIO`` returns
once the tensors are staged in host memory (``shardsafe.async_save``) and
writes in the background, one save in flight: the next save, a load, a
removal of the checkpoint being written and the trainer's teardown wait
for it and raise its failure. A save to an existing path (``last.ckpt``)
replaces it synchronously.

What is stored: each tensor (dense, of a dtype shardsafe stores) as a
tensor under its path in the dict joined with dots
(``state_dict.layer.weight``, ``optimizer_states.0.state.0.exp_avg``),
and the structure with its plain values (dicts and OrderedDicts with str
or int keys, lists, tuples, str, int, float, bool, None) as the JSON value
``lightning_checkpoint``; a load returns the same structure (types, key
order, a state dict's ``_metadata``). Any other object (a custom
hyperparameter, a sparse tensor) is stored as ``torch.save`` bytes (a U8
tensor) and loaded with ``torch.load(weights_only=True)`` unless Lightning
passes ``weights_only=False`` (a checkpoint you trust), as Lightning's own
``TorchCheckpointIO`` does. Tensors load onto the CPU, or the device
``map_location`` names (a device or a string; other forms are an error).

Lightning saves on global rank 0 alone and loads on every rank
independently, so each call is this process's own: under
torch.distributed the plugin uses a process group of this rank alone
(made once per process, by this rank only). ``storage_options`` of
``Trainer.save_checkpoint`` may be a ``shardsafe.SaveOptions`` or a dict of
its fields, applied on top of the plugin's (``ShardsafeCheckpointIO(
direct_io=False)``).

``LightningModule.load_from_checkpoint`` reads files with ``torch.load``
and never asks the plugin: load a weights-only model from such a
checkpoint with ``ShardsafeCheckpointIO().load_checkpoint(path)
["state_dict"]``, or pass ``ckpt_path=`` to ``fit`` / ``validate`` /
``test`` / ``predict``.
"""

from __future__ import annotations

import collections
import io
import os
import secrets
import shutil
from concurrent.futures import Future
from typing import Any

import torch

from . import require

require("lightning", "lightning", "shardsafe.integrations.lightning")

import torch.distributed as dist  # noqa: E402
from lightning.fabric.plugins import CheckpointIO  # noqa: E402
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO  # noqa: E402

from .. import _paths  # noqa: E402
from .._describe import describe  # noqa: E402
from .._files import fd_path, open_read  # noqa: E402
from .._load import load  # noqa: E402
from .._options import SaveOptions  # noqa: E402
from .._save import async_save, release_async_save, save  # noqa: E402
from .._state import DTYPE_NAMES, RESERVED_KEY, TORCH_DTYPES  # noqa: E402
from ..errors import InvalidStateError  # noqa: E402

__all__ = ["ShardsafeCheckpointIO", "ShardsafeAsyncCheckpointIO", "encode", "decode"]

LAYOUT_KEY = "lightning_checkpoint"  # the JSON value holding the structure
FORMAT = 1
_TAGS = ("tensor", "float", "list", "tuple", "dict", "odict", "object")


# ---------------------------------------------------------------- codec --

class _Encoded:
    """A checkpoint dict split into named tensors and a JSON layout."""

    def __init__(self) -> None:
        self.tensors: dict[str, torch.Tensor] = {}
        self.objects: list[str] = []  # keys of the U8 tensors holding torch.save bytes

    def name(self, path: list[Any]) -> str:
        """A fresh tensor key for `path`: its names joined with dots, with
        "#N" added where that key is taken (or is a key of our own)."""
        base = ".".join(map(str, path)) or "_"
        key, n = base, 1
        while key in self.tensors or key in (LAYOUT_KEY, RESERVED_KEY):
            n += 1
            key = f"{base}#{n}"
        return key

    def node(self, x: Any, path: list[Any]) -> Any:
        """`x` as tagged JSON (see encode)."""
        if _is_plain_tensor(x):
            key = self.name(path)
            self.tensors[key] = x.detach()
            return {"tensor": key}
        if x is None or type(x) in (bool, str):
            return x
        if type(x) is int and -(2**63) <= x < 2**64:
            return x
        if type(x) is float:
            return x if x == x and abs(x) != float("inf") else {"float": repr(x)}
        if type(x) in (list, tuple):
            return {type(x).__name__: [self.node(v, [*path, i]) for i, v in enumerate(x)]}
        if type(x) in (dict, collections.OrderedDict) and all(
                type(k) in (str, int) for k in x):
            out: dict[str, Any] = {"dict" if type(x) is dict else "odict":
                                   [[k, self.node(v, [*path, k])] for k, v in x.items()]}
            meta = getattr(x, "_metadata", None)
            if meta is not None:  # a module state dict's versions (load_state_dict reads them)
                out["metadata"] = self.node(meta, [*path, "_metadata"])
            return out
        key = self.name(path)
        buf = io.BytesIO()
        torch.save(x, buf)
        self.tensors[key] = torch.frombuffer(bytearray(buf.getvalue()), dtype=torch.uint8)
        self.objects.append(key)
        return {"object": key}


def _is_plain_tensor(x: Any) -> bool:
    return (type(x) in (torch.Tensor, torch.nn.Parameter) and x.layout == torch.strided
            and x.dtype in DTYPE_NAMES)


def encode(checkpoint: dict[str, Any]) -> dict[str, Any]:
    """The shardsafe state of a Lightning checkpoint dict: its tensors by
    key, and the value LAYOUT_KEY: {"format", "tree", "objects"}. In the
    tree, str / bool / None / int / finite float stand for themselves;
    {"float": "nan"} a non-finite float; {"list": [...]} / {"tuple": [...]};
    {"dict" or "odict": [[key, node], ...], "metadata": node?};
    {"tensor": KEY}; {"object": KEY} torch.save bytes in the U8 tensor KEY."""
    enc = _Encoded()
    tree = enc.node(checkpoint, [])
    return {**enc.tensors, LAYOUT_KEY: {"format": FORMAT, "tree": tree, "objects": enc.objects}}


def decode(layout: Any, tensors: dict[str, torch.Tensor], path: str, weights_only: bool,
           map_location: Any = None) -> Any:
    """The checkpoint dict `encode` split, from its layout and loaded tensors."""
    if not isinstance(layout, dict) or layout.get("format") != FORMAT:
        raise InvalidStateError(f"{path}: value {LAYOUT_KEY!r} is not a layout of format "
                                f"{FORMAT} (saved by a newer shardsafe?)")

    def node(x: Any) -> Any:
        if not isinstance(x, dict):
            return x
        tag = next((t for t in _TAGS if t in x), None)  # JSON keys come back sorted
        if tag == "tensor":
            return tensors[x["tensor"]]
        if tag == "float":
            return float(x["float"])
        if tag in ("list", "tuple"):
            items = [node(v) for v in x[tag]]
            return items if tag == "list" else tuple(items)
        if tag in ("dict", "odict"):
            out = (dict if tag == "dict" else collections.OrderedDict)(
                (k, node(v)) for k, v in x[tag])
            if "metadata" in x:
                out._metadata = node(x["metadata"])  # type: ignore[attr-defined]
            return out
        if tag == "object":
            return _unpickle(tensors[x["object"]], x["object"], path, weights_only,
                             map_location)
        raise InvalidStateError(f"{path}: value {LAYOUT_KEY!r} holds an unknown node {tag!r}")

    return node(layout["tree"])


def _unpickle(data: torch.Tensor, key: str, path: str, weights_only: bool,
              map_location: Any) -> Any:
    try:
        return torch.load(io.BytesIO(data.numpy().tobytes()), map_location=map_location,
                          weights_only=weights_only)
    except Exception as e:  # noqa: BLE001 - torch raises UnpicklingError and others
        first = str(e).strip().split("\n", 1)[0]
        hint = (" (load with weights_only=False if you trust the checkpoint)"
                if weights_only else "")
        raise InvalidStateError(f"{path}: object {key!r}: torch.load failed{hint}: "
                                f"{type(e).__name__}: {first}") from None


# ------------------------------------------------------------- plugins --

_SOLO: list = []  # [(the world group it was made in, the group of this rank alone)]


def _solo_group() -> dist.ProcessGroup | None:
    """A process group of this rank alone (None without torch.distributed):
    Lightning saves on rank 0 alone and loads on each rank independently.
    Made once per world group by this rank only (use_local_synchronization:
    no other rank takes part, and the world's group numbering is left as it
    is)."""
    if not (dist.is_available() and dist.is_initialized()):
        return None
    world = dist.group.WORLD
    if not _SOLO or _SOLO[0][0] is not world:
        _SOLO[:] = [(world, dist.new_group([dist.get_rank()], use_local_synchronization=True))]
    return _SOLO[0][1]


def _device(map_location: Any, path: str) -> torch.device:
    if map_location is None:
        return torch.device("cpu")
    if isinstance(map_location, (str, torch.device)):
        return torch.device(map_location)
    raise InvalidStateError(f"{path}: map_location {map_location!r}: shardsafe checkpoints load "
                            f"onto one device (a torch.device or a string), not a "
                            f"{type(map_location).__name__}")


class ShardsafeCheckpointIO(CheckpointIO):
    """Lightning's CheckpointIO over shardsafe.save / load (module doc).
    Keyword arguments are shardsafe.SaveOptions fields for every save."""

    def __init__(self, options: SaveOptions | None = None, **save_options: Any):
        super().__init__()
        self._options = SaveOptions.of(options, save_options)

    def _save_options(self, storage_options: Any, path: str) -> SaveOptions:
        if storage_options is None:
            return self._options
        if isinstance(storage_options, SaveOptions):
            return storage_options
        if isinstance(storage_options, dict):
            return SaveOptions.of(self._options, storage_options)
        raise InvalidStateError(f"{path}: storage_options: a shardsafe.SaveOptions or a dict of "
                                f"its fields, not a {type(storage_options).__name__}")

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any,
                        storage_options: Any = None) -> None:
        path = _paths.absolute(path)
        options = self._save_options(storage_options, path)
        save(encode(checkpoint), path, process_group=_solo_group(), overwrite=True,
             options=options)

    def load_checkpoint(self, path: Any, map_location: Any = None,
                        weights_only: bool | None = None) -> dict[str, Any]:
        path = os.fspath(path)
        if os.path.isfile(path):  # a torch.save checkpoint (before switching): Lightning's own
            # reader, given the descriptor opened checked (it takes a path only).
            with open_read(path) as f:
                return TorchCheckpointIO().load_checkpoint(
                    fd_path(f), map_location=map_location if map_location is not None
                    else (lambda storage, loc: storage), weights_only=weights_only)
        desc = describe(path)
        layout = desc["values"].get(LAYOUT_KEY)
        if layout is None:
            raise InvalidStateError(f"{path}: no {LAYOUT_KEY!r} value: not a checkpoint saved "
                                    f"by ShardsafeCheckpointIO (load it with shardsafe.load)")
        objects = set(layout.get("objects", ())) if isinstance(layout, dict) else set()
        device = _device(map_location, path)
        target: dict[str, Any] = {
            key: torch.empty(shape, dtype=TORCH_DTYPES[dtype],
                             device="cpu" if key in objects else device)
            for key, (dtype, shape) in desc["tensors"].items()}
        target[LAYOUT_KEY] = None
        load(target, path, process_group=_solo_group())
        layout = target.pop(LAYOUT_KEY)  # as loaded (the same checkpoint as the tensors)
        return decode(layout, target, path, weights_only is not False, map_location)

    def remove_checkpoint(self, path: Any) -> None:
        """Removes the checkpoint at `path` (a directory: renamed to a hidden
        .tmp-pruned-* name first, so a crash never leaves it half removed
        under its own name; the next save in that directory removes such
        leftovers)."""
        path = os.path.abspath(os.fspath(path))
        if os.path.isdir(path) and not os.path.islink(path):
            parent, tag = os.path.split(path)
            hidden = os.path.join(parent, f".tmp-pruned-{tag}.{secrets.token_hex(4)}")
            os.rename(path, hidden)
            shutil.rmtree(hidden)
        elif os.path.lexists(path):
            os.remove(path)


class ShardsafeAsyncCheckpointIO(ShardsafeCheckpointIO):
    """ShardsafeCheckpointIO whose saves return once staged (module doc)."""

    def __init__(self, options: SaveOptions | None = None, **save_options: Any):
        super().__init__(options, **save_options)
        self._pending: tuple[str, Future] | None = None

    def wait(self) -> None:
        """Waits for the save in flight; raises its failure (once)."""
        pending, self._pending = self._pending, None
        if pending is not None:
            pending[1].result()

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any,
                        storage_options: Any = None) -> None:
        self.wait()
        path = _paths.absolute(path)
        if os.path.lexists(path):  # an async save cannot replace a checkpoint
            super().save_checkpoint(checkpoint, path, storage_options)
            return
        options = self._save_options(storage_options, path)
        self._pending = (path, async_save(encode(checkpoint), path,
                                          process_group=_solo_group(), options=options))

    def load_checkpoint(self, path: Any, map_location: Any = None,
                        weights_only: bool | None = None) -> dict[str, Any]:
        self.wait()
        return super().load_checkpoint(path, map_location, weights_only)

    def remove_checkpoint(self, path: Any) -> None:
        if self._pending is not None and self._pending[0] == os.path.abspath(os.fspath(path)):
            self.wait()
        super().remove_checkpoint(path)

    def teardown(self) -> None:
        """Waits for the save in flight (raising its failure) and frees the
        async staging memory (shardsafe.release_async_save)."""
        try:
            self.wait()
        finally:
            release_async_save()
