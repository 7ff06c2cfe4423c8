"""Format versions (docs/format.md §3, §3a, §3b, §3c): checkpoints written
by the version-1, 2 and 3 writers (tests/data/format-v1, format-v2,
format-v3, committed as those writers left them) keep loading and
verifying; a save with a chunk table writes a version-4 index (the table
in parts, one per home rank of its tensors; the chunks' checksums in a
checksum file per writing rank) that loads, verifies, inspects and imports
like any other.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

import shardsafe

from conftest import EXIT_OK, REPO_ROOT, describe

V1 = REPO_ROOT / "tests" / "data" / "format-v1"
V2 = REPO_ROOT / "tests" / "data" / "format-v2"
V3 = REPO_ROOT / "tests" / "data" / "format-v3"


def _index(ckpt: Path) -> dict:
    return json.loads((ckpt / "shardsafe.json").read_text())


def test_a_version_1_checkpoint_loads_the_values_it_was_written_with(tmp_path):
    ckpt = tmp_path / "step-1"
    shutil.copytree(V1 / "import" / "step-1", ckpt)
    assert _index(ckpt)["version"] == 1
    got = {"a.f32": torch.zeros(4, 6), "b.bf16": torch.zeros(2, 8, dtype=torch.bfloat16),
           "c.i64": torch.zeros(5, dtype=torch.int64)}
    shardsafe.load(got, ckpt)
    assert torch.equal(got["a.f32"], torch.arange(24, dtype=torch.float32).reshape(4, 6) * 0.5)
    assert torch.equal(got["b.bf16"],
                       (torch.arange(16, dtype=torch.float32) - 8).to(torch.bfloat16).reshape(2, 8))
    assert torch.equal(got["c.i64"], torch.arange(5, dtype=torch.int64) * 1000)


def test_a_sharded_version_1_checkpoint_verifies_and_loads_every_chunk(run, tmp_path):
    root = tmp_path / "demo"
    shutil.copytree(V1 / "demo", root)
    proc = run("verify", root)
    assert proc.returncode == EXIT_OK, describe(proc)
    ckpt = root / "step-00000100"
    index = _index(ckpt)
    assert index["version"] == 1 and index["world_size"] == 4
    # Every tensor whole: each chunk read whole, so its checksum verified.
    dtypes = {"BF16": torch.bfloat16, "F32": torch.float32}
    got = {k: torch.zeros(t["shape"], dtype=dtypes[t["dtype"]])
           for k, t in index["tensors"].items()}
    result = shardsafe.load(got, root, strict=False)  # its values are not in `got`
    assert result.missing_keys == []
    assert result.values["step"] == 100
    assert result.bytes_read >= sum(c["bytes"] for t in index["tensors"].values()
                                    for c in t["chunks"])


@pytest.mark.parametrize("fixture,version", [(V2, 2), (V3, 3)])
def test_a_chunk_table_checkpoint_of_an_older_version_verifies_and_loads_as_a_fresh_save(
        run, tmp_path, monkeypatch, fixture, version):
    root = tmp_path / "demo"
    shutil.copytree(fixture / "demo", root)
    proc = run("verify", root)
    assert proc.returncode == EXIT_OK, describe(proc)
    assert "109 checksums verified" in proc.stdout, describe(proc)
    index = _index(root / "step-00000100")
    assert index["version"] == version and index["chunk_table"] == "shardsafe.chunks"
    assert len(index.get("checksum_files", [])) == (4 if version == 3 else 0)
    dtypes = {"BF16": torch.bfloat16, "F32": torch.float32}
    got = {k: torch.zeros(t["shape"], dtype=dtypes[t["dtype"]])
           for k, t in index["tensors"].items()}
    result = shardsafe.load(got, root, strict=False)
    assert result.missing_keys == []
    assert result.values["step"] == 100
    # The same demo saved now: version 4, the same tensors bit for bit.
    fresh = tmp_path / "fresh"
    monkeypatch.setenv("SHARDSAFE_CHUNK_TABLE_MIN_CHUNKS", "1")
    proc = run("demo", "--dir", fresh, "--layers", "1", "--hidden", "8", "--ffn", "8",
               "--vocab", "8", "--save-tp", "2", "--save-dp", "2")
    assert proc.returncode == EXIT_OK, describe(proc)
    assert _index(fresh / "step-00000100")["version"] == 4
    again = {k: torch.zeros_like(v) for k, v in got.items()}
    shardsafe.load(again, fresh, strict=False)
    for k in got:
        assert torch.equal(got[k], again[k]), k


def _parts(ckpt: Path) -> list[dict]:
    index = _index(ckpt)
    return [index["files"][i] for i in index["chunk_tables"]]


@pytest.fixture
def chunk_table_everywhere(monkeypatch):
    monkeypatch.setenv("SHARDSAFE_CHUNK_TABLE_MIN_CHUNKS", "1")


def test_a_chunk_table_checkpoint_round_trips_and_the_tools_read_it(
        chunk_table_everywhere, run, tmp_path):
    state = {"w": torch.randn(64, 32), "b": torch.arange(7, dtype=torch.int64),
             "h": torch.randn(3, 5).to(torch.bfloat16)}
    shardsafe.save(state, tmp_path / "ck")
    index = _index(tmp_path / "ck")
    assert index["version"] == 4
    assert "chunk_table" not in index
    [checksums] = [index["files"][i] for i in index["checksum_files"]]
    assert checksums["name"] == "checksums-00000.crc32c" and checksums["rank"] == 0
    assert (tmp_path / "ck" / checksums["name"]).stat().st_size == checksums["bytes"]
    [part] = _parts(tmp_path / "ck")  # one rank: every tensor's home is rank 0
    assert part["name"] == "chunks-00000.chunks" and part["rank"] == 0
    assert (tmp_path / "ck" / part["name"]).stat().st_size == part["bytes"]
    assert all("table" in t and "chunks" not in t for t in index["tensors"].values())
    assert all(t["table"][0] == 0 for t in index["tensors"].values())

    got = {k: torch.zeros_like(v) for k, v in state.items()}
    shardsafe.load(got, tmp_path / "ck")
    for k in state:
        assert torch.equal(got[k], state[k]), k

    for command in (["verify", tmp_path / "ck"], ["inspect", tmp_path / "ck"],
                    ["import", tmp_path / "ck", tmp_path / "copy"]):
        proc = run(*command)
        assert proc.returncode == EXIT_OK, describe(proc)
    human = run("inspect", tmp_path / "ck").stdout
    assert "format v4" in human and "chunks in chunks-00000.chunks" in human
    printed = json.loads(run("inspect", "--json", tmp_path / "ck").stdout)
    assert [c["crc32c"] for c in printed["tensors"]["w"]["chunks"]]  # every chunk, inline
    copied = {k: torch.zeros_like(v) for k, v in state.items()}
    shardsafe.load(copied, tmp_path / "copy")
    assert all(torch.equal(copied[k], state[k]) for k in state)


def test_a_damaged_chunk_table_is_a_clear_error_naming_it(chunk_table_everywhere, run, tmp_path):
    shardsafe.save({"w": torch.randn(16, 16)}, tmp_path / "ck")
    [part] = _parts(tmp_path / "ck")
    table = tmp_path / "ck" / part["name"]
    data = bytearray(table.read_bytes())
    data[-3] ^= 0x40  # in the last record
    table.write_bytes(bytes(data))
    with pytest.raises(shardsafe.CorruptCheckpointError, match=part["name"]):
        shardsafe.load({"w": torch.zeros(16, 16)}, tmp_path / "ck")
    proc = run("verify", tmp_path / "ck")
    assert proc.returncode != EXIT_OK
    assert part["name"] in proc.stdout + proc.stderr


def test_a_damaged_checksum_file_is_a_clear_error_naming_it(chunk_table_everywhere, run,
                                                             tmp_path):
    shardsafe.save({"w": torch.randn(16, 16)}, tmp_path / "ck")
    checksums = tmp_path / "ck" / "checksums-00000.crc32c"
    data = bytearray(checksums.read_bytes())
    data[17] ^= 0x01  # in the first entry
    checksums.write_bytes(bytes(data))
    with pytest.raises(shardsafe.CorruptCheckpointError, match="checksums-00000.crc32c"):
        shardsafe.load({"w": torch.zeros(16, 16)}, tmp_path / "ck")
    proc = run("verify", tmp_path / "ck")
    assert proc.returncode != EXIT_OK
    assert "checksums-00000.crc32c" in proc.stdout + proc.stderr
