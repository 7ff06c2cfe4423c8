"""The options of a save and of a load, typed and documented in one place.

Every save and load function takes them as keyword arguments
(``shardsafe.save(state, path, overwrite=True)``) or as one object
(``options=shardsafe.SaveOptions(overwrite=True)``); an unknown name is an
error listing the valid ones. ``None`` leaves an engine setting at the
engine's default (include/shardsafe/checkpoint.h), so the defaults live in
one place.
"""

from __future__ import annotations

import dataclasses
import difflib
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from . import _C
from .errors import InvalidStateError

_T = TypeVar("_T", bound="_Options")


def _keywords(fn: Callable) -> list[str]:
    """The optional keyword arguments of `fn` but `options` itself."""
    return [p.name for p in inspect.signature(fn).parameters.values()
            if p.default is not inspect.Parameter.empty and p.name != "options"
            and p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)]


class _Options:
    """What SaveOptions and LoadOptions share: built from keyword arguments,
    and turned into the engine's options."""

    _PYTHON_ONLY: frozenset[str] = frozenset()  # handled in Python, not by the engine
    _ENGINE: str  # the engine's class of these options (shardsafe._C, src/python/types.cc)

    @classmethod
    def of(cls: type[_T], options: _T | None, kwargs: dict[str, Any],
           caller: Callable | None = None) -> _T:
        """`options` (or the defaults) with `kwargs` applied; an unknown name
        is an error listing the valid ones: the options', and the keyword
        arguments of `caller` (the function `kwargs` were passed to), with
        the closest name when one is close."""
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(kwargs) - names)
        if unknown:
            own = _keywords(caller) if caller is not None else []
            close = difflib.get_close_matches(unknown[0], sorted(names | set(own)), n=1)
            hint = f" (did you mean {close[0]}?)" if close else ""
            takes = f"{caller.__name__}() takes {', '.join(own)}, and " if own else ""
            raise InvalidStateError(f"unknown option(s) {', '.join(unknown)}{hint}; {takes}"
                                    f"{cls.__name__} has: {', '.join(sorted(names))}")
        base = options if options is not None else cls()
        return dataclasses.replace(base, **kwargs) if kwargs else base

    def engine(self) -> Any:
        """The engine's options object: those set here (not None) and not
        Python's, the rest at the engine's defaults. A value of the wrong
        type is an InvalidStateError naming the option."""
        out = getattr(_C, self._ENGINE)()
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name in self._PYTHON_ONLY or value is None:
                continue
            if f.name == "peer_timeout":  # seconds, as a float for the engine's duration
                if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
                    raise InvalidStateError(f"peer_timeout: a positive number of seconds, "
                                            f"not {value!r}")
                value = float(value)
            try:
                setattr(out, f.name, value)
            except TypeError:
                raise InvalidStateError(f"{type(self).__name__}.{f.name}: "
                                        f"{type(value).__name__} {value!r} is not a valid "
                                        f"value") from None
        return out

    @classmethod
    def engine_names(cls) -> set[str]:
        """The fields the engine's class has (what engine() may set)."""
        kind = getattr(_C, cls._ENGINE)
        return {n for n in dir(kind) if not n.startswith("_")
                and isinstance(getattr(kind, n), property)}


@dataclass(frozen=True)
class SaveOptions(_Options):
    """How a save writes (every field optional; None: the engine's default).

    overwrite: replace an existing checkpoint at the path (default False).
    verify_replicas: ranks that pass the same key and slice must hold the
      same bytes; each holder that does not write it checksums its copy and
      a difference fails the save naming the key and two ranks (default
      True; False for callers that guarantee their replicas).
    update_latest: CheckpointManager saves move `latest` (default True);
      False commits without moving it (DeepSpeed's save_latest=False).
    exclude_frozen_parameters: leave out parameters of the state's modules
      that do not require gradients; recorded, so a strict load knows.
    max_file_bytes: payload cap per data file (2 GiB).
    direct_io: O_DIRECT data files (True; buffered where unsupported).
    io_threads: files written in parallel per rank (4).
    io_buffer_bytes, io_depth: each file in flight holds io_depth + 1
      buffers of io_buffer_bytes (16 MiB, 3).
    peer_timeout: async saves: seconds a rank's background waits for the
      other ranks once its own part is written, before the save fails as a
      StorageError naming what it waited for (600; a dead peer costs this
      long).
    """

    overwrite: bool | None = None
    verify_replicas: bool | None = None
    update_latest: bool | None = None
    exclude_frozen_parameters: bool = False
    max_file_bytes: int | None = None
    direct_io: bool | None = None
    io_threads: int | None = None
    io_buffer_bytes: int | None = None
    io_depth: int | None = None
    peer_timeout: float | None = None

    _PYTHON_ONLY = frozenset({"exclude_frozen_parameters"})
    _ENGINE = "SaveOptions"


@dataclass(frozen=True)
class LoadOptions(_Options):
    """How a load reads (every field optional; None: the engine's default).

    verify_checksums: verify every chunk read whole (True).
    convert_dtypes: allow dtype conversion on load (False; docs/format.md §5).
    io_threads: parallel reads per rank (4).
    scratch_bytes: bound on staging memory per thread (64 MiB).
    direct_io: O_DIRECT for cold data (True).
    share_reads: when other ranks on its machine read at least half of the
      bytes a rank reads of a file (a resharded load), the disk reads them
      once: one rank reads with O_DIRECT into a small shared-memory ring the
      others copy from (True; the same on every rank).
    shared_memory: shared reads through /dev/shm rings (True), else through
      the page cache.
    device_staging_bytes: host memory a load into device (CUDA) tensors
      stages their bytes in: two page-locked buffers of half this each,
      one copied to the device while the other fills, kept for the next
      load (shardsafe.release_load_staging() frees them) (256 MiB).
    """

    verify_checksums: bool | None = None
    convert_dtypes: bool | None = None
    io_threads: int | None = None
    scratch_bytes: int | None = None
    direct_io: bool | None = None
    share_reads: bool | None = None
    shared_memory: bool | None = None
    device_staging_bytes: int | None = None

    _ENGINE = "LoadOptions"
