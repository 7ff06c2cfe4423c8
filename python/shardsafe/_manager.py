"""CheckpointManager: step-tagged checkpoints under one root."""

from __future__ import annotations

import os
import warnings
from collections.abc import Mapping
from concurrent.futures import Future
from dataclasses import dataclass, replace
from typing import Any

import torch.distributed as dist

from . import _C, _paths, hf
from ._comm import resolve
from ._engine import PerProcess, future
from ._load import load
from ._result import LoadResult, as_dict
from ._options import SaveOptions
from ._save import prepared
from .errors import CheckpointNotFoundError, CorruptCheckpointError


@dataclass(frozen=True)
class MemoryTier:
    """A CheckpointManager's memory tier (CheckpointManager(memory=...)):
    every save goes into `dir`, a folder in node-local shared memory (None:
    /dev/shm/shardsafe-<a hash of the manager's root>, the same after a
    restart), as a checkpoint committed there as in any root; the tier
    keeps its `keep_last` newest. Files there survive the death of the
    training process, not of the node, and hold keep_last x the state's
    bytes (plus an async save's staging). Every rank must share the folder:
    ranks on several nodes are refused, since `replicas` (copies of each
    rank's shards on other nodes) are not built yet; on one node there is
    no other node to hold them, and the tier holds one copy."""

    dir: str | os.PathLike | None = None
    replicas: int = 1
    keep_last: int = 2


