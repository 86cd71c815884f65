#!/usr/bin/env bash
# Session 17 call I: the MoE router (BF16, N <= 256, few rows) on the resident GEMM kernel.
# (1) parity SYNC / no SYNC; (2) A/B base (main e5bfb1e) / new, bf16 + fp8, batches 1,8 x3, 32,64 x2.
set -u
C="$PWD/.carry-lead"
OUT0="${OUT:-/tmp/out}"; mkdir -p "$OUT0"
OUT=/tmp/s17i; mkdir -p "$OUT"
pack() { tar -C "$OUT" -cJf "$OUT0/results.tar.xz.tmp" . && mv "$OUT0/results.tar.xz.tmp" "$OUT0/results.tar.xz"; }
trap pack EXIT
mkdir -p "$C/g" && tar -C "$C/g" -xJf "$C/bin.tar.xz"
B="$C/g/bin"
export LD_LIBRARY_PATH="/usr/local/cuda/lib64:/usr/local/cuda/targets/x86_64-linux/lib:${LD_LIBRARY_PATH:-}"
t0=$(date +%s)
ts() { echo "[$(date -u +%H:%M:%S) +$(( $(date +%s) - t0 ))s]"; }
left() { echo $(( ${BUDGET:-200} - ($(date +%s) - t0) )); }
{ date -u; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,power.limit --format=csv; } > "$OUT/env.log" 2>&1
cat "$OUT/env.log"
echo "$(ts) == parity (SYNC)"
DEEPINFER_CUDA_SYNC=1 timeout -k 5 90 "$B/test_ops" --gtest_filter='DenseOps.*:AttentionMoe.DecodeStepPdl*:AttentionMoe.SideLine*:AttentionMoe.BatchInvariant*' > "$OUT/parity.log" 2>&1; echo "rc $?"
grep -E "^\[  PASSED|^\[  FAILED" "$OUT/parity.log" | tail -6
grep -m3 -A8 "Failure" "$OUT/parity.log" | head -20
timeout -k 5 60 "$B/test_ops" --gtest_filter='AttentionMoe.DecodeStepPdl*:DenseOps.PipeDensePdl*' --gtest_repeat=2 > "$OUT/parity_nosync.log" 2>&1; echo "no-SYNC rc $?"
grep -E "^\[  PASSED|^\[  FAILED" "$OUT/parity_nosync.log" | sort | uniq -c | tail -3
pack
ab() {  # rounds batches
  for round in $(seq 1 $1); do
    arms="base new"; [[ $((round % 2)) == 0 ]] && arms="new base"
    for dt in bf16 fp8; do
      f=""; [[ $dt == fp8 ]] && f="--fp8"
      for arm in $arms; do
        [[ $(left) -lt 15 ]] && { echo "$(ts) out of time"; return; }
        lg="$OUT/ab_${arm}_${dt}_b${2//,/-}_r${round}.log"
        timeout -k 5 40 "$B/deepinfer_cuda_bench_$arm" $f --graphs --decode-only --decode-batches $2 --out "$OUT/ab_${arm}.jsonl" > "$lg" 2>&1
        echo "$(ts) r$round $dt $arm: $(grep graph "$lg" | awk '{printf "b%s %sms | ", $5, $11}')"
      done
    done
    pack
  done
}
ab 3 1,8
ab 2 32,64
echo "$(ts) done"
