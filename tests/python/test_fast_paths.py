"""The per-tensor fast paths of save and load plan exactly what the general
paths plan, and step aside for every tensor they do not handle.

The load's opening of the checkpoint is fast too: one process opens it on
a thread of its own while it walks the state (`PendingSource`), and the index's
tensors are described by a view that builds the entries looked up.

save: the extension's `plan_save_whole` (plain, dense, contiguous CPU
tensors saved as they lie) against `_Boxes` + `_dtype_name` +
materialisation. load: `_plan_whole` (the extension's `plan_whole`: a
plain CPU tensor read in place from the checkpoint tensor of its name, dtype
and shape, its questions asked beforehand by `ask_tensors`) against
`KeyMap.resolve` + pieces, reached by an identity rename (which turns the
fast path off).
"""

from __future__ import annotations

import sys

import pytest
import torch

import shardsafe
from shardsafe import _boxes, _C, _keys, _load, _save
from shardsafe._options import LoadOptions, SaveOptions
from shardsafe._state import DTYPE_NAMES
from shardsafe._state import flatten
from shardsafe.errors import CheckpointNotFoundError


def kinds_of_tensors() -> dict[str, torch.Tensor]:
    base = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    return {
        "plain": base.clone(),
        "bf16": base.to(torch.bfloat16),
        "scalar": torch.tensor(3.5),
        "empty": torch.zeros(0, 4),
        "param": torch.nn.Parameter(base.clone()),
        "transposed": base.t(),  # not contiguous: general path
        "conj": torch.complex(base, base).conj(),  # lazy conj: general path
        "neg": torch._neg_view(base.clone()),  # lazy neg: general path
        "bool": base > 3,
        "fp8": base.to(torch.float8_e4m3fn),
    }


def general_spec(key: str, t: torch.Tensor) -> tuple:
    b = _boxes.Boxes()(key, t)
    local = b.local.detach().resolve_conj().resolve_neg().contiguous()
    return (key, _boxes.dtype_name(key, b.local), b.shape, b.offset, b.size, local)


def test_save_fast_path_matches_general_path():
    state = kinds_of_tensors()
    args = _save._prepare_save(state, None, False)
    fast = {spec[0]: spec for spec in args.whole.specs()}
    assert set(fast) == {"plain", "bf16", "scalar", "empty", "param", "bool", "fp8"}
    for key, spec in fast.items():
        name, shape, offset, size, local = general_spec(key, state[key])[1:]
        assert spec[1:5] == (name, shape, offset, size)
        assert spec[5] == local.data_ptr() == state[key].data_ptr()  # no copy
    # The rest took the general path: materialised copies, kept alive.
    assert sorted(spec[0] for spec in args.specs) == ["conj", "neg", "transposed"]
    for spec in args.specs:
        assert spec[5] != state[spec[0]].data_ptr()
    ptrs = {t.data_ptr() for t in args.keep if isinstance(t, torch.Tensor)}
    assert {spec[5] for spec in args.specs} <= ptrs


def plans(state: dict, path) -> tuple[_load._Plan, _load._Plan]:
    source = _C.open_source(str(path), None)
    desc = _C.describe_source(source)
    flat = flatten(state, for_load=True)
    fast = _load._plan(flat, _boxes.ask(flat.tensors), _keys.KeyMap(desc["tensors"]), source, True,
                      False)
    general = _load._plan(flat, None, _keys.KeyMap(desc["tensors"], rename=lambda k: k), source,
                         True, False)
    return fast, general


def read_tuple(r: _load._Read) -> tuple:
    return (r.key, r.shape, r.offset, r.size, r.dest.data_ptr(), r.dest.shape, r.dest.dtype,
            r.scale)


def planned(plan: _load._Plan) -> tuple[list[tuple], list[tuple]]:
    """(the engine targets that take their bytes in place, the other reads),
    whichever path planned them."""
    direct = plan.whole.specs() if plan.whole is not None else []
    others = []
    for r in plan.reads:
        if r.scale is None and _boxes.in_place(r.dest):
            direct.append((r.key, DTYPE_NAMES[r.dest.dtype], r.shape, r.offset, r.size,
                           r.dest.data_ptr()))
        else:
            others.append(read_tuple(r))
    return sorted(direct), sorted(others, key=lambda t: t[0])


def test_load_fast_path_matches_general_path(tmp_path):
    saved = kinds_of_tensors()
    shardsafe.save(saved, tmp_path / "ck")
    target = {k: torch.zeros_like(v) for k, v in saved.items()}
    target["transposed"] = torch.zeros(6, 4).t()  # strided target: still one read, staged
    target["conj"] = torch.zeros_like(saved["conj"]).conj()  # conjugate bit: staged too
    fast, general = plans(target, tmp_path / "ck")
    assert planned(fast) == planned(general)
    assert len(fast.whole) == len(saved) - 2  # all but the strided and the conjugated: no _Read
    assert sorted(r.key for r in fast.reads) == ["conj", "transposed"]
    assert general.whole is None
    assert fast.used == general.used == set(saved)
    assert fast.missing == general.missing == []


