#!/usr/bin/env bash
# Rewrites one platform's entry of tests/models/ppl_baselines.json after a CONFIRMED numeric
# change (a kernel's reduction order, a weight-format fix): the baselines are compared bit for
# bit, so any change of the forward shows up there first. Say in the commit why the numbers moved.
#   tools/refresh_ppl_baselines.sh [BUILD_DIR] [platform]
#     cpu (default):                      the CPU backend, 2 threads (as the ctest ppl_baseline_cpu)
#     cuda-batch-invariant (H200 script): --backend cuda --batch-invariant
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="${1:-$root/build/ci}"
platform="${2:-cpu}"
case "$platform" in
  cpu) flags=(--backend cpu --threads 2) ;;
  cuda-batch-invariant) flags=(--backend cuda --batch-invariant) ;;
  *) echo "refresh_ppl_baselines: unknown platform '$platform' (cpu | cuda-batch-invariant)" >&2; exit 2 ;;
esac
"$build/app/deepinfer" eval ppl "${flags[@]}" --texts "$root/tests/models/ppl_texts.jsonl" \
  --baseline "$root/tests/models/ppl_baselines.json" --platform "$platform" --write-baseline
git -C "$root" diff --stat -- tests/models/ppl_baselines.json
