"""Checkpoints in an S3 bucket, against a real S3-compatible server: moto in
server mode on 127.0.0.1, started by these tests. Checkpoints are put into
the bucket with boto3 (a plain client, as `aws s3 cp` would), then read
through s3:// URIs by the Python package and the command-line tool: the
objects are the files of a checkpoint directory under the same names.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest
import torch
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Shard, distribute_tensor

import shardsafe
import shardsafe.hf
from conftest import EXIT_OK, EXIT_PROBLEMS, describe
from dist_util import run_workers

import boto3  # requirements-dev.txt: a missing one fails the module loudly
from moto.server import ThreadedMotoServer

BUCKET = "ckpts"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def s3():
    """A moto server, the AWS_* variables that point at it (inherited by
    spawned ranks and the CLI), and a boto3 client with one bucket."""
    port = _free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    env = {"AWS_ACCESS_KEY_ID": "test-key", "AWS_SECRET_ACCESS_KEY": "test-secret-never-shown",
           "AWS_REGION": "us-east-1", "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}"}
    cleared = ("AWS_ENDPOINT_URL_S3", "AWS_SESSION_TOKEN", "AWS_DEFAULT_REGION")
    saved = {k: os.environ.get(k) for k in (*env, *cleared)}
    os.environ.update(env)
    for k in cleared:
        os.environ.pop(k, None)
    client = boto3.client("s3", endpoint_url=env["AWS_ENDPOINT_URL"], region_name="us-east-1",
                          aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
                          aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"])
    client.create_bucket(Bucket=BUCKET)
    try:
        yield client
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        server.stop()


def _upload(client, local: Path, prefix: str) -> None:
    for path in sorted(local.rglob("*")):
        if path.is_file():
            client.upload_file(str(path), BUCKET, f"{prefix}/{path.relative_to(local)}")


def _state(step: int) -> dict:
    g = torch.Generator().manual_seed(step)
    return {"w": torch.randn(96, 40, generator=g),
            "b": torch.randn(40, generator=g).to(torch.bfloat16),
            "step": step}


@pytest.fixture(scope="module")
def run_root(s3, tmp_path_factory) -> str:
    """A manager's root with steps 1 and 2 (`latest` names 2), uploaded."""
    local = tmp_path_factory.mktemp("s3src") / "run"
    mgr = shardsafe.CheckpointManager(str(local))
    for step in (1, 2):
        mgr.save(step, _state(step))
    _upload(s3, local, "team/run")
    return f"s3://{BUCKET}/team/run"


def _zeros_like(state: dict) -> dict:
    return {k: torch.zeros_like(v) if isinstance(v, torch.Tensor) else 0 for k, v in state.items()}


def test_a_root_in_a_bucket_loads_its_latest_and_a_tag_loads_that_step(run_root):
    for path, step in ((run_root, 2), (f"{run_root}/step-00000001", 1)):
        target = _zeros_like(_state(step))
        result = shardsafe.load(target, path)
        want = _state(step)
        assert torch.equal(target["w"], want["w"]) and torch.equal(target["b"], want["b"]), path
        assert target["step"] == step
        assert result.bytes_read >= want["w"].nbytes + want["b"].nbytes


def _resharded(rank, world, root):
    mesh = init_device_mesh("cpu", (world,))
    want = _state(2)
    target = {"w": distribute_tensor(torch.zeros(96, 40), mesh, [Shard(1)]),
              "b": torch.zeros(40, dtype=torch.bfloat16), "step": 0}
    result = shardsafe.load(target, root)
    assert torch.equal(target["w"].full_tensor(), want["w"])
    assert torch.equal(target["b"], want["b"])
    # Ranged reads of what this rank needs: a third of the columns of every
    # row of w (rows are read whole, 40 of them at once, so a rank reads at
    # most all of w), and all of b.
    need = want["w"].nbytes // world + want["b"].nbytes
    assert need <= result.bytes_read <= want["w"].nbytes + want["b"].nbytes, result.bytes_read


