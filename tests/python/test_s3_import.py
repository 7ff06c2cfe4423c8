"""Other tools' checkpoints (torch DCP, Megatron torch_dist) in an S3 bucket,
against moto (the `s3` fixture of test_s3.py): uploaded with boto3 as `aws s3
cp` would, then imported and loaded through s3:// URIs. The package stages
a prefix's objects in a fresh directory under SHARDSAFE_STAGING_DIR
(shardsafe._paths.staged), reads them there with the local readers and
removes the directory, whatever happened; every test checks that the
staging directory is left empty.
"""

from __future__ import annotations

import shutil
import warnings
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp

from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Shard, distribute_tensor

import shardsafe
from shardsafe import _C, foreign
from conftest import EXIT_ERROR, EXIT_OK, describe
from dist_util import run_workers
from test_import import BIAS, LAYERS, QKV, _zeros as _megatron_zeros, megatron_root  # noqa: F401
from test_s3 import BUCKET, _upload, s3  # noqa: F401 (s3, megatron_root: fixtures)


def _dcp_state() -> dict:
    g = torch.Generator().manual_seed(3)
    return {"model": {"embed": torch.randn(3 << 20, generator=g),  # 12 MiB: two download pieces
                      "proj": torch.randn(64, 48, generator=g).to(torch.bfloat16),
                      "ids": torch.randint(0, 1 << 40, (33,), generator=g)},
            "step": 11}


def _dcp_zeros() -> dict:
    return {"model": {k: torch.zeros_like(v) for k, v in _dcp_state()["model"].items()},
            "step": 0}


def _assert_dcp_loaded(got: dict) -> None:
    want = _dcp_state()
    for k, v in want["model"].items():
        assert got["model"][k].dtype == v.dtype and torch.equal(got["model"][k], v), k
    assert got["step"] == 11


@pytest.fixture(scope="module")
def dcp_uri(s3, tmp_path_factory) -> str:
    """A single-process torch DCP checkpoint, uploaded."""
    local = tmp_path_factory.mktemp("dcp") / "ckpt"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save(_dcp_state(), storage_writer=dcp.FileSystemWriter(str(local)), no_dist=True)
    _upload(s3, local, "dcp/step-11")
    return f"s3://{BUCKET}/dcp/step-11"


@pytest.fixture(scope="module")
def megatron_uri(s3, megatron_root) -> str:  # noqa: F811
    """test_import's Megatron root (tracker + iter_0000007/), uploaded."""
    _upload(s3, megatron_root, "megatron/run")
    return f"s3://{BUCKET}/megatron/run"


@pytest.fixture
def staging(tmp_path, monkeypatch) -> Path:
    """An empty SHARDSAFE_STAGING_DIR (inherited by the CLI's processes)."""
    path = tmp_path / "staging"
    path.mkdir()
    monkeypatch.setenv("SHARDSAFE_STAGING_DIR", str(path))
    return path


def _entries(path: Path) -> list[str]:
    return sorted(p.name for p in path.iterdir())


def _prefix_bytes(client, prefix: str) -> tuple[int, int]:
    """(objects, bytes) under `prefix/` in the bucket."""
    listed = client.list_objects_v2(Bucket=BUCKET, Prefix=prefix + "/")["Contents"]
    return len(listed), sum(o["Size"] for o in listed)


def test_dcp_imports_from_the_bucket_into_a_local_checkpoint_bit_exact(dcp_uri, staging,
                                                                        tmp_path):
    done = foreign.import_checkpoint(dcp_uri, tmp_path / "ckpt", progress=False)
    assert done["format"] == "torch DCP" and done["source"] == dcp_uri, done
    assert _entries(staging) == []
    got = _dcp_zeros()
    shardsafe.load(got, tmp_path / "ckpt")
    _assert_dcp_loaded(got)
    meta = shardsafe.describe(tmp_path / "ckpt")["metadata"]
    assert meta["imported_from"] == {"format": "torch DCP", "path": dcp_uri}


@pytest.mark.filterwarnings("ignore::shardsafe.foreign.NotImportedWarning")  # args.params_dtype
def test_megatron_root_imports_from_the_bucket_into_the_bucket(s3, megatron_uri, staging):
    dst = f"s3://{BUCKET}/imported/megatron"
    done = foreign.import_checkpoint(megatron_uri, dst, progress=False)
    # The root's tracker names iter_0000007: a nested prefix, staged too.
    assert done["source"] == f"{megatron_uri}/iter_0000007", done
    assert done["format"] == "Megatron torch_dist" and "args.params_dtype" in done["dropped"]
    assert _entries(staging) == []
    got = _megatron_zeros()
    shardsafe.load(got, dst, strict=False)
    assert torch.equal(got["decoder.qkv.weight"], QKV) and torch.equal(got["decoder.bias"], BIAS)
    assert torch.equal(got["decoder.layers.mlp.weight"], LAYERS) and got["iteration"] == 7
    with pytest.raises(shardsafe.CheckpointExistsError, match="imported/megatron"):
        foreign.import_checkpoint(megatron_uri, dst, progress=False)
    assert _entries(staging) == []


def test_dcp_imports_from_the_bucket_into_the_bucket(dcp_uri, staging):
    dst = f"s3://{BUCKET}/imported/dcp"
    foreign.import_checkpoint(dcp_uri, dst, progress=False)
    got = _dcp_zeros()
    shardsafe.load(got, dst)
    _assert_dcp_loaded(got)
    assert _entries(staging) == []


