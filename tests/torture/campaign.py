"""The crash campaign: real gloo writer jobs killed at random moments, and a
power-loss simulation on a loop-mounted ext4 image.

    python3 tests/torture/campaign.py [--kills N] [--procs 1,2,3,4] [--modes sync,async,memory]
                                      [--power-loss M] [--seed S] [--bin PATH]

(scripts/torture.sh runs it.) The package is the `shardsafe` Python finds
(PYTHONPATH or installed); the CLI is --bin, else $SHARDSAFE_BIN, else
build/shardsafe.

SIGKILL campaign, for each (processes P, mode): N times, a writer job of P
processes (torch.distributed gloo, FileStore rendezvous, forked from a
forkserver that has torch and shardsafe imported) saves checkpoints in a
loop into one root (workload.py); the campaign waits until every rank is up
and rank 0 has acknowledged k saves (k = 1, 2, 0 in turn: kills before the
first commit and kills with commits behind them, however slow the machine),
then a random delay (uniform in [0, D], D about two save periods as
observed), and SIGKILLs either every process or one random rank (P > 1,
half of the kills). Survivors of a one-rank kill must then exit by themselves (an
error from the dead peer); one still running after HANG_GUARD seconds is a
hang (its stacks are dumped to its log). The root is then checked
(root_check.py): every listed checkpoint loads bit-exact and passes `verify`,
nothing acknowledged or listed before is lost, `latest` names a committed
checkpoint, and a fresh save succeeds and leaves no leftover. Mode memory
saves with async_save into a memory tier (ROOT.mem) persisting every 2nd
save of the job to ROOT; both tiers are checked (tier_check.py): each as a
root, the root holding only steps the job persisted, the tiered manager's
list, latest and load agreeing with them, and a fresh tiered save.

Power-loss simulation (--power-loss M, root and loop devices needed; the
sync and async modes only: a memory tier is node memory, which a power
loss empties): the writers save into an ext4 file system on a loop device
(direct I/O) whose backing file lies on a second, outer ext4 loop file
system. At a random
moment (chosen as above) the writers are SIGSTOPped and the outer file system is frozen
(fsfreeze): from then on no write of the inner loop device completes, so
the backing file holds exactly the writes the "device" completed, while
dirty pages still in the inner file system's page cache are not there. The
backing file is copied while frozen (an atomic snapshot), the outer file
system is thawed and the writers killed. The copy is then fsck'ed (journal
replay), mounted and checked like a killed root, and every save that was
acknowledged before the stop must be in it. The inner file system is
mounted with noauto_da_alloc (no implicit flush on rename-over) and
commit=30 (no journal commit for 30 s unless someone syncs), so only the
engine's own fsyncs make anything durable. The device model: a disk whose
completed writes persist (no volatile write cache losing completed,
unflushed writes; see README.md in this directory).

Outcomes are counted, never timed: the exit status is 1 on any failure
(lost or corrupt checkpoint, bad `latest`, leftover after the next save, a
hang, a writer dying by itself) and when a configuration observed no
commit at all (it tested nothing); 3 when --power-loss was asked for and
this machine cannot run it.
"""

from __future__ import annotations

import argparse
import dataclasses
import multiprocessing
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field

HERE = os.path.dirname(os.path.abspath(__file__))
REPO_ROOT = os.path.dirname(os.path.dirname(HERE))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

import root_check as C  # noqa: E402
import tier_check as T  # noqa: E402
import workload as W  # noqa: E402

HANG_GUARD = 300.0  # seconds: only a guard against hangs, never a measured outcome
PEER_TIMEOUT = float(os.environ.get("TORTURE_PEER_TIMEOUT", 20))  # async: wait for a dead peer (s)


