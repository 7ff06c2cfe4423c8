"""Interop with the reference safetensors library (Python binding + torch).

Both directions: files written by `safetensors.torch.save_file` are read by
shardsafe (`shardsafe import`, `inspect`), and the data files shardsafe
writes are read back by `safetensors.safe_open`, bit for bit. A one-rank
data file must be what `save_file(..., metadata={"format": "pt"})` writes
for the same tensors byte for byte, but for the header's trailing spaces:
ours pad until the data starts on a 4 KiB boundary (docs/format.md section 2).
"""

from __future__ import annotations

import json
import math
import tempfile
from pathlib import Path

import numpy as np
import pytest
import safetensors
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from conftest import EXIT_OK, describe, read_safetensors_header

DATA_FILE = "data-00000-000.safetensors"

# Every safetensors dtype with a torch counterpart (shared/reference/formats.md
# section 1.3). F6_E2M3 / F6_E3M2 have none. Which of these the installed
# torch + safetensors can actually write and read is probed below.
CANDIDATE_DTYPES = {
    "BOOL": "bool",
    "U8": "uint8",
    "I8": "int8",
    "I16": "int16",
    "U16": "uint16",
    "I32": "int32",
    "U32": "uint32",
    "I64": "int64",
    "U64": "uint64",
    "F16": "float16",
    "BF16": "bfloat16",
    "F32": "float32",
    "F64": "float64",
    "C64": "complex64",
    "F8_E4M3": "float8_e4m3fn",
    "F8_E5M2": "float8_e5m2",
    "F8_E8M0": "float8_e8m0fnu",
    "F8_E4M3FNUZ": "float8_e4m3fnuz",
    "F8_E5M2FNUZ": "float8_e5m2fnuz",
    "F4": "float4_e2m1fn_x2",  # torch packs two elements per byte
}
CLASSIC_DTYPES = {"BOOL", "U8", "I8", "I16", "U16", "I32", "U32", "I64", "U64",
                  "F16", "BF16", "F32", "F64"}
F8_DTYPES = {"F8_E4M3", "F8_E5M2"} | ({"F8_E8M0"} if hasattr(torch, "float8_e8m0fnu") else set())


def _probe(name: str, attr: str) -> torch.dtype | None:
    """The torch dtype if save_file writes `name` and safe_open reads it back."""
    dtype = getattr(torch, attr, None)
    if dtype is None:
        return None
    try:
        t = torch.zeros(16, dtype=torch.uint8).view(dtype)
        with tempfile.TemporaryDirectory() as d:
            path = Path(d) / "probe.safetensors"
            save_file({"x": t}, str(path))
            _, header = read_safetensors_header(path)
            if header["x"]["dtype"] != name:
                return None
            with safe_open(str(path), framework="pt") as f:
                if f.get_tensor("x").dtype != dtype:
                    return None
    except Exception:  # not supported by this torch / safetensors pair
        return None
    return dtype


SUPPORTED = {n: dt for n, a in CANDIDATE_DTYPES.items() if (dt := _probe(n, a)) is not None}
SUPPORTED_NAMES = sorted(SUPPORTED)

# Per dtype: a matrix, a vector, a 0-d scalar and zero-size tensors. Shapes
# are torch shapes (for F4 the last dimension counts bytes, two elements each;
# a 0-d F4 tensor would be half a byte, which safetensors cannot store).
SHAPES = {"mat": (3, 5), "vec": (7,), "scalar": (), "empty": (0, 4), "empty3": (2, 0, 3)}


def random_tensor(dtype: torch.dtype, shape, gen: torch.Generator) -> torch.Tensor:
    """Random bit patterns (NaNs included): interop must preserve every bit."""
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=gen).bool()
    itemsize = torch.empty(0, dtype=dtype).element_size()
    n = math.prod(shape)
    raw = torch.randint(0, 256, (n * itemsize,), dtype=torch.uint8, generator=gen)
    return raw.view(dtype).reshape(shape)


