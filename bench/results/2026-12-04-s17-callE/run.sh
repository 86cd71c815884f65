#!/usr/bin/env bash
# Session 17 call E: the MoE routing's top-k by warp reductions and the index kernel's lists by warp
# scans (main + those) against main (call D's binary with --pipe-wide 0: main's kernels).
# (1) parity SYNC + no SYNC, golden runner; (2) interleaved A/B old/new, bf16 + fp8, batches 1,8 x3,
# 32,64 x2; (3) ncu of the routing and index kernels (new), one eager batch-1 step; (4) ablate new bf16 b1.
set -u
C="$PWD/.carry-lead"
OUT0="${OUT:-/tmp/out}"; mkdir -p "$OUT0"
OUT=/tmp/s17e; mkdir -p "$OUT"
pack() { tar -C "$OUT" -cJf "$OUT0/results.tar.xz.tmp" . && mv "$OUT0/results.tar.xz.tmp" "$OUT0/results.tar.xz"; }
trap pack EXIT
mkdir -p "$C/g" && tar -C "$C/g" -xJf "$C/bin.tar.xz"
B="$C/g/bin"
export LD_LIBRARY_PATH="$C/lib:/usr/local/cuda/lib64:/usr/local/cuda/targets/x86_64-linux/lib:${LD_LIBRARY_PATH:-}"
t0=$(date +%s)
ts() { echo "[$(date -u +%H:%M:%S) +$(( $(date +%s) - t0 ))s]"; }
left() { echo $(( ${BUDGET:-300} - ($(date +%s) - t0) )); }
{ date -u; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,power.limit --format=csv; } > "$OUT/env.log" 2>&1
cat "$OUT/env.log"
echo "$(ts) == parity (SYNC)"
DEEPINFER_CUDA_SYNC=1 timeout -k 5 120 "$B/test_ops" --gtest_filter='AttentionMoe.*:DenseOps.Pipe*' > "$OUT/parity.log" 2>&1; echo "rc $?"
grep -E "^\[  PASSED|^\[  FAILED" "$OUT/parity.log" | tail -8
grep -m3 -A8 "Failure" "$OUT/parity.log" | head -30
echo "$(ts) == parity (no SYNC, x2)"
timeout -k 5 60 "$B/test_ops" --gtest_filter='AttentionMoe.MoeRouting:AttentionMoe.PipeSwiglu*:AttentionMoe.DecodeStepPdl*:AttentionMoe.SideLine*' --gtest_repeat=2 \
  > "$OUT/parity_nosync.log" 2>&1; echo "no-SYNC rc $?"
grep -E "^\[  PASSED|^\[  FAILED" "$OUT/parity_nosync.log" | sort | uniq -c | tail -4
echo "$(ts) == golden runner (cuda)"
DEEPINFER_ACCELERATOR=cuda DEEPINFER_BACKEND=cuda timeout -k 5 90 "$B/test_golden_runner" > "$OUT/golden_runner.log" 2>&1; echo "golden runner rc $?"
grep -E "^\[  PASSED|^\[  FAILED" "$OUT/golden_runner.log" | tail -3
pack
run_arm() {  # arm dtype batches log
  local f=""; [[ $2 == fp8 ]] && f="--fp8"
  if [[ $1 == old ]]; then
    timeout -k 5 40 "$B/deepinfer_cuda_bench_old" --pipe-wide 0 $f --graphs --decode-only --decode-batches $3 --out "$OUT/ab_old.jsonl" > "$4" 2>&1
  else
    timeout -k 5 40 "$B/deepinfer_cuda_bench" $f --graphs --decode-only --decode-batches $3 --out "$OUT/ab_new.jsonl" > "$4" 2>&1
  fi
}
ab() {  # rounds batches
  for round in $(seq 1 $1); do
    arms="old new"; [[ $((round % 2)) == 0 ]] && arms="new old"
    for dt in bf16 fp8; do
      for arm in $arms; do
        [[ $(left) -lt 25 ]] && { echo "$(ts) out of time, stop A/B"; return; }
        lg="$OUT/ab_${arm}_${dt}_b${2//,/-}_r${round}.log"
        run_arm $arm $dt $2 "$lg"
        echo "$(ts) r$round $dt $arm: $(grep graph "$lg" | awk '{printf "b%s %sms | ", $5, $11}')"
      done
    done
    pack
  done
}
echo "$(ts) == A/B, batches 1,8"
ab 3 1,8
echo "$(ts) == A/B, batches 32,64"
ab 2 32,64
NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
if [[ -n "$NCU" && $(left) -gt 40 ]]; then
  echo "$(ts) == ncu: routing + index kernels, one eager batch-1 step (new; old: call D's ncu_b1)"
  timeout -k 5 30 "$NCU" --profile-from-start off --cache-control none --clock-control none -k regex:moe_ \
    --metrics gpu__time_duration.sum,launch__block_size --csv "$B/deepinfer_cuda_bench" --ncu-steps 1 > "$OUT/ncu_moe_b1.csv" 2> "$OUT/ncu.err"; echo "ncu rc $?"
fi
if [[ $(left) -gt 30 ]]; then
  echo "$(ts) == ablate new, bf16 b1"
  timeout -k 3 $(( $(left) - 3 )) "$B/deepinfer_cuda_bench" --graphs --ablate --decode-batches 1 --out "$OUT/ablate_new.jsonl" \
    > "$OUT/ablate_new_bf16.log" 2>&1
  grep -iE "none|moe|attention paged|small ops|weight ops|q_b|q_a|routing" "$OUT/ablate_new_bf16.log" | head -24
fi
echo "$(ts) done"
