#!/usr/bin/env bash
# Every test, from a fresh clone: dependencies, release build + CTest
# (GoogleTest and 4-rank MPI tests), pytest interop and CLI tests, an
# ASan+UBSan build running all unit tests, a TSan build of the threaded
# modules, and a short libFuzzer run of each parser fuzzer.
#   FUZZ_SECONDS  seconds per fuzzer (default 30)
set -euo pipefail
cd "$(dirname "$0")/.."
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
step() { printf '\n=== %s ===\n' "$*"; }

step "dependencies"
bash scripts/deps.sh

step "release build + CTest"
bash scripts/build.sh release
(cd build && ctest --output-on-failure -j2 --timeout 900)

step "pytest: interop with safetensors, command-line tool"
SHARDSAFE_BIN="$PWD/build/shardsafe" python3 -m pytest -q tests/python

step "ASan + UBSan"
bash scripts/build.sh asan
(cd build-asan && ASAN_OPTIONS=detect_leaks=1 ctest --output-on-failure -j2 --timeout 1800)

step "TSan (thread pool, comm, storage, engine)"
bash scripts/build.sh tsan
for t in ss_base_test ss_comm_test ss_storage_test ss_engine_test; do
  TSAN_OPTIONS=halt_on_error=1 build-tsan/$t --gtest_brief=1
done

step "libFuzzer smoke run"
bash scripts/build.sh fuzz
for f in build-fuzz/*_fuzzer; do
  corpus=fuzz/corpus/$(basename "$f" _fuzzer | sed 's/_header//')
  work=$(mktemp -d)
  "$f" -max_total_time="${FUZZ_SECONDS:-30}" -print_final_stats=1 "$work" "$corpus" 2>&1 | tail -3
  rm -rf "$work"
done

step "all tests passed"
