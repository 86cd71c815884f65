#!/usr/bin/env bash
# moe18 (one call): parity with DEEPINFER_CUDA_SYNC=1 (AttentionMoe.*, DenseOps.*), the PDL / pipe /
# side-line tests without SYNC (reads before pdl_wait exercised), then the interleaved A/B of the
# graph decode step, one binary, arms by --moe18 S,P (S: SwiGLU epilogue; P bits: 1 down early,
# 2 + L2, 4 gate|up pdl, 8 combine early), 2 rounds, arms reversed in round 2.
set -u
C="$PWD/.carry-moe18"
OUT0="${OUT:-/tmp/out}"; mkdir -p "$OUT0"
OUT=/tmp/moe18w; mkdir -p "$OUT"
pack() { tar -C "$OUT" -cJf "$OUT0/results.tar.xz.tmp" . && mv "$OUT0/results.tar.xz.tmp" "$OUT0/results.tar.xz"; }
trap pack EXIT
mkdir -p "$C/g" && tar -C "$C/g" -xJf "$C/bin.tar.xz"
B="$C/g/bin"
export LD_LIBRARY_PATH="/usr/local/cuda/lib64:/usr/local/cuda/targets/x86_64-linux/lib:${LD_LIBRARY_PATH:-}"
mkdir -p /work && ln -sfn "$PWD" /work/wt-moe18
t0=$(date +%s)
ts() { echo "[$(date -u +%H:%M:%S) +$(( $(date +%s) - t0 ))s]"; }
{ date -u; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,power.limit --format=csv; ls -la "$B"; } > "$OUT/env.log" 2>&1
echo "$(ts) == parity (SYNC)"
DEEPINFER_CUDA_SYNC=1 timeout -k 5 90 "$B/test_ops" --gtest_filter='AttentionMoe.*:DenseOps.*' > "$OUT/parity.log" 2>&1; rc=$?; echo "rc $rc"
grep -E "^\[  PASSED|^\[  FAILED|tests ran|OK \] AttentionMoe.Pipe" "$OUT/parity.log" | tail -14
grep -m3 -B2 -A8 "Failure" "$OUT/parity.log" | head -40
echo "$(ts) == no-SYNC: PDL chains, pipe switches, side line"
timeout -k 5 40 "$B/test_ops" --gtest_filter='AttentionMoe.DecodeStepPdl*:AttentionMoe.Pipe*:AttentionMoe.SideLine*:AttentionMoe.BatchInvariant*:DenseOps.Pipe*' \
  --gtest_repeat=2 > "$OUT/parity_nosync.log" 2>&1; rc2=$?; echo "rc $rc2"
grep -E "^\[  PASSED|^\[  FAILED|tests ran" "$OUT/parity_nosync.log" | sort | uniq -c | tail -8
grep -m3 -B2 -A8 "Failure" "$OUT/parity_nosync.log" | head -30
pack
[[ $rc == 124 || $rc == 137 || $rc2 == 124 || $rc2 == 137 ]] && { echo "tests timed out: a hang; no A/B"; exit 1; }
echo "$(ts) == A/B"
declare -A SW=([old]=0,0 [epi]=1,0 [down]=1,1 [l2]=1,3 [comb]=1,11 [all]=1,15)
for round in 1 2; do
  arms="old epi down l2 comb all"; [[ $round == 2 ]] && arms="all comb l2 down epi old"
  for dt in bf16 fp8; do
    f=""; [[ $dt == fp8 ]] && f="--fp8"
    for arm in $arms; do
      timeout -k 5 25 "$B/deepinfer_cuda_bench" $f --graphs --decode-only --decode-batches 1,8,32,64 --moe18 "${SW[$arm]}" \
        --out "$OUT/ab_${arm}.jsonl" > "$OUT/ab_${arm}_${dt}_r${round}.log" 2>&1
      echo "$(ts) r$round $dt $arm: $(grep graph "$OUT/ab_${arm}_${dt}_r${round}.log" | awk '{printf "b%s %sms | ", $5, $11}')"
    done
  done
  pack
done
left=$(( 188 - ($(date +%s) - t0) ))
if (( left > 14 )); then
  echo "$(ts) == ablate, default switches, bf16 b1"
  timeout -k 3 $(( left - 3 )) "$B/deepinfer_cuda_bench" --graphs --ablate --decode-batches 1 --out "$OUT/ablate.jsonl" > "$OUT/ablate_bf16.log" 2>&1
  grep -iE "moe|whole" "$OUT/ablate_bf16.log" | head -8
fi
echo "$(ts) done"
