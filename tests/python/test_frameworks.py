"""State as frameworks without DTensor hold it, with real gloo process groups:
ZeRO flat partitions, tensor-parallel shards as plain tensors, a fused QKV,
per-rank state, replicas that must be replicas, and the commit order.

Each data-loss case of the past (a plain tensor passed by several ranks
was silently saved from one of them) is a regression test here: the save
now fails, naming the key and two ranks, and commits nothing.
"""

from __future__ import annotations

import json
import os
import re
import subprocess

import pytest
import torch

import shardsafe
from dist_util import run_workers

# ------------------------------------------------------ ZeRO-1 partitions --

N_FLAT = 83  # DeepSpeed pads 83 elements to 4 x 22: partitions 22/22/22/17


def _flat_buffer() -> torch.Tensor:
    return torch.arange(N_FLAT, dtype=torch.float32) * 0.5 + 1


def _per(world: int) -> int:
    """DeepSpeed's partition size: the buffer padded to a multiple of 2 x world."""
    return -(-N_FLAT // (2 * world)) * 2


def _partition(rank: int, world: int) -> tuple[int, int]:
    per = _per(world)
    return min(rank * per, N_FLAT), min((rank + 1) * per, N_FLAT)


def _zero_save(rank, world, root):
    b, e = _partition(rank, world)
    part = _flat_buffer()[b:e].clone()
    state = {"optim": {"fp32_flat": shardsafe.Sharded(part, shape=(N_FLAT,), flat=(b, e)),
                       "step": 7}}
    shardsafe.save(state, os.path.join(root, "zero"))
    # The data-loss case: the same partitions as plain tensors of one key.
    # Padded to one size, as DeepSpeed holds them, ranks 0-2 pass equal sizes.
    padded = torch.zeros(_per(world))
    padded[:e - b] = part
    with pytest.raises(shardsafe.InvalidStateError,
                       match=r'tensor "optim.fp32_flat": ranks \d and \d hold different bytes'):
        shardsafe.save({"optim": {"fp32_flat": padded}}, os.path.join(root, "plain"))
    assert not os.path.exists(os.path.join(root, "plain"))


def _zero_load(rank, world, root):
    b, e = _partition(rank, world)
    part = torch.full((e - b,), -1.0)
    state = {"optim": {"fp32_flat": shardsafe.Sharded(part, shape=(N_FLAT,), flat=(b, e)),
                       "step": 0}}
    shardsafe.load(state, os.path.join(root, "zero"))
    assert torch.equal(part, _flat_buffer()[b:e]), f"rank {rank} got another partition"
    assert state["optim"]["step"] == 7


def test_zero1_partitions_with_padding_load_at_dp3_and_whole(tmp_path):
    run_workers(_zero_save, 4, str(tmp_path))
    run_workers(_zero_load, 3, str(tmp_path))
    whole = {"optim": {"fp32_flat": torch.zeros(N_FLAT), "step": 0}}
    shardsafe.load(whole, tmp_path / "zero")
    assert torch.equal(whole["optim"]["fp32_flat"], _flat_buffer())


def test_flat_range_of_a_2d_box_round_trips(tmp_path):
    weight = torch.arange(80, dtype=torch.float32).reshape(8, 10)
    # ZeRO over a flattened [8, 10] weight: one process holding both ranges.
    parts = [weight.view(-1)[0:37].clone(), weight.view(-1)[37:80].clone()]
    path = tmp_path / "flat2d"
    s = shardsafe.Sharded(parts[0], shape=(8, 10), flat=(0, 37))
    s.parts += shardsafe.Sharded(parts[1], shape=(8, 10), flat=(37, 80)).parts
    shardsafe.save({"w": s}, path)
    out = {"w": torch.zeros(8, 10)}
    shardsafe.load(out, path)
    assert torch.equal(out["w"], weight)
    # And back into flat ranges of another split, with a box narrower than the tensor.
    rows = torch.zeros(15)
    shardsafe.load({"w": shardsafe.Sharded(rows, shape=(8, 10), offset=(2, 0), size=(3, 10),
                                           flat=(5, 20))}, path)
    assert torch.equal(rows, weight[2:5].reshape(-1)[5:20])


# ------------------------------------------ tensor parallel, plain tensors --

def _embed() -> torch.Tensor:
    return torch.arange(64 * 16, dtype=torch.float32).reshape(64, 16) / 7


def _tp_rows(tp_rank: int, tp: int) -> tuple[int, int]:
    return 64 * tp_rank // tp, 64 * (tp_rank + 1) // tp


def _tp_save(rank, world, root):
    tp_rank = rank % 2  # TP 2 x DP 2: ranks 0, 2 hold rows 0-31; 1, 3 rows 32-63
    lo, hi = _tp_rows(tp_rank, 2)
    local = _embed()[lo:hi].clone()
    shardsafe.save({"model": {"embed": shardsafe.Sharded(local, shape=(64, 16), offset=(lo, 0))}},
                   os.path.join(root, "tp"))
    # The data-loss case: TP shards passed as plain local tensors.
    with pytest.raises(shardsafe.InvalidStateError, match=r'"model.embed": ranks 0 and 1 hold'):
        shardsafe.save({"model": {"embed": local}}, os.path.join(root, "plain"))


def _tp_load(rank, world, root):
    lo, hi = _tp_rows(rank, world)
    local = torch.zeros(hi - lo, 16)
    res = shardsafe.load({"model": {"embed": shardsafe.Sharded(local, (64, 16), (lo, 0))}},
                         os.path.join(root, "tp"))
    assert torch.equal(local, _embed()[lo:hi])
    assert res.missing_keys == [] and res.unexpected_keys == []


def test_tensor_parallel_shards_as_plain_tensors_tp2_dp2_to_tp1_3_4(tmp_path):
    run_workers(_tp_save, 4, str(tmp_path))
    for world in (3, 4):
        run_workers(_tp_load, world, str(tmp_path))
    whole = {"model": {"embed": torch.zeros(64, 16)}}
    shardsafe.load(whole, tmp_path / "tp")
    assert torch.equal(whole["model"]["embed"], _embed())
    assert list(shardsafe.describe(tmp_path / "tp")["tensors"]["model.embed"][1]) == [64, 16]


# ---------------------------------------------------------- fused QKV, GQA --

H, NQ, NKV, D = 8, 8, 2, 4  # hidden, query heads, kv heads, head dim (rows of each head)


def _qkv() -> torch.Tensor:
    """The global fused weight: [q (NQ*D rows); k (NKV*D); v (NKV*D)] x H."""
    return torch.arange((NQ + 2 * NKV) * D * H, dtype=torch.float32).reshape(-1, H)


def _qkv_local(rank: int, tp: int) -> tuple[torch.Tensor, list[tuple[int, int, int]]]:
    """This TP rank's fused shard (its q heads, then its k and v heads) and
    (local row, global row, rows) of each of its three pieces."""
    q, kv = NQ * D // tp, NKV * D // tp
    spans = [(0, rank * q, q), (q, NQ * D + rank * kv, kv),
             (q + kv, NQ * D + NKV * D + rank * kv, kv)]
    g = _qkv()
    local = torch.cat([g[start:start + n] for _, start, n in spans])
    return local, spans


def _qkv_save(rank, world, root):
    local, spans = _qkv_local(rank, world)
    pieces = [(local[lo:lo + n], (start, 0)) for lo, start, n in spans]
    shardsafe.save({"attn.qkv": shardsafe.Sharded.pieces(_qkv().shape, pieces)},
                   os.path.join(root, "qkv"))


def test_fused_qkv_under_gqa_loads_whole_and_into_another_tp(tmp_path):
    run_workers(_qkv_save, 2, str(tmp_path))
    whole = {"attn.qkv": torch.zeros(_qkv().shape)}
    shardsafe.load(whole, tmp_path / "qkv")
    assert torch.equal(whole["attn.qkv"], _qkv())
    # TP 1 -> the pieces of a TP-2 rank 1, in one process
    local, spans = _qkv_local(1, 2)
    target = torch.zeros_like(local)
    pieces = [(target[lo:lo + n], (start, 0)) for lo, start, n in spans]
    shardsafe.load({"attn.qkv": shardsafe.Sharded.pieces(_qkv().shape, pieces)}, tmp_path / "qkv")
    assert torch.equal(target, local)


# --------------------------------------------------------- per-rank state --

def _rng_state(rank: int) -> dict:
    torch.manual_seed(1000 + rank)
    return {"cpu": torch.get_rng_state(), "loader": {"epoch": 2, "index": 17 + rank},
            "best_loss": float("inf"), "window": (1.5, rank)}


def _per_rank_save(rank, world, root):
    shardsafe.save({"rng": shardsafe.PerRank(_rng_state(rank)), "step": 3,
                    "w": torch.ones(4)}, os.path.join(root, "rng"))
    # The data-loss cases: per-rank data as one plain tensor / one value.
    with pytest.raises(shardsafe.InvalidStateError, match=r'"rng": ranks 0 and 1 hold different'):
        shardsafe.save({"rng": _rng_state(rank)["cpu"]}, os.path.join(root, "plain"))
    with pytest.raises(shardsafe.InvalidStateError,
                       match=r'value "loader" differs between ranks 0 and 1'):
        shardsafe.save({"loader": _rng_state(rank)["loader"]}, os.path.join(root, "plain"))
    with pytest.raises(shardsafe.InvalidStateError,
                       match=r'value "loader1" is passed by rank 1 but not by rank 0'):
        shardsafe.save({f"loader{rank}": 5}, os.path.join(root, "plain"))


def _per_rank_load_same(rank, world, root):
    target = shardsafe.PerRank({"cpu": torch.zeros_like(torch.get_rng_state()),
                                "loader": {"epoch": 0, "index": 0}})
    cpu = target.value["cpu"]
    shardsafe.load({"rng": target, "step": 0, "w": torch.zeros(4)}, os.path.join(root, "rng"))
    expected = _rng_state(rank)
    assert torch.equal(target.value["cpu"], expected["cpu"])
    assert target.value["cpu"] is cpu, "a tensor of the same shape is filled in place"
    assert target.value["loader"] == expected["loader"]
    assert target.value["best_loss"] == float("inf")
    assert target.value["window"] == [1.5, rank]  # a list where the target had no tuple


def _per_rank_load_wider(rank, world, root):
    path = os.path.join(root, "rng")
    target = shardsafe.PerRank({"loader": None})
    # Every rank raises, naming the rank the checkpoint has nothing for.
    with pytest.raises(shardsafe.KeyMismatchError, match=re.escape("'rng[rank 2]'")):
        shardsafe.load({"rng": target, "step": 0, "w": torch.zeros(4)}, path)
    res = shardsafe.load({"rng": target, "step": 0, "w": torch.zeros(4)}, path,
                         per_rank_strict=False)
    assert res.missing_keys == ["rng[rank 2]"]
    if rank < 2:
        assert target.value["loader"] == _rng_state(rank)["loader"]
    else:
        assert target.value == {"loader": None}, "a rank without saved state keeps its own"


def test_per_rank_state_round_trips_at_the_same_and_another_world_size(tmp_path):
    run_workers(_per_rank_save, 2, str(tmp_path))
    run_workers(_per_rank_load_same, 2, str(tmp_path))
    run_workers(_per_rank_load_wider, 3, str(tmp_path))
    # One process: rank 0's state, and rank 1's saved state is reported unused.
    target = shardsafe.PerRank(None)
    with pytest.raises(shardsafe.KeyMismatchError, match=re.escape("'rng[rank 1]'")) as e:
        shardsafe.load({"rng": target, "step": 0, "w": torch.zeros(4)}, tmp_path / "rng")
    assert str(e.value).endswith("(pass per_rank_strict=False (a rank without a saved value "
                                 "keeps its own) to load anyway); per-rank values load by rank: "
                                 "rank r gets saved rank r's"), str(e.value)
    # Only the argument that helps is named; with both kinds, both.
    with pytest.raises(shardsafe.KeyMismatchError) as e:
        shardsafe.load({"rng": target, "step": 0, "w": torch.zeros(4), "extra": torch.zeros(1)},
                       tmp_path / "rng")
    assert "(pass strict=False and per_rank_strict=False (a rank" in str(e.value), str(e.value)
    res = shardsafe.load({"rng": target, "step": 0, "w": torch.zeros(4)}, tmp_path / "rng",
                         per_rank_strict=False)
    assert target.value["loader"] == _rng_state(0)["loader"]
    assert res.unexpected_keys == ["rng[rank 1]"]


# -------------------------------------------------- replicas are checked --

def _divergent_async(rank, world, root):
    w = torch.full((256,), float(rank))  # "replicated", but not equal
    fut = shardsafe.async_save({"w": w, "same": torch.ones(8)}, os.path.join(root, "async"))
    # Every rank raises the same error class as the rank that found it.
    with pytest.raises(shardsafe.InvalidStateError, match=r'"w": ranks 0 and 1 hold different'):
        fut.result(timeout=300)
    # The next save is attempted as usual (the failure was the Future's to
    # report), and replicas that agree pass.
    shardsafe.async_save({"w": torch.ones(256)}, os.path.join(root, "ok")).result(timeout=300)
    # A caller that guarantees its replicas may skip the check.
    shardsafe.save({"w": torch.ones(256)}, os.path.join(root, "unchecked"),
                   verify_replicas=False)


def test_divergent_replicas_fail_async_saves_and_agreeing_ones_pass(tmp_path):
    run_workers(_divergent_async, 2, str(tmp_path))
    assert not (tmp_path / "async").exists()
    leftovers = [p for p in tmp_path.iterdir() if p.name.startswith(".tmp-async.")]
    assert all(os.listdir(p) == ["aborted"] for p in leftovers), "data files are removed"
    out = {"w": torch.zeros(256)}
    shardsafe.load(out, tmp_path / "ok")
    assert torch.equal(out["w"], torch.ones(256))


# ----------------------------------------------- destinations and tags --

def _mismatched_destinations(rank, world, root):
    with pytest.raises(shardsafe.InvalidStateError,
                       match=re.escape(f'rank 0 saves to "{root}/a/step-1", rank 1 to '
                                       f'"{root}/b/step-1"')):
        shardsafe.save({"w": torch.ones(2)}, os.path.join(root, "ab"[rank], "step-1"))
    with pytest.raises(shardsafe.InvalidStateError,
                       match=re.escape(f'rank 0 saves to "{root}/t0", rank 1 to "{root}/t1"')):
        shardsafe.save({"w": torch.ones(2)}, os.path.join(root, f"t{rank}"))


def test_ranks_saving_to_different_places_fail_naming_both(tmp_path):
    run_workers(_mismatched_destinations, 2, str(tmp_path))
    assert list(tmp_path.iterdir()) == [], "nothing is created before the ranks agree"


# -------------------------------------------------------- commit order --

def _cli(*args: str) -> subprocess.CompletedProcess:
    binary = os.environ.get("SHARDSAFE_BIN", "shardsafe")
    return subprocess.run([binary, *args], capture_output=True, text=True, check=True)


def test_three_tags_committed_within_one_second_are_ordered_by_commit(tmp_path):
    mgr = shardsafe.CheckpointManager(tmp_path, tag_format="global_step{step}")
    for step in (98, 99, 100):
        mgr.save(step, {"step": step, "w": torch.full((4,), float(step))})
    # Same second, and "global_step100" < "global_step99" as names.
    assert mgr.latest_step() == 100
    out = {"step": 0, "w": torch.zeros(4)}
    res = shardsafe.load(out, tmp_path)
    assert out["step"] == 100 and res.tag == "global_step100"
    tags = [c["tag"] for c in json.loads(_cli("ls", str(tmp_path), "--json").stdout)]
    assert tags == ["global_step98", "global_step99", "global_step100"]
    _cli("prune", str(tmp_path), "--keep", "1")
    assert sorted(os.listdir(tmp_path)) == ["global_step100", "latest"]


def test_a_save_that_does_not_move_latest_is_not_taken_as_newer(tmp_path):
    mgr = shardsafe.CheckpointManager(tmp_path, keep_last=2)
    mgr.save(1, {"step": 1})
    mgr.save(2, {"step": 2}, update_latest=False)
    assert (tmp_path / "latest").read_text() == "step-00000001\n"
    assert mgr.latest_step() == 1
    out = {"step": 0}
    shardsafe.load(out, tmp_path)
    assert out["step"] == 1
    mgr.save(3, {"step": 3}, update_latest=False)
    # Retention keeps the newest commit (3) and the one `latest` names (1).
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest", "step-00000001",
                                                         "step-00000003"]
    mgr.save(4, {"step": 4})
    assert mgr.latest_step() == 4


