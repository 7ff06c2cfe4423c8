"""Local paths as the package hands them to the engine."""

from __future__ import annotations

import os

from . import _C


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
