#!/usr/bin/env bash
# The main job from a fresh clone: install dependencies, build, and run
# `shardsafe demo` (8 ranks save a 1.7 GB training state, reload it into
# another layout, check every byte). Extra arguments go to the demo.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
bash scripts/build.sh release
exec build/shardsafe demo "$@"
