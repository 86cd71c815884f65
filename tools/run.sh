#!/usr/bin/env bash
# The main job: set up, build, and generate with the embedded default model.
# Usage: tools/run.sh [generate flags...]   (default prompt: "def fibonacci(n):")
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
"$root/tools/setup.sh"
"$root/tools/build.sh" -DDEEPINFER_TESTS=OFF -DDEEPINFER_BENCH=OFF
if (($# == 0)); then set -- --prompt "def fibonacci(n):" --max-tokens 64 --temperature 0; fi
exec "${BUILD_DIR:-$root/build}/app/deepinfer" generate "$@"
