#!/usr/bin/env bash
# The crash campaign (not part of scripts/test.sh; tests/python/test_torture.py
# runs a short version of it there).
#
#   scripts/torture.sh [--kills N] [--procs 1,2,3,4] [--modes sync,async,memory]
#                      [--power-loss M] [--seed S] [--keep] [-q]
#
# For every number of writer processes P in --procs and mode in --modes, N
# times (default 100): a job of P gloo processes saves checkpoints in a loop
# with shardsafe.CheckpointManager (save / async_save / async_save into a
# memory tier, every 2nd save persisted to the root) and is SIGKILLed (all
# ranks, or one) at a random moment; then every committed checkpoint (in
# memory mode: of either tier) must load bit-exact and pass `shardsafe
# verify`, nothing committed may be lost, `latest` must name a committed
# checkpoint, and a fresh save must succeed and leave no leftover. Then M
# simulated power losses over the sync and async modes (default 40; needs
# root and loop devices): ext4 on a loop device, the writers stopped, the
# device's bytes copied atomically, fsck'ed, mounted and checked the same
# way. Prints a table of outcomes; exit status 1 on any failure, 3 if the
# power-loss simulation was asked for and cannot run here (--power-loss 0
# skips it). Details: tests/torture/README.md.
#
# Python finds `shardsafe` as usual (installed, or PYTHONPATH); the CLI is
# $SHARDSAFE_BIN, default build/shardsafe.
set -euo pipefail
cd "$(dirname "$0")/.."
export SHARDSAFE_BIN="${SHARDSAFE_BIN:-$PWD/build/shardsafe}"
exec python3 tests/torture/campaign.py "$@"
