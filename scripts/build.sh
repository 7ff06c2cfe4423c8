#!/usr/bin/env bash
# Configures and builds one flavour of shardsafe.
#   scripts/build.sh            release build in build/ (with MPI)
#   scripts/build.sh asan       ASan+UBSan build in build-asan/ (no MPI)
#   scripts/build.sh tsan       TSan build in build-tsan/ (thread pool, comm, storage tests)
#   scripts/build.sh fuzz       clang-16 libFuzzer targets in build-fuzz/
set -euo pipefail
cd "$(dirname "$0")/.."
flavour=${1:-release}
jobs=${JOBS:-$(nproc)}
case "$flavour" in
  release)
    cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
    ninja -C build -j"$jobs" ;;
  asan)
    cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=Debug -DSHARDSAFE_MPI=OFF \
      -DSHARDSAFE_BENCH=OFF -DSHARDSAFE_SANITIZE=address,undefined >/dev/null
    ninja -C build-asan -j"$jobs" ;;
  tsan)
    cmake -S . -B build-tsan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSHARDSAFE_MPI=OFF \
      -DSHARDSAFE_BENCH=OFF -DSHARDSAFE_SANITIZE=thread >/dev/null
    ninja -C build-tsan -j"$jobs" ss_base_test ss_comm_test ss_storage_test ;;
  fuzz)
    # A build-fuzz/ configured with another compiler (clang 14) starts afresh.
    grep -qs 'CMAKE_CXX_COMPILER:[A-Z]*=.*clang++-16$' build-fuzz/CMakeCache.txt ||
      rm -rf build-fuzz/CMakeCache.txt build-fuzz/CMakeFiles
    # Only the fuzzers and what they link; line tables are all the debug
    # information a sanitizer's stack trace needs, and compile faster than -g.
    cmake -S . -B build-fuzz -G Ninja -DCMAKE_CXX_COMPILER=clang++-16 -DSHARDSAFE_FUZZ=ON \
      -DSHARDSAFE_TESTS=OFF -DSHARDSAFE_BENCH=OFF -DSHARDSAFE_MPI=OFF \
      -DCMAKE_BUILD_TYPE=RelWithDebInfo \
      -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O2 -gline-tables-only -DNDEBUG" >/dev/null
    ninja -C build-fuzz -j"$jobs" safetensors_header_fuzzer index_fuzzer package_records_fuzzer \
      checkpoint_dir_fuzzer checkpoint_dir_seeds ;;
  *) echo "unknown flavour: $flavour" >&2; exit 2 ;;
esac