def test_bad_tag_formats_are_refused():
    for fmt in ("step", "a{step}b{step}", "{step:8d}", "../{step}", ".x{step}"):
        with pytest.raises(shardsafe.InvalidStateError, match="tag"):
            shardsafe.CheckpointManager("/tmp/unused-root", tag_format=fmt)


# ---------------------------------------------------- smaller defects --

def test_a_state_of_values_only_saves_and_loads(tmp_path):
    shardsafe.save({"step": 5}, tmp_path / "a")
    shardsafe.save({"loader": {"epoch": 1, "offsets": [3, 4]}}, tmp_path / "b")
    out = {"step": 0}
    res = shardsafe.load(out, tmp_path / "a")
    assert out == {"step": 5} and res.values == {"step": 5}
    out = {"loader": None}
    shardsafe.load(out, tmp_path / "b")
    assert out == {"loader": {"epoch": 1, "offsets": [3, 4]}}


def test_the_load_result_returns_the_saved_values_without_a_template(tmp_path):
    shardsafe.save({"w": torch.ones(2), "client_state": {"lr": 0.1, "tokens": 12345}},
                   tmp_path / "c")
    res = shardsafe.load({"w": torch.zeros(2)}, tmp_path / "c", strict=False)
    assert res.values["client_state"] == {"lr": 0.1, "tokens": 12345}


