"""CheckpointManager.load and export_hf racing retention: the latest is
resolved and held by the load itself (shardsafe.load of the root), and a
step that is gone is an error saying whether retention removed it.

The race is forced, never timed: CheckpointManager.latest_step (which a
manager load of the latest calls first) or the load itself is wrapped
(monkeypatch) so that another manager's save, whose retention removes the
checkpoint that was newest, runs exactly in between. Resolving the latest
with latest_step() and loading its path would then fail; the manager loads
the root instead, which the engine resolves and pins in one step.
"""

from __future__ import annotations

import re

import pytest
import torch
from safetensors.torch import load_file

import shardsafe
from shardsafe import CheckpointManager, _manager


def _state(step: int) -> dict:
    return {"w": torch.full((4,), float(step)), "step": step}


def _zeros() -> dict:
    return {"w": torch.zeros(4), "step": 0}


def _saved(root, steps, keep_last: int = 1, **kw) -> CheckpointManager:
    mgr = CheckpointManager(root, keep_last=keep_last, **kw)
    for step in steps:
        mgr.save(step, _state(step))
    return mgr


def _retention_when_resolving(monkeypatch, root, step: int,
                              tag_format: str = "step-{step:08d}") -> list[int]:
    """Makes CheckpointManager.latest_step() answer, then let another
    process's manager of `root` save `step` (keep_last=1: its retention
    removes the checkpoint that was answered)."""
    other = CheckpointManager(root, keep_last=1, tag_format=tag_format)
    answered = []
    real = CheckpointManager.latest_step

    def latest_step(self):
        answered.append(real(self))
        if len(answered) == 1:
            other.save(step, _state(step))
        return answered[-1]

    monkeypatch.setattr(CheckpointManager, "latest_step", latest_step)
    return answered


@pytest.mark.parametrize("tag_format", ["step-{step:08d}", "global_step{step}"])
def test_a_load_of_the_latest_racing_retention_loads_what_it_resolved(tag_format, tmp_path,
                                                                      monkeypatch):
    mgr = _saved(tmp_path / "root", [1, 2], tag_format=tag_format)
    answered = _retention_when_resolving(monkeypatch, mgr.root, 3, tag_format)
    got = _zeros()
    res = mgr.load(got)
    assert answered == [2]  # step 2 was the latest, then retention removed it
    assert [c["step"] for c in mgr.list()] == [3]
    tag = tag_format.format(step=3)
    assert got["step"] == 3 and torch.equal(got["w"], torch.full((4,), 3.0))
    assert res.tag == tag and res.path == str(tmp_path / "root" / tag)


def test_an_export_of_the_latest_racing_retention_exports_what_it_resolved(tmp_path,
                                                                          monkeypatch):
    mgr = _saved(tmp_path / "root", [1, 2])
    _retention_when_resolving(monkeypatch, mgr.root, 3)
    mgr.export_hf(tmp_path / "hf")
    assert torch.equal(load_file(tmp_path / "hf" / "model.safetensors")["w"],
                       torch.full((4,), 3.0))


def test_an_empty_root_is_still_no_committed_checkpoint(tmp_path):
    (tmp_path / "root").mkdir()
    (tmp_path / "root" / "model.safetensors").write_bytes(b"")  # not taken for a checkpoint
    mgr = CheckpointManager(tmp_path / "root")
    with pytest.raises(shardsafe.CheckpointNotFoundError,
                       match=re.escape(f"{tmp_path}/root: no committed checkpoint")):
        mgr.load(_zeros())
    with pytest.raises(shardsafe.CheckpointNotFoundError, match="no committed checkpoint"):
        mgr.export_hf(tmp_path / "hf")


def test_a_step_removed_during_its_load_says_retention_removed_it(tmp_path, monkeypatch):
    mgr = _saved(tmp_path / "root", [1, 2], keep_last=2)
    other = CheckpointManager(mgr.root, keep_last=1)
    real = _manager.load

    def load_after_retention(state, path, **kwargs):
        other.save(3, _state(3))  # keep_last=1 removes steps 1 and 2
        return real(state, path, **kwargs)

    monkeypatch.setattr(_manager, "load", load_after_retention)
    with pytest.raises(shardsafe.CheckpointNotFoundError, match=re.escape(
            f"{mgr.root}: checkpoint step-00000001 (step 1) was removed by retention or prune "
            f"while it was being loaded (steps kept now: 3)")):
        mgr.load(_zeros(), step=1)


