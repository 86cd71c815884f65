#!/usr/bin/env bash
# Session 17 call F: the MoE combine over (token, column stripe) blocks. (1) parity SYNC + no SYNC,
# goldens on CUDA; (2) interleaved A/B old (call D's binary, --pipe-wide 0 = main before call E) / mid
# (call E's binary) / new (+ combine stripes), bf16 + fp8, batches 1,8 x3, 32,64 x2; (3) bench of new
# with prefill; (4) ablate new bf16 b1.
set -u
C="$PWD/.carry-lead"
OUT0="${OUT:-/tmp/out}"; mkdir -p "$OUT0"
OUT=/tmp/s17f; mkdir -p "$OUT"
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
DEEPINFER_CUDA_SYNC=1 timeout -k 5 120 "$B/test_ops" --gtest_filter='AttentionMoe.*:DenseOps.Pipe*:V4*:V41*' > "$OUT/parity.log" 2>&1; echo "rc $?"
grep -E "^\[  PASSED|^\[  FAILED" "$OUT/parity.log" | tail -8
grep -m3 -A8 "Failure" "$OUT/parity.log" | head -30
echo "$(ts) == parity (no SYNC, x2)"
timeout -k 5 60 "$B/test_ops" --gtest_filter='AttentionMoe.MoeExperts:AttentionMoe.PipeSwiglu*:AttentionMoe.DecodeStepPdl*:AttentionMoe.SideLine*' --gtest_repeat=2 \
  > "$OUT/parity_nosync.log" 2>&1; echo "no-SYNC rc $?"
grep -E "^\[  PASSED|^\[  FAILED" "$OUT/parity_nosync.log" | sort | uniq -c | tail -4
for g in test_golden_runner test_golden; do
  [[ -x "$B/$g" ]] || continue
  echo "$(ts) == $g (cuda)"
  DEEPINFER_ACCELERATOR=cuda DEEPINFER_BACKEND=cuda timeout -k 5 90 "$B/$g" > "$OUT/$g.log" 2>&1; echo "$g rc $?"
  grep -E "^\[  PASSED|^\[  FAILED" "$OUT/$g.log" | tail -3
done
pack
run_arm() {  # arm dtype batches log
  local f=""; [[ $2 == fp8 ]] && f="--fp8"
  case $1 in
    old) timeout -k 5 40 "$B/deepinfer_cuda_bench_old" --pipe-wide 0 $f --graphs --decode-only --decode-batches $3 --out "$OUT/ab_old.jsonl" > "$4" 2>&1;;
    mid) timeout -k 5 40 "$B/deepinfer_cuda_bench_mid" $f --graphs --decode-only --decode-batches $3 --out "$OUT/ab_mid.jsonl" > "$4" 2>&1;;
    new) timeout -k 5 40 "$B/deepinfer_cuda_bench" $f --graphs --decode-only --decode-batches $3 --out "$OUT/ab_new.jsonl" > "$4" 2>&1;;
  esac
}
ab() {  # rounds batches
  for round in $(seq 1 $1); do
    arms="old mid new"; [[ $((round % 2)) == 0 ]] && arms="new mid old"
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
for dt in bf16 fp8; do
  [[ $(left) -lt 30 ]] && break
  f=""; [[ $dt == fp8 ]] && f="--fp8"
  timeout -k 5 60 "$B/deepinfer_cuda_bench" $f --graphs --out "$OUT/bench_new.jsonl" > "$OUT/bench_new_${dt}.log" 2>&1
  echo "$(ts) bench new $dt: $(grep -E 'graph|prefill' "$OUT/bench_new_${dt}.log" | awk '/graph/ {printf "b%s %sms | ", $5, $11} /prefill/ && /tok\/s/ {printf "p%s %s tok/s | ", $7, $8}')"
done
if [[ $(left) -gt 30 ]]; then
  echo "$(ts) == ablate new, bf16 b1"
  timeout -k 3 $(( $(left) - 3 )) "$B/deepinfer_cuda_bench" --graphs --ablate --decode-batches 1 --out "$OUT/ablate_new.jsonl" \
    > "$OUT/ablate_new_bf16.log" 2>&1
  grep -iE "none|moe|attention paged|small ops|weight ops|q_b|q_a|routing" "$OUT/ablate_new_bf16.log" | head -24
fi
echo "$(ts) done"