def test_loading_into_the_meta_device_is_an_error_naming_the_key(tmp_path):
    shardsafe.save({"m": torch.nn.Linear(4, 3)}, tmp_path / "m")
    with torch.device("meta"):
        model = torch.nn.Linear(4, 3)
    with pytest.raises(shardsafe.InvalidStateError, match=r"'m.weight' is on the meta device"):
        shardsafe.load({"m": model}, tmp_path / "m")


class _Experts(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.e = torch.nn.ModuleList(torch.nn.Linear(4, 4) for _ in range(3))


def test_a_strict_load_of_optimizer_state_for_some_parameters(tmp_path):
    torch.manual_seed(0)
    model = _Experts()
    optim = torch.optim.AdamW(model.parameters(), lr=0.1)
    loss = model.e[0](torch.ones(2, 4)).sum() + model.e[2](torch.ones(2, 4)).sum()
    loss.backward()  # expert 1 was not routed: no gradient, no optimizer state
    optim.step()
    assert len(optim.state) == 4
    shardsafe.save({"model": model, "optim": optim}, tmp_path / "moe")

    model2 = _Experts()
    optim2 = torch.optim.AdamW(model2.parameters(), lr=0.1)
    res = shardsafe.load({"model": model2, "optim": optim2}, tmp_path / "moe")
    assert sorted(res.missing_keys) == [f"optim.state.{i}.{n}" for i in (2, 3)
                                        for n in ("exp_avg", "exp_avg_sq", "step")]
    assert len(optim2.state) == 4, "parameters without saved state are left without state"
    for p, q in zip(optim.param_groups[0]["params"], optim2.param_groups[0]["params"]):
        assert (p in optim.state) == (q in optim2.state)
        if p in optim.state:
            assert torch.equal(optim.state[p]["exp_avg"], optim2.state[q]["exp_avg"])
    # A parameter whose state was saved but is missing a tensor is still an error.
    sd = {"optim.state.0.exp_avg": torch.zeros(4, 4)}
    shardsafe.save(sd, tmp_path / "partial")
    with pytest.raises(shardsafe.KeyMismatchError, match=r"optim.state.0.exp_avg_sq"):
        shardsafe.load({"optim": torch.optim.AdamW(_Experts().parameters())}, tmp_path / "partial")


def test_exclude_frozen_parameters(tmp_path):
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2))
    model[0].requires_grad_(False)
    shardsafe.save({"model": model}, tmp_path / "f", exclude_frozen_parameters=True)
    assert sorted(shardsafe.describe(tmp_path / "f")["tensors"]) == ["model.1.bias",
                                                                     "model.1.weight"]
    fresh = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2))
    before = fresh[0].weight.detach().clone()
    res = shardsafe.load({"model": fresh}, tmp_path / "f")  # strict, knows they were left out
    assert res.missing_keys == ["model.0.bias", "model.0.weight"]
    assert torch.equal(fresh[0].weight, before)
    assert torch.equal(fresh[1].weight, model[1].weight)