@dataclass
class Tally:
    name: str
    iterations: int = 0
    kills_all: int = 0  # every rank SIGKILLed (or, power loss: the snapshot taken)
    kills_one: int = 0  # one rank SIGKILLed, the others left to fail by themselves
    commits: int = 0  # writer checkpoints committed (listed after the crash, or acknowledged)
    persisted: int = 0  # memory mode: writer checkpoints persisted to the root, listed there
    acked: int = 0  # saves acknowledged (returned / Future resolved) before the crash
    verified: int = 0  # committed checkpoints found after a crash, loaded bit-exact + `verify`
    empty: int = 0  # crashes after which the root held no committed checkpoint
    partial: int = 0  # crashes that left a leftover (.tmp-*, .latest.tmp.*)
    latest_lagging: int = 0  # crashes after which `latest` named an older commit than the newest
    survivor_errors: int = 0  # survivors of a one-rank kill that exited with an error
    fresh_saves: int = 0  # fresh saves after a crash that succeeded and left nothing behind
    fsck_fixed: int = 0  # power loss: snapshots on which e2fsck changed something (rc 1/2)
    hangs: int = 0
    failures: list[str] = field(default_factory=list)

    def add(self, other: "Tally") -> None:
        for f in dataclasses.fields(self):
            if f.name == "name":
                continue
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))


COLUMNS = [("iterations", "runs"), ("kills_all", "kill all"), ("kills_one", "kill one"),
           ("commits", "commits"), ("persisted", "persisted"), ("acked", "acked"),
           ("verified", "verified"),
           ("empty", "empty"), ("partial", "partial"), ("latest_lagging", "latest lag"),
           ("survivor_errors", "surv err"), ("fresh_saves", "fresh ok"),
           ("fsck_fixed", "fsck fix"), ("hangs", "hangs")]


def table(tallies: list[Tally]) -> str:
    head = ["configuration"] + [h for _, h in COLUMNS] + ["failures"]
    rows = [[t.name] + [str(getattr(t, a)) for a, _ in COLUMNS] + [str(len(t.failures))]
            for t in tallies]
    widths = [max(len(r[i]) for r in [head] + rows) for i in range(len(head))]
    fmt = lambda r: "  ".join(c.ljust(w) if i == 0 else c.rjust(w)  # noqa: E731
                              for i, (c, w) in enumerate(zip(r, widths)))
    return "\n".join([fmt(head), fmt(["-" * w for w in widths])] + [fmt(r) for r in rows])


_ctx = None


def context():
    """A forkserver with torch and shardsafe imported: a writer process
    starts in a fraction of an import's time."""
    global _ctx
    if _ctx is None:
        _ctx = multiprocessing.get_context("forkserver")
        _ctx.set_forkserver_preload(["torch", "torch.distributed", "shardsafe", "workload"])
    return _ctx


def _tail(path: str, n: int = 3000) -> str:
    try:
        with open(path, errors="replace") as f:
            return f.read()[-n:]
    except OSError:
        return "<no log>"


def _logs(jobdir: str, world: int) -> str:
    return "".join(f"\n----- rank {r} log -----\n{_tail(os.path.join(jobdir, f'rank{r}.log'))}"
                   for r in range(world))


def _acks(jobdir: str) -> list[tuple[int, float]]:
    out = []
    try:
        with open(os.path.join(jobdir, "acks")) as f:
            for line in f:
                parts = line.split()
                if len(parts) == 2:
                    out.append((int(parts[0]), float(parts[1])))
    except OSError:
        pass
    return out


