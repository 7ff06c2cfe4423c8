"""Local paths as the package hands them to the engine, and object-store
prefixes staged on a local disk for the readers that read local files."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from typing import Any

from . import _C
from .errors import ShardsafeError, StorageError

# The directory staged prefixes are copied under (default: tempfile's).
STAGING_DIR_ENV = "SHARDSAFE_STAGING_DIR"


def absolute(path: str | os.PathLike) -> str:
    """`path` made absolute, once the engine has accepted it as a local path
    (shardsafe/filesystem.h CheckLocalPath): a URI ("s3://bucket/run") made
    absolute would name the local directory "s3:/bucket/run" under the
    working directory. An s3:// URI is returned as it is: the engine stores
    it in the bucket."""
    path = os.fspath(path)
    if is_s3(path):
        return path
    _C.check_local_path(path)
    return os.path.abspath(path)


def is_s3(path: str | os.PathLike) -> bool:
    return os.fspath(path).startswith("s3://")


@contextlib.contextmanager
def staged(uri: str, bar: Callable[[int], Any] | None = None) -> Iterator[str]:
    """Every object under the s3:// prefix `uri`, copied (_C.PrefixDownload:
    src/python/download.cc) into a fresh directory under $SHARDSAFE_STAGING_DIR
    (else tempfile's default), which is removed when the block exits, however
    it exits. A missing or empty prefix stages an empty directory. Before
    anything is copied, objects larger in all than the free space there are
    a StorageError naming both sizes. `bar(total bytes)`, when given, makes
    a progress bar (update(n), close()) or returns None. A ShardsafeError
    raised in the block names `uri` where it named the staged copy."""
    download = _C.PrefixDownload(uri)
    parent = os.environ.get(STAGING_DIR_ENV) or tempfile.gettempdir()
    free = shutil.disk_usage(parent).free
    if download.total_bytes > free:
        raise StorageError(f"{uri}: its {len(download.objects)} objects hold "
                           f"{download.total_bytes} bytes, more than the {free} bytes free in "
                           f"the staging directory {parent} (set {STAGING_DIR_ENV} to a "
                           f"directory with more space)", "RESOURCE_EXHAUSTED")
    local = tempfile.mkdtemp(prefix="shardsafe-staging-", dir=parent)
    try:
        progress = bar(download.total_bytes) if bar is not None else None
        try:
            download.to(local, None if progress is None else progress.update)
        finally:
            if progress is not None:
                progress.close()
        yield local
    except ShardsafeError as e:
        if e.args and isinstance(e.args[0], str):
            e.args = (e.args[0].replace(local, uri.rstrip("/")), *e.args[1:])
        raise
    finally:
        shutil.rmtree(local, ignore_errors=True)
