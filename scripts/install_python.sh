#!/usr/bin/env bash
# Installs the Python package from this checkout (`pip install .`) without
# build isolation: the extension is built in build-py/ with the build backend
# scripts/deps.sh installed, so a second install (demo, then tests) reuses
# that build instead of compiling the engine again.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m pip install -q --disable-pip-version-check --no-build-isolation .
