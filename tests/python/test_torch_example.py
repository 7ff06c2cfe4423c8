"""examples/train_resume.py: a training run killed with SIGKILL (while an
async save is in flight) and resumed follows the uninterrupted loss curve
bit for bit, and the checkpoint root keeps only the newest committed steps.

The script runs as a real subprocess: the kill is a real SIGKILL, the
checkpoints are real files written by the C++ engine.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import shardsafe

REPO_ROOT = Path(__file__).resolve().parents[2]
SCRIPT = REPO_ROOT / "examples" / "train_resume.py"

STEPS = 24
SAVE_EVERY = 5
KILL_AT = 15  # a save step: the kill lands while that step's async save is (usually) in flight
KEEP_LAST = 2  # the script's default


def train(ckpt: Path, log: Path, *extra: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items()
           if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    return subprocess.run(
        [sys.executable, str(SCRIPT), "--ckpt-dir", str(ckpt), "--steps", str(STEPS),
         "--save-every", str(SAVE_EVERY), "--log", str(log), *extra],
        capture_output=True, text=True, errors="replace", timeout=180, env=env)


def describe(proc: subprocess.CompletedProcess) -> str:
    return f"rc={proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"


def read_log(log: Path) -> list[tuple[int, str]]:
    """(step, loss as printed) per line, in file order."""
    out = []
    for line in log.read_text().splitlines():
        step, loss = line.split(" ")
        out.append((int(step), loss))
    return out


def committed_steps(ckpt: Path) -> list[int]:
    """Step directories a reader would see (temporaries start with '.tmp-')."""
    return sorted(int(p.name.split("-")[1]) for p in ckpt.iterdir()
                  if p.is_dir() and p.name.startswith("step-"))


def check_retention(ckpt: Path, last_saved: int) -> None:
    mgr = shardsafe.CheckpointManager(ckpt)
    on_disk = committed_steps(ckpt)
    listed = [c["step"] for c in mgr.list()]
    assert 1 <= len(on_disk) <= KEEP_LAST, on_disk
    assert listed == on_disk
    assert mgr.latest_step() == last_saved == max(on_disk)


def test_killed_and_resumed_run_matches_the_uninterrupted_run(tmp_path):
    # (a) uninterrupted
    straight_log = tmp_path / "straight.log"
    proc = train(tmp_path / "straight", straight_log)
    assert proc.returncode == 0, describe(proc)
    straight = read_log(straight_log)
    assert [s for s, _ in straight] == list(range(1, STEPS + 1))
    want = dict(straight)
    assert len(set(want.values())) > 1  # the loss moves: the comparison below means something
    check_retention(tmp_path / "straight", last_saved=STEPS)

    # (b) killed right after step KILL_AT ...
    ckpt, log = tmp_path / "resumed", tmp_path / "resumed.log"
    proc = train(ckpt, log, "--kill-at-step", str(KILL_AT))
    assert proc.returncode == -signal.SIGKILL, describe(proc)
    killed = read_log(log)
    assert [s for s, _ in killed] == list(range(1, KILL_AT + 1))
    assert killed == straight[:KILL_AT]
    # The save of step KILL_AT may or may not have committed before the kill;
    # either way the newest committed checkpoint is a save step and loads.
    mid = shardsafe.CheckpointManager(ckpt).latest_step()
    assert mid in (KILL_AT - SAVE_EVERY, KILL_AT), mid
    assert len(committed_steps(ckpt)) <= KEEP_LAST

    # ... then resumed to STEPS
    proc = train(ckpt, log)
    assert proc.returncode == 0, describe(proc)
    assert f"resumed from step {mid}" in proc.stdout, describe(proc)
    combined = read_log(log)
    resumed = combined[len(killed):]
    assert [s for s, _ in resumed] == list(range(mid + 1, STEPS + 1))
    # Bit-exact: the loss strings (repr of the float) are equal, including
    # the steps between the checkpoint and the kill that ran twice.
    assert resumed == [(s, want[s]) for s in range(mid + 1, STEPS + 1)]
    assert {s for s, _ in combined} == set(range(1, STEPS + 1))

    check_retention(ckpt, last_saved=STEPS)
    # The temporary directory of the save the kill interrupted is gone.
    assert not [p.name for p in ckpt.iterdir() if p.name.startswith(".tmp-")]
