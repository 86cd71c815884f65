#!/usr/bin/env bash
# occ19x (prepared for the lead, ~60 s): the side line's dense pipe GEMMs (shared experts' gate|up
# and down, beside router .. moe_experts) sized as if the card had cap/3 of its SMs
# (DEEPINFER_SIDE_PIPE_CAP; 0 = main). One binary (branch occ19x). Arms: A main, S1 (bf16 shared
# gate|up 352 -> 132 blocks at batch 1), S2 (352 -> 264). Parity with SYNC under S1; interleaved
# A/S1/S2 bf16 + fp8 batches 1,8 x3 rounds, then 32,64 x1; --ablate of S1 bf16 1,8.
set -u
C="$PWD/.carry-occ19x"
OUT0="${OUT:-/tmp/out}"; mkdir -p "$OUT0"
OUT=/tmp/occ19xw; mkdir -p "$OUT"
pack() { tar -C "$OUT" -cJf "$OUT0/results.tar.xz.tmp" . && mv "$OUT0/results.tar.xz.tmp" "$OUT0/results.tar.xz"; }
trap pack EXIT
mkdir -p "$C/g" && tar -C "$C/g" -xJf "$C/bin.tar.xz"
B="$C/g/bin"
export LD_LIBRARY_PATH="/usr/local/cuda/lib64:/usr/local/cuda/targets/x86_64-linux/lib:${LD_LIBRARY_PATH:-}"
t0=$(date +%s)
ts() { echo "[$(date -u +%H:%M:%S) +$(( $(date +%s) - t0 ))s]"; }
{ date -u; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,power.limit --format=csv; } > "$OUT/env.log" 2>&1
cap() { case $1 in A) echo 0;; S1) echo 1;; S2) echo 2;; esac; }
echo "$(ts) == parity S1 (SYNC)"
DEEPINFER_SIDE_PIPE_CAP=1 DEEPINFER_CUDA_SYNC=1 timeout -k 5 40 "$B/test_ops" \
  --gtest_filter='DenseOps.PipeDense*:AttentionMoe.DecodeStepPdl*:AttentionMoe.SideLine*' > "$OUT/parity_S1.log" 2>&1; echo "rc $?"
grep -E "^\[  PASSED|^\[  FAILED" "$OUT/parity_S1.log" | tail -6; grep -m3 -A6 "Failure" "$OUT/parity_S1.log" | head -20
DEEPINFER_SIDE_PIPE_CAP=1 timeout -k 5 30 "$B/test_ops" --gtest_filter='AttentionMoe.DecodeStepPdl*:AttentionMoe.SideLine*' \
  --gtest_repeat=2 > "$OUT/parity_nosync_S1.log" 2>&1; echo "no-SYNC rc $?"
grep -E "^\[  PASSED|^\[  FAILED" "$OUT/parity_nosync_S1.log" | sort | uniq -c | tail -4
pack
for round in 1 2 3; do
  arms="A S1 S2"; [[ $round == 2 ]] && arms="S2 S1 A"; [[ $round == 3 ]] && arms="S1 A S2"
  for dt in bf16 fp8; do
    f=""; [[ $dt == fp8 ]] && f="--fp8"
    for a in $arms; do
      DEEPINFER_SIDE_PIPE_CAP=$(cap $a) timeout -k 5 20 "$B/deepinfer_cuda_bench" $f --graphs --decode-only \
        --decode-batches 1,8 --out "$OUT/ab_$a.jsonl" > "$OUT/ab_${a}_${dt}_r${round}.log" 2>&1
      echo "$(ts) r$round $dt $a: $(grep graph "$OUT/ab_${a}_${dt}_r${round}.log" | awk '{printf "b%s %sms | ", $5, $11}')"
    done
  done
  pack
done
for dt in bf16 fp8; do
  f=""; [[ $dt == fp8 ]] && f="--fp8"
  for a in A S1 S2; do
    DEEPINFER_SIDE_PIPE_CAP=$(cap $a) timeout -k 5 20 "$B/deepinfer_cuda_bench" $f --graphs --decode-only \
      --decode-batches 32,64 --out "$OUT/ab_$a.jsonl" > "$OUT/ab_${a}_${dt}_big.log" 2>&1
    echo "$(ts) $dt $a: $(grep graph "$OUT/ab_${a}_${dt}_big.log" | awk '{printf "b%s %sms | ", $5, $11}')"
  done
done
pack
echo "$(ts) == ablate S1 bf16 1,8"
DEEPINFER_SIDE_PIPE_CAP=1 timeout -k 3 25 "$B/deepinfer_cuda_bench" --graphs --ablate --decode-batches 1,8 \
  --out "$OUT/ablate_S1.jsonl" > "$OUT/ablate_S1_bf16.log" 2>&1
grep -E "none|side|router|routing|moe_experts|shared" "$OUT/ablate_S1_bf16.log" | awk '{printf "%s %s %s: %s us\n", $2,$4,$5" "$6, $(NF-3)}'
echo "$(ts) done"
