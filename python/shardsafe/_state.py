"""State dicts as the engine sees them: flat tensor keys, boxes, JSON values.

A state is walked depth first. Keys are the path of names joined by ".":
``{"model": {"layer.weight": t}}`` saves ``model.layer.weight``; list and
tuple items use their index. What each node becomes:

- ``torch.Tensor``: a tensor. A DTensor (Shard / Replicate placements on any
  device mesh) contributes the box its local shard covers; a plain tensor is
  the whole tensor (ranks that pass it must hold identical bytes: the save
  checks).
- ``shardsafe.Sharded``: a plain tensor's part(s) of a global tensor (boxes,
  flat ranges); ``shardsafe.PerRank``: a value each rank saves for itself
  (_parts.py).
- an object with ``state_dict()`` / ``load_state_dict()`` (module, optimizer,
  scheduler, any Stateful): its state dict, walked in its place; loading
  fills that state dict and hands it back through ``load_state_dict``.
- a dict, list or tuple holding tensors somewhere below: walked.
- anything else (numbers, strings, None, containers of those): one JSON
  value under its key (_json.py). Non-finite floats are kept (tagged objects in the
  JSON). A value JSON cannot hold is an error naming its key, unless the
  caller passes ``unsafe_pickle=True``: it is then pickled into a blob, and
  loading it needs the same opt-in.

The root is walked as a dict even when it holds no tensor (a state of
values only). Loading follows the structure of the target state: tensors are filled in
place, values are replaced by the saved ones (converted back to tuples,
integer dict keys and namedtuples where the target has them).
"""

from __future__ import annotations

import pickle
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from ._json import StoredValueError, from_json, join, to_json
from ._parts import PerRank, Sharded
from .errors import CorruptCheckpointError, InvalidStateError

# safetensors dtype names (docs/format.md §2) of every torch dtype we store.
DTYPE_NAMES: dict[torch.dtype, str] = {
    torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
    torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8",
    torch.uint64: "U64", torch.uint32: "U32", torch.uint16: "U16", torch.uint8: "U8",
    torch.bool: "BOOL", torch.complex64: "C64",
    torch.float8_e4m3fn: "F8_E4M3", torch.float8_e5m2: "F8_E5M2",
    torch.float8_e4m3fnuz: "F8_E4M3FNUZ", torch.float8_e5m2fnuz: "F8_E5M2FNUZ",
    torch.float8_e8m0fnu: "F8_E8M0",
}
TORCH_DTYPES: dict[str, torch.dtype] = {v: k for k, v in DTYPE_NAMES.items()}

PICKLE_PREFIX = "pickle/"  # blob names of values stored with unsafe_pickle
PER_RANK_PREFIX = "rank/"  # per-rank blob names of PerRank values
# The global value shardsafe keeps its own facts under (docs/format.md §6):
# {"excluded_frozen": [keys]}; a state key of this name is refused.
RESERVED_KEY = "__shardsafe__"
FILE_PREFIX = "file/"  # blob names of files saved with a checkpoint (config.json, ...)


def is_stateful(x: Any) -> bool:
    return callable(getattr(x, "state_dict", None)) and callable(getattr(x, "load_state_dict", None))


def holds(x: Any, leaf: Callable[[Any], bool]) -> bool:
    """Whether `x`, or anything in its dicts, lists and tuples, is a `leaf`."""
    if leaf(x):
        return True
    if isinstance(x, Mapping):
        return any(holds(v, leaf) for v in x.values())
    if isinstance(x, (list, tuple)):
        return any(holds(v, leaf) for v in x)
    return False


def holds_tensors(x: Any) -> bool:
    return holds(x, lambda v: isinstance(v, (torch.Tensor, Sharded, PerRank)) or is_stateful(v))


@dataclass
class TensorLeaf:
    key: str
    tensor: torch.Tensor  # as found in the state (plain tensor or DTensor)


@dataclass
class Flat:
    """A state walked once: its tensors, its values, its stateful objects."""

    tensors: list[TensorLeaf] = field(default_factory=list)
    sharded: dict[str, Sharded] = field(default_factory=dict)
    per_rank: dict[str, PerRank] = field(default_factory=dict)
    values: dict[str, Any] = field(default_factory=dict)  # key -> Python value
    state_dicts: dict[int, Any] = field(default_factory=dict)  # id(obj) -> obj.state_dict()
    optimizers: dict[str, int] = field(default_factory=dict)  # key -> id(optimizer)
    frozen: set[str] = field(default_factory=set)  # keys of parameters without requires_grad

    def drop(self, skip: Callable[[str], bool]) -> None:
        """Forgets the tensors, values and per-rank values whose key `skip`
        accepts (a load leaves them as they are)."""
        self.tensors = [leaf for leaf in self.tensors if not skip(leaf.key)]
        for d in (self.sharded, self.per_rank, self.values):
            for key in [k for k in d if skip(k)]:
                del d[key]


def init_optimizer_state(optim: torch.optim.Optimizer) -> None:
    """Creates the per-parameter state of an optimizer that has not stepped
    yet (so a load has tensors to fill): one step with zero gradients and a
    zero learning rate, leaving parameters and gradients as they were."""
    if optim.state:
        return
    params = [p for g in optim.param_groups for p in g["params"] if p.requires_grad]
    grads = [p.grad for p in params]
    lrs = [g.get("lr") for g in optim.param_groups]
    try:
        for p in params:
            p.grad = torch.zeros_like(p)
        for g in optim.param_groups:
            if "lr" in g:
                g["lr"] = torch.tensor(0.0) if isinstance(g["lr"], torch.Tensor) else 0.0
        optim.step()
    finally:
        for p, grad in zip(params, grads):
            p.grad = grad
        for g, lr in zip(optim.param_groups, lrs):
            if lr is not None:
                g["lr"] = lr