def test_skip_keys_by_prefix_or_regex_stays_strict_for_the_rest(tmp_path):
    shardsafe.save({"body.w": torch.ones(3), "head.w": torch.ones(5), "head.b": torch.ones(5),
                    "aux": 1}, tmp_path / "s")
    head = torch.zeros(2)
    out = {"body.w": torch.zeros(3), "head.w": head, "aux": 0}
    shardsafe.load(out, tmp_path / "s", skip_keys=["head."])
    assert torch.equal(out["body.w"], torch.ones(3)) and torch.equal(head, torch.zeros(2))
    assert out["aux"] == 1
    out = {"body.w": torch.zeros(3), "head.w": torch.zeros(2)}
    with pytest.raises(shardsafe.KeyMismatchError, match="aux"):
        shardsafe.load(out, tmp_path / "s", skip_keys=[re.compile(r"^head\.")])
    shardsafe.load(out, tmp_path / "s", skip_keys=[re.compile(r"^head\."), "aux"])


def test_sharded_describes_its_mistakes():
    with pytest.raises(shardsafe.InvalidStateError, match="passes the end of dimension 0"):
        shardsafe.Sharded(torch.zeros(4, 2), shape=(6, 2), offset=(3, 0))
    with pytest.raises(shardsafe.InvalidStateError, match="has 3 elements, the local tensor 4"):
        shardsafe.Sharded(torch.zeros(4), shape=(10,), flat=(0, 3))
    with pytest.raises(shardsafe.InvalidStateError, match="not within the box's 10 elements"):
        shardsafe.Sharded(torch.zeros(4), shape=(10,), flat=(8, 12))


