"""Checkpoints written by other tools (torch DCP, Megatron torch_dist,
DeepSpeed, nanotron), read without those tools: one interface over their
readers (reader.py: Format, ForeignCheckpoint), so that loading one into any
layout (loader.py) and importing one (`shardsafe import SRC DST`,
importer.py) are written once, whatever the format.

    detect(path)            the Format that claims a directory, or None (formats.py)
    by_name(name)           the Format of that name
    load(state, path, fmt)  shardsafe.load of it (collective; loader.py)
    import_checkpoint(src, dst)

Readers: dcp.py (+ dcp_metadata.py), megatron.py, deepspeed.py
(+ deepspeed_zero.py), nanotron.py (+ nanotron_weights.py); common.py holds
what they share (torch_load, read_latest, one_line, as_dicts). Internal: the
public faces are shardsafe.load, shardsafe.peers and `shardsafe import`.
"""

from .common import read_latest, torch_load
from .formats import FORMATS, KNOWN, by_name, detect, formats, open_checkpoint
from .importer import NotImportedWarning, import_checkpoint
from .loader import load
from .reader import ForeignCheckpoint, Format

__all__ = ["FORMATS", "KNOWN", "ForeignCheckpoint", "Format", "NotImportedWarning", "by_name",
           "detect", "formats", "import_checkpoint", "load", "open_checkpoint", "read_latest", "torch_load"]