def test_three_ranks_load_a_one_rank_checkpoint_from_the_bucket(run_root):
    run_workers(_resharded, 3, run_root)


def test_cli_lists_inspects_and_verifies_a_root_in_the_bucket(run, run_root):
    tags = {c["tag"]: c for c in run.json("ls", run_root)}
    assert set(tags) == {"step-00000001", "step-00000002"}
    assert tags["step-00000002"]["latest"] and not tags["step-00000001"]["latest"]
    assert tags["step-00000002"]["bytes"] > 0
    inspected = run.json("inspect", f"{run_root}/step-00000001")
    assert set(inspected["tensors"]) >= {"w", "b"}
    proc = run("verify", f"{run_root}/step-00000002")
    assert proc.returncode == EXIT_OK, describe(proc)


def test_a_changed_object_in_the_bucket_fails_verify_and_load_naming_it(s3, run_root, run,
                                                                        tmp_path):
    local = tmp_path / "one"
    shardsafe.save(_state(3), str(local))
    data = next(local.glob("data-*.safetensors"))
    raw = bytearray(data.read_bytes())
    raw[-1] ^= 0xFF  # the last byte of w's or b's data
    _upload(s3, local, "team/damaged")
    s3.put_object(Bucket=BUCKET, Key=f"team/damaged/{data.name}", Body=bytes(raw))
    uri = f"s3://{BUCKET}/team/damaged"
    proc = run("verify", uri)
    assert proc.returncode == EXIT_PROBLEMS, describe(proc)
    assert f"{uri}/{data.name}" in proc.stdout + proc.stderr, describe(proc)
    with pytest.raises(shardsafe.ShardsafeError, match=data.name):
        shardsafe.load(_zeros_like(_state(3)), uri)


def test_a_missing_bucket_or_key_is_a_one_line_error_naming_it(run_root):
    with pytest.raises(shardsafe.CheckpointNotFoundError) as info:
        shardsafe.load(_zeros_like(_state(1)), "s3://no-such-bucket/run")
    message = str(info.value)
    assert "\n" not in message
    # The bucket and the service asked are named; no other tool's checkpoint
    # is looked for in a bucket that does not exist.
    assert f"s3://no-such-bucket: no such bucket at {os.environ['AWS_ENDPOINT_URL']}" in message
    assert info.value.detail == "NO_SUCH_BUCKET" and "torch DCP" not in message
    with pytest.raises(shardsafe.CheckpointNotFoundError, match=f"{BUCKET}/team/nothing-here"):
        shardsafe.load(_zeros_like(_state(1)), f"s3://{BUCKET}/team/nothing-here")


def test_missing_credentials_are_named_and_the_secret_never_shown(run_root, monkeypatch):
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    with pytest.raises(shardsafe.ShardsafeError, match="AWS_ACCESS_KEY_ID"):
        shardsafe.load(_zeros_like(_state(1)), run_root)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "test-key")
    with pytest.raises(shardsafe.ShardsafeError) as info:
        shardsafe.load(_zeros_like(_state(1)), "s3://no-such-bucket/run")
    assert os.environ["AWS_SECRET_ACCESS_KEY"] not in str(info.value)


def _keys(client, prefix: str) -> list[str]:
    pages = client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix)
    return sorted(o["Key"] for page in pages for o in page.get("Contents", []))


def _save_sharded(rank, world, uri):
    mesh = init_device_mesh("cpu", (world,))
    want = _state(5)
    state = {"w": distribute_tensor(want["w"], mesh, [Shard(0)]), "b": want["b"], "step": 5}
    shardsafe.save(state, uri)


