"""Hugging Face hub repo ids ("ORG/NAME") as load paths, resolved in the
local hub cache only (never the network): CACHE/models--ORG--NAME/refs/main
names the revision whose snapshot (CACHE/.../snapshots/REV/, files linking
into ../../blobs) is loaded. CACHE is $HF_HUB_CACHE, else $HF_HOME/hub,
else ~/.cache/huggingface/hub. A path that exists locally always wins over
a repo id of the same spelling."""

from __future__ import annotations

import os
import re

from ._files import FileRefusedError, read_bytes
from .errors import CheckpointNotFoundError, InvalidStateError

_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
_REF_LIMIT = 256  # a revision is a commit hash (at most 64 hex digits)


def cache_dir() -> str:
    if os.environ.get("HF_HUB_CACHE"):
        return os.environ["HF_HUB_CACHE"]
    home = os.environ.get("HF_HOME") or os.path.join(os.path.expanduser("~"), ".cache",
                                                     "huggingface")
    return os.path.join(home, "hub")


def resolve(path: str) -> str:
    """`path` itself, or the cached snapshot of the repo id it spells."""
    if os.path.exists(path) or not _REPO_ID.match(path):
        return path
    repo = os.path.join(cache_dir(), "models--" + path.replace("/", "--"))
    if not os.path.isdir(repo):
        return path  # neither: the load reports it as not found (explain_missing)
    try:
        revision = read_bytes(os.path.join(repo, "refs", "main"), within=repo,
                              limit=_REF_LIMIT).decode("utf-8", errors="replace").strip()
    except OSError:
        raise CheckpointNotFoundError(f"{path}: the hub cache has {repo} but no refs/main "
                                      f"(download the model, or pass a snapshot directory)")
    except FileRefusedError as e:
        raise InvalidStateError(f"{path}: {repo}/refs/main {e.problem}", e.code) from None
    snapshot = os.path.join(repo, "snapshots", revision)
    if not re.fullmatch(r"[0-9a-f]{7,64}", revision) or not os.path.isdir(snapshot):
        raise CheckpointNotFoundError(f"{path}: {repo}/refs/main names {revision!r}, which is no "
                                      f"snapshot in the cache")
    return snapshot


def explain_missing(path: str, error: BaseException) -> BaseException:
    """`error`, or where a repo id was looked for when `path` (not found, not
    resolved by `resolve`) spells one: shardsafe reads the cache, never the
    network, so the message says how to fill it."""
    if (not isinstance(error, CheckpointNotFoundError) or os.path.exists(path)
            or not _REPO_ID.match(path)):
        return error
    return CheckpointNotFoundError(
        f"{error}; nor is {path!r}, as a Hugging Face repo id, in the hub cache {cache_dir()} "
        f"(shardsafe never downloads: fetch it with `huggingface-cli download {path}` or "
        f"huggingface_hub.snapshot_download, or set HF_HUB_CACHE to the cache holding it)",
        error.code, error.detail)
