#!/usr/bin/env bash
# Installs what shardsafe needs: Debian packages (scripts/apt-packages.txt)
# and Python packages (pinned in requirements-*.txt; the build backend from
# pyproject.toml's [build-system] requires).
#   scripts/deps.sh demo   what the demo needs: the build's Debian packages,
#                          torch and the build backend
#   scripts/deps.sh        everything the tests need besides (default)
# Safe to run again: installs only what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
mode=${1:-test}
[[ $mode == demo || $mode == test ]] || { echo "usage: scripts/deps.sh [demo|test]" >&2; exit 2; }

sudo_if_needed() { if [[ $(id -u) -eq 0 ]]; then "$@"; else sudo "$@"; fi; }

# A package line is "NAME [test] [# comment]"; `test` lines only for the tests.
mapfile -t packages < <(grep -v '^\s*#' scripts/apt-packages.txt |
  awk -v mode="$mode" 'NF && (mode == "test" || $2 != "test") {print $1}')
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "deps: installing Debian packages: ${missing[*]}"
  sudo_if_needed apt-get update -qq
  DEBIAN_FRONTEND=noninteractive sudo_if_needed apt-get install -y -qq "${missing[@]}" >/dev/null
fi

pip_install() { python3 -m pip install -q --disable-pip-version-check "$@" 2>>/tmp/shardsafe-pip.log; }
mapfile -t backend < <(python3 -c 'import tomllib
print("\n".join(tomllib.load(open("pyproject.toml", "rb"))["build-system"]["requires"]))')
: >/tmp/shardsafe-pip.log
if ! pip_install "${backend[@]}" -r "requirements-$([[ $mode == demo ]] && echo demo || echo dev).txt" ||
   { [[ $mode == test ]] && ! pip_install --no-deps -r requirements-dev-nodeps.txt; }; then
  cat /tmp/shardsafe-pip.log >&2
  exit 1
fi
echo "deps ($mode): ok"
