#!/usr/bin/env bash
# Installs what shardsafe needs to build and test: Debian packages (listed in
# scripts/apt-packages.txt) and Python packages (pinned in
# requirements-dev.txt, and requirements-dev-nodeps.txt installed without
# their declared dependencies). Safe to run again: installs only what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

sudo_if_needed() { if [[ $(id -u) -eq 0 ]]; then "$@"; else sudo "$@"; fi; }

mapfile -t packages < <(grep -v '^\s*#' scripts/apt-packages.txt | awk 'NF {print $1}')
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "deps: installing Debian packages: ${missing[*]}"
  sudo_if_needed apt-get update -qq
  DEBIAN_FRONTEND=noninteractive sudo_if_needed apt-get install -y -qq "${missing[@]}" >/dev/null
fi

if ! python3 -m pip install -q --disable-pip-version-check -r requirements-dev.txt 2>/tmp/shardsafe-pip.log ||
   ! python3 -m pip install -q --disable-pip-version-check --no-deps -r requirements-dev-nodeps.txt \
     2>>/tmp/shardsafe-pip.log; then
  cat /tmp/shardsafe-pip.log >&2
  exit 1
fi
echo "deps: ok"
