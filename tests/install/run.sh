#!/usr/bin/env bash
# Installs the build in BUILD into a scratch prefix and builds the README's
# C++ examples (tests/install/extract_readme.py) against it, as an outside
# project would: with CMake (find_package(shardsafe)) under g++ and
# clang++-16, and with pkg-config under mpicxx. Each must link against the
# installed libraries, not the build tree; a C++-only project (no C
# language) must find the package without MPI and, with the mpi component,
# link a program that includes <mpi.h> first; both run. Then shardsafe as a
# subproject (add_subdirectory) must configure without GoogleTest.
#   tests/install/run.sh BUILD
set -euo pipefail
build=$(realpath "$1")
src=$(cd "$(dirname "$0")/../.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
prefix=$work/prefix
uses_installed() {  # ldd's whole output first: grep -q would cut its pipe (pipefail)
  local libs
  libs=$(ldd "$1")
  grep -q "$prefix/lib/libshardsafe.so" <<<"$libs" ||
    { echo "$1 does not use the installed libshardsafe.so" >&2; exit 1; }
}
cmake --install "$build" --prefix "$prefix" >/dev/null
python3 "$src/tests/install/extract_readme.py" "$src/README.md" "$work/readme_examples.cc"
for cxx in g++ clang++-16; do
  echo "== CMake package, $cxx"
  cmake -S "$src/tests/install" -B "$work/build-$cxx" -DCMAKE_CXX_COMPILER="$cxx" \
        -DCMAKE_PREFIX_PATH="$prefix" -DEXAMPLES="$work/readme_examples.cc" >/dev/null
  cmake --build "$work/build-$cxx"
  uses_installed "$work/build-$cxx/readme_examples"
done
echo "== CMake package from a C++-only project, without MPI (never looked for)"
cmake -S "$src/tests/install/cxx_only" -B "$work/build-cxx-only" -DCMAKE_PREFIX_PATH="$prefix" \
      -DCMAKE_DISABLE_FIND_PACKAGE_MPI=ON --no-warn-unused-cli >/dev/null
cmake --build "$work/build-cxx-only"
uses_installed "$work/build-cxx-only/app"
mkdir "$work/saved"
"$work/build-cxx-only/app" "$work/saved"
echo "== CMake package from a C++-only project, the mpi component, <mpi.h> included first"
cmake -S "$src/tests/install/cxx_only" -B "$work/build-cxx-mpi" -DCMAKE_PREFIX_PATH="$prefix" \
      -DWITH_MPI=ON >/dev/null
cmake --build "$work/build-cxx-mpi"
uses_installed "$work/build-cxx-mpi/app"
"$work/build-cxx-mpi/app"
echo "== pkg-config, mpicxx"
flags=$(PKG_CONFIG_PATH="$prefix/lib/pkgconfig" pkg-config --cflags --libs shardsafe-mpi)
# shellcheck disable=SC2086  # the flags are words
mpicxx -std=c++20 "$work/readme_examples.cc" $flags -Wl,-rpath,"$prefix/lib" -o "$work/pc_examples"
uses_installed "$work/pc_examples"
echo "== add_subdirectory, without GoogleTest"
mkdir "$work/outer"
printf 'cmake_minimum_required(VERSION 3.24)\nproject(outer LANGUAGES C CXX)\nadd_subdirectory(%s shardsafe)\n' \
  "$src" >"$work/outer/CMakeLists.txt"
cmake -S "$work/outer" -B "$work/outer-build" -DCMAKE_DISABLE_FIND_PACKAGE_GTest=ON >/dev/null
echo "README examples build against the installed package; the subproject configures"
