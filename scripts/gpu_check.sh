#!/usr/bin/env bash
# Builds the Python package and runs the CUDA tests (tests/gpu) and the CUDA
# bandwidth benchmark on a GPU machine that lacks the Debian dev packages.
#
#   scripts/gpu_check.sh [DEPS]     DEPS default: .gpu-carry
#
# DEPS holds what the build needs, copied from a Debian 12 machine by
# scripts/gpu_carry.sh (the headers, the shared libraries and the libraries
# they load, CMake package files, and the build backend's wheels). The package is installed into
# a private folder ($GPU_SITE, default /tmp/shardsafe-gpu-site), never into
# the environment. PYTHON (default python3), BENCH=0 skips the benchmark,
# PYTEST_ARGS adds pytest arguments.
set -euo pipefail
cd "$(dirname "$0")/.."
DEPS=$(realpath "${1:-.gpu-carry}")
PY=${PYTHON:-python3}
SITE=${GPU_SITE:-/tmp/shardsafe-gpu-site}
BUILD=${GPU_BUILD_DIR:-/tmp/shardsafe-gpu-build}
P=$DEPS/prefix

rm -rf "$SITE" && mkdir -p "$SITE"
export PYTHONPATH=$SITE${PYTHONPATH:+:$PYTHONPATH}
if compgen -G "$DEPS/wheels/*.whl" >/dev/null; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --target "$SITE" "$DEPS"/wheels/*.whl
fi
"$PY" - <<'PY'
import sys, torch, nanobind, scikit_build_core
print(f"python {sys.version.split()[0]}, torch {torch.__version__} (CUDA {torch.version.cuda}, "
      f"available: {torch.cuda.is_available()}), nanobind {nanobind.__version__}, "
      f"scikit-build-core {scikit_build_core.__version__}")
PY

export LD_LIBRARY_PATH=$P/lib:$P/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export CMAKE_ARGS="-DISAL_INCLUDE_DIR=$P/include -DISAL_LIBRARY=$P/lib/libisal.so \
-Dnlohmann_json_DIR=$P/share/cmake/nlohmann_json -DCLI11_DIR=$P/share/cmake/CLI11 \
-DRE2_INCLUDE_DIR=$P/include -DRE2_LIBRARY=$P/lib/libre2.so \
-DSIMDJSON_INCLUDE_DIR=$P/include -DSIMDJSON_LIBRARY=$P/lib/libsimdjson.so \
-DCURL_NO_CURL_CMAKE=ON -DCURL_INCLUDE_DIR=$P/include -DCURL_LIBRARY=$P/lib/libcurl.so \
-DOPENSSL_INCLUDE_DIR=$P/include -DOPENSSL_CRYPTO_LIBRARY=$P/lib/libcrypto.so \
-DOPENSSL_SSL_LIBRARY=$P/lib/libssl.so -Dpugixml_DIR=$P/lib/x86_64-linux-gnu/cmake/pugixml"
echo "=== build: pip install (no build isolation) into $SITE"
"$PY" -m pip install -q --no-build-isolation --no-deps --no-compile --target "$SITE" \
  -C build-dir="$BUILD" .
"$PY" -c "import shardsafe, os; print('shardsafe from', os.path.dirname(shardsafe.__file__))"

echo "=== pytest tests/gpu"
status=0
# shellcheck disable=SC2086
"$PY" -m pytest -v -p no:cacheprovider tests/gpu ${PYTEST_ARGS:-} || status=$?

if [[ ${BENCH:-1} != 0 ]]; then
  echo "=== benchmark"
  "$PY" tests/gpu/bench_cuda.py || status=$?
fi
exit $status
