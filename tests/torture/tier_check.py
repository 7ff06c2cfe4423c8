"""What the campaign checks after a kill of a memory-mode job: both tiers of
a tiered CheckpointManager (workload.manager(root, "memory")).

check_tiers(root, ...) returns one RootCheck for the two tiers (the memory
tier's listing as `listed`, both tiers' counts and failures summed, the
root's new steps as `persisted`). Checks:

- each tier is a root that passes check_root (root_check.py): nothing
  partial listed, every listed checkpoint loads bit-exact and passes
  `shardsafe verify`, `latest` names a committed checkpoint, and nothing
  committed there is lost: the memory tier keeps the newest KEEP_LAST of
  the steps known committed there (acknowledged saves, steps listed
  before), the root the newest KEEP_LAST of the steps listed there before;
- the root holds only persisted steps: each step it lists that it did not
  list before is one this job persisted (a PERSIST_EVERY-th save of the
  job: start + 1, start + 3, ... for PERSIST_EVERY = 2) and no newer than
  the newest memory commit (a persist copies a committed memory
  checkpoint, and a tier's newest commit is never removed);
- the tiered manager agrees with the tiers: list() shows each step with
  the tiers that list it, latest_step() is the newest step listed in
  either, and load() of the latest gives that step bit-exact, from the
  memory tier when it holds the step, with no warning;
- optionally, a fresh save (one process, tiered manager persisting it,
  then wait()) succeeds and in both tiers leaves no `.`-entry, moves
  `latest` to itself, keeps at most KEEP_LAST and loads bit-exact; the
  tiered manager lists it in both tiers and loads it from memory.
"""

from __future__ import annotations

import os
import warnings

import root_check as C
import workload as W

MODE = "memory"


def check_tiers(root: str, binary: str, *, known_mem: set[int], known_root: set[int],
                start: int, fresh_save: bool) -> C.RootCheck:
    """Checks both tiers of `root` after a job that saved from `start` (see
    the module doc). `known_mem` / `known_root`: steps known committed in
    each tier; updated with what each lists (and the fresh save)."""
    before_root = set(known_root)
    mem = C.check_root(W.memory_dir(root), binary, known=known_mem, fresh_save=False)
    rt = C.check_root(root, binary, known=known_root, fresh_save=False)
    out = C.RootCheck(listed=mem.listed, verified=mem.verified + rt.verified,
                      partial=mem.partial + [f"root/{p}" for p in rt.partial],
                      latest=mem.latest, latest_lagging=mem.latest_lagging or rt.latest_lagging,
                      failures=mem.failures + rt.failures)
    out.persisted = [s for s in rt.listed if s not in before_root]
    _check_persisted(out, root, start, max(known_mem, default=None))
    _check_manager(out, root, mem.listed, rt.listed)
    if fresh_save:
        _fresh_save(out, root, known_mem, known_root)
    return out


def _check_persisted(out: C.RootCheck, root: str, start: int, newest_mem: int | None) -> None:
    """The root's new steps are steps this job persisted."""
    for s in out.persisted:
        if (s < start or (s - start) % W.PERSIST_EVERY != W.PERSIST_EVERY - 1
                or newest_mem is None or s > newest_mem):
            out.failures.append(
                f"PERSIST {root}: step {s} is listed in the root, but the job (saves from step "
                f"{start}, persisting steps {start + W.PERSIST_EVERY - 1}, "
                f"{start + 2 * W.PERSIST_EVERY - 1}, ...; newest memory commit {newest_mem}) "
                f"never persisted it")