def test_a_hostile_blob_size_is_data_loss_naming_the_blob_not_an_allocation(tmp_path, run):
    shardsafe.save({"w": torch.ones(4)}, tmp_path / "h", files={"config.json": b"{}"})
    index_path = tmp_path / "h" / "shardsafe.json"
    index = json.loads(index_path.read_text())
    claim = 1 << 40  # a terabyte, claimed by the last entry of a file of a few KiB
    for f in index["files"]:
        f["bytes"] = claim * 2
    (chunk,) = index["blobs"]["file/config.json"]["chunks"]
    assert chunk["at"] > max(c["at"] for c in index["tensors"]["w"]["chunks"])
    chunk["bytes"] = claim
    index_path.write_text(json.dumps(index))
    # The file's size is checked against the index before any read.
    message = r"data-00000-000.safetensors: size \d+ bytes, index records 2199023255552"
    with pytest.raises(shardsafe.CorruptCheckpointError, match=message):
        shardsafe.load({"w": torch.zeros(4)}, tmp_path / "h")
    # Blobs first (an export copies the saved files before any tensor), or
    # alone: the blob's claim against the file.
    proc = run("export-hf", tmp_path / "h", tmp_path / "out")
    assert proc.returncode == 2 and "claimed by the index" in proc.stderr, proc.stderr
    with pytest.raises(shardsafe.CorruptCheckpointError, match=r'blob "file/config.json" in '
                       r'.*claimed by the index, but the file has \d+ bytes'):
        shardsafe.load({}, tmp_path / "h", strict=False)


