"""What the campaign checks in a root after a kill (or in a power-loss image).

check_root(root, ...) returns a RootCheck: counts and a list of failures,
each a line naming the checkpoint and what is wrong. Checks:

- every committed checkpoint (shardsafe's list, and the CLI's `ls --json`,
  which must agree) has the tag of its step, loads bit-exact (values and the
  per-rank value included, checksums verified) and passes `shardsafe verify`;
- nothing committed was lost: the newest KEEP_LAST of the steps known to be
  committed (acknowledged saves, and checkpoints listed earlier) are listed;
  retention never removes those;
- `latest`, if present, is one line naming a listed checkpoint, and loading
  the root resolves to the newest listed one (the commit order decides);
- optionally, a fresh save (one process) of the next step succeeds, leaves
  no `.`-entry (no `.tmp-*` or `.latest.tmp.*` leftover) in the root, moves
  `latest` to itself, loads bit-exact and keeps at most KEEP_LAST.
"""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass, field

import workload as W


@dataclass
class RootCheck:
    listed: list[int] = field(default_factory=list)  # steps committed, in commit order
    verified: int = 0  # checkpoints loaded bit-exact and passing `verify`
    partial: list[str] = field(default_factory=list)  # leftovers seen before the fresh save
    latest: str | None = None
    latest_lagging: bool = False  # `latest` names an older checkpoint than the newest
    fresh_step: int | None = None  # the fresh save's step, when it succeeded
    persisted: list[int] = field(default_factory=list)  # memory mode: steps the job persisted
    failures: list[str] = field(default_factory=list)