class Job:
    """A writer job of `world` processes saving into `root` from `start`."""

    def __init__(self, world: int, mode: str, root: str, start: int, jobdir: str):
        self.world, self.jobdir = world, jobdir
        os.makedirs(jobdir, exist_ok=True)
        store = os.path.join(jobdir, "store")
        ctx = context()
        self.procs = [ctx.Process(target=W.writer_main, daemon=True,
                                  args=(r, world, root, mode, start, jobdir, store, PEER_TIMEOUT))
                      for r in range(world)]
        for p in self.procs:
            p.start()

    def _wait(self, done, what: str) -> str | None:
        """None once done() holds, else what went wrong: a rank exited
        first, or the hang guard ran out."""
        deadline = time.monotonic() + HANG_GUARD
        while not done():
            dead = [r for r, p in enumerate(self.procs) if p.exitcode is not None]
            if dead:
                return f"rank(s) {dead} exited ({[self.procs[r].exitcode for r in dead]}) " \
                       f"before {what}"
            if time.monotonic() > deadline:
                return f"not {what} after {HANG_GUARD:.0f} s (hang guard)"
            time.sleep(0.005)
        return None

    def wait_ready(self) -> str | None:
        """None once every rank is up (rank 0 wrote `ready`), else what went wrong."""
        ready = os.path.join(self.jobdir, "ready")
        return self._wait(lambda: os.path.exists(ready), "the job was up")

    def wait_acks(self, n: int) -> str | None:
        """None once rank 0 acknowledged `n` saves, else what went wrong."""
        return self._wait(lambda: len(_acks(self.jobdir)) >= n,
                          f"{n} saves were acknowledged")

    def signal(self, ranks: list[int], sig: int) -> None:
        for r in ranks:
            try:
                os.kill(self.procs[r].pid, sig)
            except ProcessLookupError:
                pass

    def dump_and_kill(self) -> None:
        alive = [r for r, p in enumerate(self.procs) if p.exitcode is None]
        self.signal(alive, signal.SIGUSR1)  # faulthandler: every thread's stack to the log
        time.sleep(2)
        self.signal(alive, signal.SIGKILL)
        for p in self.procs:
            p.join()

    def close(self) -> None:
        for p in self.procs:
            if p.exitcode is None:
                p.kill()
            p.join()
            p.close()


def _crash_outcome(t: Tally, job: Job, victims: list[int], where: str) -> None:
    """Joins the job after the kill of `victims`: victims must have died of
    SIGKILL, survivors must exit by themselves (an error) within the guard."""
    for r in victims:
        job.procs[r].join()
    deadline = time.monotonic() + HANG_GUARD
    for r, p in enumerate(job.procs):
        if r not in victims:
            p.join(max(0.0, deadline - time.monotonic()))
    hung = [r for r, p in enumerate(job.procs) if p.exitcode is None]
    if hung:
        t.hangs += 1
        job.dump_and_kill()
        t.failures.append(f"HANG {where}: rank(s) {hung} still running {HANG_GUARD:.0f} s after "
                          f"rank(s) {victims} were killed{_logs(job.jobdir, job.world)}")
        return
    for r, p in enumerate(job.procs):
        code = p.exitcode
        if r in victims:
            if code != -signal.SIGKILL:
                t.failures.append(f"WRITER {where}: rank {r} exited with {code} before it was "
                                  f"killed{_logs(job.jobdir, job.world)}")
        elif code == 0:
            t.failures.append(f"WRITER {where}: rank {r} exited cleanly although rank(s) "
                              f"{victims} died{_logs(job.jobdir, job.world)}")
        elif code < 0:
            t.failures.append(f"WRITER {where}: survivor rank {r} died of signal {-code} "
                              f"(expected an error exit){_logs(job.jobdir, job.world)}")
        else:
            t.survivor_errors += 1


def _record(t: Tally, rc: C.RootCheck, start: int, acks: list, where: str) -> int:
    """Adds a root check to the tally; the writer commits it saw."""
    acked = {s for s, _ in acks}
    commits = {s for s in set(rc.listed) | acked if s >= start}
    t.commits += len(commits)
    t.persisted += len(rc.persisted)
    t.acked += len(acked)
    t.verified += rc.verified
    t.empty += not rc.listed
    t.partial += bool(rc.partial)
    t.latest_lagging += rc.latest_lagging
    t.fresh_saves += rc.fresh_step is not None and not any(
        f.startswith(("LEFTOVER", "FRESH", "RETENTION")) for f in rc.failures)
    t.failures += [f"{where}: {f}" for f in rc.failures]
    return len(commits)


class DelayPicker:
    """Random kill delays after the anchor (job up, or the k-th acknowledged
    save), uniform in [0, D]: D follows about two save periods as observed
    (a kill lands mid-save, between the data and the commit, or between
    saves), and grows while nothing gets committed."""

    def __init__(self, rng: random.Random, initial: float = 1.0):
        self.rng, self.max = rng, initial
        self.periods: list[float] = []

    def pick(self) -> float:
        return self.rng.uniform(0.0, self.max)

    def observe(self, ready_at: float | None, acks: list, commits: int) -> None:
        times = ([ready_at] if ready_at is not None else []) + [a for _, a in acks]
        self.periods += [b - a for a, b in zip(times, times[1:]) if b > a]
        self.periods = self.periods[-50:]
        if commits == 0 and not acks:
            self.max = min(self.max * 1.5, 30.0)
        elif self.periods:
            self.max = min(max(2.0 * statistics.median(self.periods), 0.05), 30.0)