def test_a_chunk_without_a_checksum_is_corrupt_not_unchecked(tmp_path, run):
    shardsafe.save({"w": torch.ones(4)}, tmp_path / "c", files={"config.json": b"{}"})
    index_path = tmp_path / "c" / "shardsafe.json"
    good = index_path.read_text()
    index = json.loads(good)
    del index["tensors"]["w"]["chunks"][0]["crc32c"]
    index_path.write_text(json.dumps(index))
    with pytest.raises(shardsafe.CorruptCheckpointError, match=r'tensor "w" chunk .* has no crc32c'):
        shardsafe.load({"w": torch.zeros(4)}, tmp_path / "c")
    proc = run("verify", tmp_path / "c")
    assert proc.returncode != 0 and "has no crc32c" in proc.stdout + proc.stderr, proc.stdout
    index = json.loads(good)
    del index["blobs"]["file/config.json"]["chunks"][0]["crc32c"]
    index_path.write_text(json.dumps(index))
    with pytest.raises(shardsafe.CorruptCheckpointError, match=r'blob "file/config.json" .*crc32c'):
        shardsafe.load({"w": torch.zeros(4)}, tmp_path / "c")


def test_verify_and_load_judge_a_data_file_of_another_size_alike(tmp_path, run):
    shardsafe.save({"w": torch.ones(4)}, tmp_path / "g")
    (data,) = (tmp_path / "g").glob("data-*.safetensors")
    with open(data, "ab") as f:
        f.write(b"\0" * 100)  # the tensor itself is intact
    with pytest.raises(shardsafe.CorruptCheckpointError,
                       match=re.escape(f"{data}: size ") + r"\d+ bytes, index records \d+"):
        shardsafe.load({"w": torch.zeros(4)}, tmp_path / "g")
    proc = run("verify", tmp_path / "g")
    assert proc.returncode == 1 and f"FAULT  {data}: " in proc.stdout, proc.stdout


