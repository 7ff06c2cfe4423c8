"""python -m shardsafe import SRC DST: converts a torch DCP checkpoint into a
shardsafe one (shardsafe.peers.import_checkpoint). The `shardsafe import`
command hands DCP sources to this, since their metadata is a pickle that
only torch's reader opens."""

from __future__ import annotations

import argparse
import sys

from . import peers
from .errors import ShardsafeError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m shardsafe")
    commands = parser.add_subparsers(dest="command", required=True)
    imp = commands.add_parser("import", help="convert a torch DCP checkpoint into a shardsafe one")
    imp.add_argument("src", help="a torch DCP checkpoint directory (.metadata, __R_N.distcp)")
    imp.add_argument("dst", help="the shardsafe checkpoint to create")
    imp.add_argument("--overwrite", action="store_true", help="replace DST if it exists")
    imp.add_argument("--unsafe-pickle", action="store_true",
                     help="unpickle saved values of any type (only for checkpoints you trust)")
    args = parser.parse_args(argv)
    try:
        done = peers.import_checkpoint(args.src, args.dst, unsafe_pickle=args.unsafe_pickle,
                                       overwrite=args.overwrite)
    except ShardsafeError as e:
        print(f"shardsafe: error: {e}", file=sys.stderr)
        return 2
    print(f"imported {done['tensors']} tensors ({done['bytes']} bytes) and {done['values']} "
          f"values from torch DCP checkpoint {args.src} into {args.dst}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
