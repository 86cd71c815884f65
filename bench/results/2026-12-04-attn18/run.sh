#!/usr/bin/env bash
# attn18 (one call): parity of the paged attention (SYNC), the PDL chain tests without SYNC
# (the kernel reads rows and addressing before pdl_wait), then the interleaved A/B of the graph
# decode step (one binary: --attn-legacy = main's form), 2 rounds, arms reversed in round 2.
set -u
C="$PWD/.carry-attn18"
OUT0="${OUT:-/tmp/out}"; mkdir -p "$OUT0"
OUT=/tmp/attn18w; mkdir -p "$OUT"
pack() { tar -C "$OUT" -cJf "$OUT0/results.tar.xz.tmp" . && mv "$OUT0/results.tar.xz.tmp" "$OUT0/results.tar.xz"; }
trap pack EXIT
mkdir -p "$C/g" && tar -C "$C/g" -xJf "$C/bin.tar.xz"
B="$C/g/bin"
export LD_LIBRARY_PATH="/usr/local/cuda/lib64:/usr/local/cuda/targets/x86_64-linux/lib:${LD_LIBRARY_PATH:-}"
mkdir -p /work && ln -sfn "$PWD" /work/wt-attn18
t0=$(date +%s)
ts() { echo "[$(date -u +%H:%M:%S) +$(( $(date +%s) - t0 ))s]"; }
{ date -u; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,power.limit --format=csv; ls -la "$B"
  cuobjdump -res-usage "$B/deepinfer_cuda_bench" 2>&1 | grep -A1 "mla_paged_kernel\|mla_combine_kernel" | head -24; } > "$OUT/env.log" 2>&1
echo "$(ts) == parity (SYNC)"
DEEPINFER_CUDA_SYNC=1 timeout -k 5 70 "$B/test_ops" --gtest_filter='AttentionMoe.*:SparseAttention.*:MlaAbsorbed.*:FusedMla.*:-AttentionMoe.CutlassExperts*:AttentionMoe.PipeExperts*:AttentionMoe.QuantizedExperts*:AttentionMoe.RouteExperts*:AttentionMoe.MoeExperts*' \
  > "$OUT/parity.log" 2>&1; rc=$?; echo "rc $rc"
grep -E "^\[  PASSED|^\[  FAILED|tests ran" "$OUT/parity.log" | tail -12
grep -m3 -B2 -A8 "Failure" "$OUT/parity.log" | head -40
echo "$(ts) == no-SYNC: PDL chain, paged"
timeout -k 5 30 "$B/test_ops" --gtest_filter='AttentionMoe.DecodeStepPdl*:AttentionMoe.MlaPaged*:SparseAttention.Paged*:FusedMla.Paged*' \
  --gtest_repeat=2 > "$OUT/parity_nosync.log" 2>&1; rc2=$?; echo "rc $rc2"
grep -E "^\[  PASSED|^\[  FAILED|tests ran" "$OUT/parity_nosync.log" | sort | uniq -c | tail -8
grep -m3 -B2 -A8 "Failure" "$OUT/parity_nosync.log" | head -30
pack
[[ $rc == 124 || $rc == 137 || $rc2 == 124 || $rc2 == 137 ]] && { echo "tests timed out: a hang; no A/B"; exit 1; }
echo "$(ts) == A/B"
for round in 1 2; do
  arms="old new"; [[ $round == 2 ]] && arms="new old"
  for dt in bf16 fp8; do
    f=""; [[ $dt == fp8 ]] && f="--fp8"
    for arm in $arms; do
      extra=""; [[ $arm == old ]] && extra="--attn-legacy"
      timeout -k 5 20 "$B/deepinfer_cuda_bench" $f --graphs --decode-only --decode-batches 1,8,64 $extra \
        --out "$OUT/ab_${arm}.jsonl" > "$OUT/ab_${arm}_${dt}_r${round}.log" 2>&1
      echo "$(ts) r$round $dt $arm: $(grep graph "$OUT/ab_${arm}_${dt}_r${round}.log" | awk '{printf "b%s %sms | ", $5, $11}')"
    done
  done
  pack
done
left=$(( 185 - ($(date +%s) - t0) ))
if (( left > 14 )); then
  echo "$(ts) == ablate, new, bf16 b1"
  timeout -k 3 $(( left - 3 )) "$B/deepinfer_cuda_bench" --graphs --ablate --decode-batches 1 --out "$OUT/ablate.jsonl" > "$OUT/ablate_bf16.log" 2>&1
  grep -iE "attention|whole" "$OUT/ablate_bf16.log" | head -6
fi
echo "$(ts) done"