def test_the_tag_is_the_directorys_name_not_the_indexs_field(tmp_path):
    shardsafe.save({"w": torch.ones(4)}, tmp_path / "step-1")
    index_path = tmp_path / "step-1" / "shardsafe.json"
    index = json.loads(index_path.read_text())
    index["tag"] = "../../etc"
    index_path.write_text(json.dumps(index))
    assert shardsafe.load({"w": torch.zeros(4)}, tmp_path / "step-1").tag == "step-1"
    assert shardsafe.describe(tmp_path / "step-1")["tag"] == "step-1"


def test_nul_bytes_in_keys_and_paths_are_refused_never_cut_short(tmp_path):
    with pytest.raises(shardsafe.InvalidStateError, match="NUL byte"):
        shardsafe.save({"a\x00b": torch.ones(2)}, tmp_path / "k")
    with pytest.raises(shardsafe.InvalidStateError, match="NUL byte"):
        shardsafe.save({"w": torch.ones(2)}, str(tmp_path / "p") + "\x00/elsewhere")
    assert sorted(os.listdir(tmp_path)) == [], "nothing created at a cut-short path"
    # A crafted index whose key differs from the wanted one after a NUL.
    shardsafe.save({"w": torch.ones(2), "wx": torch.ones(2)}, tmp_path / "c")
    index_path = tmp_path / "c" / "shardsafe.json"
    index_path.write_text(index_path.read_text().replace('"wx"', '"w\\u0000x"'))
    with pytest.raises(shardsafe.CorruptCheckpointError, match="NUL byte"):
        shardsafe.load({"w": torch.zeros(2), "wx": torch.zeros(2)}, tmp_path / "c")