def _check_manager(out: C.RootCheck, root: str, mem_listed: list[int],
                   root_listed: list[int]) -> None:
    """The tiered manager's list, latest_step and load agree with the tiers."""
    fail = out.failures.append
    want = {s: [t for t, listed in (("memory", mem_listed), ("root", root_listed))
                if s in listed] for s in set(mem_listed) | set(root_listed)}
    try:
        mgr = W.manager(root, MODE)
        got = {c["step"]: list(c["tiers"]) for c in mgr.list()}
        latest = mgr.latest_step()
    except Exception as e:  # noqa: BLE001 - any failure is the finding
        fail(f"TIERS {root}: the tiered manager's list/latest_step failed: "
             f"{type(e).__name__}: {e}")
        return
    if got != want:
        fail(f"TIERS {root}: the tiered manager lists {got}, the tiers list {want}")
    newest = max(want, default=None)
    if latest != newest:
        fail(f"TIERS {root}: latest_step() is {latest}, the newest step listed is {newest}")
    if newest is not None:
        problem = _tiered_load(mgr, newest, "memory" if newest in mem_listed else "root")
        if problem:
            fail(f"TIERED LOAD {root}: {problem}")


def _tiered_load(mgr, step: int, tier: str) -> str | None:
    """None if the tiered manager's load of the latest gives `step` from
    `tier`, bit-exact and without a warning, else what went wrong."""
    target = W.load_target()
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            res = mgr.load(target, per_rank_strict=False)
    except Exception as e:  # noqa: BLE001
        return f"load of the latest (step {step}) failed: {type(e).__name__}: {e}"
    said = [str(w.message) for w in caught] + list(res.warnings)
    if said:
        return f"load of the latest warned: {said}"
    if res.step != step or list(res.bytes_by_tier) != [tier]:
        return (f"load of the latest gave step {res.step} from {list(res.bytes_by_tier)}, "
                f"expected step {step} from {tier}")
    return C.loaded_differs(f"tiered load of step {step}", target, res, step)


def _fresh_save(out: C.RootCheck, root: str, known_mem: set[int], known_root: set[int]) -> None:
    """A one-process tiered save of the next step, persisted: it succeeds and
    in both tiers removes every leftover, moves `latest`, applies retention
    and loads bit-exact."""
    fail = out.failures.append
    step = max(known_mem | known_root, default=0) + 1
    mgr = W.manager(root, MODE, persist_every=1)
    try:
        mgr.save(step, W.whole_state(step), max_file_bytes=W.MAX_FILE_BYTES)
        mgr.wait()
    except Exception as e:  # noqa: BLE001
        fail(f"FRESH SAVE {root}: tiered save (persisted) of step {step} after the crash failed: "
             f"{type(e).__name__}: {e}")
        return
    out.fresh_step = step
    known_mem.add(step)
    known_root.add(step)
    tag = W.TAG_FORMAT.format(step=step)
    for tier, where in (("memory", W.memory_dir(root)), ("root", root)):
        left = sorted(e for e in os.listdir(where) if e.startswith("."))
        if left:
            fail(f"LEFTOVER {where}: after the fresh tiered save of step {step}: {left}")
        kept = sorted(e for e in os.listdir(where) if e.startswith("step-"))
        if len(kept) > W.KEEP_LAST:
            fail(f"RETENTION {where}: {len(kept)} checkpoints after the fresh save, "
                 f"keep_last={W.KEEP_LAST}: {kept}")
        try:
            with open(os.path.join(where, "latest")) as f:
                if f.read() != tag + "\n":
                    fail(f"LATEST {where}: `latest` does not name the fresh save {tag}")
        except OSError as e:
            fail(f"LATEST {where}: no `latest` after the fresh save: {e}")
        problem = C.loads_bit_exact(os.path.join(where, tag), step)
        if problem:
            fail(f"CORRUPT (fresh save, {tier}) " + problem)
    tiers = {c["step"]: list(c["tiers"]) for c in mgr.list()}.get(step)
    if tiers != ["memory", "root"]:
        fail(f"TIERS {root}: the fresh save of step {step} is listed in {tiers}, "
             f"expected ['memory', 'root']")
    problem = _tiered_load(mgr, step, "memory")
    if problem:
        fail(f"TIERED LOAD (fresh save) {root}: {problem}")
