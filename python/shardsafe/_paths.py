"""Local paths as the package hands them to the engine."""

from __future__ import annotations

import os
import re

from .errors import InvalidStateError

_URI = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")


def absolute(path: str | os.PathLike) -> str:
    """`path` made absolute. A URI ("s3://bucket/run") is refused, as the
    engine refuses it: made absolute, it would name the local directory
    "s3:/bucket/run" under the working directory."""
    path = os.fspath(path)
    if m := _URI.match(path):
        raise InvalidStateError(f"{path}: no storage for {m.group(1)}:// URIs; shardsafe reads "
                                f"and writes local paths")
    return os.path.abspath(path)
