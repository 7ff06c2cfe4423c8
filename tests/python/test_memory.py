"""Memory bounds of issue 3, measured as peak RSS in a fresh process:
a synchronous save streams through bounded buffers (at most 256 MiB extra
whatever the state size), an async save holds one staging copy (at most
1.1x the bytes written)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

MIB = 1 << 20
STATE_MIB = 768

_SCRIPT = textwrap.dedent("""
    import json, resource, sys, torch, shardsafe
    mode, path, mib = sys.argv[1], sys.argv[2], int(sys.argv[3])
    peak = lambda: resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    state = {f"w{i}": torch.ones(mib // 8 * (1 << 20) // 4) for i in range(8)}
    for t in state.values():
        t.add_(1)  # touched: resident before the baseline is taken
    shardsafe.save({"warm": torch.ones(4)}, path + "-warmup")  # load code paths first
    base = peak()
    if mode == "sync":
        shardsafe.save(state, path)
    else:
        shardsafe.async_save(state, path).result()
    print(json.dumps({"extra": peak() - base, "bytes": sum(t.numel() * 4 for t in state.values())}))
""")


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_peak_extra_memory_of_a_save(tmp_path, mode):
    proc = subprocess.run([sys.executable, "-c", _SCRIPT, mode, str(tmp_path / "step-1"),
                           str(STATE_MIB)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    m = json.loads(proc.stdout.strip().splitlines()[-1])
    bound = 256 * MIB if mode == "sync" else 1.1 * m["bytes"]
    print(f"{mode}: extra peak RSS {m['extra'] / MIB:.0f} MiB for {m['bytes'] / MIB:.0f} MiB "
          f"saved (bound {bound / MIB:.0f} MiB)")
    assert m["extra"] <= bound


_EXPORT = textwrap.dedent("""
    import json, resource, subprocess, sys
    r = subprocess.run(sys.argv[1:], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    print(json.dumps({"peak": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024}))
""")


def test_export_memory_is_bounded_whatever_the_checkpoint_size(tmp_path, shardsafe_bin):
    """export-hf streams: 4 shard writers x (two 16 MiB windows + an 8 MiB
    tail buffer) at the defaults, the same for a small and a large
    checkpoint."""
    import torch

    import shardsafe

    peaks = {}
    for mib in (256, 1536):
        state = {f"model.layers.{i}.w": torch.full((mib // 16 * MIB // 4,), float(i))
                 for i in range(16)}
        shardsafe.save(state, tmp_path / f"ckpt{mib}")
        del state
        cmd = [str(shardsafe_bin), "export-hf", str(tmp_path / f"ckpt{mib}"),
               str(tmp_path / f"out{mib}"), "--max-shard-size", f"{mib // 5}MB"]
        proc = subprocess.run([sys.executable, "-c", _EXPORT, *cmd], capture_output=True,
                              text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr
        peaks[mib] = json.loads(proc.stdout)["peak"]
        print(f"export of {mib} MiB: peak RSS {peaks[mib] / MIB:.0f} MiB")
    bound = 4 * (2 * 16 + 8) * MIB + 96 * MIB
    assert max(peaks.values()) <= bound
    assert peaks[1536] <= 1.25 * peaks[256] + 32 * MIB  # does not grow with the checkpoint