def tensors_for(name: str, seed: int = 0) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    out = {}
    for label, shape in SHAPES.items():
        if name == "F4" and shape == ():
            continue
        out[f"{name.lower()}.{label}"] = random_tensor(SUPPORTED[name], shape, gen)
    return out


def all_dtype_tensors(seed: int = 1) -> dict[str, torch.Tensor]:
    out = {}
    for i, name in enumerate(SUPPORTED_NAMES):
        out.update(tensors_for(name, seed + i))
    return out


def raw_bytes(t: torch.Tensor) -> bytes:
    return t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def read_all(path: Path) -> dict[str, torch.Tensor]:
    with safe_open(str(path), framework="pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}


def assert_bit_identical(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]):
    assert sorted(got) == sorted(want)
    for key, w in want.items():
        g = got[key]
        assert g.dtype == w.dtype, key
        assert tuple(g.shape) == tuple(w.shape), key
        assert raw_bytes(g) == raw_bytes(w), f"{key}: bytes differ"


def import_ok(run, src: Path, dst: Path) -> Path:
    proc = run("import", src, dst)
    assert proc.returncode == EXIT_OK, describe(proc)
    assert sorted(p.name for p in dst.iterdir()) == ["commit.json", DATA_FILE, "shardsafe.json"]
    return dst / DATA_FILE


def test_supported_dtypes_include_classic_and_f8(record_property):
    exercised = set(SUPPORTED_NAMES)
    record_property("dtypes_exercised", ",".join(SUPPORTED_NAMES))
    print(f"safetensors {safetensors.__version__}, torch {torch.__version__}: "
          f"dtypes exercised: {' '.join(SUPPORTED_NAMES)}")
    missing = (CLASSIC_DTYPES | F8_DTYPES) - exercised
    assert not missing, f"installed torch/safetensors cannot round-trip {sorted(missing)}"


# --------------------------------------------------- a) they -> us -> they --


@pytest.mark.parametrize("name", SUPPORTED_NAMES)
def test_import_of_their_file_reads_back_bit_identical(run, tmp_path, name):
    tensors = tensors_for(name)
    src = tmp_path / "theirs.safetensors"
    save_file(tensors, str(src))
    ours = import_ok(run, src, tmp_path / "ckpt")
    assert_bit_identical(read_all(ours), tensors)
    proc = run("verify", tmp_path / "ckpt")
    assert proc.returncode == EXIT_OK, describe(proc)
    assert proc.stdout.startswith("OK")


def test_import_of_all_dtypes_in_one_file_reads_back_bit_identical(run, tmp_path):
    tensors = all_dtype_tensors()
    src = tmp_path / "theirs.safetensors"
    save_file(tensors, str(src), metadata={"format": "pt", "note": "ignored by import"})
    ours = import_ok(run, src, tmp_path / "ckpt")
    assert_bit_identical(read_all(ours), tensors)
    proc = run("verify", "--json", tmp_path / "ckpt")
    assert proc.returncode == EXIT_OK, describe(proc)
    report = json.loads(proc.stdout)
    assert report["ok"] is True and report["faults"] == []
    assert report["tensors"] == len(tensors)
    assert report["chunks_verified"] == len(tensors)


def test_import_into_existing_checkpoint_fails_with_exit_2(run, tmp_path):
    src = tmp_path / "theirs.safetensors"
    save_file({"a": torch.ones(2)}, str(src))
    import_ok(run, src, tmp_path / "ckpt")
    proc = run("import", src, tmp_path / "ckpt")
    assert proc.returncode == 2
    assert "already exists" in proc.stderr


def test_import_of_missing_source_fails_with_exit_2(run, tmp_path):
    proc = run("import", tmp_path / "nope.safetensors", tmp_path / "ckpt")
    assert proc.returncode == 2
    assert proc.stderr.startswith("shardsafe: error: ")
    assert "nope.safetensors" in proc.stderr
    assert not (tmp_path / "ckpt").exists()


