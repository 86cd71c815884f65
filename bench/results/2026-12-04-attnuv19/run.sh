#!/usr/bin/env bash
# attnuv19 (one call, <= 200 s): (1) parity with DEEPINFER_CUDA_SYNC=1 (the paged attention, the new
# mla_attention_paged_uv against the combine kernel + gemm_heads bit for bit and the CPU, the PDL decode
# step with the fused op against plain launches of the unfused ops, gemm_heads, MLA) and without SYNC;
# (2) interleaved A/B in one binary, graph decode: new (mla_attention_paged_uv: the combine inside the
# resident uv GEMM) vs old (--no-attn-uv: main's combine kernel + gemm_heads uv), bf16 and fp8, batches
# 1,8 three rounds, then 32,64 two rounds; (3) --ablate --decode-batches 1,8 of the new arm (bf16).
set -u
C="$PWD/.carry-attnuv19"
OUT0="${OUT:-/tmp/out}"; mkdir -p "$OUT0"
OUT=/tmp/attnuv19w; mkdir -p "$OUT"
pack() { tar -C "$OUT" -cJf "$OUT0/results.tar.xz.tmp" . && mv "$OUT0/results.tar.xz.tmp" "$OUT0/results.tar.xz"; }
trap pack EXIT
mkdir -p "$C/g" && tar -C "$C/g" -xJf "$C/bin.tar.xz"
B="$C/g/bin"
export LD_LIBRARY_PATH="/usr/local/cuda/lib64:/usr/local/cuda/targets/x86_64-linux/lib:${LD_LIBRARY_PATH:-}"
t0=$(date +%s)
ts() { echo "[$(date -u +%H:%M:%S) +$(( $(date +%s) - t0 ))s]"; }
left() { echo $(( 190 - ($(date +%s) - t0) )); }
{ date -u; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,power.limit --format=csv; } > "$OUT/env.log" 2>&1
F='AttentionMoe.MlaPaged*:AttentionMoe.DecodeStepPdl*:DenseOps.GemmHeads*:MlaAbsorbed.*:FusedMla.*:SparseAttention.Paged*'
echo "$(ts) == parity (SYNC)"
DEEPINFER_CUDA_SYNC=1 timeout -k 5 60 "$B/test_ops" --gtest_filter="$F" > "$OUT/parity.log" 2>&1; echo "rc $?"
grep -E "^\[  PASSED|^\[  FAILED|^\[       OK|^\[  FAILED  \]" "$OUT/parity.log" | tail -24
grep -m3 -A8 "Failure" "$OUT/parity.log" | head -30
timeout -k 5 30 "$B/test_ops" --gtest_filter='AttentionMoe.MlaPagedUv*:AttentionMoe.DecodeStepPdl*' --gtest_repeat=2 \
  > "$OUT/parity_nosync.log" 2>&1; echo "no-SYNC rc $?"
grep -E "^\[  PASSED|^\[  FAILED" "$OUT/parity_nosync.log" | sort | uniq -c | tail -4
grep -m2 -A8 "Failure" "$OUT/parity_nosync.log" | head -20
pack
ab() {  # rounds batches
  for round in $(seq 1 $1); do
    arms="old new"; [[ $((round % 2)) == 0 ]] && arms="new old"
    for dt in bf16 fp8; do
      f=""; [[ $dt == fp8 ]] && f="--fp8"
      for arm in $arms; do
        [[ $(left) -lt 25 ]] && { echo "$(ts) out of time, stop A/B"; return; }
        a=""; [[ $arm == old ]] && a="--no-attn-uv"
        timeout -k 5 40 "$B/deepinfer_cuda_bench" $f $a --graphs --decode-only --decode-batches $2 \
          --out "$OUT/ab_${arm}.jsonl" > "$OUT/ab_${arm}_${dt}_b${2//,/-}_r${round}.log" 2>&1
        echo "$(ts) r$round $dt $arm: $(grep graph "$OUT/ab_${arm}_${dt}_b${2//,/-}_r${round}.log" | awk '{printf "b%s %sms | ", $5, $11}')"
      done
    done
    pack
  done
}
echo "$(ts) == A/B old vs new, batches 1,8"
ab 3 1,8
echo "$(ts) == A/B old vs new, batches 32,64"
ab 2 32,64
echo "$(ts) == ablate new, bf16 b1,8 ($(left) s left)"
if [[ $(left) -gt 20 ]]; then
  timeout -k 3 $(( $(left) - 3 )) "$B/deepinfer_cuda_bench" --graphs --ablate --decode-batches 1,8 --out "$OUT/ablate_new.jsonl" \
    > "$OUT/ablate_new_bf16.log" 2>&1
  grep -iE "  none|gemm_heads|attention paged|rope|small ops" "$OUT/ablate_new_bf16.log" | head -16
fi
echo "$(ts) done"
