#!/usr/bin/env bash
# fp8dec17b (no call of its own; for the lead's merged-main call, ~150 s): parity of the lean
# pipeline kernel (CudaOptions::pipe_lean) with DEEPINFER_CUDA_SYNC=1, then the interleaved A/B of
# one bench binary: plain, --pipe-lean, --pipe-blocks 4 (ARMS), bf16 and FP8, 2 rounds (order
# reversed in round 2).
# Usage: bash run.sh BIN_DIR   (BIN_DIR holds test_ops and deepinfer_cuda_bench); results in $OUT.
set -u
B="${1:?bin dir with test_ops and deepinfer_cuda_bench}"
OUT0="${OUT:-/tmp/out}"; mkdir -p "$OUT0"
export LD_LIBRARY_PATH="/usr/local/cuda/lib64:/usr/local/cuda/targets/x86_64-linux/lib:${LD_LIBRARY_PATH:-}"
t0=$(date +%s)
echo "== parity (SYNC)"
DEEPINFER_CUDA_SYNC=1 timeout -k 5 60 "$B/test_ops" \
  --gtest_filter='AttentionMoe.PipeExpertsBitsEqualStreamKernel:DenseOps.PipeDense*:AttentionMoe.MoeExperts*' \
  > "$OUT0/fp8dec17b_parity.log" 2>&1
echo "rc $?"; grep -E "^\[  (PASSED|FAILED)|FAILED|tests ran" "$OUT0/fp8dec17b_parity.log" | tail -8
echo "== A/B $(( $(date +%s) - t0 ))s"
ARMS="${ARMS:-plain lean blocks4}"  # plain, lean (--pipe-lean), blocks4 (--pipe-blocks 4), leanblocks4
for round in 1 2; do
  arms="$ARMS"; [[ $round == 2 ]] && arms="$(echo $ARMS | tr ' ' '\n' | tac | tr '\n' ' ')"
  for dt in bf16 fp8; do
    f=""; [[ $dt == fp8 ]] && f="--fp8"
    for arm in $arms; do
      case $arm in
        lean) extra="--pipe-lean" ;;
        blocks4) extra="--pipe-blocks 4" ;;
        leanblocks4) extra="--pipe-lean --pipe-blocks 4" ;;
        *) extra="" ;;
      esac
      log="$OUT0/fp8dec17b_ab_${arm}_${dt}_r${round}.log"
      timeout -k 5 30 "$B/deepinfer_cuda_bench" $f --graphs --decode-only $extra \
        --out "$OUT0/fp8dec17b_ab_${arm}.jsonl" > "$log" 2>&1
      echo "r$round $dt $arm: $(grep graph "$log" | awk '{printf "b%s %sms | ", $5, $11}')"
    done
  done
done
echo "done $(( $(date +%s) - t0 ))s"