def test_import_to_bad_tag_fails_with_exit_2(run, tmp_path):
    src = tmp_path / "theirs.safetensors"
    save_file({"a": torch.ones(2)}, str(src))
    proc = run("import", src, tmp_path / "bad tag")
    assert proc.returncode == 2, describe(proc)
    assert not (tmp_path / "bad tag").exists()


# ------------------------------------------- b) byte-identical canonical form --


def assert_same_bytes_as_save_file(run, tmp_path, tensors):
    """The same JSON text and data bytes as save_file's; only the run of
    spaces that ends the header differs, and ours makes the data start on 4 KiB."""
    src = tmp_path / "theirs.safetensors"
    save_file(tensors, str(src), metadata={"format": "pt"})
    ours = import_ok(run, src, tmp_path / "ckpt")
    theirs_bytes, ours_bytes = src.read_bytes(), ours.read_bytes()
    n_t, _ = read_safetensors_header(src)
    n_o, _ = read_safetensors_header(ours)
    json_t, json_o = theirs_bytes[8:8 + n_t].rstrip(b" "), ours_bytes[8:8 + n_o].rstrip(b" ")
    if json_t != json_o:
        pytest.fail(f"header differs from save_file output\ntheirs: {json_t!r}\nours:   {json_o!r}")
    assert ours_bytes[8 + n_o:] == theirs_bytes[8 + n_t:], "data buffer differs"
    assert (8 + n_o) % 4096 == 0
    assert (8 + n_t) % 8 == 0 and 8 + n_t - len(json_t) < 16  # theirs pads to 8 only


@pytest.mark.parametrize("name", SUPPORTED_NAMES)
def test_one_rank_data_file_is_save_files_bytes(run, tmp_path, name):
    assert_same_bytes_as_save_file(run, tmp_path, tensors_for(name, seed=7))


def test_mixed_dtypes_file_is_save_files_bytes(run, tmp_path):
    # Exercises the dtype-descending order and the alignment it gives.
    assert_same_bytes_as_save_file(run, tmp_path, all_dtype_tensors(seed=11))


def test_name_order_is_bytewise_like_save_file(run, tmp_path):
    gen = torch.Generator().manual_seed(3)
    names = ["a.10", "a.2", "B", "a", "_x", "a.1.weight", "a.1", "Z9", "é", "z"]
    tensors = {n: random_tensor(torch.float32, (i + 1,), gen) for i, n in enumerate(names)}
    tensors.update({f"zero{i}": torch.empty(0, dtype=torch.float32) for i in (3, 1, 2)})
    assert_same_bytes_as_save_file(run, tmp_path, tensors)


def test_names_needing_json_escapes_are_save_files_bytes(run, tmp_path):
    gen = torch.Generator().manual_seed(5)
    names = ['quote"d', "back\\slash", "tab\tname", "new\nline", "ctrl\x01\x1f", "del\x7f",
             "slash/name", "bracket[0:1]", "ünïcødé.wëight", "日本語", "emoji😀", ""]
    tensors = {n: random_tensor(torch.bfloat16, (2, 3), gen) for n in names}
    assert_same_bytes_as_save_file(run, tmp_path, tensors)


@pytest.mark.parametrize("pad", range(8))
def test_header_padding_matches_save_file(run, tmp_path, pad):
    # Name lengths 1..8 move the unpadded header length through every residue mod 8.
    tensors = {"w" * (pad + 1): torch.arange(3, dtype=torch.int32)}
    assert_same_bytes_as_save_file(run, tmp_path, tensors)