def _cli(binary: str, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([binary, *args], capture_output=True, text=True, errors="replace",
                          timeout=timeout)


def loads_bit_exact(path: str, step: int) -> str | None:
    """None if `path` holds checkpoint `step` exactly, else what differs."""
    import shardsafe

    target = W.load_target()
    try:
        # per_rank_strict=False: one process gets rank 0's per-rank value; the other
        # ranks' come back as unexpected keys, checked below.
        res = shardsafe.load(target, path, per_rank_strict=False)
    except Exception as e:  # noqa: BLE001 - any failure is the finding
        return f"{path}: load failed: {type(e).__name__}: {e}"
    return loaded_differs(path, target, res, step)


def loaded_differs(path: str, target: dict, res, step: int) -> str | None:
    """None if `target` (filled from load_target() by a load whose result
    is `res`, per_rank_strict=False) holds checkpoint `step` exactly, else
    what differs; `path` names what was loaded."""
    want = W.expected(step)
    bad = [k for k in want if not W.same_bits(target[k], want[k])]
    if bad:
        return f"{path}: tensor(s) {bad} are not step {step}'s bytes"
    if target["step"] != step or res.values.get("step") != step:
        return f"{path}: value step={target['step']!r} (values {res.values}), expected {step}"
    who = target["who"].value if hasattr(target["who"], "value") else target["who"]
    if not isinstance(who, dict) or who.get("step") != step or who.get("rank") != 0:
        return f"{path}: per-rank value {who!r}, expected rank 0's of step {step}"
    if res.missing_keys or any(not k.startswith("who[rank ") for k in res.unexpected_keys):
        return f"{path}: missing {res.missing_keys}, unexpected {res.unexpected_keys}"
    return None


def check_none_lost(out: RootCheck, root: str, known: set[int], detail: str) -> None:
    """Nothing committed was lost: retention removes the oldest beyond
    KEEP_LAST only, so the newest KEEP_LAST commits ever made (`known`, and
    what `out` lists) are listed. `known` gains what is listed."""
    newest = sorted(known | set(out.listed))[-W.KEEP_LAST:]
    lost = [s for s in newest if s not in out.listed]
    if lost:
        out.failures.append(f"LOST {root}: committed step(s) {lost} are not listed (listed: "
                            f"{out.listed}, known committed: {sorted(known)}; {detail})")
    known |= set(out.listed)


def check_root(root: str, binary: str, *, known: set[int], fresh_save: bool) -> RootCheck:
    """Checks `root` (see the module doc). `known`: steps known to be
    committed (acknowledged, or listed before); updated with what is listed."""
    import shardsafe

    out = RootCheck()
    fail = out.failures.append
    latest_path = os.path.join(root, "latest")
    if not os.path.isdir(root):  # killed before the first save created it
        if known:
            fail(f"LOST {root}: the root is gone, yet steps {sorted(known)} were committed")
        if fresh_save:
            _fresh_save(out, root, known)
        return out
    mgr = shardsafe.CheckpointManager(root, keep_last=W.KEEP_LAST, tag_format=W.TAG_FORMAT)
    out.partial = sorted(e for e in os.listdir(root) if e.startswith("."))
    try:
        listing = mgr.list()
    except Exception as e:  # noqa: BLE001
        fail(f"{root}: list failed: {type(e).__name__}: {e}")
        return out
    listing.sort(key=lambda c: c["sequence"])
    out.listed = [c["step"] for c in listing]
    tags = [c["tag"] for c in listing]

    cli = _cli(binary, "ls", root, "--json")
    if cli.returncode != 0:
        fail(f"{root}: `shardsafe ls` rc={cli.returncode}: {cli.stderr.strip()}")
    else:
        cli_tags = sorted(c["tag"] for c in json.loads(cli.stdout))
        if cli_tags != sorted(tags):
            fail(f"{root}: `shardsafe ls` lists {cli_tags}, the Python list {sorted(tags)}")

    for c in listing:
        step = c["step"]
        if step is None or c["tag"] != W.TAG_FORMAT.format(step=step):
            fail(f"{c['path']}: committed checkpoint with step {step!r} and tag {c['tag']!r}")
            continue
        problem = loads_bit_exact(c["path"], step)
        v = _cli(binary, "verify", c["path"])
        if v.returncode != 0:
            problem = (problem + "; " if problem else "") + (
                f"{c['path']}: `shardsafe verify` rc={v.returncode}: "
                f"{(v.stdout + v.stderr).strip()[-2000:]}")
        if problem:
            fail("CORRUPT " + problem)
        else:
            out.verified += 1

    check_none_lost(out, root, known, f"entries: {sorted(os.listdir(root))}")

    if os.path.lexists(latest_path):
        try:
            with open(latest_path) as f:
                text = f.read()
        except OSError as e:
            text = f"<unreadable: {e}>"
        if not text.endswith("\n") or text[:-1] not in tags:
            fail(f"LATEST {root}: `latest` holds {text!r}, which names no committed checkpoint "
                 f"(listed: {tags})")
        else:
            out.latest = text[:-1]
            out.latest_lagging = out.latest != tags[-1]
    if listing:
        target = W.load_target()
        try:
            got = shardsafe.load(target, root, per_rank_strict=False).tag
            if got != tags[-1]:
                fail(f"LATEST {root}: loading the root gives {got}, the newest commit is "
                     f"{tags[-1]} (latest: {out.latest})")
        except Exception as e:  # noqa: BLE001
            fail(f"LATEST {root}: loading the root failed: {type(e).__name__}: {e}")

    if fresh_save:
        _fresh_save(out, root, known)
    return out


def _fresh_save(out: RootCheck, root: str, known: set[int]) -> None:
    """A one-process save of the next step: it succeeds, removes every
    leftover, moves `latest`, applies retention and loads bit-exact."""
    import shardsafe

    fail = out.failures.append
    latest_path = os.path.join(root, "latest")
    step = max(known | set(out.listed), default=0) + 1
    try:
        mgr = shardsafe.CheckpointManager(root, keep_last=W.KEEP_LAST, tag_format=W.TAG_FORMAT)
        mgr.save(step, W.whole_state(step), max_file_bytes=W.MAX_FILE_BYTES)
    except Exception as e:  # noqa: BLE001
        fail(f"FRESH SAVE {root}: save of step {step} after the crash failed: "
             f"{type(e).__name__}: {e}")
        return
    out.fresh_step = step
    known.add(step)
    left = sorted(e for e in os.listdir(root) if e.startswith("."))
    if left:
        fail(f"LEFTOVER {root}: after the fresh save of step {step}: {left}")
    after = mgr.list()
    if len(after) > W.KEEP_LAST:
        fail(f"RETENTION {root}: {len(after)} checkpoints after the fresh save, "
             f"keep_last={W.KEEP_LAST}: {[c['tag'] for c in after]}")
    tag = W.TAG_FORMAT.format(step=step)
    try:
        with open(latest_path) as f:
            if f.read() != tag + "\n":
                fail(f"LATEST {root}: `latest` does not name the fresh save {tag}")
    except OSError as e:
        fail(f"LATEST {root}: no `latest` after the fresh save: {e}")
    problem = loads_bit_exact(os.path.join(root, tag), step)
    if problem:
        fail("CORRUPT (fresh save) " + problem)
