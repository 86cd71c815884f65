#!/usr/bin/env bash
# Session 17 call D: (1) parity with SYNC (attention incl. the sparse chunk rule, MoE incl. 32-column
# BF16 items, dense pipes) and without SYNC; golden runner on CUDA; (2) interleaved A/B of
# --pipe-wide 0 (main) / 1 (default: 32-column BF16 items when they fit one round) / 2 (always), bf16,
# batches 1,8 three rounds, 32,64 two; (3) ncu of one eager batch-1 step with the default (warm caches).
set -u
C="$PWD/.carry-lead"
OUT0="${OUT:-/tmp/out}"; mkdir -p "$OUT0"
OUT=/tmp/s17d; mkdir -p "$OUT"
pack() { tar -C "$OUT" -cJf "$OUT0/results.tar.xz.tmp" . && mv "$OUT0/results.tar.xz.tmp" "$OUT0/results.tar.xz"; }
trap pack EXIT
mkdir -p "$C/g" && tar -C "$C/g" -xJf "$C/bin.tar.xz"
B="$C/g/bin"
export LD_LIBRARY_PATH="$C/lib:/usr/local/cuda/lib64:/usr/local/cuda/targets/x86_64-linux/lib:${LD_LIBRARY_PATH:-}"
t0=$(date +%s)
ts() { echo "[$(date -u +%H:%M:%S) +$(( $(date +%s) - t0 ))s]"; }
left() { echo $(( ${BUDGET:-330} - ($(date +%s) - t0) )); }
{ date -u; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,power.limit --format=csv; } > "$OUT/env.log" 2>&1
cat "$OUT/env.log"
F='AttentionMoe.*:SparseAttention.*:DenseOps.Pipe*:MlaAbsorbed.*'
echo "$(ts) == parity (SYNC)"
DEEPINFER_CUDA_SYNC=1 timeout -k 5 120 "$B/test_ops" --gtest_filter="$F" > "$OUT/parity.log" 2>&1; echo "rc $?"
grep -E "^\[  PASSED|^\[  FAILED" "$OUT/parity.log" | tail -8
grep -m3 -A8 "Failure" "$OUT/parity.log" | head -30
echo "$(ts) == parity (no SYNC, x2)"
timeout -k 5 60 "$B/test_ops" --gtest_filter='AttentionMoe.PipeExperts*:AttentionMoe.PipeSwiglu*:AttentionMoe.DecodeStepPdl*:AttentionMoe.SideLine*' --gtest_repeat=2 \
  > "$OUT/parity_nosync.log" 2>&1; echo "no-SYNC rc $?"
grep -E "^\[  PASSED|^\[  FAILED" "$OUT/parity_nosync.log" | sort | uniq -c | tail -4
echo "$(ts) == golden runner (cuda)"
DEEPINFER_ACCELERATOR=cuda DEEPINFER_BACKEND=cuda timeout -k 5 90 "$B/test_golden_runner" > "$OUT/golden_runner.log" 2>&1; echo "golden runner rc $?"
grep -E "^\[  PASSED|^\[  FAILED" "$OUT/golden_runner.log" | tail -3
pack
ab() {  # rounds batches
  for round in $(seq 1 $1); do
    arms="0 1 2"; [[ $((round % 2)) == 0 ]] && arms="2 1 0"
    for arm in $arms; do
      [[ $(left) -lt 25 ]] && { echo "$(ts) out of time, stop A/B"; return; }
      lg="$OUT/ab_w${arm}_bf16_b${2//,/-}_r${round}.log"
      timeout -k 5 40 "$B/deepinfer_cuda_bench" --pipe-wide $arm --graphs --decode-only --decode-batches $2 \
        --out "$OUT/ab_w${arm}.jsonl" > "$lg" 2>&1
      echo "$(ts) r$round wide $arm: $(grep graph "$lg" | awk '{printf "b%s %sms | ", $5, $11}')"
    done
    pack
  done
}
echo "$(ts) == A/B, batches 1,2,8"
ab 3 1,2,8
echo "$(ts) == A/B, batches 32,64"
ab 2 32,64
NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
if [[ -n "$NCU" && $(left) -gt 30 ]]; then
  echo "$(ts) == ncu: one eager step, batch 1 bf16, default (wide 1), warm caches"
  timeout -k 5 $(( $(left) - 5 )) "$NCU" --profile-from-start off --cache-control none --clock-control none \
    --metrics gpu__time_duration.sum,dram__bytes_read.sum,launch__grid_size,launch__block_size,launch__registers_per_thread \
    --csv "$B/deepinfer_cuda_bench" --ncu-steps 1 > "$OUT/ncu_b1.csv" 2> "$OUT/ncu.err"; echo "ncu rc $?"
  xz -9 "$OUT/ncu_b1.csv"
fi
echo "$(ts) done"