def _load_columns(rank, world, uri):
    mesh = init_device_mesh("cpu", (world,))
    want = _state(5)
    target = {"w": distribute_tensor(torch.zeros(96, 40), mesh, [Shard(1)]),
              "b": torch.zeros(40, dtype=torch.bfloat16), "step": 0}
    shardsafe.load(target, uri)
    assert torch.equal(target["w"].full_tensor(), want["w"]) and torch.equal(target["b"], want["b"])
    assert target["step"] == 5


def test_four_ranks_save_to_the_bucket_and_three_load_it(s3):
    uri = f"s3://{BUCKET}/team/world4/step-5"
    run_workers(_save_sharded, 4, uri)
    keys = _keys(s3, "team/world4/")
    data = [k for k in keys if k.endswith(".safetensors")]
    assert len(data) == 4 and f"team/world4/step-5/shardsafe.json" in keys, keys
    assert not [k for k in keys if "/.tmp-" in k], keys  # the save's markers are gone
    run_workers(_load_columns, 3, uri)


def test_data_objects_open_with_the_reference_safetensors_reader(s3, tmp_path):
    from safetensors.torch import load as st_load

    uri = f"s3://{BUCKET}/team/reference/step-6"
    shardsafe.save(_state(6), uri)
    (key,) = [k for k in _keys(s3, "team/reference/") if k.endswith(".safetensors")]
    tensors = st_load(s3.get_object(Bucket=BUCKET, Key=key)["Body"].read())
    want = _state(6)
    assert torch.equal(tensors["w"], want["w"]) and torch.equal(tensors["b"], want["b"])


def test_a_manager_on_a_bucket_keeps_the_last_two_and_resumes_from_latest(s3):
    root = f"s3://{BUCKET}/team/managed"
    mgr = shardsafe.CheckpointManager(root, keep_last=2)
    for step in (1, 2, 3, 4):
        mgr.save(step, _state(step))
    assert [c["step"] for c in mgr.list()] == [3, 4]
    assert mgr.latest_step() == 4
    tags = {k.split("/")[2] for k in _keys(s3, "team/managed/") if k.count("/") >= 3}
    assert tags == {"step-00000003", "step-00000004"}, tags  # retention removed every object
    assert s3.get_object(Bucket=BUCKET, Key="team/managed/latest")["Body"].read() == \
        b"step-00000004\n"
    target = _zeros_like(_state(4))
    mgr.load(target)
    assert torch.equal(target["w"], _state(4)["w"])


def test_async_save_to_the_bucket(s3):
    uri = f"s3://{BUCKET}/team/async/step-7"
    assert shardsafe.async_save(_state(7), uri).result(timeout=300) == uri
    target = _zeros_like(_state(7))
    shardsafe.load(target, uri)
    assert torch.equal(target["w"], _state(7)["w"])
    assert not [k for k in _keys(s3, "team/async/") if "/.tmp-" in k]


_RACER = """
import sys, torch, shardsafe
seed = int(sys.argv[2])
state = {"w": torch.full((256, 1024), float(seed)), "seed": seed}
try:
    shardsafe.save(state, sys.argv[1])
    print("committed")
except shardsafe.CheckpointExistsError as e:
    print("exists")
"""


