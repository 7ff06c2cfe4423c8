"""Memory of a Python load of many tensors (issue 48): shardsafe.load of
500,000 small tensors may raise the process's peak resident memory, over
the target state dict it fills, by at most 3x the checkpoint's index.

The index: shardsafe.json, and where the save wrote a chunk table (from
65,536 chunks on, by default) its parts and the checksum files, which a
whole read of the chunks reads (docs/format.md §3c); the version-1 case
saves with SHARDSAFE_CHUNK_TABLE_MIN_CHUNKS above the chunk count.

Each measurement runs in a fresh process: it builds the target (500,000
BF16 tensors of 8 elements, touched), loads a tiny checkpoint once (code
paths and caches warmed), resets the kernel's high-water mark of its
resident memory (/proc/self/clear_refs "5"), loads, and reports VmHWM less
VmRSS before the load.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

TENSORS = 500_000

_KEYS = 'f"layers.{i // 384:04d}.e{i // 3 % 128:03d}.w{i % 3}"'

_SAVE = textwrap.dedent(f"""
    import sys, torch, shardsafe
    n = int(sys.argv[2])
    state = {{{_KEYS}: torch.zeros(8, dtype=torch.bfloat16) for i in range(n)}}
    shardsafe.save(state, sys.argv[1])
""")

_LOAD = textwrap.dedent(f"""
    import gc, json, re, sys, torch, shardsafe
    def status(field):
        text = open("/proc/self/status").read()
        return int(re.search(field + r":\\s+(\\d+)", text).group(1)) * 1024
    path, n, warm = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    state = {{{_KEYS}: torch.ones(8, dtype=torch.bfloat16) for i in range(n)}}
    shardsafe.save({{"w": torch.ones(4)}}, warm)
    shardsafe.load({{"w": torch.ones(4)}}, warm)
    gc.collect()
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # VmHWM := VmRSS
    before = status("VmRSS")
    shardsafe.load(state, path)
    extra = status("VmHWM") - before
    assert all(bool((t == 0).all()) for t in list(state.values())[:: n // 100])
    print(json.dumps({{"extra": extra}}))
""")


def _index_bytes(ckpt: Path) -> int:
    return sum(p.stat().st_size for p in ckpt.iterdir()
               if p.name == "shardsafe.json" or p.suffix in (".chunks", ".crc32c"))


def _can_reset_peak() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


@pytest.mark.skipif(not _can_reset_peak(), reason="/proc/self/clear_refs cannot reset VmHWM")
@pytest.mark.parametrize("form", ["json", "table"])
def test_load_of_many_tensors_takes_at_most_three_times_the_index(tmp_path, form):
    ckpt = tmp_path / "ckpt"
    env = dict(os.environ)
    if form == "json":
        env["SHARDSAFE_CHUNK_TABLE_MIN_CHUNKS"] = str(TENSORS + 1)
    else:
        env.pop("SHARDSAFE_CHUNK_TABLE_MIN_CHUNKS", None)
    saved = subprocess.run([sys.executable, "-c", _SAVE, str(ckpt), str(TENSORS)], env=env,
                           capture_output=True, text=True, timeout=600)
    assert saved.returncode == 0, saved.stderr
    has_table = any(p.suffix == ".chunks" for p in ckpt.iterdir())
    assert has_table == (form == "table")
    index = _index_bytes(ckpt)
    loaded = subprocess.run([sys.executable, "-c", _LOAD, str(ckpt), str(TENSORS),
                             str(tmp_path / "warm")], capture_output=True, text=True,
                            timeout=600)
    assert loaded.returncode == 0, loaded.stderr
    extra = json.loads(loaded.stdout.strip().splitlines()[-1])["extra"]
    print(f"{form}: index {index / 1e6:.1f} MB, load's extra peak {extra / 1e6:.1f} MB "
          f"= {extra / index:.2f} x")
    assert extra <= 3 * index
