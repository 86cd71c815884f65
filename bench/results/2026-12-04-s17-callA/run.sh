#!/usr/bin/env bash
# Session 17 call A (<= 300 s): (1) parity with DEEPINFER_CUDA_SYNC=1 (MoE pipes incl. the gated down,
# dense pipes incl. whole-item stages, PDL decode step, side line) and the same without SYNC (twice);
# (2) goldens on CUDA; (3) interleaved A/B in one binary, graph decode, 4 arms:
#   base = --no-down-gate --no-dense-whole (main's path), gate = --no-dense-whole, whole = --no-down-gate,
#   both = defaults; bf16 and fp8, batches 1,8 three rounds, 32,64 two rounds; (4) ablate of both, bf16 b1.
set -u
C="$PWD/.carry-lead"
OUT0="${OUT:-/tmp/out}"; mkdir -p "$OUT0"
OUT=/tmp/s17w; mkdir -p "$OUT"
pack() { tar -C "$OUT" -cJf "$OUT0/results.tar.xz.tmp" . && mv "$OUT0/results.tar.xz.tmp" "$OUT0/results.tar.xz"; }
trap pack EXIT
mkdir -p "$C/g" && tar -C "$C/g" -xJf "$C/bin.tar.xz"
B="$C/g/bin"
export LD_LIBRARY_PATH="/usr/local/cuda/lib64:/usr/local/cuda/targets/x86_64-linux/lib:${LD_LIBRARY_PATH:-}"
t0=$(date +%s)
ts() { echo "[$(date -u +%H:%M:%S) +$(( $(date +%s) - t0 ))s]"; }
left() { echo $(( ${BUDGET:-330} - ($(date +%s) - t0) )); }
{ date -u; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,power.limit --format=csv; } > "$OUT/env.log" 2>&1
cat "$OUT/env.log"
F='AttentionMoe.*:DenseOps.Pipe*:DenseOps.GemmPair*:DenseOps.Gemm*'
echo "$(ts) == parity (SYNC)"
DEEPINFER_CUDA_SYNC=1 timeout -k 5 120 "$B/test_ops" --gtest_filter="$F" > "$OUT/parity.log" 2>&1; echo "rc $?"
grep -E "^\[  PASSED|^\[  FAILED" "$OUT/parity.log" | tail -12
grep -m3 -A8 "Failure" "$OUT/parity.log" | head -30
echo "$(ts) == parity (no SYNC, x2)"
timeout -k 5 90 "$B/test_ops" --gtest_filter='AttentionMoe.PipeSwiglu*:AttentionMoe.DecodeStepPdl*:AttentionMoe.SideLine*:DenseOps.Pipe*' --gtest_repeat=2 \
  > "$OUT/parity_nosync.log" 2>&1; echo "no-SYNC rc $?"
grep -E "^\[  PASSED|^\[  FAILED" "$OUT/parity_nosync.log" | sort | uniq -c | tail -6
grep -m2 -A8 "Failure" "$OUT/parity_nosync.log" | head -20
if [[ -x "$B/test_golden_runner" ]]; then
  echo "$(ts) == golden runner (cuda)"
  DEEPINFER_ACCELERATOR=cuda DEEPINFER_BACKEND=cuda timeout -k 5 90 "$B/test_golden_runner" > "$OUT/golden_runner.log" 2>&1; echo "golden runner rc $?"
  grep -E "^\[  PASSED|^\[  FAILED|SKIPPED" "$OUT/golden_runner.log" | tail -5
fi
if [[ -x "$B/test_golden" ]]; then
  echo "$(ts) == golden (cuda)"
  DEEPINFER_ACCELERATOR=cuda DEEPINFER_BACKEND=cuda timeout -k 5 60 "$B/test_golden" > "$OUT/golden.log" 2>&1; echo "golden rc $?"
  grep -E "^\[  PASSED|^\[  FAILED|SKIPPED" "$OUT/golden.log" | tail -5
fi
pack
flags() { case $1 in base) echo "--no-down-gate --no-dense-whole";; gate) echo "--no-dense-whole";; whole) echo "--no-down-gate";; both) echo "";; esac; }
ab() {  # rounds batches
  for round in $(seq 1 $1); do
    arms="base gate whole both"; [[ $((round % 2)) == 0 ]] && arms="both whole gate base"
    for dt in bf16 fp8; do
      f=""; [[ $dt == fp8 ]] && f="--fp8"
      for arm in $arms; do
        [[ $(left) -lt 25 ]] && { echo "$(ts) out of time, stop A/B"; return; }
        lg="$OUT/ab_${arm}_${dt}_b${2//,/-}_r${round}.log"
        timeout -k 5 40 "$B/deepinfer_cuda_bench" $f $(flags $arm) --graphs --decode-only --decode-batches $2 \
          --out "$OUT/ab_${arm}.jsonl" > "$lg" 2>&1
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
echo "$(ts) == ablate both, bf16 b1 ($(left) s left)"
if [[ $(left) -gt 30 ]]; then
  timeout -k 3 $(( $(left) - 3 )) "$B/deepinfer_cuda_bench" --graphs --ablate --decode-batches 1 --out "$OUT/ablate_both.jsonl" \
    > "$OUT/ablate_both_bf16.log" 2>&1
  grep -iE "none|moe|attention paged|small ops|weight ops|q_b|q_a" "$OUT/ablate_both_bf16.log" | head -24
fi
echo "$(ts) done"
