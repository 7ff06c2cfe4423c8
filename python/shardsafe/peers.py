"""Other tools' checkpoints: the public face of shardsafe.foreign.

``import_checkpoint(src, dst)`` (``shardsafe import SRC DST``, ``python -m
shardsafe import SRC DST``) converts a torch DCP, Megatron torch_dist,
DeepSpeed or nanotron checkpoint into a shardsafe one, in bounded memory
(shardsafe.foreign.importer); ``shardsafe.load(state, path)`` loads any of
them straight into a state of any layout (shardsafe.foreign.loader).

A torch DCP checkpoint is read through torch's own DCP reader and planner
(shardsafe.foreign.dcp): load_dcp loads one into a state of any layout,
DcpCheckpoint reads it key by key (a ForeignCheckpoint), is_dcp tells one.
"""

from __future__ import annotations

from .foreign.dcp import FORMAT, DcpCheckpoint, is_dcp, load_dcp, unpickle_error
from .foreign.importer import import_checkpoint

__all__ = ["FORMAT", "DcpCheckpoint", "import_checkpoint", "is_dcp", "load_dcp", "unpickle_error"]
