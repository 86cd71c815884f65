#!/usr/bin/env bash
# Session 17 call J: test_golden_runner on CUDA with main's final kernels (graph + async decode = eager).
set -u
C="$PWD/.carry-lead"; OUT0="${OUT:-/tmp/out}"; mkdir -p "$OUT0"
mkdir -p "$C/g" && tar -C "$C/g" -xJf "$C/bin.tar.xz"
export LD_LIBRARY_PATH="/usr/local/cuda/lib64:/usr/local/cuda/targets/x86_64-linux/lib:${LD_LIBRARY_PATH:-}"
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; } | tee "$OUT0/env.log"
DEEPINFER_ACCELERATOR=cuda DEEPINFER_BACKEND=cuda timeout -k 5 90 "$C/g/bin/test_golden_runner" > "$OUT0/golden_runner.log" 2>&1; echo "rc $?"
grep -E "^\[       OK|^\[  PASSED|^\[  FAILED|SKIP" "$OUT0/golden_runner.log" | tail -8
