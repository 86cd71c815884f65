#!/usr/bin/env bash
# gemm18 (one call): parity (SYNC) of the dense / MLA / attention+MoE ops with the new arms, the PDL
# chain tests without SYNC, then the interleaved A/B of the graph decode step, one binary, 4 arms:
#   A main (pipe dense D=2, stream gemm_heads)   B --gemm-resident 1 (gemm_heads resident)
#   C --gemm-resident 1 --pipe-dense-deep        D --gemm-resident 2 --pipe-dense-deep (dense resident too)
# 3 rounds, arm order rotated (r2 reversed); then --ablate of the best bf16 batch-1 arm.
set -u
C="$PWD/.carry-gemm18"
OUT0="${OUT:-/tmp/out}"; mkdir -p "$OUT0"
OUT=/tmp/gemm18w; mkdir -p "$OUT"
pack() { tar -C "$OUT" -cJf "$OUT0/results.tar.xz.tmp" . && mv "$OUT0/results.tar.xz.tmp" "$OUT0/results.tar.xz"; }
trap pack EXIT
mkdir -p "$C/g" && tar -C "$C/g" -xJf "$C/bin.tar.xz"
B="$C/g/bin"
export LD_LIBRARY_PATH="/usr/local/cuda/lib64:/usr/local/cuda/targets/x86_64-linux/lib:${LD_LIBRARY_PATH:-}"
mkdir -p /work && ln -sfn "$PWD" /work/wt-gemm18
t0=$(date +%s)
ts() { echo "[$(date -u +%H:%M:%S) +$(( $(date +%s) - t0 ))s]"; }
{ date -u; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,power.limit --format=csv; ls -la "$B"; } > "$OUT/env.log" 2>&1
echo "$(ts) == parity (SYNC)"
DEEPINFER_CUDA_SYNC=1 timeout -k 5 80 "$B/test_ops" --gtest_filter='DenseOps.*:MlaAbsorbed.*:AttentionMoe.*' \
  > "$OUT/parity.log" 2>&1; rc=$?; echo "rc $rc"
grep -E "^\[  PASSED|^\[  FAILED|tests ran" "$OUT/parity.log" | tail -12
grep -m3 -B2 -A8 "Failure" "$OUT/parity.log" | head -40
echo "$(ts) == no-SYNC: PDL chains, resident"
timeout -k 5 30 "$B/test_ops" --gtest_filter='AttentionMoe.DecodeStepPdl*:DenseOps.PipeDense*:DenseOps.Resident*' \
  --gtest_repeat=2 > "$OUT/parity_nosync.log" 2>&1; rc2=$?; echo "rc $rc2"
grep -E "^\[  PASSED|^\[  FAILED|tests ran" "$OUT/parity_nosync.log" | sort | uniq -c | tail -8
grep -m3 -B2 -A8 "Failure" "$OUT/parity_nosync.log" | head -30
pack
[[ $rc == 124 || $rc == 137 || $rc2 == 124 || $rc2 == 137 ]] && { echo "tests timed out: a hang; no A/B"; exit 1; }
declare -A FL=([A]="" [B]="--gemm-resident 1" [C]="--gemm-resident 1 --pipe-dense-deep" [D]="--gemm-resident 2 --pipe-dense-deep")
echo "$(ts) == A/B"
for round in 1 2 3; do
  case $round in 1) arms="A B C D";; 2) arms="D C B A";; 3) arms="B D A C";; esac
  for dt in bf16 fp8; do
    f=""; [[ $dt == fp8 ]] && f="--fp8"
    for arm in $arms; do
      timeout -k 5 25 "$B/deepinfer_cuda_bench" $f --graphs --decode-only --decode-batches 1,8,32,64 ${FL[$arm]} \
        --out "$OUT/ab_${arm}.jsonl" > "$OUT/ab_${arm}_${dt}_r${round}.log" 2>&1
      echo "$(ts) r$round $dt $arm: $(grep graph "$OUT/ab_${arm}_${dt}_r${round}.log" | awk '{printf "b%s %sms | ", $5, $11}')"
    done
  done
  pack
  (( $(date +%s) - t0 > 150 )) && { echo "$(ts) stopping after round $round (time)"; break; }
done
# The best arm at bf16 batch 1 (sum of its rounds' graph steps).
best=$(for a in A B C D; do grep -h "bf16  graph  batch   1 " "$OUT"/ab_${a}_bf16_r*.log 2>/dev/null | awk -v a=$a '{s+=$11; n++} END {if (n) printf "%s %.4f\n", a, s/n}'; done | sort -k2 -n | head -1 | cut -d' ' -f1)
left=$(( 188 - ($(date +%s) - t0) ))
if [[ -n "$best" ]] && (( left > 14 )); then
  echo "$(ts) == ablate, arm $best (${FL[$best]}), bf16 b1"
  timeout -k 3 $(( left - 3 )) "$B/deepinfer_cuda_bench" --graphs --ablate --decode-batches 1 ${FL[$best]} \
    --out "$OUT/ablate_${best}.jsonl" > "$OUT/ablate_${best}_bf16.log" 2>&1
  grep -iE "none|gemm|router|attention block" "$OUT/ablate_${best}_bf16.log" | head -14
fi
echo "$(ts) done"
