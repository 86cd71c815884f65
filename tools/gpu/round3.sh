#!/usr/bin/env bash
# Round 3 of issue #4 (decode latency at batch 1/8), one device call (carry: ["build-gpu"]):
#   1. per-op eager profile (CUDA events around each op) at batch 1 and 8, bf16 and fp8
#   2. decode A/B with graphs, two interleaved reps: paged-attention chunk 16 vs 64
#      (DEEPINFER_CUDA_ATTN_CHUNK), fused vs unfused MLA ops (--unfused-mla), fp8
#   3. parity (tests/ops) with DEEPINFER_CUDA_SYNC=1 in the remaining time
# Logs in $OUT; a short table last.
root="$(cd "$(dirname "$0")/../.." && pwd)"
OUT="${OUT:-/tmp/deepinfer_out}"; mkdir -p "$OUT"
export LD_LIBRARY_PATH="/usr/local/cuda/lib64:/usr/local/cuda/targets/x86_64-linux/lib:${LD_LIBRARY_PATH:-}"
b="$root/build-gpu/bin"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > "$OUT/env.log" 2>&1
timeout 30 "$b/deepinfer_cuda_bench" --profile > "$OUT/profile_bf16.log" 2>&1
timeout 30 "$b/deepinfer_cuda_bench" --profile --fp8 > "$OUT/profile_fp8.log" 2>&1
for rep in 1 2; do
  for arm in "16 bf16 fused" "64 bf16 fused" "16 bf16 unfused" "16 fp8 fused" "64 fp8 fused"; do
    set -- $arm
    args="--graphs --decode-only"
    [[ $2 == fp8 ]] && args="$args --fp8"
    [[ $3 == unfused ]] && args="$args --unfused-mla"
    DEEPINFER_CUDA_ATTN_CHUNK=$1 timeout 40 "$b/deepinfer_cuda_bench" $args --out "$OUT/ab.jsonl" 2>&1 |
      grep graph | sed "s/^/rep $rep chunk $1 $3: /" | cut -c1-112
  done
done > "$OUT/ab.log"
DEEPINFER_CUDA_SYNC=1 timeout "${PARITY_S:-100}" "$b/test_ops" > "$OUT/parity.log" 2>&1
echo "parity rc $?"
grep -E "^\[  FAILED  \]|Failure" "$OUT/parity.log" | head -20
grep -E "PASSED|FAILED  \] [0-9]" "$OUT/parity.log"
cat "$OUT/env.log" "$OUT/profile_bf16.log" "$OUT/profile_fp8.log" "$OUT/ab.log"
