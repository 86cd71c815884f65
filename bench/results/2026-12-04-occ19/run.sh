#!/usr/bin/env bash
# occ19 (~190 s): the dense pipeline GEMM's launch shape, arms by env (one binary, branch occ19):
#  A main (occupancy: bf16 3 / fp8 2 blocks per SM, 2 stages), B 1 block per SM, C 1 block per SM
#  with 4 stages, D 2 per SM (fp8: = main, a noise check). Parity with SYNC (B, C) and without;
#  interleaved A/B/C/D, bf16 + fp8, batches 1,8 x3 rounds, then 32,64 x1; --ablate of B.
set -u
C="$PWD/.carry-occ19"
OUT0="${OUT:-/tmp/out}"; mkdir -p "$OUT0"
OUT=/tmp/occ19w; mkdir -p "$OUT"
pack() { tar -C "$OUT" -cJf "$OUT0/results.tar.xz.tmp" . && mv "$OUT0/results.tar.xz.tmp" "$OUT0/results.tar.xz"; }
trap pack EXIT
mkdir -p "$C/g" && tar -C "$C/g" -xJf "$C/bin.tar.xz"
B="$C/g/bin"
export LD_LIBRARY_PATH="/usr/local/cuda/lib64:/usr/local/cuda/targets/x86_64-linux/lib:${LD_LIBRARY_PATH:-}"
t0=$(date +%s)
ts() { echo "[$(date -u +%H:%M:%S) +$(( $(date +%s) - t0 ))s]"; }
{ date -u; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,power.limit --format=csv; } > "$OUT/env.log" 2>&1
arm() { case $1 in A) echo "0 0";; B) echo "1 0";; C) echo "1 4";; D) echo "2 0";; esac; }
run_arm() { local a=$1; shift; read -r ps st <<< "$(arm $a)"; DEEPINFER_PIPE_DENSE_PER_SM=$ps DEEPINFER_PIPE_DENSE_STAGES=$st "$@"; }
F='DenseOps.*:AttentionMoe.DecodeStepPdl*:AttentionMoe.SideLine*'
for a in B C; do
  echo "$(ts) == parity $a (SYNC)"
  DEEPINFER_CUDA_SYNC=1 run_arm $a timeout -k 5 40 "$B/test_ops" --gtest_filter="$F" > "$OUT/parity_$a.log" 2>&1; echo "rc $?"
  grep -E "^\[  PASSED|^\[  FAILED" "$OUT/parity_$a.log" | tail -6; grep -m3 -A6 "Failure" "$OUT/parity_$a.log" | head -20
done
run_arm C timeout -k 5 30 "$B/test_ops" --gtest_filter='DenseOps.PipeDense*:AttentionMoe.DecodeStepPdl*' --gtest_repeat=2 > "$OUT/parity_nosync_C.log" 2>&1
echo "no-SYNC C rc $?"; grep -E "^\[  PASSED|^\[  FAILED" "$OUT/parity_nosync_C.log" | sort | uniq -c | tail -4
pack
echo "$(ts) == A/B/C/D batches 1,8"
for round in 1 2 3; do
  arms="A B C D"; [[ $round == 2 ]] && arms="D C B A"; [[ $round == 3 ]] && arms="B A D C"
  for dt in bf16 fp8; do
    f=""; [[ $dt == fp8 ]] && f="--fp8"
    for a in $arms; do
      run_arm $a timeout -k 5 20 "$B/deepinfer_cuda_bench" $f --graphs --decode-only --decode-batches 1,8 \
        --out "$OUT/ab_$a.jsonl" > "$OUT/ab_${a}_${dt}_r${round}.log" 2>&1
      echo "$(ts) r$round $dt $a: $(grep graph "$OUT/ab_${a}_${dt}_r${round}.log" | awk '{printf "b%s %sms | ", $5, $11}')"
    done
  done
  pack
done
echo "$(ts) == batches 32,64"
for dt in bf16 fp8; do
  f=""; [[ $dt == fp8 ]] && f="--fp8"
  for a in A B C D; do
    run_arm $a timeout -k 5 20 "$B/deepinfer_cuda_bench" $f --graphs --decode-only --decode-batches 32,64 \
      --out "$OUT/ab_$a.jsonl" > "$OUT/ab_${a}_${dt}_big.log" 2>&1
    echo "$(ts) $dt $a: $(grep graph "$OUT/ab_${a}_${dt}_big.log" | awk '{printf "b%s %sms | ", $5, $11}')"
  done
done
pack
for dt in bf16 fp8; do
  f=""; [[ $dt == fp8 ]] && f="--fp8"
  echo "$(ts) == ablate B $dt 1,8"
  run_arm B timeout -k 3 25 "$B/deepinfer_cuda_bench" $f --graphs --ablate --decode-batches 1,8 --out "$OUT/ablate_B.jsonl" \
    > "$OUT/ablate_B_$dt.log" 2>&1
  grep -E "none|gemm|side|lm_head|argmax" "$OUT/ablate_B_$dt.log" | awk '{printf "%s %s %s: %s us\n", $2,$4,$5" "$6" "$7, $(NF-3)}' | head -30
  pack
done
echo "$(ts) done"
