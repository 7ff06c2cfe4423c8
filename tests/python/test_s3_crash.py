"""SIGKILLs of saves into an S3 bucket: the sync and async crash campaign
of test_torture.py (tests/torture: writer jobs of 1 and 2 gloo processes, sync
and async saves with CheckpointManager(keep_last=2), each job killed at a
random moment anchored on its acknowledged saves, whole or one rank) with
its root in a bucket of moto (tests/s3/moto_server.py, a process of its
own). After every kill:

- nothing partial is listed: the Python listing, `shardsafe ls --json` and
  the tags that hold an index object in the bucket are the same, and every
  listed checkpoint loads bit-exact (checksums verified);
- nothing committed is lost: the newest keep_last of the steps known
  committed (acknowledged, or listed before) are listed, so what `latest`
  named before the kill loads bit-exact unless keep_last newer commits
  retired it;
- `latest` names a listed checkpoint, never an older one than it named
  before the job, and loading the root gives the newest commit.

Then a one-process save of the next step with SHARDSAFE_S3_LEFTOVER_AGE=0
(the job restarted after the crash) cleans every leftover: afterwards every
object under the root is `latest` or belongs to a committed checkpoint (its
index, its commit record, the data files its index names), and no
multipart upload is open under the root. Jobs save data files of at most
2 MiB (a PUT each) and, every other job, one file per rank uploaded in
5 MiB parts, so kills leave both kinds of leftover. The last test kills a
job inside a save and saves that step again within the leftover age, as a
restarted job does: a later save with the age 0 leaves nothing of the dead
save either.

Assertions count outcomes, never time; delays before a kill are random and
deadlines are hang guards. The seed is printed; TORTURE_SEED=S replays a
run's choices. Writers come from the campaign's forkserver, which may have
started before the AWS_* variables pointed at this test's moto, so each
writer sets them first (_writer). A writer imports this module: boto3 is
imported by the fixture only.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

import shardsafe

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "torture"))
import campaign  # noqa: E402
import root_check as C  # noqa: E402
import workload as W  # noqa: E402

MOTO = Path(__file__).resolve().parents[1] / "s3" / "moto_server.py"
BUCKET = "crash"
# (processes, mode, kills): 50 kills in all.
CONFIGS = [(1, "sync", 15), (1, "async", 15), (2, "sync", 10), (2, "async", 10)]
# A job's data files, alternately: several of at most 2 MiB per rank (one
# PUT each), or one per rank, a multipart upload of 5 MiB parts (the
# smallest S3 takes; the state is 11 MiB).
FILE_BYTES = (W.MAX_FILE_BYTES, 64 << 20)
PART_BYTES = 5 << 20
INDEX, RECORD, LATEST = "shardsafe.json", "commit.json", "latest"


def _writer(env: dict, max_file_bytes: int, *args) -> None:
    """A campaign writer (workload.writer_main) with the environment `env`,
    saving data files of at most `max_file_bytes`."""
    os.environ.clear()
    os.environ.update(env)
    W.MAX_FILE_BYTES = max_file_bytes  # in this writer process only
    W.writer_main(*args)


class _BucketJob(campaign.Job):
    """campaign.Job, its writers started by _writer with this process's
    environment."""

    def __init__(self, world: int, mode: str, root: str, start: int, jobdir: str,
                 max_file_bytes: int):
        self.world, self.jobdir = world, jobdir
        os.makedirs(jobdir, exist_ok=True)
        args = (world, root, mode, start, jobdir, os.path.join(jobdir, "store"),
                campaign.PEER_TIMEOUT)
        self.procs = [campaign.context().Process(
            target=_writer, daemon=True, args=(dict(os.environ), max_file_bytes, r, *args))
            for r in range(world)]
        for p in self.procs:
            p.start()


@pytest.fixture(scope="module")
def server():
    """moto on 127.0.0.1 in a process of its own, this process's AWS_*
    variables pointing at it (restored afterwards); yields a boto3 client
    that has created BUCKET."""
    import boto3  # requirements-dev.txt: a missing one fails the tests loudly

    moto = subprocess.Popen([sys.executable, str(MOTO)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    saved = dict(os.environ)
    try:
        port = moto.stdout.readline().split()  # moto_server.py prints its port once up
        assert port, f"{MOTO} did not start (python3 with moto[server]; its stderr above)"
        env = {"AWS_ACCESS_KEY_ID": "crash-key", "AWS_SECRET_ACCESS_KEY": "crash-secret",
               "AWS_REGION": "us-east-1", "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port[0]}",
               "SHARDSAFE_S3_PART_BYTES": str(PART_BYTES)}
        for k in ("AWS_ENDPOINT_URL_S3", "AWS_SESSION_TOKEN", "AWS_DEFAULT_REGION"):
            os.environ.pop(k, None)
        os.environ.update(env)
        client = boto3.client("s3", endpoint_url=env["AWS_ENDPOINT_URL"],
                              region_name=env["AWS_REGION"],
                              aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
                              aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"])
        client.create_bucket(Bucket=BUCKET)
        yield client
    finally:
        os.environ.clear()
        os.environ.update(saved)
        moto.stdin.close()  # moto_server.py serves until its stdin closes
        try:
            moto.wait(timeout=60)
        except subprocess.TimeoutExpired:
            moto.kill()
            moto.wait()


class _Bucket:
    """A boto3 view of one root: its objects, tags and open uploads."""

    def __init__(self, client, prefix: str):
        self.client, self.prefix = client, prefix

    def keys(self) -> list[str]:
        pages = self.client.get_paginator("list_objects_v2").paginate(
            Bucket=BUCKET, Prefix=self.prefix + "/")
        return sorted(o["Key"] for page in pages for o in page.get("Contents", []))

    def uploads(self) -> list[str]:
        pages = self.client.get_paginator("list_multipart_uploads").paginate(
            Bucket=BUCKET, Prefix=self.prefix + "/")
        return sorted(u["Key"] for page in pages for u in page.get("Uploads", []))

    def read(self, name: str) -> str | None:
        try:
            body = self.client.get_object(Bucket=BUCKET, Key=f"{self.prefix}/{name}")["Body"]
        except self.client.exceptions.NoSuchKey:
            return None
        return body.read().decode()

    def tags_with(self, keys: list[str], name: str) -> set[str]:
        """Tags directly under the root that hold the object `name`."""
        return {k.split("/")[-2] for k in keys if k == f"{self.prefix}/{k.split('/')[-2]}/{name}"}

    def strays(self) -> list[str]:
        """Objects and open uploads that are neither `latest` nor part of a
        committed checkpoint (its index, record and the files it names)."""
        keys = self.keys()
        kept = {f"{self.prefix}/{LATEST}"}
        for tag in self.tags_with(keys, INDEX):
            index = json.loads(self.read(f"{tag}/{INDEX}"))
            kept |= {f"{self.prefix}/{tag}/{n}"
                     for n in [INDEX, RECORD] + [f["name"] for f in index["files"]]}
        return [k for k in keys if k not in kept] + [f"upload {k}" for k in self.uploads()]


def _step_of(tag: str | None) -> int | None:
    return None if tag is None else int(tag.removeprefix("step-"))


def _latest_tag(bucket: _Bucket) -> str | None:
    text = bucket.read(LATEST)
    return None if text is None else text.rstrip("\n")


def _check(bucket: _Bucket, root: str, binary: str, known: set[int],
           latest_before: str | None) -> C.RootCheck:
    """The checks of the module doc after a kill; `known` gains what is listed."""
    out = C.RootCheck()
    fail = out.failures.append
    out.partial = bucket.strays()
    listing = sorted(shardsafe.CheckpointManager(root, tag_format=W.TAG_FORMAT).list(),
                     key=lambda c: c["sequence"])
    tags = [c["tag"] for c in listing]
    out.listed = [c["step"] for c in listing]
    indexed = sorted(bucket.tags_with(bucket.keys(), INDEX))
    if sorted(tags) != indexed:
        fail(f"LISTING {root}: lists {sorted(tags)}, the tags with an index are {indexed}")
    cli = C._cli(binary, "ls", root, "--json")
    if cli.returncode != 0 or sorted(c["tag"] for c in json.loads(cli.stdout)) != sorted(tags):
        fail(f"LISTING {root}: `shardsafe ls` rc={cli.returncode} {cli.stdout}{cli.stderr}, "
             f"the Python list {sorted(tags)}")
    for c in listing:
        problem = C.loads_bit_exact(c["path"], c["step"])
        if c["tag"] != W.TAG_FORMAT.format(step=c["step"]):
            problem = f"{c['path']} holds step {c['step']}"
        if problem:
            fail("CORRUPT " + problem)
        out.verified += not problem

    C.check_none_lost(out, root, known, f"latest before: {latest_before}")

    out.latest = _latest_tag(bucket)
    if out.latest is None and latest_before is not None:
        fail(f"LATEST {root}: `latest` is gone (it named {latest_before})")
    elif out.latest is not None:
        if out.latest not in tags:
            fail(f"LATEST {root}: `latest` names {out.latest!r}, not a listed checkpoint {tags}")
        if latest_before is not None and _step_of(out.latest) < _step_of(latest_before):
            fail(f"LATEST {root}: `latest` went back from {latest_before} to {out.latest}")
        out.latest_lagging = bool(tags) and out.latest != tags[-1]
    if listing:
        try:  # the value only: which checkpoint the root resolves to
            got = shardsafe.load({"step": -1}, root, strict=False).tag
        except Exception as e:  # noqa: BLE001 - any failure is the finding
            got = f"an error: {type(e).__name__}: {e}"
        if got != tags[-1]:
            fail(f"LATEST {root}: loading the root gives {got}, the newest commit is {tags[-1]} "
                 f"(`latest` names {out.latest})")
    return out


def _next_start(bucket: _Bucket, known: set[int]) -> int:
    """The first step of the next job: after every step known committed and
    every tag claimed by a killed save (a claim younger than the leftover
    age holds its tag, docs/design.md "Object storage", step 4)."""
    keys = bucket.keys()
    claimed = bucket.tags_with(keys, RECORD) - bucket.tags_with(keys, INDEX)
    return max(known | {_step_of(t) for t in claimed}, default=0) + 1


def _save_with_leftover_age_0(bucket: _Bucket, root: str, known: set[int],
                              out: C.RootCheck) -> None:
    """A one-process save of the next step with SHARDSAFE_S3_LEFTOVER_AGE=0
    after a kill: it succeeds, `latest` names it, and it leaves nothing
    under the root but `latest` and committed checkpoints, no multipart
    upload open. Adds to `out` and `known`."""
    step = _next_start(bucket, known)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SHARDSAFE_S3_LEFTOVER_AGE", "0")
        try:
            mgr = shardsafe.CheckpointManager(root, keep_last=W.KEEP_LAST,
                                              tag_format=W.TAG_FORMAT)
            mgr.save(step, W.whole_state(step), max_file_bytes=W.MAX_FILE_BYTES)
        except Exception as e:  # noqa: BLE001 - any failure is the finding
            out.failures.append(f"FRESH SAVE {root}: the save of step {step} failed: "
                                f"{type(e).__name__}: {e}")
            return
    out.fresh_step = step
    known.add(step)
    if _latest_tag(bucket) != W.TAG_FORMAT.format(step=step):
        out.failures.append(f"LATEST {root}: `latest` names {_latest_tag(bucket)}, not the "
                            f"save of step {step}")
    out.failures += [f"LEFTOVER {root}: after the save of step {step}: {k}"
                     for k in bucket.strays()]


def _is_cleanup(failure: str) -> bool:
    return ": LEFTOVER " in failure or ": FRESH SAVE " in failure


@dataclass
class Root:
    """A root the campaign killed saves in, and what it saw there."""
    bucket: _Bucket
    tally: campaign.Tally
    known: set[int] = field(default_factory=set)  # steps seen committed
    open_uploads: int = 0  # kills after which a multipart upload was open


def _kill_campaign(world: int, mode: str, kills: int, rng: random.Random, bucket: _Bucket,
                   workdir: str, binary: str) -> Root:
    """`kills` SIGKILLs of a writer job saving into `bucket`'s root, each
    followed by _check and _save_with_leftover_age_0 (the moments and the
    outcome counts of campaign.kill_campaign)."""
    r = Root(bucket, campaign.Tally(f"kill  P={world} {mode}"))
    t, root = r.tally, f"s3://{BUCKET}/{bucket.prefix}"
    delays = campaign.DelayPicker(rng)
    for i in range(kills):
        where = f"{t.name} #{i}"
        latest_before, start = _latest_tag(bucket), _next_start(bucket, r.known)
        jobdir = os.path.join(workdir, bucket.prefix, f"job{i}")
        t0 = time.monotonic()
        job = _BucketJob(world, mode, root, start, jobdir, FILE_BYTES[i % 2])
        try:
            anchor = (i + 1) % 3  # after the 1st, 2nd or 0th acknowledged save ...
            err = job.wait_ready() or job.wait_acks(anchor)
            if err:
                job.dump_and_kill()
                t.failures.append(f"WRITER {where}: {err}{campaign._logs(jobdir, world)}")
                break
            delay = delays.pick()  # ... and a random delay
            time.sleep(delay)
            victims = [rng.randrange(world)] if world > 1 and rng.random() < 0.5 \
                else rng.sample(range(world), world)
            t.kills_one += len(victims) < world
            t.kills_all += len(victims) == world
            job.signal(victims, signal.SIGKILL)
            campaign._crash_outcome(t, job, victims, where)
        finally:
            job.close()
        t1 = time.monotonic()
        t.iterations += 1
        acks = campaign._acks(jobdir)
        r.known |= {s for s, _ in acks}
        rc = _check(bucket, root, binary, r.known, latest_before)
        r.open_uploads += any(k.startswith("upload ") for k in rc.partial)
        t2 = time.monotonic()
        _save_with_leftover_age_0(bucket, root, r.known, rc)
        commits = campaign._record(t, rc, start, acks, where)
        delays.observe(campaign._ready_time(jobdir), acks, commits)
        print(f"  {where}: from {start}, files of {FILE_BYTES[i % 2] >> 20} MiB, ack {anchor} + "
              f"{delay:.3f}s, killed {victims}; listed {rc.listed}, latest {rc.latest}, "
              f"{len(rc.partial)} stray(s), {len(rc.failures)} failure(s) [job {t1 - t0:.1f}s, "
              f"check {t2 - t1:.1f}s, save {time.monotonic() - t2:.1f}s]")
    return r


@pytest.fixture(scope="module")
def killed_roots(server, shardsafe_bin, tmp_path_factory):
    """The campaign, a root per configuration."""
    seed = int(os.environ.get("TORTURE_SEED", random.SystemRandom().randrange(1 << 32)))
    print(f"torture seed {seed}")
    rng = random.Random(seed)
    workdir = str(tmp_path_factory.mktemp("s3crash"))
    return [_kill_campaign(world, mode, kills, rng, _Bucket(server, f"p{world}-{mode}"), workdir,
                           str(shardsafe_bin))
            for world, mode, kills in CONFIGS]


def _total(roots: list[Root]) -> campaign.Tally:
    total = campaign.Tally("total")
    for r in roots:
        total.add(r.tally)
    return total


def _report(roots: list[Root], failures: list[str]) -> str:
    uploads = ", ".join(f"{r.tally.name.strip()}: {r.open_uploads}" for r in roots)
    return (f"{campaign.table([r.tally for r in roots])}\nkills that left a multipart upload "
            f"open: {uploads}\n\n{len(failures)} failure(s):\n" + "\n\n".join(failures))


def test_after_every_kill_only_committed_checkpoints_are_listed_and_none_is_lost(killed_roots):
    total = _total(killed_roots)
    failures = [f for f in total.failures if not _is_cleanup(f)]
    report = _report(killed_roots, failures)
    print(report)
    assert not failures, report
    assert total.hangs == 0, report
    kills = sum(k for _, _, k in CONFIGS)
    assert total.iterations == total.kills_all + total.kills_one == kills >= 50, report
    assert total.commits >= 1 and total.verified >= 1, "no commit observed\n" + report


def test_a_save_with_leftover_age_0_after_every_kill_cleans_every_leftover(killed_roots):
    total = _total(killed_roots)
    failures = [f for f in total.failures if _is_cleanup(f)]
    report = _report(killed_roots, failures)
    print(report)
    assert not failures, report
    assert total.fresh_saves == total.iterations, report
    # Kills left objects and multipart uploads behind: there was something to clean.
    assert total.partial >= 1 and sum(r.open_uploads for r in killed_roots) >= 1, report


def _in_progress(bucket: _Bucket) -> list[str]:
    """Tags that hold a data object but no index: saves not committed."""
    keys = bucket.keys()
    data = {k.split("/")[1] for k in keys if k.count("/") == 2 and "/data-" in k}
    return sorted(data - bucket.tags_with(keys, INDEX))


def test_a_dead_saves_objects_under_a_tag_saved_again_are_cleaned(server, tmp_path, monkeypatch):
    """A job killed while saving step N restarts (within the leftover age)
    and saves step N again; a later save with SHARDSAFE_S3_LEFTOVER_AGE=0
    leaves nothing of the dead save under step N, which is now committed."""
    bucket = _Bucket(server, "saved-again")
    root = f"s3://{BUCKET}/{bucket.prefix}"
    mgr = shardsafe.CheckpointManager(root, keep_last=W.KEEP_LAST, tag_format=W.TAG_FORMAT)
    dead = []
    for attempt in range(10):  # until a kill lands inside a save's data
        start = _next_start(bucket, {_step_of(t) for t in bucket.tags_with(bucket.keys(), INDEX)})
        job = _BucketJob(1, "sync", root, start, str(tmp_path / f"job{attempt}"),
                         W.MAX_FILE_BYTES)
        try:
            err = job.wait_ready() or job._wait(lambda: _in_progress(bucket), "a save had data")
            job.signal([0], signal.SIGKILL)
        finally:
            job.close()
        assert err is None, err
        dead = _in_progress(bucket)
        if dead:
            break
    assert dead, "no kill landed between a save's first data object and its commit"
    step = _step_of(dead[0])
    left_by_kill = [k for k in bucket.keys() if k.startswith(f"{bucket.prefix}/{dead[0]}/")]
    mgr.save(step, W.whole_state(step), max_file_bytes=W.MAX_FILE_BYTES)
    monkeypatch.setenv("SHARDSAFE_S3_LEFTOVER_AGE", "0")
    mgr.save(step + 1, W.whole_state(step + 1), max_file_bytes=W.MAX_FILE_BYTES)
    problem = C.loads_bit_exact(f"{root}/{dead[0]}", step)
    assert problem is None, problem
    left = bucket.strays()
    assert not left, f"the killed save left {left_by_kill}; after the saves of {step} and " \
                     f"{step + 1}, not committed checkpoints' objects: {left}"