def _ready_time(jobdir: str) -> float | None:
    try:
        with open(os.path.join(jobdir, "ready")) as f:
            return float(f.read().strip())
    except (OSError, ValueError):
        return None


def kill_campaign(world: int, mode: str, kills: int, rng: random.Random, workdir: str,
                  binary: str, log=print) -> Tally:
    """`kills` SIGKILLs of a `world`-process `mode` writer job, each followed
    by the checks of root_check.py."""
    name = f"kill  P={world} {mode}"
    t = Tally(name)
    base = os.path.join(workdir, f"kill-p{world}-{mode}")
    root = os.path.join(base, "root")
    known: set[int] = set()  # committed where the writer saves (memory mode: the memory tier)
    known_root: set[int] = set()  # memory mode: committed in the root
    delays = DelayPicker(rng)
    for i in range(kills):
        where = f"{name} #{i}"
        start = max(known | known_root, default=0) + 1
        jobdir = os.path.join(base, f"job{i}")
        t0 = time.monotonic()
        job = Job(world, mode, root, start, jobdir)
        try:
            anchor = (i + 1) % 3  # kill after the 1st, 2nd or 0th acknowledged save ...
            err = job.wait_ready() or job.wait_acks(anchor)
            t_up = time.monotonic() - t0
            if err:
                job.dump_and_kill()
                t.failures.append(f"WRITER {where}: {err}{_logs(jobdir, world)}")
                break
            delay = delays.pick()  # ... plus a random delay
            time.sleep(delay)
            if world > 1 and rng.random() < 0.5:
                victims = [rng.randrange(world)]
                t.kills_one += 1
            else:
                victims = list(range(world))
                rng.shuffle(victims)
                t.kills_all += 1
            job.signal(victims, signal.SIGKILL)
            t1 = time.monotonic()
            _crash_outcome(t, job, victims, where)
        finally:
            job.close()
        t_down = time.monotonic() - t1
        t.iterations += 1
        acks = _acks(jobdir)
        known |= {s for s, _ in acks}
        t2 = time.monotonic()
        if mode == T.MODE:
            rc = T.check_tiers(root, binary, known_mem=known, known_root=known_root, start=start,
                               fresh_save=True)
        else:
            rc = C.check_root(root, binary, known=known, fresh_save=True)
        t_check = time.monotonic() - t2
        commits = _record(t, rc, start, acks, where)
        delays.observe(_ready_time(jobdir), acks, commits)
        log(f"  {where}: ack {anchor} + {delay:.3f}s, killed {'all' if len(victims) == world else victims}"
            f"; commits {commits}, listed {rc.listed}"
            + (f", persisted {rc.persisted}" if mode == T.MODE else "")
            + f", leftovers {rc.partial or '-'}, "
            f"latest {rc.latest}, {len(rc.failures)} failure(s) "
            f"[up {t_up:.1f}s, down {t_down:.1f}s, check {t_check:.1f}s]")
        if not rc.failures and not t.failures:
            shutil.rmtree(jobdir, ignore_errors=True)
    return t


# ------------------------------------------------------------- power loss --

class Unavailable(Exception):
    pass


def _sh(*cmd: str, timeout: float = 300, check: bool = True) -> subprocess.CompletedProcess:
    p = subprocess.run(list(cmd), capture_output=True, text=True, errors="replace",
                       timeout=timeout)
    if check and p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: rc={p.returncode}: {(p.stdout + p.stderr).strip()}")
    return p


