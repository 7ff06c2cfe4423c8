"""The `shardsafe` command-line tool, run as a subprocess: demo, ls, inspect,
verify (and what it reports for damaged checkpoints), diff, prune, import,
and hostile files from tests/attacks/.

Exit codes (src/cli/output.h): 0 success, 1 a check found problems, 2 error.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import shardsafe
from safetensors.torch import save_file

from conftest import (ATTACKS_DIR, DEMO_ARGS, EXIT_ERROR, EXIT_OK, EXIT_PROBLEMS, describe,
                      read_safetensors_header)

STEP_DIR = "step-00000100"


def load_index(ckpt: Path) -> dict:
    return json.loads((ckpt / "shardsafe.json").read_text())


def pick_chunk(ckpt: Path, min_bytes: int = 64):
    """A (key, chunk, data file name) of the checkpoint with a sizeable chunk."""
    index = load_index(ckpt)
    for key, t in sorted(index["tensors"].items()):
        for c in t["chunks"]:
            if c["bytes"] >= min_bytes:
                return key, c, index["files"][c["file"]]["name"]
    raise AssertionError("no chunk large enough")


# ------------------------------------------------------------------ demo --


def test_demo_exits_0_and_prints_ok_lines(run, tmp_path):
    proc = run("demo", "--dir", tmp_path / "D", *DEMO_ARGS)
    assert proc.returncode == EXIT_OK, describe(proc)
    assert "check every loaded byte against the expected values: OK" in proc.stdout
    assert "verify on disk: OK" in proc.stdout
    assert "FAILED" not in proc.stdout
    assert (tmp_path / "D" / "latest").read_text() == STEP_DIR + "\n"


def test_demo_large_enough_for_shared_memory_rings_completes(run, tmp_path):
    # 590 MB over 8 ranks, reloaded tp 3 x dp 2: the shared data files are
    # read through several shared-memory rings whose readers each skip some
    # of a ring's files. An earlier ring protocol deadlocked on exactly this
    # (a rank held blocks of a file it does not read): the run then hangs
    # until the timeout below.
    args = ["--layers", "4", "--hidden", "1024", "--ffn", "2048", "--vocab", "8192"]
    proc = run("demo", "--dir", tmp_path / "D", *args, timeout=120)
    assert proc.returncode == EXIT_OK, describe(proc)
    assert "check every loaded byte against the expected values: OK" in proc.stdout


def test_ls_json_lists_step_100_as_latest(run, demo_root_pristine):
    listing = run.json("ls", demo_root_pristine)
    assert len(listing) == 1
    (entry,) = listing
    assert entry["tag"] == STEP_DIR
    assert entry["step"] == 100
    assert entry["latest"] is True
    assert entry["path"].endswith(STEP_DIR)


def test_ls_bytes_is_sum_of_data_file_sizes(run, demo_root_pristine):
    # include/shardsafe/checkpoint.h: CheckpointInfo::bytes is the "sum of
    # data file sizes"; the index (shardsafe.json) is not a data file.
    (entry,) = run.json("ls", demo_root_pristine)
    ckpt = demo_root_pristine / STEP_DIR
    data_bytes = sum(f["bytes"] for f in load_index(ckpt)["files"])
    assert data_bytes == sum(p.stat().st_size for p in ckpt.glob("data-*.safetensors"))
    assert entry["bytes"] == data_bytes, (
        f"ls reports {entry['bytes']}, data files hold {data_bytes}; the difference is "
        f"shardsafe.json ({(ckpt / 'shardsafe.json').stat().st_size} bytes)")


def test_ls_human_marks_latest(run, demo_root_pristine):
    proc = run("ls", demo_root_pristine)
    assert proc.returncode == EXIT_OK, describe(proc)
    line = next(l for l in proc.stdout.splitlines() if l.startswith(STEP_DIR))
    assert "100" in line and "<- latest" in line


def test_ls_of_empty_root_says_none(run, tmp_path):
    proc = run("ls", tmp_path)
    assert proc.returncode == EXIT_OK, describe(proc)
    assert "(no committed checkpoints)" in proc.stdout


def test_inspect_json_lists_tensors_chunks_and_layout(run, demo_root_pristine):
    report = run.json("inspect", demo_root_pristine)
    assert report["native"] is True
    assert report["tag"] == STEP_DIR
    assert report["world_size"] == 8
    assert report["layout"]["tp"] == 2 and report["layout"]["dp"] == 4
    assert report["values"]["step"] == 100
    assert report["metadata"] == {"producer": "shardsafe demo"}
    assert len(report["files"]) == 8
    assert sorted(f["rank"] for f in report["files"]) == list(range(8))
    assert len(report["tensors"]) > 10
    sharded = 0
    for key, t in report["tensors"].items():
        assert t["chunks"], key
        for c in t["chunks"]:
            assert {"offset", "size", "file", "at", "bytes", "crc32c"} <= set(c), key
        sharded += len(t["chunks"]) > 1
    assert sharded > 0, "a TP=2 x DP=4 save must have sharded tensors"
    assert len(report["blobs"]["rng"]["chunks"]) == 8


def test_inspect_human_shows_kind_and_layout(run, demo_root_pristine):
    proc = run("inspect", demo_root_pristine, "--chunks")
    assert proc.returncode == EXIT_OK, describe(proc)
    assert "shardsafe checkpoint (format v1)" in proc.stdout
    assert "saved by  8 rank(s)" in proc.stdout
    assert "crc32c" in proc.stdout


def test_verify_of_demo_exits_0(run, demo_root_pristine):
    proc = run("verify", demo_root_pristine)
    assert proc.returncode == EXIT_OK, describe(proc)
    assert proc.stdout.startswith("OK  ")
    assert "8 files" in proc.stdout


def test_verify_json_of_demo_reports_every_checksum(run, demo_root_pristine):
    report = run.json("verify", demo_root_pristine)
    index = load_index(demo_root_pristine / STEP_DIR)
    chunks = sum(len(t["chunks"]) for t in index["tensors"].values())
    blobs = sum(len(b["chunks"]) for b in index["blobs"].values())
    assert report["ok"] is True and report["faults"] == []
    assert report["files"] == 8
    assert report["chunks_verified"] == chunks + blobs


# ------------------------------------------------------ verify: damage --


def test_verify_flipped_byte_names_file_tensor_and_checksum(run, demo_root):
    ckpt = demo_root / STEP_DIR
    key, chunk, fname = pick_chunk(ckpt)
    path = ckpt / fname
    data = bytearray(path.read_bytes())
    data[chunk["at"] + chunk["bytes"] // 2] ^= 0x01
    path.write_bytes(bytes(data))
    proc = run("verify", demo_root)
    assert proc.returncode == EXIT_PROBLEMS, describe(proc)
    faults = [l for l in proc.stdout.splitlines() if l.startswith("FAULT")]
    assert len(faults) == 1, proc.stdout
    assert fname in faults[0] and f'"{key}"' in faults[0]
    assert "checksum mismatch" in faults[0]
    assert "FAILED" in proc.stdout


def test_verify_json_flipped_byte_reports_fault(run, demo_root):
    ckpt = demo_root / STEP_DIR
    key, chunk, fname = pick_chunk(ckpt)
    path = ckpt / fname
    data = bytearray(path.read_bytes())
    data[chunk["at"]] ^= 0x80
    path.write_bytes(bytes(data))
    proc = run("verify", "--json", demo_root)
    assert proc.returncode == EXIT_PROBLEMS, describe(proc)
    report = json.loads(proc.stdout)
    assert report["ok"] is False
    assert any(fname in f and key in f and "checksum mismatch" in f for f in report["faults"])


@pytest.mark.parametrize("cut", ["last_byte", "half", "header"])
def test_verify_truncated_data_file_names_the_file(run, demo_root, cut):
    ckpt = demo_root / STEP_DIR
    path = ckpt / "data-00003-000.safetensors"
    size = path.stat().st_size
    new_size = {"last_byte": size - 1, "half": size // 2, "header": 100}[cut]
    os.truncate(path, new_size)
    proc = run("verify", demo_root)
    assert proc.returncode == EXIT_PROBLEMS, describe(proc)
    assert "FAULT" in proc.stdout
    assert "data-00003-000.safetensors" in proc.stdout


def test_verify_missing_data_file_names_it(run, demo_root):
    (demo_root / STEP_DIR / "data-00005-000.safetensors").unlink()
    proc = run("verify", demo_root)
    assert proc.returncode == EXIT_PROBLEMS, describe(proc)
    assert "data-00005-000.safetensors" in proc.stdout


def test_verify_checkpoint_dir_without_index_is_flagged_uncommitted(run, demo_root):
    (demo_root / STEP_DIR / "shardsafe.json").unlink()
    proc = run("verify", demo_root / STEP_DIR)
    assert proc.returncode == EXIT_PROBLEMS, describe(proc)
    assert "uncommitted or damaged checkpoint" in proc.stdout


def test_verify_root_without_index_says_no_committed_checkpoint(run, demo_root):
    (demo_root / STEP_DIR / "shardsafe.json").unlink()
    proc = run("verify", demo_root)
    assert proc.returncode == EXIT_PROBLEMS, describe(proc)
    assert "no committed checkpoint" in proc.stdout


def test_verify_garbage_index_names_index_file(run, demo_root):
    (demo_root / STEP_DIR / "shardsafe.json").write_text("garbage{")
    proc = run("verify", demo_root)
    assert proc.returncode == EXIT_PROBLEMS, describe(proc)
    assert "shardsafe.json" in proc.stdout and "invalid JSON" in proc.stdout


def test_verify_index_with_wrong_crc_names_tensor(run, demo_root):
    ckpt = demo_root / STEP_DIR
    index = load_index(ckpt)
    key, t = sorted(index["tensors"].items())[0]
    t["chunks"][0]["crc32c"] ^= 1
    (ckpt / "shardsafe.json").write_text(json.dumps(index))
    proc = run("verify", demo_root)
    assert proc.returncode == EXIT_PROBLEMS, describe(proc)
    assert f'"{key}"' in proc.stdout and "checksum mismatch" in proc.stdout


def test_inspect_garbage_index_is_single_line_error(run, demo_root):
    (demo_root / STEP_DIR / "shardsafe.json").write_text("garbage{")
    proc = run("inspect", demo_root)
    assert proc.returncode == EXIT_ERROR, describe(proc)
    assert proc.stderr.startswith("shardsafe: error: ")
    assert proc.stderr.count("\n") == 1
    assert "shardsafe.json" in proc.stderr


# ------------------------------------------------------------------ diff --


def save_two(tmp_path: Path, change):
    """Two small safetensors files differing as `change(tensors)` says."""
    gen = torch.Generator().manual_seed(0)
    a = {
        "w": torch.randn(4, 6, generator=gen),
        "h": torch.randn(3, 3, generator=gen).to(torch.bfloat16),
        "ids": torch.arange(10, dtype=torch.int64),
    }
    b = {k: v.clone() for k, v in a.items()}
    change(b)
    save_file(a, str(tmp_path / "a.safetensors"))
    save_file(b, str(tmp_path / "b.safetensors"))
    return a, b


def import_pair(run, tmp_path, change):
    save_two(tmp_path, change)
    for n in ("a", "b"):
        proc = run("import", tmp_path / f"{n}.safetensors", tmp_path / f"ck-{n}")
        assert proc.returncode == EXIT_OK, describe(proc)
    return tmp_path / "ck-a", tmp_path / "ck-b"


def test_diff_of_checkpoint_and_its_import_is_identical(run, demo_root_pristine, tmp_path):
    proc = run("import", demo_root_pristine, tmp_path / "copy")
    assert proc.returncode == EXIT_OK, describe(proc)
    proc = run("diff", demo_root_pristine, tmp_path / "copy")
    assert proc.returncode == EXIT_OK, describe(proc)
    n = len(load_index(demo_root_pristine / STEP_DIR)["tensors"])
    assert f"identical: {n} tensors" in proc.stdout


def test_import_of_native_checkpoint_keeps_values_and_metadata(run, demo_root_pristine, tmp_path):
    proc = run("import", demo_root_pristine, tmp_path / "copy", "--json")
    assert proc.returncode == EXIT_OK, describe(proc)
    summary = json.loads(proc.stdout)
    assert summary["native"] is True
    assert summary["skipped_per_rank_blobs"] == 1  # rng, one per saving rank
    src = load_index(demo_root_pristine / STEP_DIR)
    dst = load_index(tmp_path / "copy")
    assert dst["world_size"] == 1
    assert dst["values"] == src["values"]
    assert dst["metadata"] == src["metadata"]
    assert sorted(dst["tensors"]) == sorted(src["tensors"])
    assert all(len(t["chunks"]) == 1 for t in dst["tensors"].values())
    assert run("verify", tmp_path / "copy").returncode == EXIT_OK


def test_diff_one_changed_float_element_reports_max_abs_diff(run, tmp_path):
    def change(t):
        t["w"][2, 3] += 0.5

    a, b = import_pair(run, tmp_path, change)
    proc = run("diff", a, b)
    assert proc.returncode == EXIT_PROBLEMS, describe(proc)
    line = next(l for l in proc.stdout.splitlines() if l.startswith("differs"))
    assert line.split()[1] == "w"
    assert "1 of 24 elements" in line
    assert "max abs diff 0.5" in line
    assert "1 of 3 tensors differ" in proc.stdout


def test_diff_json_reports_differing_tensor_only(run, tmp_path):
    def change(t):
        t["w"][0, 0] -= 2.0

    a, b = import_pair(run, tmp_path, change)
    proc = run("diff", "--json", a, b)
    assert proc.returncode == EXIT_PROBLEMS, describe(proc)
    report = json.loads(proc.stdout)
    assert report["identical"] is False
    by_key = {t["key"]: t for t in report["tensors"]}
    assert by_key["w"]["status"] == "differs"
    assert by_key["w"]["differing_elements"] == 1
    assert by_key["w"]["max_abs_diff"] == pytest.approx(2.0)
    assert by_key["h"]["status"] == "equal" and by_key["ids"]["status"] == "equal"


def test_diff_changed_integer_element_has_no_float_diff(run, tmp_path):
    def change(t):
        t["ids"][7] = 1000

    a, b = import_pair(run, tmp_path, change)
    report = json.loads(run("diff", "--json", a, b).stdout)
    by_key = {t["key"]: t for t in report["tensors"]}
    assert by_key["ids"]["status"] == "differs"
    assert by_key["ids"]["differing_elements"] == 1


def test_diff_reports_missing_and_shape_changes(run, tmp_path):
    def change(t):
        del t["h"]
        t["ids"] = torch.arange(11, dtype=torch.int64)
        t["extra"] = torch.zeros(2)

    a, b = import_pair(run, tmp_path, change)
    proc = run("diff", "--json", a, b)
    assert proc.returncode == EXIT_PROBLEMS, describe(proc)
    by_key = {t["key"]: t["status"] for t in json.loads(proc.stdout)["tensors"]}
    assert by_key == {"extra": "only in B", "h": "only in A", "ids": "shape differs",
                      "w": "equal"}


def test_diff_safetensors_file_against_its_import_is_identical(run, tmp_path):
    a, _ = import_pair(run, tmp_path, lambda t: None)
    proc = run("diff", tmp_path / "a.safetensors", a)
    assert proc.returncode == EXIT_OK, describe(proc)
    assert "identical: 3 tensors" in proc.stdout


def test_diff_names_the_values_that_differ(run, tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    shardsafe.save({"w": torch.ones(2), "step": 1, "cfg": {"lr": 0.1, "betas": [0.9, 0.95]}}, a)
    shardsafe.save({"w": torch.ones(2), "step": 2,
                    "cfg": {"lr": 0.1, "betas": [0.9, 0.99], "wd": 0.0}}, b)
    report = json.loads(run("diff", "--json", a, b).stdout)
    assert report["values_equal"] is False and report["identical"] is False
    assert report["differing_values"] == ["/cfg/betas/1", "/cfg/wd", "/step"]
    proc = run("diff", a, b)
    assert proc.returncode == EXIT_PROBLEMS, describe(proc)
    assert "value differs /step\n" in proc.stdout and "value differs /cfg/wd\n" in proc.stdout
    assert json.loads(run("diff", "--json", a, a).stdout)["differing_values"] == []


def test_diff_with_missing_side_is_error(run, tmp_path):
    a, _ = import_pair(run, tmp_path, lambda t: None)
    proc = run("diff", a, tmp_path / "nope")
    assert proc.returncode == EXIT_ERROR, describe(proc)
    assert proc.stderr.startswith("shardsafe: error: ")


# ----------------------------------------------------------------- prune --


def make_root_with_steps(run, tmp_path, steps, latest):
    root = tmp_path / "root"
    manager = shardsafe.CheckpointManager(root)  # saves that move `latest`
    for s in steps:
        manager.save(s, {"w": torch.ones(8)})
    # `latest` rewritten by hand after every commit (a deliberate choice, e.g. a
    # rollback): make it visibly later than the commits, as it would be.
    pointer = root / "latest"
    pointer.write_text(f"step-{latest:08d}\n")
    later = time.time() + 5
    os.utime(pointer, (later, later))
    return root


def test_ls_stale_latest_does_not_hide_newer_commit(run, tmp_path):
    root = make_root_with_steps(run, tmp_path, [1, 2], latest=1)
    earlier = time.time() - 60  # as if the save of step 2 failed to replace it
    os.utime(root / "latest", (earlier, earlier))
    listing = run.json("ls", root)
    assert [(e["step"], e["latest"]) for e in listing] == [(1, False), (2, True)]


def test_prune_keep_1_removes_older_keeps_latest(run, tmp_path):
    root = make_root_with_steps(run, tmp_path, [1, 2], latest=2)
    proc = run("prune", root, "--keep", "1")
    assert proc.returncode == EXIT_OK, describe(proc)
    assert "removed step-00000001" in proc.stdout
    assert sorted(p.name for p in root.iterdir() if not p.name.startswith(".")) == [
        "latest", "step-00000002"]
    listing = run.json("ls", root)
    assert [(e["step"], e["latest"]) for e in listing] == [(2, True)]
    assert run("verify", root).returncode == EXIT_OK


def test_prune_json_lists_removed_tags(run, tmp_path):
    root = make_root_with_steps(run, tmp_path, [1, 2, 3], latest=3)
    assert run.json("prune", root, "--keep", "1") == {
        "removed": ["step-00000001", "step-00000002"], "warnings": []}
    assert not (root / "step-00000001").exists()


def test_an_unreadable_commit_record_is_marked_reported_and_kept(run, tmp_path):
    root = make_root_with_steps(run, tmp_path, [1, 2, 3], latest=3)
    record = root / "step-00000002" / "commit.json"
    record.write_text("xx{")
    listing = run.json("ls", root)
    assert [(e["step"], e["latest"]) for e in listing] == [(1, False), (3, True), (2, False)]
    assert listing[2]["order_fault"] == f"{record}: not JSON"
    assert listing[0]["order_fault"] is None
    proc = run("ls", root)
    assert proc.returncode == EXIT_OK, describe(proc)
    assert "step-00000002" in proc.stdout and "order unknown" in proc.stdout
    proc = run("verify", root)
    assert proc.returncode == EXIT_PROBLEMS, describe(proc)
    assert f"{record}: not JSON" in proc.stdout
    proc = run("prune", root, "--keep", "1")
    assert proc.returncode == EXIT_OK, describe(proc)
    assert "removed step-00000001" in proc.stdout
    assert "warning: retention kept step-00000002" in proc.stderr
    assert sorted(p.name for p in root.iterdir() if not p.name.startswith(".")) == [
        "latest", "step-00000002", "step-00000003"]


def test_prune_never_removes_the_checkpoint_latest_names(run, tmp_path):
    root = make_root_with_steps(run, tmp_path, [1, 2, 3], latest=1)
    proc = run("prune", root, "--keep", "1")
    assert proc.returncode == EXIT_OK, describe(proc)
    assert (root / "step-00000001" / "shardsafe.json").exists()  # named by latest
    assert (root / "step-00000003" / "shardsafe.json").exists()  # the newest
    assert not (root / "step-00000002").exists()


def test_prune_keep_0_is_rejected(run, tmp_path):
    root = make_root_with_steps(run, tmp_path, [1, 2], latest=2)
    proc = run("prune", root, "--keep", "0")
    assert proc.returncode == EXIT_ERROR, describe(proc)
    assert "--keep: must be a whole number of checkpoints, at least 1 (the newest always " \
           "stays), not 0" in proc.stderr, describe(proc)
    assert (root / "step-00000001").exists()


def test_help_states_the_exit_codes(run):
    proc = run("--help")
    assert proc.returncode == EXIT_OK, describe(proc)
    assert "Exit status: 0 success; 1 a check found problems (verify, diff); 2 a usage " \
           "error, a path" in proc.stdout


def test_verify_of_a_missing_path_is_an_error_not_a_finding(run, tmp_path):
    proc = run("verify", tmp_path / "nothing")
    assert proc.returncode == EXIT_ERROR, describe(proc)
    assert proc.stderr == f"shardsafe: error: checkpoint not found: {tmp_path / 'nothing'}\n"
    assert proc.stdout == ""


def test_import_and_export_onto_an_existing_path_say_how_to_replace_it(run, tmp_path):
    a, _ = import_pair(run, tmp_path, lambda t: None)
    proc = run("import", tmp_path / "b.safetensors", a)
    assert proc.returncode == EXIT_ERROR, describe(proc)
    assert proc.stderr == f"shardsafe: error: checkpoint {a} already exists (pass --overwrite " \
                          "to replace it)\n"
    (tmp_path / "out").mkdir()
    proc = run("export-hf", a, tmp_path / "out")
    assert proc.returncode == EXIT_ERROR, describe(proc)
    assert proc.stderr.endswith("already exists (pass --overwrite to replace it)\n"), describe(proc)
    assert run("export-hf", a, tmp_path / "out", "--overwrite").returncode == EXIT_OK


def test_prune_of_demo_roots_keeps_latest(run, tmp_path):
    # Two demo runs: the step of each is 100, so build a root from both.
    root = tmp_path / "root"
    for step, d in ((100, "A"), (200, "B")):
        proc = run("demo", "--dir", tmp_path / d, *DEMO_ARGS)
        assert proc.returncode == EXIT_OK, describe(proc)
        root.mkdir(exist_ok=True)
        (tmp_path / d / STEP_DIR).rename(root / f"step-{step:08d}")
    (root / "latest").write_text("step-00000200\n")
    proc = run("prune", root, "--keep", "1")
    assert proc.returncode == EXIT_OK, describe(proc)
    assert not (root / "step-00000100").exists()
    assert [e["tag"] for e in run.json("ls", root)] == ["step-00000200"]


# --------------------------------------------------------------- attacks --


def attack_files() -> list[Path]:
    if not ATTACKS_DIR.is_dir():
        return []
    return sorted(p for p in ATTACKS_DIR.iterdir() if p.suffix == ".safetensors")


def expected_messages() -> dict[str, str]:
    tsv = ATTACKS_DIR / "expected.tsv"
    if not tsv.is_file():
        return {}
    out = {}
    for line in tsv.read_text().splitlines():
        if line and not line.startswith("#") and "\t" in line:
            name, msg = line.split("\t", 1)
            out[name] = msg
    return out


ATTACKS = attack_files()


def test_attack_corpus_present():
    if not ATTACKS_DIR.is_dir():
        pytest.skip("tests/attacks/ not created yet")
    assert ATTACKS, "tests/attacks/ holds no .safetensors files"


@pytest.mark.parametrize("path", ATTACKS, ids=[p.name for p in ATTACKS])
def test_attack_inspect_fails_cleanly_naming_the_file(run, path):
    proc = run("inspect", path)  # the runner fails on any signal
    assert proc.returncode in (EXIT_PROBLEMS, EXIT_ERROR), describe(proc)
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, f"want one error line, got:\n{proc.stderr}"
    assert lines[0].startswith("shardsafe: error: ")
    assert path.name in lines[0]
    expected = expected_messages().get(path.name)
    if expected is not None:
        assert expected.lower() in lines[0].lower(), f"want {expected!r} in {lines[0]!r}"


@pytest.mark.parametrize("path", ATTACKS, ids=[p.name for p in ATTACKS])
def test_attack_verify_and_import_never_crash(run, path, tmp_path):
    proc = run("verify", path)
    assert proc.returncode == EXIT_PROBLEMS, describe(proc)
    assert path.name in proc.stdout
    proc = run("import", path, tmp_path / "ckpt")
    assert proc.returncode == EXIT_ERROR, describe(proc)
    assert path.name in proc.stderr
    assert not (tmp_path / "ckpt").exists()
    proc = run("export-hf", path, tmp_path / "hf")
    assert proc.returncode == EXIT_ERROR, describe(proc)
    assert len(proc.stderr.strip().splitlines()) == 1 and path.name in proc.stderr
    assert os.listdir(tmp_path) == []  # no output, no temporary


def test_export_of_corrupt_checkpoint_names_file_and_tensor(run, demo_root, tmp_path):
    data = sorted((demo_root / "step-00000100").glob("data-*.safetensors"))[0]
    raw = bytearray(data.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    data.write_bytes(raw)
    proc = run("export-hf", demo_root, tmp_path / "hf")
    assert proc.returncode == EXIT_ERROR, describe(proc)
    line = proc.stderr.strip()
    assert len(line.splitlines()) == 1 and "checksum mismatch" in line, line
    assert data.name in line and 'tensor "' in line, line
    assert not (tmp_path / "hf").exists()


# ------------------------------------------------------------ misc usage --


def test_unknown_subcommand_exits_2(run):
    proc = run("frobnicate")
    assert proc.returncode == EXIT_ERROR, describe(proc)


def test_help_lists_import(run):
    proc = run("--help")
    assert proc.returncode == EXIT_OK, describe(proc)
    for cmd in ("inspect", "verify", "ls", "prune", "diff", "demo", "import", "export-hf"):
        assert cmd in proc.stdout


def test_names_with_control_characters_cannot_drive_the_terminal(run, tmp_path):
    # A key that would clear the screen and forge a line of verify's output.
    hostile = "w\x1b[2J\rOK  /etc: 0 problems\x07"
    src = tmp_path / "hostile.safetensors"
    save_file({hostile: torch.ones(2), "b": torch.zeros(1)}, str(src))
    ckpt = tmp_path / "ckpt"
    assert run("import", src, ckpt).returncode == EXIT_OK
    other = tmp_path / "other.safetensors"
    save_file({hostile: torch.zeros(2), "b": torch.zeros(1)}, str(other))
    for args in (("inspect", src), ("inspect", ckpt, "--chunks"), ("diff", ckpt, other)):
        proc = run(*args)
        out = proc.stdout + proc.stderr
        assert not any(ord(c) < 0x20 and c not in "\n" for c in out), (args, repr(out))
        assert "w\\x1b[2J\\x0dOK  /etc: 0 problems\\x07" in out, (args, out)
    # --json keeps the key intact (JSON escapes it).
    def strings(x):
        if isinstance(x, dict):
            return [*x, *(s for v in x.values() for s in strings(v))]
        if isinstance(x, list):
            return [s for v in x for s in strings(v)]
        return [x] if isinstance(x, str) else []

    assert hostile in strings(run.json("inspect", ckpt))


def test_fifos_in_a_checkpoint_are_errors_not_hangs(run, tmp_path):
    # Opening a FIFO for reading waits for a writer that never comes: every
    # reader must refuse anything that is not a regular file instead.
    root = tmp_path / "root"
    shardsafe.CheckpointManager(root).save(1, {"w": torch.ones(4)})
    ckpt = root / "step-00000001"
    data = next(ckpt.glob("data-*.safetensors"))
    data.unlink()
    os.mkfifo(data)
    assert run("inspect", ckpt, timeout=120).returncode == EXIT_OK  # reads the index only
    for args in (("verify", ckpt), ("export-hf", ckpt, tmp_path / "out")):
        proc = run(*args, timeout=120)
        assert proc.returncode in (EXIT_PROBLEMS, EXIT_ERROR), (args, describe(proc))
        assert "not a regular file" in proc.stdout + proc.stderr, (args, describe(proc))
    # shardsafe.load too, in a process of its own (a hang must fail, not stall the suite).
    code = ("import sys, torch, shardsafe\n"
            "try:\n"
            "    shardsafe.load({'w': torch.zeros(4)}, sys.argv[1])\n"
            "except shardsafe.ShardsafeError as e:\n"
            "    print(e)\n")
    proc = subprocess.run([sys.executable, "-c", code, str(ckpt)], capture_output=True, text=True,
                          timeout=300)
    assert "not a regular file" in proc.stdout, describe(proc)
    (ckpt / "shardsafe.json").unlink()
    os.mkfifo(ckpt / "shardsafe.json")
    proc = run("inspect", ckpt, timeout=120)
    assert proc.returncode == EXIT_ERROR and "not a regular file" in proc.stderr, describe(proc)
    os.unlink(root / "latest")
    os.mkfifo(root / "latest")
    proc = run("ls", root, timeout=120)
    assert proc.returncode == EXIT_OK, describe(proc)  # a `latest` that cannot be read names nothing


def test_symlinks_never_lead_out_of_a_checkpoint_or_model_directory(run, tmp_path):
    # A planted link must not make a reader read, or export-hf copy out, a
    # file from outside the directory it was given.
    secret = tmp_path / "secret.json"
    secret.write_text('{"secret": "do not copy"}')
    model = tmp_path / "model"
    model.mkdir()
    save_file({"w": torch.ones(2)}, str(model / "model.safetensors"))
    (model / "config.json").symlink_to(secret)
    proc = run("export-hf", model, tmp_path / "out")
    assert proc.returncode == EXIT_ERROR, describe(proc)
    assert "config.json: a symbolic link leading outside" in proc.stderr, describe(proc)
    assert not any("do not copy" in p.read_text(errors="replace")
                   for p in tmp_path.glob("out*/**/*") if p.is_file())

    root = tmp_path / "root"
    shardsafe.CheckpointManager(root).save(1, {"w": torch.ones(4)})
    ckpt = root / "step-00000001"
    data = next(ckpt.glob("data-*.safetensors"))
    outside = tmp_path / data.name
    data.rename(outside)
    data.symlink_to(outside)
    proc = run("verify", ckpt)
    assert proc.returncode in (EXIT_PROBLEMS, EXIT_ERROR), describe(proc)
    assert "a symbolic link leading outside" in proc.stdout + proc.stderr, describe(proc)
    with pytest.raises(shardsafe.ShardsafeError, match="symbolic link leading outside"):
        shardsafe.load({"w": torch.zeros(4)}, ckpt)
    index = ckpt / "shardsafe.json"
    index.rename(tmp_path / "shardsafe.json")
    index.symlink_to(tmp_path / "shardsafe.json")
    proc = run("inspect", ckpt)
    assert proc.returncode == EXIT_ERROR, describe(proc)
    assert "a symbolic link leading outside" in proc.stderr, describe(proc)


def test_a_hugging_face_cache_snapshot_loads_through_its_blob_links(run, tmp_path):
    # The hub cache keeps files in models--ORG--NAME/blobs and links them
    # from snapshots/REV/: links inside the cached repository are followed.
    repo = tmp_path / "hub" / "models--org--tiny"
    (repo / "blobs").mkdir(parents=True)
    snapshot = repo / "snapshots" / "0123abcd"
    snapshot.mkdir(parents=True)
    save_file({"w": torch.arange(4.0)}, str(repo / "blobs" / "aaaa"))
    (repo / "blobs" / "bbbb").write_text('{"model_type": "tiny"}')
    (snapshot / "model.safetensors").symlink_to("../../blobs/aaaa")
    (snapshot / "config.json").symlink_to("../../blobs/bbbb")
    out = {"w": torch.zeros(4)}
    shardsafe.load(out, snapshot)
    assert torch.equal(out["w"], torch.arange(4.0))
    proc = run("export-hf", snapshot, tmp_path / "out")
    assert proc.returncode == EXIT_OK, describe(proc)
    assert (tmp_path / "out" / "config.json").read_text() == '{"model_type": "tiny"}'


def test_inspect_and_verify_of_another_tools_checkpoint_say_what_it_looks_like(run, tmp_path):
    import torch.distributed.checkpoint as dcp

    path = tmp_path / "dcp"
    dcp.save({"w": torch.ones(4)}, storage_writer=dcp.FileSystemWriter(str(path)), no_dist=True)
    hint = (f"; it holds what looks like a torch DCP checkpoint, which the Python package reads: "
            f"`shardsafe import {path} DST` makes a checkpoint of it, shardsafe.load reads it as "
            f"it is")
    proc = run("inspect", path)
    assert proc.returncode == EXIT_ERROR, describe(proc)
    assert proc.stderr == f"shardsafe: error: no committed checkpoint, Hugging Face model or " \
                          f"safetensors file in {path}{hint}\n"
    proc = run("verify", path)
    assert proc.returncode == EXIT_PROBLEMS, describe(proc)
    assert hint in proc.stdout
