"""Exceptions raised by shardsafe.

Every error is a ShardsafeError; the subclasses also derive from the matching
built-in exception, so ``except FileNotFoundError`` or ``except ValueError``
work as expected. Messages are one line naming the file, the tensor and the
problem.
"""

from __future__ import annotations


class ShardsafeError(RuntimeError):
    """Base class. ``code`` is the engine's status code name (e.g. "DATA_LOSS");
    ``detail`` the failure within it where the engine tells them apart
    (shardsafe/status.h ErrorDetail, e.g. "NO_SUCH_BUCKET"), else ""."""

    code = "UNKNOWN"
    detail = ""

    def __init__(self, message: str, code: str | None = None, detail: str = ""):
        super().__init__(message)
        if code is not None:
            self.code = code
        self.detail = detail


class CheckpointNotFoundError(ShardsafeError, FileNotFoundError):
    """No committed checkpoint (or safetensors file) at the given path."""


class CheckpointExistsError(ShardsafeError, FileExistsError):
    """A save would replace an existing checkpoint (pass overwrite=True)."""


class CorruptCheckpointError(ShardsafeError):
    """A file is corrupt or truncated, or a checksum does not match."""


class ShapeMismatchError(ShardsafeError, ValueError):
    """A tensor's shape in the checkpoint differs from the target's."""


class DTypeMismatchError(ShardsafeError, TypeError):
    """A tensor's dtype in the checkpoint differs from the target's."""


class InvalidStateError(ShardsafeError, ValueError):
    """The state or layout passed in is unusable (gaps, overlaps, bad values)."""


class StorageError(ShardsafeError, OSError):
    """An I/O failure: disk full, permission denied, a failed fsync."""


class KeyMismatchError(ShardsafeError, KeyError):
    """Keys requested but not in the checkpoint, or saved but not requested."""

    def __init__(self, missing: list[str], unexpected: list[str], path: str,
                 remedy: str = "pass strict=False to load anyway"):
        self.missing_keys = list(missing)
        self.unexpected_keys = list(unexpected)
        parts = []
        if missing:
            parts.append(f"missing keys {_some(missing)}")
        if unexpected:
            parts.append(f"unexpected keys {_some(unexpected)}")
        super().__init__(f"{path}: " + "; ".join(parts) + f" ({remedy})",
                         "NOT_FOUND" if missing else "INVALID_ARGUMENT")

    def __str__(self) -> str:  # KeyError would quote the message
        return self.args[0]


def _some(keys: list[str], limit: int = 8) -> str:
    shown = ", ".join(repr(k) for k in keys[:limit])
    more = f" and {len(keys) - limit} more" if len(keys) > limit else ""
    return f"[{shown}{more}]"


def from_status(code: str, message: str, detail: str = "") -> ShardsafeError:
    """The exception for an engine status (called from the C++ extension):
    chosen by its code and, for the failures a code groups, its detail
    (shardsafe/status.h ErrorDetail), never by the message text."""
    if detail == "SHAPE_MISMATCH":
        cls = ShapeMismatchError
    elif detail == "DTYPE_MISMATCH":
        cls = DTypeMismatchError
    elif code == "NOT_FOUND":
        cls = CheckpointNotFoundError
    elif code == "ALREADY_EXISTS":
        cls = CheckpointExistsError
    elif code == "DATA_LOSS":
        cls = CorruptCheckpointError
    elif code in ("INVALID_ARGUMENT", "FAILED_PRECONDITION", "UNIMPLEMENTED"):
        cls = InvalidStateError
    elif code in ("RESOURCE_EXHAUSTED", "UNAVAILABLE"):
        cls = StorageError
    else:
        cls = ShardsafeError
    return cls(message, code, detail)
