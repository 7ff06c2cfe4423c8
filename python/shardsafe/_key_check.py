"""The key check of a load, the same for every source: each rank's
Report of its key matching, and the Agreement that every rank runs on all
ranks' reports before any byte is read (a KeyMismatchError the same on
every rank, or what the load reports as missing and unexpected)."""

from __future__ import annotations

import json
from dataclasses import dataclass

from . import _keys
from .errors import KeyMismatchError


@dataclass
class Report:
    """One rank's view of a load's key matching, before the agreement."""

    missing: list[str]  # state keys the checkpoint lacks (fatal under strict)
    unexpected: list[str]  # saved keys no target wants (fatal under strict when every rank agrees)
    notes: list[str]  # for the KeyMismatchError message
    # Reported, never fatal: optimizer state of parameters that had none when saved.
    absent_state: list[str]
    # Per-rank values this rank has no saved value for, and saved ranks'
    # values no rank loads: fatal unless per_rank_strict=False.
    per_rank_missing: list[str]
    per_rank_unused: list[str]
    # Grouped PerRank values (PerRank(value, group=...)): the group rank this
    # rank loads of each key, and the group ranks the checkpoint holds of it.
    per_rank_groups: dict[str, int]
    per_rank_saved_groups: dict[str, list[int]]


def _key_error(missing: list[str], unexpected: list[str], path: str, notes: list[str],
               keys: _keys.KeyMap | None, remedy: str) -> KeyMismatchError:
    """KeyMismatchError (state-side names), its message naming checkpoint keys
    where they differ (`keys`: the load's renames, if any) and `remedy`, the
    argument that loads anyway."""
    err = KeyMismatchError(missing, unexpected, path, remedy)
    to_ckpt = keys.to_ckpt if keys is not None else {}
    renamed = [f"{k!r} is {to_ckpt[k]!r}" for k in unexpected[:8]
               if k in to_ckpt and to_ckpt[k] != k]
    extra = notes[:4] + ([f"renamed checkpoint keys: {', '.join(renamed)}"] if renamed else [])
    if extra:
        err.args = (err.args[0] + "; " + "; ".join(extra),)
    return err


class Agreement:
    """Called with every rank's key report (a Report as JSON), on every
    rank, before any byte is read (a native load: in the engine load's first
    collective, its check_reports; another tool's checkpoint: after
    _comm.agree): a key is missing when a rank lacks it, unexpected only
    when no rank wants it (pipeline stages load disjoint keys); strict (and
    per_rank_strict) raise a KeyMismatchError, the same on every rank."""

    def __init__(self, strict: bool, per_rank_strict: bool, keys: _keys.KeyMap | None,
                 path: str):
        self.strict, self.per_rank_strict, self.keys, self.path = (strict, per_rank_strict,
                                                                  keys, path)
        self.missing: list[str] = []
        self.unexpected: list[str] = []
        self.per_rank_missing: list[str] = []
        self.per_rank_unused: list[str] = []
        self.absent: list[str] = []

    def __call__(self, raw: list[bytes]) -> None:
        self.check([json.loads(r) for r in raw])

    def check(self, reports: list[dict]) -> None:
        """The check of every rank's report (a Report as a dict), by rank."""
        self.missing = sorted({k for r in reports for k in r["missing"]})
        self.unexpected = sorted(set.intersection(*(set(r["unexpected"]) for r in reports)))
        self.per_rank_missing = sorted({k for r in reports for k in r["per_rank_missing"]})
        # the same on every rank
        self.per_rank_unused = reports[0]["per_rank_unused"] + _unused_groups(reports)
        self.absent = sorted({k for r in reports for k in r["absent_state"]})
        keys_fail = self.strict and bool(self.missing or self.unexpected)
        per_rank_fail = self.per_rank_strict and bool(self.per_rank_missing or
                                                      self.per_rank_unused)
        if not (keys_fail or per_rank_fail):
            return
        notes = sorted({n for r in reports for n in r["notes"]})
        remedies = ["strict=False"] if keys_fail else []
        if per_rank_fail:
            grouped = any("[group rank " in k
                          for k in self.per_rank_missing + self.per_rank_unused)
            notes.append("per-rank values load by rank: rank r gets saved rank r's" +
                         (" (with group=, group rank g gets saved group rank g's)"
                          if grouped else ""))
            remedies.append("per_rank_strict=False (a rank without a saved value keeps its own)")
        raise _key_error(
            (self.missing if keys_fail else []) + (self.per_rank_missing if per_rank_fail else []),
            (self.unexpected if keys_fail else []) + (self.per_rank_unused if per_rank_fail
                                                      else []),
            self.path, notes, self.keys, f"pass {' and '.join(remedies)} to load anyway")


def _unused_groups(reports: list[dict]) -> list[str]:
    """"KEY[group rank G]" for each saved group rank of a grouped PerRank
    that no rank loads (the same on every rank: from every rank's report)."""
    loaded: dict[str, set[int]] = {}
    saved: dict[str, set[int]] = {}
    for r in reports:
        for key, g in r["per_rank_groups"].items():
            loaded.setdefault(key, set()).add(g)
        for key, gs in r["per_rank_saved_groups"].items():
            saved.setdefault(key, set()).update(gs)
    return [f"{key}[group rank {g}]" for key in sorted(saved)
            for g in sorted(saved[key] - loaded.get(key, set()))]