class LoopFs:
    """An ext4 file system in `image` (a file), on a loop device, mounted at `mnt`."""

    def __init__(self, image: str, mnt: str, size_mb: int | None, options: str = "",
                 direct_io: bool = True):
        self.image, self.mnt, self.dev = image, mnt, None
        if size_mb is not None:
            with open(image, "wb") as f:
                f.truncate(size_mb << 20)
            _sh("mkfs.ext4", "-q", "-F", "-E", "lazy_itable_init=0,lazy_journal_init=0", image)
        os.makedirs(mnt, exist_ok=True)
        self.dev = _sh("losetup", "--find", "--show", f"--direct-io={'on' if direct_io else 'off'}",
                       image).stdout.strip()
        try:
            _sh("mount", *(["-o", options] if options else []), self.dev, mnt)
        except Exception:
            _sh("losetup", "-d", self.dev, check=False)
            self.dev = None
            raise

    def close(self) -> None:
        if self.dev is None:
            return
        for _ in range(20):
            if _sh("umount", self.mnt, check=False).returncode == 0:
                break
            time.sleep(0.5)
        _sh("losetup", "-d", self.dev, check=False)
        self.dev = None


INNER_OPTIONS = "noauto_da_alloc,commit=30"


class PowerLossRig:
    """outer.img (host file) -> loop -> ext4 at OUTER; OUTER/device.img ->
    loop (direct I/O) -> ext4 at INNER, where the writers save."""

    def __init__(self, workdir: str):
        if os.geteuid() != 0:
            raise Unavailable("not root: loop devices and mounts need root")
        for tool in ("mkfs.ext4", "losetup", "mount", "umount", "fsfreeze", "e2fsck"):
            if shutil.which(tool) is None:
                raise Unavailable(f"{tool} not found")
        self.dir = os.path.join(workdir, "power-loss")
        os.makedirs(self.dir, exist_ok=True)
        self.outer = self.inner = None
        try:
            self.outer = LoopFs(os.path.join(self.dir, "outer.img"),
                                os.path.join(self.dir, "outer"), 768)
            self.inner = LoopFs(os.path.join(self.outer.mnt, "device.img"),
                                os.path.join(self.dir, "inner"), 480, INNER_OPTIONS)
            _sh("fsfreeze", "-f", self.outer.mnt)
            _sh("fsfreeze", "-u", self.outer.mnt)
        except Exception as e:
            self.close()
            raise Unavailable(f"cannot loop-mount (and freeze) ext4 images here: {e}") from None

    def snapshot(self, dst: str) -> None:
        """Copies the inner device's bytes atomically: the outer file system
        is frozen meanwhile, so no inner device write completes."""
        _sh("fsfreeze", "-f", self.outer.mnt)
        try:
            _sh("cp", "--sparse=always", self.inner.image, dst)
        finally:
            _sh("fsfreeze", "-u", self.outer.mnt)

    def close(self) -> None:
        if self.inner is not None:
            self.inner.close()
        if self.outer is not None:
            self.outer.close()
        shutil.rmtree(self.dir, ignore_errors=True)


def _check_snapshot(t: Tally, image: str, mnt: str, binary: str, where: str,
                    known: set[int]) -> tuple[C.RootCheck | None, int | None]:
    """e2fsck -fy (journal replay), mount and check_root of a snapshot; the
    image is removed afterwards."""
    dev = None
    mounted = False
    fsck_rc = None
    try:
        dev = _sh("losetup", "--find", "--show", image).stdout.strip()
        fsck = _sh("e2fsck", "-fy", dev, check=False)
        fsck_rc = fsck.returncode
        if fsck_rc >= 4:
            t.failures.append(f"FSCK {where}: e2fsck rc={fsck_rc} on the snapshot:\n"
                              f"{fsck.stdout[-3000:]}")
        t.fsck_fixed += fsck_rc in (1, 2)
        if os.environ.get("TORTURE_FSCK_LOG"):
            with open(os.environ["TORTURE_FSCK_LOG"], "a") as f:
                f.write(f"--- {where}: rc {fsck_rc}\n{fsck.stdout}{fsck.stderr}")
        os.makedirs(mnt, exist_ok=True)
        _sh("mount", dev, mnt)
        mounted = True
        return C.check_root(os.path.join(mnt, "root"), binary, known=known,
                            fresh_save=True), fsck_rc
    except RuntimeError as e:
        t.failures.append(f"SNAPSHOT {where}: {e}")
        return None, fsck_rc
    finally:
        if mounted:
            for _ in range(20):
                if _sh("umount", mnt, check=False).returncode == 0:
                    break
                time.sleep(0.5)
        if dev:
            _sh("losetup", "-d", dev, check=False)
        if os.path.exists(image):
            os.unlink(image)