def test_import_of_file_without_tensors_gives_empty_checkpoint(run, tmp_path):
    # No tensors, no data file: the checkpoint is just its index.
    src = tmp_path / "theirs.safetensors"
    save_file({}, str(src), metadata={"format": "pt"})
    proc = run("import", src, tmp_path / "ckpt")
    assert proc.returncode == EXIT_OK, describe(proc)
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == ["commit.json", "shardsafe.json"]
    report = run.json("inspect", tmp_path / "ckpt")
    assert report["tensors"] == {} and report["files"] == []
    assert run("verify", tmp_path / "ckpt").returncode == EXIT_OK


# ----------------------------------------------------- c) inspect their file --


def test_inspect_json_of_their_file_reports_dtypes_and_shapes(run, tmp_path):
    tensors = all_dtype_tensors(seed=2)
    src = tmp_path / "theirs.safetensors"
    save_file(tensors, str(src))
    _, header = read_safetensors_header(src)
    report = run.json("inspect", src)
    assert report["native"] is False
    assert report["format"] == "shardsafe"
    assert [f["name"] for f in report["files"]] == [src.name]
    assert report["files"][0]["bytes"] == src.stat().st_size
    assert sorted(report["tensors"]) == sorted(tensors)
    for key, t in tensors.items():
        got = report["tensors"][key]
        assert got["dtype"] == header[key]["dtype"], key
        assert got["shape"] == header[key]["shape"], key
        if t.dtype != SUPPORTED.get("F4"):
            assert got["shape"] == list(t.shape), key
        (chunk,) = got["chunks"]
        begin, end = header[key]["data_offsets"]
        assert chunk["bytes"] == end - begin, key
        assert "crc32c" not in chunk, key


def test_inspect_human_of_their_file_names_kind(run, tmp_path):
    src = tmp_path / "theirs.safetensors"
    save_file({"layer.w": torch.zeros(2, 3, dtype=torch.bfloat16)}, str(src))
    proc = run("inspect", src)
    assert proc.returncode == EXIT_OK, describe(proc)
    assert "safetensors (no index, no checksums)" in proc.stdout
    line = next(l for l in proc.stdout.splitlines() if l.startswith("layer.w"))
    assert "BF16" in line and "[2, 3]" in line


def test_f4_shape_counts_elements_not_bytes(run, tmp_path):
    if "F4" not in SUPPORTED:
        pytest.skip("this torch/safetensors has no F4")
    src = tmp_path / "theirs.safetensors"
    save_file({"q": torch.zeros(3, 5, dtype=torch.uint8).view(SUPPORTED["F4"])}, str(src))
    report = run.json("inspect", src)
    assert report["tensors"]["q"]["dtype"] == "F4"
    assert report["tensors"]["q"]["shape"] == [3, 10]
    assert report["tensors"]["q"]["chunks"][0]["bytes"] == 15


# ------------------------------------------- d) Hugging Face sharded model --


def write_hf_sharded(model_dir: Path, shards: list[dict[str, torch.Tensor]]):
    """model-0000i-of-0000n.safetensors + model.safetensors.index.json, as
    huggingface_hub.save_torch_state_dict writes them."""
    model_dir.mkdir()
    try:
        from huggingface_hub import save_torch_state_dict  # noqa: F401
    except ImportError:
        save_torch_state_dict = None
    weight_map, total = {}, 0
    n = len(shards)
    for i, shard in enumerate(shards, start=1):
        fname = f"model-{i:05d}-of-{n:05d}.safetensors"
        save_file(shard, str(model_dir / fname), metadata={"format": "pt"})
        for k, t in shard.items():
            weight_map[k] = fname
            total += len(raw_bytes(t))
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    (model_dir / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))


def hf_shards():
    gen = torch.Generator().manual_seed(9)
    shard1 = {
        "model.embed_tokens.weight": random_tensor(torch.bfloat16, (16, 8), gen),
        "model.layers.0.self_attn.q_proj.weight": random_tensor(torch.bfloat16, (8, 8), gen),
        "model.layers.0.input_layernorm.weight": random_tensor(torch.float32, (8,), gen),
    }
    shard2 = {
        "model.layers.1.self_attn.q_proj.weight": random_tensor(torch.bfloat16, (8, 8), gen),
        "model.norm.weight": random_tensor(torch.float32, (8,), gen),
        "lm_head.weight": random_tensor(torch.float16, (16, 8), gen),
        "model.rotary.step": torch.tensor(42, dtype=torch.int64),
    }
    return [shard1, shard2]


