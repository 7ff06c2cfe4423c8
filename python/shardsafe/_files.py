"""The one way the package opens a file to read it: without waiting, only a
regular file, and only the file it checked.

open_read(path, within=DIR) opens `path` with O_RDONLY | O_NONBLOCK |
O_CLOEXEC, so that a FIFO or a device never blocks the open waiting for a
writer, then checks the descriptor (fstat): a FIFO, socket, device or
directory is a FileRefusedError, an InvalidStateError naming the path (the
engine's own open refuses these as INVALID_ARGUMENT too). With `within`,
what the descriptor resolves to (/proc/self/fd/N) must lie inside that
directory's real path: a symbolic link or a `..` leading outside it is
refused; links inside it (a Hugging Face cache's snapshot files into
../../blobs, when `within` is the repository) are followed. Then
O_NONBLOCK is cleared and that same descriptor is handed on as a file
object: nothing is opened again by the path, so a file swapped in after
the check is never read. O_NOFOLLOW is not used: checkpoints and model
caches are legitimately reached through links; `within` is the check.

Readers that take only a path (torch.load with mmap, safetensors.safe_open)
are given fd_path(f): /proc/self/fd/N of the checked descriptor, which
opens the same inode whatever the original path names meanwhile (where
/proc is missing, the checked path itself).

`_after_open(path, fd)` is called right after the open, before any check:
the tests replace it to swap a file in at that point.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from typing import IO, Any

from .errors import InvalidStateError

# Called right after the open, before the checks (tests swap files here).
_after_open: Callable[[str, int], Any] = lambda path, fd: None

_KINDS = ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a device"),
          (stat.S_ISBLK, "a device"), (stat.S_ISDIR, "a directory"))


class FileRefusedError(InvalidStateError):
    """open_read refused what `path` names: `problem` says why (e.g. "is a
    FIFO, not a regular file")."""

    def __init__(self, path: str, problem: str) -> None:
        super().__init__(f"open {path}: {problem}", "INVALID_ARGUMENT")
        self.path, self.problem = path, problem


def open_read(path: str | os.PathLike, *, within: str | os.PathLike | None = None,
              encoding: str | None = None, errors: str | None = None) -> IO[Any]:
    """`path` opened for reading, checked (module doc): a binary file object,
    or a text one when `encoding` is given. Raises the OSError of the open
    (FileNotFoundError, PermissionError, ...) or FileRefusedError, an
    InvalidStateError ("open PATH: is a FIFO, not a regular file"; "open
    PATH: resolves to TARGET, outside DIR")."""
    path = os.fspath(path)
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        _after_open(path, fd)
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kind = next((name for test, name in _KINDS if test(mode)), "not a regular file")
            raise FileRefusedError(path, f"is {kind}, not a regular file")
        if within is not None:
            _check_within(fd, path, os.fspath(within))
        os.set_blocking(fd, True)
        f = os.fdopen(fd, "rb" if encoding is None else "r", encoding=encoding, errors=errors)
    except BaseException:
        os.close(fd)
        raise
    (f.raw if encoding is None else f.buffer.raw).name = path  # messages name the path, not N
    return f


def read_bytes(path: str | os.PathLike, *, within: str | os.PathLike | None = None,
               limit: int = -1) -> bytes:
    """The contents of `path` (at most `limit` bytes when >= 0), opened by
    open_read."""
    with open_read(path, within=within) as f:
        return f.read(limit)


def fd_path(f: IO[Any]) -> str:
    """A path that opens the file `f` holds open, for readers that take only
    a path: /proc/self/fd/N (the same inode, whatever the original path
    names now), or `f`'s own path where there is no /proc."""
    proc = f"/proc/self/fd/{f.fileno()}"
    return proc if os.path.exists(proc) else f.name


def _check_within(fd: int, path: str, within: str) -> None:
    try:
        target = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:  # no /proc: the path as it resolves now
        target = os.path.realpath(path)
    root = os.path.realpath(within)
    if root == "/" or target.startswith(root.rstrip("/") + "/"):
        return
    raise FileRefusedError(path, f"resolves to {target}, outside {within}")
