#!/usr/bin/env bash
# Bounded fuzzing: builds the libFuzzer targets with clang into BUILD (default
# build/fuzz), libraries instrumented for coverage, and runs every fuzz_* binary for
# FUZZ_SECONDS (default 30) each, from its corpus plus tests/fuzz/seeds/<target>/ when present.
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
build="${1:-$root/build/fuzz}"
seconds="${FUZZ_SECONDS:-30}"
cxx="$(command -v clang++-14 || command -v clang++)"
cc="$(command -v clang-14 || command -v clang)"
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_COMPILER="$cxx" \
  -DCMAKE_C_COMPILER="$cc" -DDEEPINFER_FUZZ=ON \
  -DCMAKE_CXX_FLAGS="-fsanitize=fuzzer-no-link,address,undefined -fno-omit-frame-pointer" -DDEEPINFER_CUDA=OFF -DDEEPINFER_BENCH=OFF \
  -DDEEPINFER_TESTS=ON >/dev/null
targets=$(grep -ho 'deepinfer_fuzz(fuzz_[a-z0-9_]*' "$root"/tests/fuzz/CMakeLists.txt | sed 's/deepinfer_fuzz(//')
[[ -n "$targets" ]] || { echo "no fuzz targets"; exit 0; }
cmake --build "$build" -j "$(nproc)" --target $targets
for t in $targets; do
  corpus="$build/corpus/$t"
  mkdir -p "$corpus"
  echo "fuzzing $t for ${seconds}s"
  seeds=()  # committed seed inputs, read only
  [[ -d "$root/tests/fuzz/seeds/$t" ]] && seeds=("$root/tests/fuzz/seeds/$t")
  "$build/tests/fuzz/$t" -max_total_time="$seconds" -max_len=65536 -timeout=10 "$corpus" ${seeds[@]+"${seeds[@]}"}
done
