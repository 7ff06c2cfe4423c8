"""python -m shardsafe import SRC DST: converts another tool's checkpoint
(torch DCP, Megatron torch_dist, DeepSpeed, nanotron: shardsafe.foreign)
into a shardsafe one (shardsafe.foreign.import_checkpoint), with a progress
bar on a terminal (--progress: always; --no-progress: never). The
`shardsafe import` command hands every directory the engine cannot open
to this (their pickles are read here, never by the engine), passing
--engine-error with the engine's own message for a path nothing claims
(an s3:// prefix is staged on a local disk and detected there: the
import's own error says that nothing claims it).
What the import leaves out (values JSON cannot hold, the reader's
not_imported() lines) is printed as notes on stdout, also with --json (as
the result's "dropped" and "not_imported"); any other warning raised during
the import is printed on stderr, never dropped."""

from __future__ import annotations

import argparse
import json
import sys
import warnings

from .foreign import KNOWN, NotImportedWarning, detect, import_checkpoint
from ._paths import is_s3
from .errors import ShardsafeError


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m shardsafe")
    commands = parser.add_subparsers(dest="command", required=True)
    imp = commands.add_parser("import", help=f"convert a {KNOWN} checkpoint into a shardsafe one")
    imp.add_argument("src", help="the checkpoint directory (or its root) to convert")
    imp.add_argument("dst", help="the shardsafe checkpoint to create")
    imp.add_argument("--overwrite", action="store_true", help="replace DST if it exists")
    imp.add_argument("--unsafe-pickle", action="store_true",
                     help="unpickle saved values of any type (only for checkpoints you trust)")
    imp.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                     help="show a progress bar on stderr (default: on a terminal)")
    imp.add_argument("--json", action="store_true", help="machine-readable output")
    imp.add_argument("--engine-error", default=None, help=argparse.SUPPRESS)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    # An s3:// SRC is detected once staged, by the import itself.
    if args.engine_error is not None and not is_s3(args.src) and detect(args.src) is None:
        print(f"shardsafe: error: {args.engine_error}; nor is it a {KNOWN} checkpoint",
              file=sys.stderr)
        return 2
    try:
        with warnings.catch_warnings(record=True) as caught:
            done = import_checkpoint(
                args.src, args.dst, unsafe_pickle=args.unsafe_pickle, overwrite=args.overwrite,
                progress=False if args.json else args.progress)
    except (ShardsafeError, ImportError) as e:  # ImportError: a reader's package is missing
        _print_warnings(caught)
        print(f"shardsafe: error: {e}", file=sys.stderr)
        return 2
    _print_warnings(caught)
    if args.json:
        print(json.dumps({**done, "native": False}))
        return 0
    print(f"imported {done['tensors']} tensors ({done['bytes']} bytes) and {done['values']} "
          f"values from {done['format']} checkpoint {args.src} into {args.dst}")
    if done["dropped"]:
        shown = ", ".join(done["dropped"][:16]) + (" ..." if len(done["dropped"]) > 16 else "")
        print(f"note: {len(done['dropped'])} value(s) that JSON cannot hold were not imported: "
              f"{shown}")
    for line in done["not_imported"]:
        print(f"note: not imported: {line}")
    return 0


def _print_warnings(caught: list[warnings.WarningMessage]) -> None:
    """Every warning recorded during the import but those the result
    reports (NotImportedWarning), on stderr, one line each."""
    for w in caught:
        if not issubclass(w.category, NotImportedWarning):
            text = " ".join(str(w.message).split())
            print(f"warning: {w.category.__name__}: {text}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
