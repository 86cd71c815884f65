#!/usr/bin/env bash
# gemm18x (optional re-run for the lead, ~60 s): (1) parity of gemm18's FINAL binaries (branch gemm18,
# 1fd8e48: gemm_heads on the resident form, set_smem_limit raise-only; not re-run on the card after
# the A/B) and of the experiment (branch gemm18x, 988909a: the same kernel with 8 warps per block,
# 64 / 32 CTAs for uk / uv instead of 512 / 128); (2) interleaved A/B final vs x, graph decode, bf16
# and fp8, batches 1 and 8, 3 rounds; (3) --ablate of x at bf16 batch 1 (uk / uv figures).
set -u
C="$PWD/.carry-gemm18x"
OUT0="${OUT:-/tmp/out}"; mkdir -p "$OUT0"
OUT=/tmp/gemm18xw; mkdir -p "$OUT"
pack() { tar -C "$OUT" -cJf "$OUT0/results.tar.xz.tmp" . && mv "$OUT0/results.tar.xz.tmp" "$OUT0/results.tar.xz"; }
trap pack EXIT
mkdir -p "$C/g" && tar -C "$C/g" -xJf "$C/bin.tar.xz"
export LD_LIBRARY_PATH="/usr/local/cuda/lib64:/usr/local/cuda/targets/x86_64-linux/lib:${LD_LIBRARY_PATH:-}"
t0=$(date +%s)
ts() { echo "[$(date -u +%H:%M:%S) +$(( $(date +%s) - t0 ))s]"; }
{ date -u; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,power.limit --format=csv; } > "$OUT/env.log" 2>&1
F='DenseOps.*:MlaAbsorbed.*:AttentionMoe.DecodeStepPdl*:AttentionMoe.MlaPaged*'
for v in final x; do
  echo "$(ts) == parity $v (SYNC)"
  DEEPINFER_CUDA_SYNC=1 timeout -k 5 60 "$C/g/$v/test_ops" --gtest_filter="$F" > "$OUT/parity_$v.log" 2>&1; echo "rc $?"
  grep -E "^\[  PASSED|^\[  FAILED" "$OUT/parity_$v.log" | tail -6
  grep -m3 -A6 "Failure" "$OUT/parity_$v.log" | head -20
  timeout -k 5 30 "$C/g/$v/test_ops" --gtest_filter='AttentionMoe.DecodeStepPdl*:DenseOps.GemmHeads*:DenseOps.PipeDense*' \
    --gtest_repeat=2 > "$OUT/parity_nosync_$v.log" 2>&1; echo "no-SYNC rc $?"
  grep -E "^\[  PASSED|^\[  FAILED" "$OUT/parity_nosync_$v.log" | sort | uniq -c | tail -4
done
pack
echo "$(ts) == A/B final vs x"
for round in 1 2 3; do
  arms="final x"; [[ $round == 2 ]] && arms="x final"
  for dt in bf16 fp8; do
    f=""; [[ $dt == fp8 ]] && f="--fp8"
    for arm in $arms; do
      timeout -k 5 20 "$C/g/$arm/deepinfer_cuda_bench" $f --graphs --decode-only --decode-batches 1,8 \
        --out "$OUT/ab_${arm}.jsonl" > "$OUT/ab_${arm}_${dt}_r${round}.log" 2>&1
      echo "$(ts) r$round $dt $arm: $(grep graph "$OUT/ab_${arm}_${dt}_r${round}.log" | awk '{printf "b%s %sms | ", $5, $11}')"
    done
  done
  pack
done
echo "$(ts) == ablate x, bf16 b1"
timeout -k 3 25 "$C/g/x/deepinfer_cuda_bench" --graphs --ablate --decode-batches 1 --out "$OUT/ablate_x.jsonl" \
  > "$OUT/ablate_x_bf16.log" 2>&1
grep -iE "none|gemm_heads|attention paged|rope" "$OUT/ablate_x_bf16.log" | head -8
echo "$(ts) done"
