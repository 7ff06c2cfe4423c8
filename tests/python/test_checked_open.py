"""Every file the Python package reads is opened by shardsafe._files.open_read:
non-blocking, only a regular file, inside its checkpoint, and read through
that one descriptor.

A plain open() of a FIFO waits for a writer for ever, so a FIFO as a
pointer file (shardsafe's and DeepSpeed's `latest`, nanotron's latest.txt,
Megatron's tracker) must never be opened that way by `shardsafe.load` or
`shardsafe import`. Each of those runs here in a subprocess with a generous
timeout, so a regression fails instead of hanging the suite. Files swapped in between the open and its use (a FIFO,
a link leading outside, another file) are swapped by the open's test hook
(`_files._after_open`), never by a racing thread.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp
from safetensors.torch import save_file

import shardsafe
from shardsafe import _files, foreign
from shardsafe.foreign import nanotron_weights
from shardsafe._files import FileRefusedError, open_read
from test_peer_nanotron import make_checkpoint

# Far longer than any of these runs takes (a few seconds: starting Python
# and torch); a blocking open never returns at all.
TIMEOUT = 180

# shardsafe.load(STATE, PATH) with STATE {key: a tensor of N zeros, or 0
# where N is null} from argv[2].
_LOAD = """
import json, sys, torch, shardsafe
state = {k: 0 if n is None else torch.zeros(n) for k, n in json.loads(sys.argv[2]).items()}
try:
    res = shardsafe.load(state, sys.argv[1])
    print(json.dumps({"tag": res.tag, "step": state.get("step")}))
except shardsafe.ShardsafeError as e:
    print(json.dumps({"error": type(e).__name__, "message": str(e),
                      "kinds": [c.__name__ for c in type(e).__mro__]}))