def test_load_fast_path_steps_aside(tmp_path):
    """A dtype that differs from the checkpoint's, a missing key and an FP8
    tensor dequantised into BF16 go through the general path, which raises
    or plans exactly as before."""
    w = torch.randn(256, 256).to(torch.float8_e4m3fn)
    shardsafe.save({"w": w, "w_scale_inv": torch.ones(2, 2), "x": torch.ones(3)}, tmp_path / "ck")
    fast, general = plans({"w": torch.zeros(256, 256, dtype=torch.bfloat16),
                           "y": torch.zeros(3)}, tmp_path / "ck")
    assert planned(fast) == planned(general)
    assert fast.reads[0].scale is not None  # dequantised, not read as is
    assert fast.missing == general.missing == ["y"]
    with pytest.raises(shardsafe.DTypeMismatchError, match="dtype mismatch"):
        shardsafe.load({"x": torch.zeros(3, dtype=torch.float64)}, tmp_path / "ck", strict=False)
    with pytest.raises(shardsafe.ShapeMismatchError, match="shape mismatch"):
        shardsafe.load({"x": torch.zeros(4)}, tmp_path / "ck", strict=False)
    negated = torch._neg_view(torch.zeros(3))  # its bytes hold minus what it shows: staged
    fast, general = plans({"x": negated}, tmp_path / "ck")
    assert fast.whole is not None and len(fast.whole) == 0 and planned(fast) == planned(general)
    shardsafe.load({"x": negated}, tmp_path / "ck", strict=False)
    assert torch.equal(negated, torch.ones(3))


def test_a_fast_plan_goes_to_one_engine_call(tmp_path):
    """The planned items move into the engine call; handing the same plan to
    a second call raises instead of silently loading nothing into them."""
    saved = {"a": torch.arange(6.0), "b": torch.ones(2, 3)}
    shardsafe.save(saved, tmp_path / "ck")
    target = {k: torch.zeros_like(v) for k, v in saved.items()}
    source = _C.open_source(str(tmp_path / "ck"), None)
    fast, _ = plans(target, tmp_path / "ck")
    assert len(fast.whole) == 2
    _C.load_source([], source, None, LoadOptions().engine(), fast.whole)
    assert all(torch.equal(target[k], saved[k]) for k in saved)
    with pytest.raises(ValueError, match="one engine call"):
        _C.load_source([], source, None, LoadOptions().engine(), fast.whole)
    args = _save._prepare_save(saved, None, False)
    options = SaveOptions().engine()
    _C.save(_C.SaveCall(args.specs, args.blobs, args.values, args.metadata, None, options,
                        args.whole), str(tmp_path / "s1"))
    with pytest.raises(ValueError, match="one engine call"):
        _C.save(_C.SaveCall(args.specs, args.blobs, args.values, args.metadata, None, options,
                            args.whole), str(tmp_path / "s2"))
    assert not (tmp_path / "s2").exists()
    # The tensors' answers move into one plan too: a second plan would have no shapes.
    asked = _boxes.ask(flatten(target, for_load=True).tensors)
    assert len(asked) == 2 and len(_C.plan_whole(asked, source)[0]) == 2
    for plan_again in (lambda: _C.plan_whole(asked, source), lambda: _C.plan_save_whole(asked)):
        with pytest.raises(ValueError, match="planned already"):
            plan_again()


def test_a_checkpoint_opened_on_a_thread_is_described_by_a_view_of_its_index(tmp_path):
    path = str(tmp_path / "ck")
    shardsafe.save({"b": torch.arange(6.0).reshape(2, 3), "a": torch.ones(4, dtype=torch.bfloat16),
                    "c": torch.tensor(1.0)}, path)
    pending = _C.PendingSource(path)
    source = pending.result()
    with pytest.raises(ValueError, match="called twice"):
        pending.result()
    refs = sys.getrefcount(source)
    tensors = _C.describe_source(source)["tensors"]
    assert sys.getrefcount(source) == refs + 1  # the view keeps the opened source alive
    del source, pending
    assert len(tensors) == 3 and list(tensors) == ["a", "b", "c"]
    assert tensors["b"] == ("F32", (2, 3)) and tensors["a"] == ("BF16", (4,))
    assert tensors["c"] == ("F32", ())
    assert {k: tensors[k] for k in tensors} == _C.describe(path)["tensors"]
    assert "a" in tensors and "z" not in tensors and 1 not in tensors
    with pytest.raises(KeyError, match="z"):
        tensors["z"]
    with pytest.raises(CheckpointNotFoundError, match="none"):
        _C.PendingSource(str(tmp_path / "none")).result()
    missing = _C.PendingSource(str(tmp_path / "none"))
    for _ in range(2):  # wait() raises the open's error each time it is called
        with pytest.raises(CheckpointNotFoundError, match="none"):
            missing.wait()
    waited = _C.PendingSource(path)
    waited.wait()
    waited.wait()
    assert len(_C.describe_source(waited.result())["tensors"]) == 3
    _C.PendingSource(path)  # dropped unwaited: joins its thread (no crash, no hang)
    # A load's open, walk and questions: the answers plan every tensor whole.
    state = {"a": torch.zeros(4, dtype=torch.bfloat16), "b": torch.zeros(2, 3)}
    source, flat, asked = _load._walk(state, _load._open(path, None), ask=True)
    assert len(flat.tensors) == len(asked) == 2
    assert sorted(_C.plan_whole(asked, source)[1]) == ["a", "b"]
    assert _load._walk(state, _load._open(path, None), ask=False)[2] is None  # under a rename
    # What a load does with them: the identity key map, built from the view.
    keys = _keys.KeyMap(_C.describe_source(_C.open_source(path, None))["tensors"])
    assert isinstance(keys.saved, _C.SavedTensors)  # a view until the general path needs more
    assert keys.to_ckpt.get("a") == "a" and keys.to_ckpt.get("z") is None
    assert sorted(keys.to_ckpt) == ["a", "b", "c"] and len(keys.to_ckpt) == 3
    keys.materialize()  # before the general path: dicts, the same entries
    assert keys.saved == _C.describe(path)["tensors"] and type(keys.saved) is dict
    assert keys.to_ckpt == {"a": "a", "b": "b", "c": "c"}