def flatten(state: Any, for_load: bool = False,
            before_init: Callable[[], None] | None = None) -> Flat:
    """Walks `state` (see the module doc) and records what it holds. For a
    load, optimizers that have not stepped yet get their state created,
    each after a call of `before_init` (if given), which may raise to leave
    them as they are."""
    flat = Flat()
    seen: set[str] = set()

    def visit(node: Any, key: str) -> None:
        if isinstance(node, torch.Tensor):
            add(key)
            flat.tensors.append(TensorLeaf(key, node))
        elif isinstance(node, Sharded):
            add(key)
            flat.sharded[key] = node
        elif isinstance(node, PerRank):
            add(key)
            flat.per_rank[key] = node
        elif is_stateful(node) and not isinstance(node, Mapping):
            if for_load and isinstance(node, torch.optim.Optimizer):
                if not node.state and before_init is not None:
                    before_init()
                init_optimizer_state(node)
            sd = flat.state_dicts.setdefault(id(node), node.state_dict())
            if isinstance(node, torch.optim.Optimizer):
                flat.optimizers[key] = id(node)
            if isinstance(node, torch.nn.Module):
                flat.frozen |= {join(key, name) for name, p in node.named_parameters()
                                if not p.requires_grad}
            visit(sd, key)
        elif not _walked(node, key):
            add(key)
            flat.values[key] = node
        elif isinstance(node, Mapping):
            for k, v in node.items():
                visit(v, join(key, k))
        else:  # list or tuple
            for i, v in enumerate(node):
                visit(v, join(key, i))

    def add(key: str) -> None:
        if key == RESERVED_KEY or key.startswith(RESERVED_KEY + "/"):
            raise InvalidStateError(f"key {key!r} is reserved for shardsafe's own records")
        if not key:
            raise InvalidStateError("the state must be a dict (or an object with state_dict()), "
                                    "not a bare tensor or value")
        if key in seen:
            raise InvalidStateError(f"key {key!r} appears twice in the state (names joined "
                                    f"with '.' collide)")
        seen.add(key)

    try:
        visit(state, "")
    finally:
        del visit  # the cycle visit -> its cell -> visit would hold `flat` until a collection
    return flat


def _walked(node: Any, key: str) -> bool:
    """Whether a node is walked into (else it is one value): containers
    that hold tensors somewhere below, and the root dict."""
    return holds_tensors(node) or (not key and isinstance(node, Mapping))


def rebuild(state: Any, flat: Flat, tensor_fn: Callable[[str, torch.Tensor], None],
            value_fn: Callable[[str, Any], Any]) -> Any:
    """Walks `state` again in the order of `flatten`, calling `tensor_fn` for
    each tensor and replacing each value by `value_fn(key, old)`; mutable
    containers are updated in place, tuples rebuilt, stateful objects given
    their state dict back through load_state_dict; a PerRank is passed to
    `value_fn` whole, a Sharded left as it is (filled in place). Returns the
    new root."""

    def visit(node: Any, key: str) -> Any:
        if isinstance(node, torch.Tensor):
            tensor_fn(key, node)
            return node
        if isinstance(node, Sharded):
            return node
        if isinstance(node, PerRank):
            return value_fn(key, node)
        if is_stateful(node) and not isinstance(node, Mapping):
            sd = visit(flat.state_dicts[id(node)], key)
            node.load_state_dict(sd)
            return node
        if not _walked(node, key):
            return value_fn(key, node)
        if isinstance(node, Mapping):
            for k in list(node.keys()):
                node[k] = visit(node[k], join(key, k))
            return node
        items = [visit(v, join(key, i)) for i, v in enumerate(node)]
        if isinstance(node, list):
            node[:] = items
            return node
        return type(node)(*items) if hasattr(node, "_fields") else type(node)(items)

    try:
        return visit(state, "")
    finally:
        del visit  # as in flatten


def decoded_values(values: dict[str, Any], path: str) -> dict[str, Any]:
    """The index's global values as Python (from_json); a value no save
    writes (a float tag other than _json.NON_FINITE's) is a CorruptCheckpointError
    naming the checkpoint `path` and the key."""
    out = {}
    for key, stored in values.items():
        try:
            out[key] = from_json(stored, None)
        except StoredValueError as e:
            raise CorruptCheckpointError(f"{path}: value {key!r}: {e}", "DATA_LOSS") from None
    return out


def encode_values(values: dict[str, Any], unsafe_pickle: bool) -> tuple[dict, list]:
    """Splits values into JSON data and pickled blobs (only with unsafe_pickle)."""
    data, blobs = {}, []
    for key, value in values.items():
        try:
            data[key] = to_json(value, key)
        except InvalidStateError:
            if not unsafe_pickle:
                raise
            blobs.append((PICKLE_PREFIX + key, pickle.dumps(value), False))
    return data, blobs


def decode_value(key: str, like: Any, values: dict, blobs: dict, unsafe_pickle: bool) -> Any:
    """The saved value for `key`; KeyError if there is none."""
    if key in values:
        return from_json(values[key], like)
    blob = blobs.get(PICKLE_PREFIX + key)
    if blob is None:
        raise KeyError(key)
    if not unsafe_pickle:
        raise InvalidStateError(f"value at {key!r} was saved with pickle; loading it runs "
                                f"arbitrary code, pass unsafe_pickle=True if you trust the file")
    return pickle.loads(blob)
