"""Shared fixtures for the shardsafe interop and command-line tests.

The tests run the real `shardsafe` binary. Its path comes from the
SHARDSAFE_BIN environment variable (absolute, or relative to the repository
root), default `build/shardsafe`. A missing binary is an error, never a skip:
a test suite that silently skips everything proves nothing.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
ATTACKS_DIR = REPO_ROOT / "tests" / "attacks"

# Exit codes of the tool (src/cli/output.h).
EXIT_OK = 0
EXIT_PROBLEMS = 1
EXIT_ERROR = 2

# Small demo model: well under a second to save, reload and verify.
DEMO_ARGS = ["--layers", "2", "--hidden", "64", "--ffn", "128", "--vocab", "256"]


def _find_binary() -> Path:
    raw = os.environ.get("SHARDSAFE_BIN", "build/shardsafe")
    path = Path(raw)
    if not path.is_absolute():
        path = REPO_ROOT / path
    return path


@pytest.fixture(scope="session")
def shardsafe_bin() -> Path:
    path = _find_binary()
    if not path.is_file() or not os.access(path, os.X_OK):
        pytest.fail(
            f"shardsafe binary not found or not executable at {path}; build it "
            "(ninja -C build-py shardsafe) and set SHARDSAFE_BIN",
            pytrace=False,
        )
    return path


class Runner:
    """Runs the shardsafe binary and returns the CompletedProcess."""

    def __init__(self, binary: Path):
        self.binary = binary

    def __call__(self, *args, cwd=None, timeout: float = 60) -> subprocess.CompletedProcess:
        proc = subprocess.run(
            [str(self.binary), *map(str, args)],
            cwd=cwd,
            capture_output=True,
            text=True,
            errors="replace",
            timeout=timeout,
        )
        # A negative return code is a signal (SIGSEGV, SIGABRT...): always a bug.
        assert proc.returncode >= 0, (
            f"shardsafe {' '.join(map(str, args))} died of signal {-proc.returncode}\n"
            f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
        )
        return proc

    def json(self, *args, **kw):
        proc = self(*args, "--json", **kw)
        assert proc.returncode == EXIT_OK, describe(proc)
        return json.loads(proc.stdout)


def describe(proc: subprocess.CompletedProcess) -> str:
    return f"rc={proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"


@pytest.fixture(autouse=True)
def _torch_determinism_restored():
    """Trainers switch torch's deterministic algorithms on for the whole
    process (Lightning's deterministic=True); a later test would then run
    under them (torch.empty of some dtypes fails there). Restored after
    every test."""
    import torch

    enabled = torch.are_deterministic_algorithms_enabled()
    warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    yield
    torch.use_deterministic_algorithms(enabled, warn_only=warn_only)


@pytest.fixture(scope="session")
def run(shardsafe_bin) -> Runner:
    return Runner(shardsafe_bin)


@pytest.fixture(scope="session")
def demo_root_pristine(tmp_path_factory, run) -> Path:
    """One demo run for the whole session. Never modify it: use `demo_root`."""
    root = tmp_path_factory.mktemp("demo") / "D"
    proc = run("demo", "--dir", root, *DEMO_ARGS)
    assert proc.returncode == EXIT_OK, describe(proc)
    return root


@pytest.fixture
def demo_root(demo_root_pristine, tmp_path) -> Path:
    """A private copy of the demo root that a test may damage."""
    dst = tmp_path / "D"
    shutil.copytree(demo_root_pristine, dst)
    return dst


def read_safetensors_header(path: Path) -> tuple[int, dict]:
    """(header length N, parsed header) of a safetensors file."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        return n, json.loads(f.read(n))


def import_error_without(package: str, module: str) -> str:
    """What importing `module` prints as its ImportError, in a fresh
    interpreter where `package` cannot be imported."""
    import sys

    code = (f"import sys; sys.modules[{package!r}] = None\n"
            "import shardsafe\n"
            "try:\n"
            f"    import {module}\n"
            "except ImportError as e:\n"
            "    print(e)\n")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, check=True).stdout