def test_a_step_removed_during_its_export_says_retention_removed_it(tmp_path, monkeypatch):
    mgr = _saved(tmp_path / "root", [1, 2], keep_last=2)
    other = CheckpointManager(mgr.root, keep_last=1)
    from shardsafe import hf
    real = hf.export

    def export_after_retention(source, out, **kwargs):
        other.save(3, _state(3))
        return real(source, out, **kwargs)

    monkeypatch.setattr(hf, "export", export_after_retention)
    with pytest.raises(shardsafe.CheckpointNotFoundError,
                       match=r"checkpoint step-00000002 \(step 2\) was removed by retention or "
                             r"prune while it was being loaded"):
        mgr.export_hf(tmp_path / "hf", step=2)
    assert not (tmp_path / "hf").exists()


def test_a_step_retention_removed_before_may_have_been_one_of_the_removed(tmp_path):
    mgr = _saved(tmp_path / "root", [1, 2, 3, 4], keep_last=2)
    for step in (1, 9):  # commit order is not step order: a step 9 may have come and gone
        with pytest.raises(shardsafe.CheckpointNotFoundError, match=re.escape(
                f"{mgr.root}: checkpoint step-{step:08d} (step {step}): not there: 2 earlier "
                f"checkpoint(s) were removed by retention or prune, and it may have been one of "
                f"them (steps kept: 3, 4)")):
            mgr.load(_zeros(), step=step)


def test_a_step_never_saved_says_so(tmp_path):
    mgr = _saved(tmp_path / "root", [1, 2], keep_last=0, tag_format="global_step{step}")
    with pytest.raises(shardsafe.CheckpointNotFoundError, match=re.escape(
            f"{mgr.root}: checkpoint global_step5 (step 5): never saved here (the commit "
            f"records show no checkpoint removed from this root) (steps kept: 1, 2)")):
        mgr.load(_zeros(), step=5)
    got = _zeros()
    assert mgr.load(got, step=1).tag == "global_step1" and got["step"] == 1


def test_the_latest_loaded_is_the_one_latest_names(tmp_path):
    mgr = _saved(tmp_path / "root", [5, 6, 7], keep_last=2, tag_format="global_step{step}")
    got = _zeros()
    res = mgr.load(got)
    assert (mgr.latest_step(), got["step"], res.tag) == (7, 7, "global_step7")
    mgr.save(8, _state(8), update_latest=False)  # committed, `latest` stays on 7
    assert mgr.load(got).tag == "global_step7" and got["step"] == 7


def test_a_checkpoint_whose_commit_record_is_unreadable_is_kept_and_marked(tmp_path):
    """Retention never orders a checkpoint by a record it cannot read: it
    keeps it and warns; list() says why its order is unknown; with no
    `latest` to go by, latest_step() refuses to guess (docs/format.md §1)."""
    root = tmp_path / "root"
    mgr = _saved(root, [1, 2, 3], keep_last=0)
    record = root / "step-00000003" / "commit.json"
    record.write_text("xx{")
    keep2 = CheckpointManager(root, keep_last=2)
    stats = keep2.save(4, _state(4))
    assert any(w.startswith("retention kept step-00000003: its place in the commit order is "
                            f"unknown ({record}: not JSON)") for w in stats["warnings"]), stats
    listed = {c["tag"]: c for c in keep2.list()}
    assert sorted(listed) == ["step-00000002", "step-00000003", "step-00000004"]
    assert listed["step-00000003"]["order_fault"] == f"{record}: not JSON"
    assert listed["step-00000004"]["order_fault"] is None and listed["step-00000004"]["is_latest"]
    assert keep2.latest_step() == 4
    with pytest.warns(UserWarning, match="retention kept step-00000003"):
        assert keep2.prune(1) == ["step-00000002"]
    (root / "latest").unlink()
    with pytest.raises(shardsafe.CorruptCheckpointError, match="step-00000003"):
        mgr.latest_step()
    with pytest.raises(shardsafe.CorruptCheckpointError, match="cannot be told"):
        mgr.load(_zeros())
    state = _zeros()
    mgr.load(state, step=3)  # by its path, as ever
    assert state["step"] == 3
