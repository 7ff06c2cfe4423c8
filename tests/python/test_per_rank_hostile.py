"""Per-rank values and global values that no save writes are a
CorruptCheckpointError naming the checkpoint and the key, never a bare
KeyError or ValueError out of the decoder (docs/format.md §6).

The hostile bytes are written by the engine itself, so that the checkpoint
is committed with correct checksums around them: the save's encoder is
replaced (monkeypatch) by one returning the crafted blob or value, and the
checkpoint is then loaded as any other.
"""

from __future__ import annotations

import json
import math
import re

import pytest
import torch
from safetensors.torch import save as st_save

import shardsafe
from shardsafe import _save
from shardsafe._json import FLOAT_TAG


def _blob(value_text: str | None, tensors: dict | None = None) -> bytes:
    """A per-rank blob: safetensors bytes with `value_text` as its `value`."""
    metadata = {} if value_text is None else {"value": value_text}
    return st_save(tensors if tensors is not None else {"t0": torch.arange(3)}, metadata=metadata)


VALID = _blob(json.dumps({"seed": 7, "cpu": {"__shardsafe_tensor__": "t0"}}))

HOSTILE = {
    "a tensor tag naming no tensor": (
        _blob(json.dumps({"cpu": {"__shardsafe_tensor__": "t9"}})),
        "tensor tag 't9' names no tensor of the blob (it holds ['t0'])"),
    "a tensor tag that is a number": (
        _blob(json.dumps({"cpu": {"__shardsafe_tensor__": 5}})),
        "tensor tag 5 names no tensor of the blob (it holds ['t0'])"),
    "a float tag that is no non-finite float": (
        _blob(json.dumps({"best": {FLOAT_TAG: "rm -rf"}})),
        "float tag 'rm -rf' is not one of 'nan', 'inf', '-inf'"),
    "a float tag that float() would read": (
        _blob(json.dumps({"best": {FLOAT_TAG: "1e5"}})),
        "float tag '1e5' is not one of 'nan', 'inf', '-inf'"),
    "a value that is not JSON": (
        _blob("{'seed': 7"),
        "its 'value' is not JSON (JSONDecodeError: Expecting property name enclosed in double "
        "quotes: line 1 column 2 (char 1))"),
    "a NaN literal, which JSON has not": (
        _blob('{"best": NaN}'),
        "its 'value' is not JSON (ValueError: NaN is not JSON)"),
    "a value nested deeper than a save writes": (
        _blob("[" * 257 + "]" * 257),
        "its 'value' nests deeper than 256 lists and dicts"),
    "no value in the metadata": (
        _blob(None),
        "its safetensors metadata has no 'value'"),
    "a truncated blob": (
        VALID[:len(VALID) - 5],
        "not a safetensors blob (SafetensorError: "),
    "a blob shorter than its header length": (
        VALID[:6],
        "not a safetensors blob (SafetensorError: "),
}


def _save_with_blob(path, monkeypatch, blob: bytes) -> None:
    monkeypatch.setattr(_save, "encode_per_rank", lambda value, key: blob)
    shardsafe.save({"w": torch.ones(2), "rng": shardsafe.PerRank({"seed": 7})}, path)
    monkeypatch.undo()


def test_the_crafted_valid_blob_loads(tmp_path, monkeypatch):
    """The control: the crafting itself makes a loadable checkpoint."""
    _save_with_blob(tmp_path / "ckpt", monkeypatch, VALID)
    target = shardsafe.PerRank({"cpu": torch.zeros(3, dtype=torch.int64)})
    shardsafe.load({"w": torch.zeros(2), "rng": target}, tmp_path / "ckpt")
    assert target.value["seed"] == 7 and torch.equal(target.value["cpu"], torch.arange(3))


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_a_hostile_per_rank_value_is_corrupt_naming_checkpoint_and_key(case, tmp_path,
                                                                        monkeypatch):
    blob, problem = HOSTILE[case]
    path = tmp_path / "ckpt"
    _save_with_blob(path, monkeypatch, blob)
    with pytest.raises(shardsafe.CorruptCheckpointError) as e:
        shardsafe.load({"w": torch.zeros(2), "rng": shardsafe.PerRank(None)}, path)
    assert str(e.value).startswith(f"{path}: per-rank value 'rng' (rank 0): {problem}"), \
        str(e.value)
    assert e.value.code == "DATA_LOSS"


def _save_with_value(path, monkeypatch, key: str, stored) -> None:
    """Saves {"w", key: 0.5} with the stored JSON of `key` replaced."""
    real = _save.encode_values

    def crafted(values, unsafe_pickle):
        data, blobs = real(values, unsafe_pickle)
        data[key] = stored
        return data, blobs

    monkeypatch.setattr(_save, "encode_values", crafted)
    shardsafe.save({"w": torch.ones(2), key: 0.5}, path)
    monkeypatch.undo()


@pytest.mark.parametrize("tag", ["rm -rf", "1e5", 5, None, "NaN"])
def test_a_hostile_float_tag_in_the_values_is_corrupt_naming_checkpoint_and_key(tag, tmp_path,
                                                                               monkeypatch):
    path = tmp_path / "ckpt"
    _save_with_value(path, monkeypatch, "best", {"history": [1.0, {FLOAT_TAG: tag}]})
    state = {"w": torch.zeros(2), "best": 0.0}
    with pytest.raises(shardsafe.CorruptCheckpointError, match=re.escape(
            f"{path}: value 'best': float tag {tag!r} is not one of 'nan', 'inf', '-inf'")):
        shardsafe.load(state, path)
    assert torch.equal(state["w"], torch.zeros(2)), "refused before anything was loaded"


def test_non_finite_floats_still_round_trip(tmp_path):
    """The tags a save writes are the ones a load takes."""
    floats = [math.nan, math.inf, -math.inf, 0.25]
    shardsafe.save({"w": torch.ones(2), "f": floats, "rng": shardsafe.PerRank({"f": floats})},
                   tmp_path / "ckpt")
    target = shardsafe.PerRank(None)
    state = {"w": torch.zeros(2), "f": None, "rng": target}
    shardsafe.load(state, tmp_path / "ckpt")
    for got in (state["f"], target.value["f"]):
        assert math.isnan(got[0]) and got[1:] == [math.inf, -math.inf, 0.25]


def test_a_per_rank_value_nested_deeper_than_a_checkpoint_holds_is_refused_at_save(tmp_path):
    deep: list = []
    for _ in range(256):
        deep = [deep]  # 257 lists
    with pytest.raises(shardsafe.InvalidStateError, match="nests deeper than 256"):
        shardsafe.save({"w": torch.ones(2), "rng": shardsafe.PerRank(deep)}, tmp_path / "a")
    shardsafe.save({"w": torch.ones(2), "rng": shardsafe.PerRank(deep[0])}, tmp_path / "b")
    target = shardsafe.PerRank(None)
    shardsafe.load({"w": torch.zeros(2), "rng": target}, tmp_path / "b")
    assert target.value == deep[0]
    assert not (tmp_path / "a").exists()