"""


def _python(*args: str) -> subprocess.CompletedProcess:
    """`python3 ARGS` in a fresh interpreter; a run past TIMEOUT fails the
    test (it blocked)."""
    try:
        return subprocess.run([sys.executable, *args], capture_output=True, text=True,
                              timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        pytest.fail(f"python3 {' '.join(args[-3:])} still running after {TIMEOUT} s: it "
                    f"blocked (a FIFO opened for reading?)", pytrace=False)


def _load(path: Path, state: dict | None = None) -> dict:
    """What shardsafe.load(`state` ({"w": 4, "step": None}: see _LOAD),
    path) does in a fresh process."""
    proc = _python("-c", _LOAD, str(path), json.dumps(state or {"w": 4, "step": None}))
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def _python_import(src: Path, dst: Path) -> subprocess.CompletedProcess:
    return _python("-m", "shardsafe", "import", str(src), str(dst))


def _exactly(message: str) -> str:
    return f"^{re.escape(message)}$"


def _fifo(path: Path) -> None:
    """`path` (a file or nothing) replaced by a FIFO no one writes to."""
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    os.mkfifo(path)


# ------------------------------------------------------ layouts, cheaply --
# Detection looks at file names and pointer files only: these are enough
# for each format to claim its root when the pointer is a regular file.

def _deepspeed_root(root: Path) -> Path:
    (root / "global_step1").mkdir(parents=True)
    torch.save({"module": {"w": torch.ones(4)}},
               root / "global_step1" / "mp_rank_00_model_states.pt")
    (root / "latest").write_text("global_step1")
    return root / "latest"


def _megatron_root(root: Path) -> Path:
    (root / "iter_0000007").mkdir(parents=True)
    (root / "iter_0000007" / ".metadata").write_bytes(b"")
    (root / "iter_0000007" / "metadata.json").write_text('{"sharded_backend": "torch_dist"}')
    (root / "latest_checkpointed_iteration.txt").write_text("7")
    return root / "latest_checkpointed_iteration.txt"


def _nanotron_root(root: Path) -> Path:
    make_checkpoint(root / "40")  # a real one: it imports while latest.txt is a file
    (root / "latest.txt").write_text("40")
    return root / "latest.txt"


FOREIGN = {"DeepSpeed": _deepspeed_root, "Megatron torch_dist": _megatron_root,
           "nanotron": _nanotron_root}


@pytest.mark.parametrize("fmt", sorted(FOREIGN))
def test_a_fifo_pointer_of_another_tools_root_fails_load_and_import_promptly(fmt, tmp_path):
    root = tmp_path / "root"
    pointer = FOREIGN[fmt](root)
    assert foreign.detect(root).name == fmt  # claimed through its pointer file
    _fifo(pointer)
    # Not a pointer now (read_latest: None if unreadable), so no format
    # claims the root: the load and the import say so.
    with _deadline():
        assert foreign.read_latest(str(pointer)) is None
        assert foreign.detect(root) is None
    got = _load(root)
    assert got["error"] == "CheckpointNotFoundError", got
    assert str(root) in got["message"], got
    proc = _python_import(root, tmp_path / "out")
    assert proc.returncode == 2, proc.stderr
    assert f"shardsafe: error: no {foreign.KNOWN} checkpoint in {root}" in proc.stderr
    assert not (tmp_path / "out").exists()


def test_the_nanotron_root_imports_while_its_pointer_is_a_file(tmp_path):
    """The control of the FIFO case: the same root, latest.txt a file."""
    root = tmp_path / "root"
    _nanotron_root(root)
    proc = _python_import(root, tmp_path / "out")
    assert proc.returncode == 0, proc.stderr
    assert "from nanotron checkpoint" in proc.stdout
    assert (tmp_path / "out" / "shardsafe.json").is_file()


def test_a_fifo_latest_of_a_shardsafe_root_does_not_hang_load_or_import(tmp_path, run):
    root = tmp_path / "root"
    mgr = shardsafe.CheckpointManager(root)
    for step in (1, 2):
        mgr.save(step, {"w": torch.full((4,), float(step)), "step": step})
    _fifo(root / "latest")
    got = _load(root)
    # The engine reads `latest` checked too: a FIFO is no valid `latest`, and
    # the newest commit is the latest then (docs/format.md §1).
    assert got == {"tag": "step-00000002", "step": 2}, got
    proc = _python_import(root, tmp_path / "py-out")
    assert proc.returncode == 2, proc.stderr  # a shardsafe root is no other tool's
    assert f"no {foreign.KNOWN} checkpoint in {root}" in proc.stderr
    # The command-line tool imports a shardsafe root itself.
    proc = run("import", root, tmp_path / "cli-out", timeout=TIMEOUT)
    assert proc.returncode == 0, proc.stderr
    assert shardsafe.describe(tmp_path / "cli-out")["tensors"]["w"][1] == (4,)


@pytest.mark.parametrize("fmt", sorted(FOREIGN))
def test_the_command_line_import_hands_the_fifo_root_to_python_and_fails(fmt, tmp_path, run):
    """`shardsafe import` hands a directory the engine cannot open to the
    Python importer (src/cli/import.cc), whose detection read the pointer."""
    root = tmp_path / "root"
    _fifo(FOREIGN[fmt](root))
    proc = run("import", root, tmp_path / "out", timeout=TIMEOUT)
    assert proc.returncode == 2, proc.stderr
    assert f"nor is it a {foreign.KNOWN} checkpoint" in proc.stderr, proc.stderr
    assert not (tmp_path / "out").exists()


# --------------------------------------------- files inside a checkpoint --

def _dcp_checkpoint(path: Path) -> Path:
    dcp.save({"w": torch.arange(4.0), "b": torch.ones(3)}, checkpoint_id=str(path), no_dist=True)
    data = sorted(path.glob("*.distcp"))
    assert data, list(path.iterdir())
    return data[0]


def test_a_fifo_data_file_of_a_dcp_checkpoint_is_an_error_naming_it(tmp_path):
    ckpt = tmp_path / "dcp"
    data = _dcp_checkpoint(ckpt)
    _fifo(data)
    got = _load(ckpt, {"w": 4, "b": 3})
    assert "InvalidStateError" in got["kinds"], got
    assert got["message"] == f"open {data}: is a FIFO, not a regular file", got


def test_a_fifo_dcp_metadata_is_an_error_naming_it(tmp_path):
    ckpt = tmp_path / "dcp"
    _dcp_checkpoint(ckpt)
    _fifo(ckpt / ".metadata")
    with _deadline():
        with pytest.raises(shardsafe.InvalidStateError,
                           match=_exactly(f"open {ckpt}/.metadata: is a FIFO, not a regular file")):
            shardsafe.peers.DcpCheckpoint(ckpt)


def test_a_dcp_data_file_linking_outside_the_checkpoint_is_refused(tmp_path):
    ckpt = tmp_path / "dcp"
    data = _dcp_checkpoint(ckpt)
    outside = tmp_path / "elsewhere.distcp"
    data.rename(outside)
    data.symlink_to(outside)
    with pytest.raises(shardsafe.InvalidStateError,
                       match=_exactly(f"open {data}: resolves to {outside}, outside {ckpt}")):
        shardsafe.load({"w": torch.zeros(4), "b": torch.zeros(3)}, ckpt)
    # A link inside the checkpoint is followed.
    data.unlink()
    outside.rename(ckpt / "moved.bin")
    data.symlink_to(ckpt / "moved.bin")
    out = {"w": torch.zeros(4), "b": torch.zeros(3)}
    shardsafe.load(out, ckpt)
    assert torch.equal(out["w"], torch.arange(4.0))


def test_a_fifo_pickle_in_a_deepspeed_checkpoint_is_an_error_naming_it(tmp_path):
    _deepspeed_root(tmp_path / "root")
    pt = tmp_path / "root" / "global_step1" / "mp_rank_00_model_states.pt"
    _fifo(pt)
    with _deadline():
        with pytest.raises(shardsafe.InvalidStateError,
                           match=_exactly(f"open {pt}: is a FIFO, not a regular file")):
            foreign.torch_load(str(pt), unsafe_pickle=False, within=str(pt.parent))


# ------------------------------------------- the helper's one descriptor --

class _Blocked(BaseException):
    """Raised by _deadline: a BaseException, so that no `except OSError` or
    `except Exception` on the way (read_latest's, for one) takes it for an
    unreadable file."""


@contextlib.contextmanager
def _deadline(seconds: int = 30):
    """Turns an open or read that blocks in this (the main) thread into a
    failure: after `seconds`, SIGALRM is sent to this thread, whose blocked
    system call then fails with EINTR and runs the handler, which raises
    (signal.alarm would signal the process, and may land on one of torch's
    threads instead). A guard against hanging only: every check in it takes
    milliseconds."""
    def fire(signum, frame):
        raise _Blocked(f"blocked for {seconds} s")

    old = signal.signal(signal.SIGALRM, fire)
    timer = threading.Timer(seconds, signal.pthread_kill,
                            (threading.get_ident(), signal.SIGALRM))
    timer.start()
    try:
        yield
    finally:
        timer.cancel()
        timer.join()
        signal.signal(signal.SIGALRM, old)


def _swap(monkeypatch, change) -> list[str]:
    """Makes the next open_read call change(path) between its open and its
    checks; returns the paths it changed."""
    swapped = []

    def hook(path: str, fd: int) -> None:
        if not swapped:
            swapped.append(path)
            change(Path(path))

    monkeypatch.setattr(_files, "_after_open", hook)
    return swapped


def test_open_refuses_what_is_no_regular_file_without_blocking(tmp_path):
    _fifo(tmp_path / "fifo")
    with _deadline():
        with pytest.raises(FileRefusedError, match="is a FIFO, not a regular file"):
            open_read(tmp_path / "fifo")
        with pytest.raises(shardsafe.InvalidStateError, match="is a directory, not a regular"):
            open_read(tmp_path)
        with pytest.raises(shardsafe.InvalidStateError, match="is a device, not a regular"):
            open_read("/dev/null")
        with pytest.raises(FileNotFoundError):
            open_read(tmp_path / "missing")


def test_open_within_refuses_a_link_leading_outside_and_follows_one_inside(tmp_path):
    inside = tmp_path / "ckpt"
    inside.mkdir()
    (tmp_path / "secret").write_text("outside")
    (inside / "data").write_text("inside")
    (inside / "out").symlink_to(tmp_path / "secret")
    (inside / "in").symlink_to(inside / "data")
    with pytest.raises(FileRefusedError, match=_exactly(
            f"open {inside}/out: resolves to {tmp_path}/secret, outside {inside}")):
        open_read(inside / "out", within=inside)
    with pytest.raises(FileRefusedError, match="outside"):
        open_read(inside / ".." / "secret", within=inside)
    with open_read(inside / "in", within=inside, encoding="utf-8") as f:
        assert f.read() == "inside" and f.name == str(inside / "in")
    with open_read(inside / "out") as f:  # no `within`: links are followed
        assert f.read() == b"outside"


@pytest.mark.parametrize("swap", ["fifo", "link outside"])
def test_a_file_swapped_after_the_open_is_not_read(swap, tmp_path, monkeypatch):
    """The checks and the read use the descriptor opened: a FIFO or a link
    leading outside swapped in after the open is never opened."""
    root = tmp_path / "root"
    root.mkdir()
    (root / "latest").write_text("step-7\n")
    (tmp_path / "secret").write_text("not a tag")

    def change(path: Path) -> None:
        path.unlink()
        if swap == "fifo":
            os.mkfifo(path)
        else:
            path.symlink_to(tmp_path / "secret")

    swapped = _swap(monkeypatch, change)
    with _deadline():
        assert foreign.read_latest(str(root / "latest")) == "step-7"
    assert swapped == [str(root / "latest")]
    # The swap happened: opened now, the path is refused.
    assert foreign.read_latest(str(root / "latest")) is None


def test_torch_reads_the_checked_descriptor_not_the_path(tmp_path, monkeypatch):
    """torch.load (memory-mapped: it takes a path) gets /proc/self/fd/N of the
    checked descriptor: a file swapped in after the check is not what it
    reads."""
    pt = tmp_path / "ckpt" / "state.pt"
    pt.parent.mkdir()
    torch.save({"w": torch.arange(3)}, pt)
    torch.save({"w": torch.full((3,), -1)}, tmp_path / "other.pt")
    swapped = _swap(monkeypatch, lambda p: os.replace(tmp_path / "other.pt", p))
    got = foreign.torch_load(str(pt), unsafe_pickle=False, within=str(pt.parent))
    assert swapped == [str(pt)]
    assert torch.equal(got["w"], torch.arange(3))
    got = foreign.torch_load(str(pt), unsafe_pickle=False)
    assert torch.equal(got["w"], torch.full((3,), -1))  # the path names the other file now


def test_safetensors_reads_the_checked_descriptor_not_the_path(tmp_path, monkeypatch):
    """nanotron's weight files: safetensors.safe_open takes a path only."""
    f = tmp_path / "ckpt" / "model_weight.safetensors"
    f.parent.mkdir()
    save_file({"data": torch.arange(6.0)}, f)
    save_file({"data": torch.zeros(6)}, tmp_path / "other.safetensors")
    swapped = _swap(monkeypatch, lambda p: os.replace(tmp_path / "other.safetensors", p))
    got = nanotron_weights.read_tensor(str(f), "w", str(f.parent))
    assert swapped == [str(f)]
    assert torch.equal(got, torch.arange(6.0))


def test_a_nanotron_weight_file_linking_outside_is_refused_naming_the_key(tmp_path):
    root = tmp_path / "40"
    make_checkpoint(root)
    weight = next(root.glob("model/**/*.safetensors"))
    outside = tmp_path / "outside.safetensors"
    weight.rename(outside)
    weight.symlink_to(outside)
    ck = foreign.open_checkpoint(root)
    with pytest.raises(shardsafe.InvalidStateError,
                       match=re.escape(f"{weight}: tensor '") + ".*"
                       + re.escape(f"': resolves to {outside}, outside {root}") + "$"):
        ck.tensors()


def test_a_fifo_file_to_save_with_the_checkpoint_is_refused(tmp_path):
    _fifo(tmp_path / "config.json")
    with _deadline():
        with pytest.raises(shardsafe.InvalidStateError,
                           match=r"^files\['config.json'\]: open .*config.json: is a FIFO"):
            shardsafe.save({"w": torch.ones(2)}, tmp_path / "ckpt",
                           files={"config.json": tmp_path / "config.json"})
    assert not (tmp_path / "ckpt").exists()