def test_two_writers_racing_for_one_tag_commit_exactly_once(s3, tmp_path):
    import subprocess
    import sys

    uri = f"s3://{BUCKET}/team/race/step-8"
    racers = [subprocess.Popen([sys.executable, "-c", _RACER, uri, str(seed)],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
              for seed in (1, 2)]
    outcomes = []
    for p in racers:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
        outcomes.append(out.strip())
    assert sorted(outcomes) == ["committed", "exists"], outcomes
    winner = 1 + outcomes.index("committed")
    target = {"w": torch.zeros(256, 1024), "seed": 0}
    shardsafe.load(target, uri)
    assert target["seed"] == winner and torch.equal(target["w"], torch.full((256, 1024),
                                                                            float(winner)))
    # The loser removed its data objects: only the winner's remain.
    data = [k for k in _keys(s3, "team/race/") if k.endswith(".safetensors")]
    assert len(data) == 1, data


def test_saving_over_a_committed_tag_is_refused_and_changes_nothing(s3):
    uri = f"s3://{BUCKET}/team/twice/step-9"
    shardsafe.save(_state(9), uri)
    before = _keys(s3, "team/twice/")
    with pytest.raises(shardsafe.CheckpointExistsError, match="step-9"):
        shardsafe.save(_state(10), uri)
    assert _keys(s3, "team/twice/") == before


def test_prune_on_the_command_line_removes_old_steps_and_leftovers(s3, run, monkeypatch):
    root = f"s3://{BUCKET}/team/pruned"
    mgr = shardsafe.CheckpointManager(root)
    for step in (1, 2, 3):
        mgr.save(step, _state(step))
    # What a killed save leaves: data under a tag with no index.
    s3.put_object(Bucket=BUCKET, Key="team/pruned/step-00000004/data-00000-000.0123456789abcdef"
                  ".safetensors", Body=b"partial")
    assert [c["tag"] for c in run.json("ls", root)] == ["step-00000001", "step-00000002",
                                                        "step-00000003"]
    monkeypatch.setenv("SHARDSAFE_S3_LEFTOVER_AGE", "0")  # old enough to be a dead save's
    proc = run("prune", root, "--keep", "1")
    assert proc.returncode == EXIT_OK, describe(proc)
    assert [c["tag"] for c in run.json("ls", root)] == ["step-00000003"]
    tags = {k.split("/")[2] for k in _keys(s3, "team/pruned/") if k.count("/") >= 3}
    assert tags == {"step-00000003"}, tags


def test_hugging_face_export_from_and_into_the_bucket(s3, run_root, tmp_path):
    from safetensors.torch import load as st_load
    from safetensors.torch import load_file

    want = _state(2)
    # From the bucket to a local directory.
    local = tmp_path / "hf"
    shardsafe.hf.export(run_root, str(local))
    exported = load_file(str(local / "model.safetensors"))
    assert torch.equal(exported["w"], want["w"]) and torch.equal(exported["b"], want["b"])
    # From a local checkpoint into the bucket, sharded: the index comes last.
    out = f"s3://{BUCKET}/team/hf-out"
    shardsafe.hf.export(str(local), out, max_shard_size=4096)
    keys = _keys(s3, "team/hf-out/")
    assert "team/hf-out/model.safetensors.index.json" in keys, keys
    shards = [k for k in keys if k.endswith(".safetensors")]
    assert len(shards) >= 2, keys
    got = {}
    for key in shards:
        got.update(st_load(s3.get_object(Bucket=BUCKET, Key=key)["Body"].read()))
    assert torch.equal(got["w"], want["w"]) and torch.equal(got["b"], want["b"])
    # The directory in the bucket loads as a Hugging Face directory.
    target = {"w": torch.zeros(96, 40), "b": torch.zeros(40, dtype=torch.bfloat16)}
    shardsafe.load(target, out)
    assert torch.equal(target["w"], want["w"])
    # An existing output in the bucket is not replaced.
    with pytest.raises(shardsafe.ShardsafeError, match="exists"):
        shardsafe.hf.export(str(local), out, overwrite=True)


def test_overwriting_a_tag_in_the_bucket_leaves_only_the_new_data(s3):
    uri = f"s3://{BUCKET}/team/overwritten/step-11"
    shardsafe.save(_state(11), uri)
    before = [k for k in _keys(s3, "team/overwritten/") if k.endswith(".safetensors")]
    shardsafe.save(_state(12), uri, overwrite=True)
    after = [k for k in _keys(s3, "team/overwritten/") if k.endswith(".safetensors")]
    assert len(after) == len(before) == 1 and after != before  # a new name; the old one removed
    target = _zeros_like(_state(12))
    shardsafe.load(target, uri)
    assert torch.equal(target["w"], _state(12)["w"]) and target["step"] == 12