def power_loss_campaign(combos: list[tuple[int, str]], iterations: int, rng: random.Random,
                        workdir: str, binary: str, log=print) -> list[Tally]:
    """`iterations` simulated power losses, cycling through (P, mode) combos
    in one root of the inner file system. Raises Unavailable."""
    rig = PowerLossRig(workdir)
    tallies = {c: Tally(f"power P={c[0]} {c[1]}") for c in combos}
    live = {c: Tally(f"(live after kill) P={c[0]} {c[1]}") for c in combos}
    try:
        root = os.path.join(rig.inner.mnt, "root")
        durable: set[int] = set()  # listed in the live root after a fresh (synced) save
        delays = {c: DelayPicker(rng) for c in combos}
        snap_img = os.path.join(rig.dir, "snapshot.img")
        snap_mnt = os.path.join(rig.dir, "snapshot")
        for i in range(iterations):
            combo = combos[i % len(combos)]
            world, mode = combo
            t = tallies[combo]
            where = f"{t.name} #{i}"
            start = max(durable, default=0) + 1
            jobdir = os.path.join(rig.dir, f"job{i}")
            job = Job(world, mode, root, start, jobdir)
            try:
                # after the 1st, 2nd or 0th acknowledged save (each combination's
                # first power loss has a commit behind it)
                anchor = (i // len(combos) + 1) % 3
                err = job.wait_ready() or job.wait_acks(anchor)
                if err:
                    job.dump_and_kill()
                    t.failures.append(f"WRITER {where}: {err}{_logs(jobdir, world)}")
                    break
                delay = delays[combo].pick()
                time.sleep(delay)
                job.signal(list(range(world)), signal.SIGSTOP)
                # Acknowledged before the stop: durable, so in the snapshot.
                acks = _acks(jobdir)
                rig.snapshot(snap_img)
                job.signal(list(range(world)), signal.SIGKILL)
                job.signal(list(range(world)), signal.SIGCONT)
                _crash_outcome(t, job, list(range(world)), where)
            finally:
                job.close()
            t.iterations += 1
            t.kills_all += 1

            # The device's bytes: fsck (journal replay), mount, check.
            rc, fsck_rc = _check_snapshot(t, snap_img, snap_mnt, binary, where,
                                          known=set(durable) | {s for s, _ in acks})
            commits = _record(t, rc, start, acks, where) if rc is not None else 0

            # The live root after the kill: the SIGKILL checks, and the fresh
            # save there makes its listing durable for the next iteration.
            known = set(durable) | {s for s, _ in acks}
            lrc = C.check_root(root, binary, known=known, fresh_save=True)
            _record(live[combo], lrc, start, acks, where + " (live)")
            live[combo].iterations += 1
            if lrc.fresh_step is not None:
                durable = set(lrc.listed) | {lrc.fresh_step}
            delays[combo].observe(_ready_time(jobdir), acks, commits)
            log(f"  {where}: ack {anchor} + {delay:.3f}s, acked {[s for s, _ in acks]}; snapshot: fsck rc "
                f"{fsck_rc}, listed {rc.listed if rc else '?'}, "
                f"leftovers {(rc.partial if rc else '?') or '-'}, latest {rc.latest if rc else '?'}"
                f"; live listed {lrc.listed}; {len(t.failures)} failure(s)")
            if not t.failures:
                shutil.rmtree(jobdir, ignore_errors=True)
    finally:
        rig.close()
    return list(tallies.values()) + list(live.values())


# ------------------------------------------------------------------- main --

def _binary(arg: str | None) -> str:
    raw = arg or os.environ.get("SHARDSAFE_BIN") or "build/shardsafe"
    path = raw if os.path.isabs(raw) else os.path.join(REPO_ROOT, raw)
    if not (os.path.isfile(path) and os.access(path, os.X_OK)):
        sys.exit(f"shardsafe binary not found at {path} (--bin or SHARDSAFE_BIN)")
    return path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kills", type=int, default=100, help="SIGKILLs per configuration (100)")
    ap.add_argument("--procs", default="1,2,3,4", help="writer processes, e.g. 1,2,3,4")
    ap.add_argument("--modes", default=",".join(W.MODES),
                    help=f"some of {','.join(W.MODES)} (all)")
    ap.add_argument("--power-loss", type=int, default=40, metavar="M",
                    help="simulated power losses in all, cycling through the sync and async "
                         "configurations (40; 0: none)")
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--bin", default=None, help="the shardsafe CLI (default $SHARDSAFE_BIN, "
                                                "else build/shardsafe)")
    ap.add_argument("--workdir", default=None, help="scratch directory (default: a new one in /tmp)")
    ap.add_argument("--keep", action="store_true", help="keep the scratch directory")
    ap.add_argument("-q", "--quiet", action="store_true", help="no line per kill")
    args = ap.parse_args(argv)
    procs = [int(p) for p in args.procs.split(",") if p]
    modes = [m for m in args.modes.split(",") if m]
    if any(p < 1 or p > 4 for p in procs) or any(m not in W.MODES for m in modes):
        ap.error(f"--procs takes 1..4, --modes some of {','.join(W.MODES)}")
    binary = _binary(args.bin)
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1 << 32)
    rng = random.Random(seed)
    import shardsafe

    print(f"torture: seed {seed}; package {os.path.dirname(shardsafe.__file__)}; CLI {binary}",
          flush=True)
    workdir = args.workdir or tempfile.mkdtemp(prefix="shardsafe-torture-")
    os.makedirs(workdir, exist_ok=True)
    log = (lambda *a: None) if args.quiet else (lambda s: print(s, flush=True))
    tallies: list[Tally] = []
    status = 0
    power_note = "power-loss simulation: not run (--power-loss 0)"
    try:
        for world in procs:
            for mode in modes:
                if args.kills <= 0:
                    continue
                print(f"SIGKILL campaign: {args.kills} kills of {world} process(es), {mode}",
                      flush=True)
                tallies.append(kill_campaign(world, mode, args.kills, rng, workdir, binary, log))
        combos = [(p, m) for p in procs for m in modes if m != T.MODE]
        if args.power_loss > 0 and combos:
            print(f"power-loss simulation: {args.power_loss} snapshots over {combos}", flush=True)
            try:
                tallies += power_loss_campaign(combos, args.power_loss, rng, workdir, binary, log)
                power_note = ("power-loss simulation: REAL: ext4 on a loop device (direct I/O) "
                              "inside a frozen outer ext4; atomic copy of the device's bytes, "
                              "e2fsck, mount, checks")
            except Unavailable as e:
                power_note = f"power-loss simulation: NOT RUN: {e}"
                status = 3
        if args.power_loss > 0 and T.MODE in modes:
            note = (f"power-loss simulation: none for mode {T.MODE} (its memory tier is node "
                    f"memory, which a power loss empties)")
            power_note = power_note + "\n" + note if combos else note
    finally:
        if not args.keep and not any(t.failures for t in tallies):
            shutil.rmtree(workdir, ignore_errors=True)
    print()
    print(table(tallies))
    total = Tally("total")
    for t in tallies:
        total.add(t)
    print(f"\ntotal: {total.iterations} crashes, {total.commits} writer commits, "
          f"{total.verified} checkpoint verifications, {len(total.failures)} failure(s)")
    print(power_note)
    for t in tallies:
        if t.iterations and t.commits == 0 and not t.name.startswith("(live"):
            t.failures.append(f"NOTHING TESTED {t.name}: no commit observed in {t.iterations} "
                              f"crashes")
    failures = [f for t in tallies for f in t.failures]
    if failures:
        print(f"\n{len(failures)} FAILURE(S) (seed {seed}, workdir {workdir}):")
        for f in failures:
            print("\n* " + f)
        return 1
    if status == 3:
        print(f"no failure in what ran (seed {seed}), but the power-loss simulation asked for "
              f"could not run: exit 3 (--power-loss 0 skips it)")
    else:
        print(f"no failure (seed {seed})")
    return status


if __name__ == "__main__":
    sys.exit(main())
