#!/usr/bin/env bash
# Copies what scripts/gpu_check.sh needs to build the package on a GPU machine
# that lacks the Debian dev packages, from this Debian 12 machine (where
# scripts/deps.sh has run) into DEPS (default .gpu-carry, which git ignores):
#
#   DEPS/prefix/include   ISA-L, nlohmann-json, CLI11, RE2, simdjson, curl, OpenSSL, pugixml
#   DEPS/prefix/lib       their shared libraries, and every library libcurl loads
#                         except glibc's own (the GPU machine may lack them)
#   DEPS/prefix/lib/x86_64-linux-gnu/{libpugixml*, cmake/pugixml}
#   DEPS/prefix/share/cmake/{nlohmann_json,CLI11}
#   DEPS/wheels           scikit-build-core and nanobind as pinned in pyproject.toml
#
#   scripts/gpu_carry.sh [DEPS]
set -euo pipefail
cd "$(dirname "$0")/.."
DEPS=${1:-.gpu-carry}
L=/usr/lib/x86_64-linux-gnu
P=$DEPS/prefix
rm -rf "$DEPS" && mkdir -p "$P/include/openssl" "$P/lib/x86_64-linux-gnu/cmake" "$P/share/cmake"

cp -r /usr/include/isa-l /usr/include/isa-l.h /usr/include/nlohmann /usr/include/CLI \
      /usr/include/re2 /usr/include/simdjson.h /usr/include/pugixml.hpp \
      /usr/include/pugiconfig.hpp /usr/include/x86_64-linux-gnu/curl "$P/include/"
cp -r /usr/include/openssl/. /usr/include/x86_64-linux-gnu/openssl/. "$P/include/openssl/"
for lib in libisal.so libisal.so.2 libre2.so libre2.so.9 libsimdjson.so libsimdjson.so.14 \
           libcurl.so libcurl.so.4 libcrypto.so libssl.so; do
  cp -L "$L/$lib" "$P/lib/"
done
# libcurl's own dependencies, glibc's libraries excepted.
ldd "$L/libcurl.so.4" | awk '$3 ~ /^\// {print $3}' |
  grep -Ev '/(libc|libm|libdl|libpthread|libresolv|librt)\.so' |
  while read -r dep; do cp -L "$dep" "$P/lib/"; done
cp -L "$L/libpugixml.so.1.13" "$L/libpugixml.so.1" "$L/libpugixml.a" "$P/lib/x86_64-linux-gnu/"
cp -r "$L/cmake/pugixml" "$P/lib/x86_64-linux-gnu/cmake/"
cp -r /usr/share/cmake/nlohmann_json /usr/share/cmake/CLI11 "$P/share/cmake/"

pin() { grep -o "\"$1[=<>]=*[0-9.]*" pyproject.toml | head -1 | tr -d '"'; }
python3 -m pip download -q --no-deps --only-binary=:all: -d "$DEPS/wheels" \
  "$(pin scikit-build-core)" "$(pin nanobind)"
du -sh "$DEPS"
