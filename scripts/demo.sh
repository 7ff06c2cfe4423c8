#!/usr/bin/env bash
# The main job from a fresh clone: install what the demo needs, build and
# install the Python package (the engine is compiled once, in build-py/: the
# package carries the extension and the `shardsafe` command-line tool), run
# `shardsafe demo` (8 ranks save a 1.7 GB training state, reload it into
# another layout, check every byte); then run examples/train_resume.py three
# times: straight through, killed with SIGKILL mid-run, and resumed, checking
# the resumed loss curve is bit-identical. Extra arguments go to
# `shardsafe demo`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh demo
bash scripts/install_python.sh
"$(python3 -c 'import sysconfig; print(sysconfig.get_path("scripts"))')/shardsafe" demo "$@"

printf '\n=== Python: a training run killed and resumed ===\n'
out=demo-out/python
rm -rf "$out" && mkdir -p "$out"
train() { python3 examples/train_resume.py --steps 40 --save-every 5 "$@"; }
train --ckpt-dir "$out/straight" --log "$out/straight.log"
set +e
train --ckpt-dir "$out/resumed" --log "$out/resumed.log" --kill-at-step 22
rc=$?
set -e
[[ $rc -eq 137 ]] || { echo "expected the run to die of SIGKILL (137), got $rc" >&2; exit 1; }
echo "(killed at step 22 with SIGKILL, as asked)"
train --ckpt-dir "$out/resumed" --log "$out/resumed.log"
if diff <(sort -n -u "$out/straight.log") <(sort -n -u "$out/resumed.log") >/dev/null; then
  echo "resumed run: every step's loss bit-identical to the uninterrupted run ($(wc -l <"$out/straight.log") steps)"
else
  echo "resumed run diverged from the uninterrupted run" >&2; exit 1
fi
