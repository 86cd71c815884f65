#!/usr/bin/env bash
# fp8dec17 follow-up (not run by fp8dec17: its one call is spent): test_ops of 7afe0b5 (main's FP8
# conversion, the corrected Fp8Ops.EveryE4m3CodeExactInStreamingKernels), ~30 s.
set -u
C="$PWD/.carry-fp8dec17"; OUT0="${OUT:-/tmp/out}"; mkdir -p "$OUT0" "$C/g"
tar -C "$C/g" -xJf "$C/bin2.tar.xz"
export LD_LIBRARY_PATH="/usr/local/cuda/lib64:/usr/local/cuda/targets/x86_64-linux/lib:${LD_LIBRARY_PATH:-}"
DEEPINFER_CUDA_SYNC=1 timeout -k 5 90 "$C/g/bin/test_ops" \
  --gtest_filter='Fp8Ops.*:AttentionMoe.PipeExperts*:AttentionMoe.MoeExperts:DenseOps.PipeDense*' > "$OUT0/parity2.log" 2>&1
echo "rc $?"; grep -E "^\[  (PASSED|FAILED)|FAILED|OK \]" "$OUT0/parity2.log" | tail -14