class CheckpointManager:
    """Checkpoints under ROOT/TAG, one per step, with a `latest` pointer and
    retention of the newest `keep_last` (0 keeps all). `tag_format` names a
    step's checkpoint: one "{step}" or "{step:0Nd}" in a tag, e.g.
    "global_step{step}" (DeepSpeed); the step is also recorded at commit,
    so latest_step() works for any format. Which checkpoint is newest is the
    order of commits, never file times or names (docs/format.md §1).

        mgr = shardsafe.CheckpointManager("/ckpt", keep_last=3)
        mgr.async_save(step, {"model": model, "optim": optim, "step": step})
        ...
        step = mgr.latest_step()  # None for an empty root
        mgr.load({"model": model, "optim": optim, "step": 0})

    A manager owns its async saves' staging memory and threads; dropping it
    (or release_async_save) frees them once its save in flight is durable.

    With memory=shardsafe.MemoryTier(...), saves (sync or async) go to the
    memory tier, and every `persist_every`-th is also copied to `root` (a
    local path) in the background from the memory copy, by rank 0, without
    stalling training again; wait() waits for that copy too. `keep_last`
    is then the root's retention, the tier's is its own. list() shows
    which tiers hold each step, latest_step() is the newest step in either,
    and load() reads the fastest tier's copy: a copy that is corrupt or
    incomplete is passed over, with a UserWarning, for the root's copy of
    the same step, then (loading the latest) for older steps, newest first.
    """

    def __init__(self, root: str | os.PathLike, keep_last: int = 0, *,
                 process_group: dist.ProcessGroup | None = None,
                 tag_format: str = "step-{step:08d}", memory: MemoryTier | None = None,
                 persist_every: int = 1):
        self.root = root = _paths.absolute(root)
        tier = None if memory is None else (
            "" if memory.dir is None else _paths.absolute(memory.dir), memory.replicas,
            memory.keep_last)
        self.memory = memory
        # (the factory holds the root, not self: a pending Future holds the
        # engine holder, and must not hold the manager too)
        self._engine = PerProcess(
            lambda: _C.CheckpointManager(root, keep_last, tag_format, tier, persist_every),
            _C.CheckpointManager.wait_async)
        self._engine.get()  # a bad root fails here
        self._group = process_group

    @property
    def _m(self) -> _C.CheckpointManager:
        return self._engine.get()

    def path(self, step: int) -> str:
        return os.path.join(self.root, self._m.tag_of(step))

    def save(self, step: int, state: Any, *, metadata: Any = None, unsafe_pickle: bool = False,
             files: Mapping[str, Any] | None = None, options: SaveOptions | None = None,
             **kwargs: Any) -> dict:
        """Saves as step `step`, moves `latest`, applies retention (which
        never removes the newest commit nor the one `latest` names).
        update_latest=False commits without moving `latest` (DeepSpeed's
        save_latest=False): that checkpoint is not taken as the latest while
        `latest` names another. Other options as shardsafe.save."""
        comm = resolve(self._group)
        options = SaveOptions.of(options, kwargs)
        args = prepared(state, comm, metadata, unsafe_pickle, files, options)
        return as_dict(args.run(lambda call: self._m.save(step, call)))

    def async_save(self, step: int, state: Any, *, metadata: Any = None,
                   unsafe_pickle: bool = False, files: Mapping[str, Any] | None = None,
                   options: SaveOptions | None = None, **kwargs: Any) -> Future:
        """save in the background; the Future's result is the checkpoint path."""
        comm = resolve(self._group)
        options = SaveOptions.of(options, kwargs)
        args = prepared(state, comm, metadata, unsafe_pickle, files, options)
        handle = args.run(lambda call: self._m.async_save(step, call))
        return future(handle, self.path(step), self._engine)

    def reserve_async_save(self, state: Any, *, metadata: Any = None,
                           unsafe_pickle: bool = False,
                           files: Mapping[str, Any] | None = None,
                           options: SaveOptions | None = None, **kwargs: Any) -> int:
        """Allocates the staging memory of this manager's async saves of
        `state` now (see shardsafe.reserve_async_save); the bytes held."""
        comm = resolve(self._group)
        options = SaveOptions.of(options, kwargs)
        args = prepared(state, comm, metadata, unsafe_pickle, files, options)
        return args.run(lambda call: self._m.reserve_async(call))

    def release_async_save(self) -> None:
        """Frees this manager's staging memory and threads once its save in
        flight is durable, raising that save's failure (as
        shardsafe.release_async_save); the next async_save allocates again."""
        self._engine.release()

    def wait(self) -> None:
        """Waits for the async save in flight, then for the copy of the
        memory tier to the root in flight (memory=); raises a failure."""
        self._m.wait_async()

    def latest_step(self) -> int | None:
        return self._m.latest_step()

    @property
    def memory_dir(self) -> str | None:
        """The memory tier's folder (None without one)."""
        return self._m.memory_dir or None

    def load(self, state: Any, step: int | None = None, **kwargs: Any) -> LoadResult:
        """Loads step `step`, or the latest; keyword arguments as load().
        The latest is the root's, resolved and held by the load itself
        (shardsafe.load of the root: retention cannot remove it between
        choosing it and reading it); the result's path and tag say which
        checkpoint it was. A step not there is a CheckpointNotFoundError
        saying whether retention or prune removed it during this load, may
        have removed it before, or it was never saved here (_not_found).
        With a memory tier: the tiers' copies in turn (class doc)."""
        if self.memory is not None:
            return self._load_tiers(state, step, kwargs)
        if step is None:
            self._require_one()
            return load(state, self.root, process_group=self._group, **kwargs)
        listed = self.list()
        try:
            return load(state, self.path(step), process_group=self._group, **kwargs)
        except CheckpointNotFoundError as e:
            raise self._not_found(step, listed, e) from None

    def _load_tiers(self, state: Any, step: int | None, kwargs: dict) -> LoadResult:
        """load() with a memory tier: the copies the engine orders
        (CheckpointManager::LoadOrder, the same on every rank), each until
        one loads; a corrupt or incomplete copy (CorruptCheckpointError on
        any rank, so on every rank) is passed over with a UserWarning."""
        copies = self._m.load_order(step, resolve(self._group))
        passed: list[str] = []
        for i, (tier, path, at) in enumerate(copies):
            try:
                result = load(state, path, process_group=self._group, **kwargs)
            except CorruptCheckpointError as e:
                if i + 1 == len(copies):
                    raise
                passed.append(f"{tier} copy of step {at} ({path}) passed over: {e}")
                warnings.warn(passed[-1], stacklevel=3)
                continue
            if at != copies[0][2]:
                passed.append(f"step {copies[0][2]} could not be loaded from any tier; loaded "
                              f"step {at}, the newest that could")
                warnings.warn(passed[-1], stacklevel=3)
            return replace(result, step=at, bytes_by_tier={tier: result.bytes_read},
                           warnings=passed)
        raise CheckpointNotFoundError(f"{self.root}: no checkpoint to load", "NOT_FOUND")

    def export_hf(self, out: str | os.PathLike, step: int | None = None,
                  **kwargs: Any) -> dict:
        """Writes step `step`'s checkpoint (the latest by default) as the
        Hugging Face directory `out`, collectively over the manager's group:
        each rank writes its share of the weight files and `out` appears
        once (NeMo's save_consolidated, torchtitan's last_save_in_hf). Call
        it on every rank after save; it first waits for an async save in
        flight (raising its failure). Keyword arguments as
        shardsafe.hf.export (prefix="model." for the model of a training
        state, dtype, max_shard_size, overwrite, ...); its stats."""
        self._m.wait_async()
        group = self._group
        if group is None and dist.is_available() and dist.is_initialized():
            group = dist.group.WORLD
        if step is None:  # the root's latest, resolved and held by the export (as load)
            self._require_one()
            return hf.export(self.root, out, process_group=group, **kwargs)
        listed = self.list()
        try:
            return hf.export(self.path(step), out, process_group=group, **kwargs)
        except CheckpointNotFoundError as e:
            raise self._not_found(step, listed, e) from None

    def list(self) -> list[dict]:
        """The root's committed checkpoints, oldest first in commit order
        (those whose order is unknown last: `order_fault` says why)."""
        return [as_dict(c) for c in self._m.list()]

    def prune(self, keep: int) -> list[str]:
        """Removes all but the newest `keep` checkpoints, never the newest
        nor the one `latest` names (it counts among the `keep`); one a load
        is reading stays beside them (a later prune removes it); the tags
        removed. A checkpoint whose order is unknown is kept, with a
        UserWarning saying why."""
        return self._m.prune(keep)

    def _require_one(self) -> None:
        """CheckpointNotFoundError unless the root has a latest checkpoint:
        loading an empty root must not take whatever else lies there (a
        stray .safetensors file) for one. Retention never removes the
        newest commit, so a checkpoint stays for the load that follows."""
        if self.latest_step() is None:
            raise CheckpointNotFoundError(f"{self.root}: no committed checkpoint", "NOT_FOUND")

    def _not_found(self, step: int, listed: list[dict],
                   error: CheckpointNotFoundError) -> CheckpointNotFoundError:
        """The error of a load of `step` that found no checkpoint there
        (`error`, the engine's), given `listed`, the root's listing taken
        before the load. What the manager can tell:
        - the step was listed then and is gone now: retention or prune
          removed it during the load;
        - it was not listed: commit records number a root's commits 1, 2,
          ... (docs/format.md §1) and the newest commit is never removed,
          so a gap below the newest sequence counts checkpoints removed
          (by retention, prune or a save that replaced its tag), which it
          may have been; without a gap, it was never saved here; with
          checkpoints whose record is missing or not trusted, the manager
          cannot tell;
        - it is still listed: the engine's error stands (something inside
          the checkpoint is missing)."""
        tag = self._m.tag_of(step)
        kept = self.list()
        if any(c["tag"] == tag for c in kept):
            return error
        steps = ", ".join(str(c["step"]) for c in kept if c["step"] is not None) or "none"
        where = f"{self.root}: checkpoint {tag} (step {step})"
        if any(c["tag"] == tag for c in listed):
            return CheckpointNotFoundError(f"{where} was removed by retention or prune while it "
                                           f"was being loaded (steps kept now: {steps})",
                                           "NOT_FOUND")
        sequences = [c["sequence"] for c in kept]
        if not kept or 0 in sequences or any(c.get("order_fault") for c in kept):
            why = "removed by retention or prune, or never saved here"
        elif max(sequences) > len(kept):
            why = (f"not there: {max(sequences) - len(kept)} earlier checkpoint(s) were removed "
                   f"by retention or prune, and it may have been one of them")
        else:
            why = "never saved here (the commit records show no checkpoint removed from this root)"
        return CheckpointNotFoundError(f"{where}: {why} (steps kept: {steps})", "NOT_FOUND")
