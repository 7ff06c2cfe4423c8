#!/usr/bin/env bash
# Every test, from a fresh clone: dependencies, release build + CTest
# (GoogleTest and 4-rank MPI tests), `pip install .` (scripts/install_python.sh,
# reusing the extension's build-py/ of an earlier install) and pytest (Python API
# with multi-process gloo tests, interop and CLI tests), an
# ASan+UBSan build running all unit tests, a TSan build of the threaded
# modules, and a short libFuzzer run of each fuzzer (the three parsers and a
# whole checkpoint root; scripts/fuzz.sh fuzzes for longer).
#   FUZZ_SECONDS  seconds per fuzzer (default 30)
set -euo pipefail
cd "$(dirname "$0")/.."
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
start=$SECONDS
step() { printf '\n=== %s (at %d min %02d s) ===\n' "$*" $(((SECONDS - start) / 60)) $(((SECONDS - start) % 60)); }

step "dependencies"
bash scripts/deps.sh

step "release build + CTest"
bash scripts/build.sh release
(cd build && ctest --output-on-failure -j2 --timeout 900)

step "Python package: pip install ."
bash scripts/install_python.sh

step "pytest: Python API (1 and 4 gloo processes), DCP adapter, example, interop, CLI"
SHARDSAFE_BIN="$PWD/build/shardsafe" python3 -m pytest -q -W ignore::UserWarning tests/python

step "ASan + UBSan"
bash scripts/build.sh asan
(cd build-asan && ASAN_OPTIONS=detect_leaks=1 ctest --output-on-failure -j2 --timeout 1800)

step "TSan (thread pool, comm, storage)"
bash scripts/build.sh tsan
for t in ss_base_test ss_comm_test ss_storage_test; do
  TSAN_OPTIONS=halt_on_error=1 build-tsan/$t --gtest_brief=1
done

step "libFuzzer smoke run"
bash scripts/build.sh fuzz
fuzz() {  # fuzz NAME CORPUS [flags]: new inputs go to a scratch dir, seeds stay untouched
  local work log; work=$(mktemp -d); log=$(mktemp)
  if ! "build-fuzz/$1" -max_total_time="${FUZZ_SECONDS:-30}" -print_final_stats=1 "${@:3}" \
      "$work" "fuzz/corpus/$2" >"$log" 2>&1; then
    tail -40 "$log"; echo "fuzzer $1 failed" >&2; exit 1
  fi
  echo "$1: $(grep -E 'stat::number_of_executed_units' "$log" | awk '{print $2}') runs, no crash"
  rm -rf "$work" "$log"
}
fuzz safetensors_header_fuzzer safetensors -dict=fuzz/safetensors_header.dict
fuzz index_fuzzer index
fuzz package_records_fuzzer package_records -dict=fuzz/package_records.dict
fuzz checkpoint_dir_fuzzer checkpoint_dir -dict=fuzz/checkpoint_dir.dict

step "all tests passed"
