"""More checkpoints in an S3 bucket, against moto (the `s3` fixture of
test_s3.py: a server on 127.0.0.1, the AWS_* variables pointing at it, a
boto3 client with one bucket): a tensor of every dtype the package stores
round-trips through the bucket bit-exact, and a sharded Hugging Face model
directory uploaded under a prefix with a plain S3 client loads through
s3:// and is described by `shardsafe inspect`.
"""

from __future__ import annotations

import json

import torch

import shardsafe
from shardsafe._state import DTYPE_NAMES  # every torch dtype the package stores
from hf_models import SMALL_SHARDS, state_of, tiny_llama
from test_interop import random_tensor, raw_bytes
from test_s3 import BUCKET, _upload, s3  # noqa: F401 (s3: the fixture)

# Written out, so that a dtype the package drops fails here.
DTYPES = [torch.bool, torch.uint8, torch.int8, torch.int16, torch.uint16, torch.int32,
          torch.uint32, torch.int64, torch.uint64, torch.float16, torch.bfloat16, torch.float32,
          torch.float64, torch.complex64, torch.float8_e4m3fn, torch.float8_e5m2,
          torch.float8_e4m3fnuz, torch.float8_e5m2fnuz, torch.float8_e8m0fnu]


def _sentinel_like(t: torch.Tensor) -> torch.Tensor:
    """Bytes 0x5A of t's dtype and shape: a load that skips a byte shows."""
    n = t.numel() * t.element_size()
    return torch.full((n,), 0x5A, dtype=torch.uint8).view(t.dtype).reshape(t.shape)


def test_a_tensor_of_every_dtype_round_trips_through_the_bucket_bit_exact(s3, run):
    assert set(DTYPES) == set(DTYPE_NAMES), set(DTYPES) ^ set(DTYPE_NAMES)
    gen = torch.Generator().manual_seed(3)
    want = {str(d).removeprefix("torch."): random_tensor(d, (7, 5 + i), gen)
            for i, d in enumerate(DTYPES)}
    uri = f"s3://{BUCKET}/dtypes/step-1"
    shardsafe.save(want, uri)
    got = {k: _sentinel_like(v) for k, v in want.items()}
    result = shardsafe.load(got, uri)
    assert not result.missing_keys and not result.unexpected_keys
    for key, w in want.items():
        assert got[key].dtype == w.dtype and got[key].shape == w.shape, key
        assert raw_bytes(got[key]) == raw_bytes(w), f"{key}: bytes differ after the bucket"
    # The objects in the bucket carry each tensor's safetensors dtype.
    tensors = run.json("inspect", uri)["tensors"]
    assert {k: t["dtype"] for k, t in tensors.items()} == \
        {k: DTYPE_NAMES[w.dtype] for k, w in want.items()}


def test_a_sharded_hf_model_directory_in_the_bucket_loads_bit_exact_and_inspects(
        s3, run, tmp_path):
    local = tmp_path / "llama"
    model = tiny_llama()
    model.save_pretrained(local, max_shard_size=SMALL_SHARDS)
    index = json.loads((local / "model.safetensors.index.json").read_text())
    shards = sorted(set(index["weight_map"].values()))
    assert len(shards) >= 2, shards  # a sharded directory, not one file
    _upload(s3, local, "hf/llama")
    uri = f"s3://{BUCKET}/hf/llama"

    want = state_of(model)
    got = {k: _sentinel_like(v) for k, v in want.items()}
    result = shardsafe.load(got, uri)
    assert not result.missing_keys and not result.unexpected_keys
    for key, w in want.items():
        assert raw_bytes(got[key]) == raw_bytes(w), f"{key}: bytes differ"

    report = run.json("inspect", uri)
    assert set(report["tensors"]) == set(want)
    for key, w in want.items():
        t = report["tensors"][key]
        assert t["dtype"] == DTYPE_NAMES[w.dtype] and t["shape"] == list(w.shape), (key, t)
    files = {report["files"][c["file"]]["name"] for t in report["tensors"].values()
             for c in t["chunks"]}
    assert files == set(shards), files