def test_hf_sharded_dir_imports_and_reads_back(run, tmp_path):
    shards = hf_shards()
    model = tmp_path / "model"
    write_hf_sharded(model, shards)
    want = {k: v for s in shards for k, v in s.items()}
    ours = import_ok(run, model, tmp_path / "ckpt")
    assert_bit_identical(read_all(ours), want)
    proc = run("verify", tmp_path / "ckpt")
    assert proc.returncode == EXIT_OK, describe(proc)


def test_hf_sharded_dir_inspect_lists_both_shards(run, tmp_path):
    shards = hf_shards()
    model = tmp_path / "model"
    write_hf_sharded(model, shards)
    report = run.json("inspect", model)
    assert report["native"] is False
    assert sorted(f["name"] for f in report["files"]) == [
        "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    names = [f["name"] for f in report["files"]]
    for i, shard in enumerate(shards, start=1):
        for key, t in shard.items():
            got = report["tensors"][key]
            assert got["shape"] == list(t.shape)
            assert names[got["chunks"][0]["file"]] == f"model-{i:05d}-of-00002.safetensors"


def test_hf_sharded_dir_diff_with_its_import_is_identical(run, tmp_path):
    model = tmp_path / "model"
    write_hf_sharded(model, hf_shards())
    import_ok(run, model, tmp_path / "ckpt")
    proc = run("diff", model, tmp_path / "ckpt")
    assert proc.returncode == EXIT_OK, describe(proc)
    assert "identical: 7 tensors" in proc.stdout


# ------------------------------- us -> they: multi-rank data files (demo) --


def _place(full: np.ndarray, chunk: dict, payload: bytes, itemsize: int):
    region = full[tuple(slice(o, o + s) for o, s in zip(chunk["offset"], chunk["size"]))]
    elems = np.frombuffer(payload, dtype=f"V{itemsize}")
    if "flat" in chunk:
        b, e = chunk["flat"]
        flat = region.copy().reshape(-1)
        flat[b:e] = elems
        region[...] = flat.reshape(region.shape)
    else:
        region[...] = elems.reshape(region.shape)


def test_demo_data_files_open_with_safetensors_and_reassemble(run, demo_root_pristine, tmp_path):
    """Every data file of an 8-rank checkpoint is a valid safetensors file;
    the chunks read through safe_open, put together by the index, equal the
    tensors of the checkpoint's one-rank import (which itself is read with
    safe_open)."""
    ckpt = demo_root_pristine / "step-00000100"
    index = json.loads((ckpt / "shardsafe.json").read_text())
    assert index["world_size"] == 8

    # Each entry of each data file, keyed by absolute byte offset.
    entries = {}
    for i, f in enumerate(index["files"]):
        path = ckpt / f["name"]
        assert path.stat().st_size == f["bytes"]
        n, header = read_safetensors_header(path)
        assert header["__metadata__"] == {"format": "pt"}
        with safe_open(str(path), framework="pt") as st:
            assert set(st.keys()) == set(header) - {"__metadata__"}
            for name in st.keys():
                t = st.get_tensor(name)
                at = 8 + n + header[name]["data_offsets"][0]
                entries[(i, at)] = (name, raw_bytes(t))

    flat_import = import_ok(run, demo_root_pristine, tmp_path / "one")
    imported = read_all(flat_import)
    assert sorted(imported) == sorted(index["tensors"])
    for key, t in index["tensors"].items():
        want = imported[key]
        assert list(want.shape) == t["shape"]
        itemsize = want.element_size()
        full = np.zeros(t["shape"], dtype=f"V{itemsize}")
        for c in t["chunks"]:
            name, payload = entries[(c["file"], c["at"])]
            assert len(payload) == c["bytes"]
            assert name == key or name.startswith(key + "["), (name, key)
            _place(full, c, payload, itemsize)
        assert full.tobytes() == raw_bytes(want), key


def test_hf_index_naming_tensor_missing_from_its_shard_is_reported(run, tmp_path):
    """weight_map promises "b" in shard 1, which does not hold it. transformers
    would report "b" as missing; shardsafe must not silently drop it."""
    model = tmp_path / "model"
    model.mkdir()
    save_file({"a": torch.ones(2)}, str(model / "model-00001-of-00002.safetensors"))
    save_file({"b": torch.ones(3)}, str(model / "model-00002-of-00002.safetensors"))
    index = {"metadata": {}, "weight_map": {"a": "model-00001-of-00002.safetensors",
                                            "b": "model-00001-of-00002.safetensors"}}
    (model / "model.safetensors.index.json").write_text(json.dumps(index))
    proc = run("verify", model)
    assert proc.returncode == 1, describe(proc)
    assert '"b"' in proc.stdout or "`b`" in proc.stdout
    proc = run("import", model, tmp_path / "ckpt")
    assert proc.returncode == 2, describe(proc)
    assert not (tmp_path / "ckpt").exists()


# ----------------- headers the reference reader accepts (formats.md 1.2) --


def write_raw_safetensors(path: Path, header_text: str, data: bytes):
    h = header_text.encode()
    path.write_bytes(len(h).to_bytes(8, "little") + h + data)


REFERENCE_ACCEPTED = {
    "whitespace_around_object": (
        ' \t\n{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}\r\n  ', 8),
    "metadata_null": (
        '{"__metadata__":null,"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}', 8),
    "unknown_field_in_tensor_info": (
        '{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"extra":[1,{"x":2}]}}', 8),
    "keys_in_reverse_offset_order": (
        '{"b":{"dtype":"U8","shape":[2],"data_offsets":[4,6]},'
        '"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}', 6),
    "escaped_name": (
        '{"\\u0041\\u00e9":{"dtype":"I16","shape":[3],"data_offsets":[0,6]}}', 6),
    "multi_key_metadata": (
        '{"__metadata__":{"format":"np","x":"y"},"a":{"dtype":"BOOL","shape":[3],'
        '"data_offsets":[0,3]}}', 3),
}


@pytest.mark.parametrize("case", sorted(REFERENCE_ACCEPTED))
def test_header_accepted_by_reference_is_imported_identically(run, tmp_path, case):
    header, nbytes = REFERENCE_ACCEPTED[case]
    src = tmp_path / "odd.safetensors"
    data = bytes((7 * i + 1) % 2 if case == "multi_key_metadata" else (37 * i + 11) % 256
                 for i in range(nbytes))
    write_raw_safetensors(src, header, data)
    want = read_all(src)  # the reference reader accepts it
    ours = import_ok(run, src, tmp_path / "ckpt")
    assert_bit_identical(read_all(ours), want)
    proc = run("verify", src)
    assert proc.returncode == EXIT_OK, describe(proc)


def test_duplicate_tensor_name_last_wins_and_verify_reports_it(run, tmp_path):
    src = tmp_path / "dup.safetensors"
    entry = '{"dtype":"F32","shape":[4],"data_offsets":[0,16]}'
    write_raw_safetensors(src, '{"a":' + entry + ',"a":' + entry + "}", bytes(range(16)))
    want = read_all(src)
    assert list(want) == ["a"]
    ours = import_ok(run, src, tmp_path / "ckpt")
    assert_bit_identical(read_all(ours), want)
    proc = run("verify", src)
    assert proc.returncode == 1, describe(proc)
    assert '"a"' in proc.stdout and "twice" in proc.stdout