def test_cli_imports_a_checkpoint_from_the_bucket(run, dcp_uri, staging, tmp_path):
    proc = run("import", dcp_uri, tmp_path / "ckpt", timeout=300)
    assert proc.returncode == EXIT_OK, describe(proc)
    assert f"from torch DCP checkpoint {dcp_uri} into" in proc.stdout, describe(proc)
    assert "100%" in proc.stderr, describe(proc)  # the download's and the import's bars
    assert _entries(staging) == []
    got = _dcp_zeros()
    shardsafe.load(got, tmp_path / "ckpt")
    _assert_dcp_loaded(got)


def test_foreign_checkpoints_load_straight_from_the_bucket(dcp_uri, megatron_uri, staging):
    got = _dcp_zeros()
    res = shardsafe.load(got, dcp_uri)
    _assert_dcp_loaded(got)
    assert res.path == dcp_uri and res.tag == "step-11"
    got = _megatron_zeros()
    with pytest.raises(shardsafe.KeyMismatchError) as info:  # strict: as from a local root
        shardsafe.load(got, megatron_uri)
    assert "rng_state/shard_0_2" in str(info.value) and megatron_uri in str(info.value)
    assert "staging" not in str(info.value)  # named by its URI, not the staged copy
    assert not got["decoder.qkv.weight"].any()
    shardsafe.load(got, megatron_uri, strict=False)
    assert torch.equal(got["decoder.qkv.weight"], QKV) and torch.equal(got["decoder.bias"], BIAS)
    assert torch.equal(got["decoder.layers.mlp.weight"], LAYERS) and got["iteration"] == 7
    assert _entries(staging) == []


def _load_on_two_ranks(rank, world, uri):
    mesh = init_device_mesh("cpu", (world,))
    got = _dcp_zeros()
    got["model"]["proj"] = distribute_tensor(got["model"]["proj"], mesh, [Shard(0)])
    shardsafe.load(got, uri)
    got["model"]["proj"] = got["model"]["proj"].full_tensor()
    _assert_dcp_loaded(got)


def test_two_ranks_each_stage_and_load_a_checkpoint_from_the_bucket(dcp_uri, staging):
    run_workers(_load_on_two_ranks, 2, dcp_uri)
    assert _entries(staging) == []


def test_too_little_staging_space_is_named_before_anything_is_copied(s3, dcp_uri, staging,
                                                                     tmp_path, monkeypatch):
    objects, total = _prefix_bytes(s3, "dcp/step-11")
    real = shutil.disk_usage

    def small(path):
        usage = real(path)
        return usage._replace(free=total - 1)

    monkeypatch.setattr(shutil, "disk_usage", small)
    want = (f"{dcp_uri}: its {objects} objects hold {total} bytes, more than the {total - 1} "
            f"bytes free in the staging directory {staging} (set SHARDSAFE_STAGING_DIR to a "
            f"directory with more space)")
    with pytest.raises(shardsafe.StorageError) as info:
        foreign.import_checkpoint(dcp_uri, tmp_path / "ckpt", progress=False)
    assert str(info.value) == want
    with pytest.raises(shardsafe.StorageError) as info:
        shardsafe.load(_dcp_zeros(), dcp_uri)
    assert str(info.value) == want
    assert _entries(staging) == [] and not (tmp_path / "ckpt").exists()


def test_a_prefix_holding_no_known_checkpoint_is_a_clear_not_found(s3, run, staging, tmp_path):
    s3.put_object(Bucket=BUCKET, Key="notes/readme.txt", Body=b"not a checkpoint")
    for uri in (f"s3://{BUCKET}/nothing-here", f"s3://{BUCKET}/notes"):
        with pytest.raises(shardsafe.CheckpointNotFoundError) as info:
            foreign.import_checkpoint(uri, tmp_path / "ckpt", progress=False)
        assert str(info.value) == (f"no torch DCP, Megatron torch_dist, DeepSpeed or nanotron "
                                   f"checkpoint in {uri}")
        with pytest.raises(shardsafe.CheckpointNotFoundError, match=f"{uri}.*nor is it a torch "
                                                                     f"DCP, Megatron"):
            shardsafe.load(_dcp_zeros(), uri)
        proc = run("import", uri, tmp_path / "ckpt")
        assert proc.returncode == EXIT_ERROR, describe(proc)
        assert f"checkpoint in {uri}" in proc.stderr, describe(proc)
        assert _entries(staging) == [] and not (tmp_path / "ckpt").exists()


def test_an_object_gone_before_its_copy_is_an_error_naming_it(s3, tmp_path):
    for name, body in (("a/x.bin", b"x" * 100), ("b.bin", b"y" * 10)):
        s3.put_object(Bucket=BUCKET, Key=f"gone/{name}", Body=body)
    download = _C.PrefixDownload(f"s3://{BUCKET}/gone")
    assert download.objects == [("a/x.bin", 100), ("b.bin", 10)] and download.total_bytes == 110
    s3.delete_object(Bucket=BUCKET, Key="gone/a/x.bin")
    with pytest.raises(shardsafe.CheckpointNotFoundError) as info:
        download.to(str(tmp_path))
    assert str(info.value).startswith(f"s3://{BUCKET}/gone/a/x.bin: bytes [0, 100) into "
                                      f"{tmp_path}/a/x.bin: "), str(info.value)
    # Every file was created before the copy began: none is written over.
    with pytest.raises(shardsafe.CheckpointExistsError, match="a/x.bin"):
        download.to(str(tmp_path))
    download = _C.PrefixDownload(f"s3://{BUCKET}/gone")
    assert download.objects == [("b.bin", 10)]
    download.to(str(tmp_path / "again"))
    assert (tmp_path / "again" / "b.bin").read_bytes() == b"y" * 10
