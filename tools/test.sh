#!/usr/bin/env bash
# Every test: warnings-as-errors build + unit/golden/e2e tests, the same again
# under AddressSanitizer + UndefinedBehaviorSanitizer, bounded fuzzing, and a
# compile of the CUDA backend (sm_90a) when nvcc is present. CI runs exactly this.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
"$root/tools/setup.sh"
jobs="$(nproc)"
step() { echo; echo "=== $* ==="; }

step "build (-Werror)"
BUILD_DIR="$root/build/ci" "$root/tools/build.sh" -DDEEPINFER_WERROR=ON -DDEEPINFER_CUDA=OFF
step "tests"
ctest --test-dir "$root/build/ci" --output-on-failure -j "$jobs" --timeout 900

step "Python package (wheel built in a fresh virtual environment, tests/python)"
# pip builds the core again through scikit-build-core (Release, PIC, CPU only): the wheel a user
# gets from `pip install ./python`, not the test build above.
rm -rf "$root/build/pyvenv"
python3 -m venv "$root/build/pyvenv"
"$root/build/pyvenv/bin/pip" install --quiet --upgrade pip
CMAKE_BUILD_PARALLEL_LEVEL="$jobs" "$root/build/pyvenv/bin/pip" install --quiet "$root/python[test]" \
  -Ccmake.define.DEEPINFER_CUDA=OFF -Cbuild-dir="$root/build/pywheel"
(cd "$root/tests/python" && DEEPINFER_CLI="$root/build/ci/app/deepinfer" \
  "$root/build/pyvenv/bin/python" -m pytest -q -p no:cacheprovider .)

step "tests under ASan + UBSan"
BUILD_DIR="$root/build/asan" BUILD_TYPE=Debug "$root/tools/build.sh" -DDEEPINFER_WERROR=ON \
  -DDEEPINFER_SANITIZE=ON -DDEEPINFER_CUDA=OFF -DDEEPINFER_BENCH=OFF
ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
  ctest --test-dir "$root/build/asan" --output-on-failure -j "$jobs" --timeout 1800 -LE slow

if [[ -x "$root/tests/fuzz/run.sh" ]]; then
  step "fuzz (bounded)"
  "$root/tests/fuzz/run.sh" "$root/build/fuzz"
fi

if command -v nvcc >/dev/null 2>&1 || [[ -x /usr/local/cuda/bin/nvcc ]]; then
  step "CUDA backend compile (sm_90a)"
  export PATH="$PATH:/usr/local/cuda/bin"
  # The backend library holds every CUDA source, dist/ the NCCL communicator; the rest is the
  # same host code built above.
  TARGETS="deepinfer_backend_cuda deepinfer_backend deepinfer_dist" BUILD_DIR="$root/build/cuda" \
    "$root/tools/build.sh" -DDEEPINFER_WERROR=ON -DDEEPINFER_CUDA=ON -DDEEPINFER_TESTS=OFF \
    -DDEEPINFER_BENCH=OFF
fi
echo; echo "all tests passed"
