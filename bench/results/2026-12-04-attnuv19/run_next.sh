#!/usr/bin/env bash
# attnuv19's prepared experiment (for the lead; ~40 s): deepinfer_cuda_bench of branch attnuv19 (= main
# 532f7b5 + two bench-only flags): --rope-side (decode's mla_rope_store on the side line beside
# gemm_heads uk, joined before the paged attention) and --attn-chunk 32|64 (CudaOptions::attn_chunk for
# every launch), against the default; graph decode, batches 1,8, bf16 and fp8, 2 interleaved rounds;
# then --ablate of --rope-side at bf16 batch 1. Results: $OUT/results.tar.xz.
set -u
C="$PWD/.carry-attnuv19"
OUT0="${OUT:-/tmp/out}"; mkdir -p "$OUT0"
OUT=/tmp/attnuv19n; mkdir -p "$OUT"
pack() { tar -C "$OUT" -cJf "$OUT0/results.tar.xz.tmp" . && mv "$OUT0/results.tar.xz.tmp" "$OUT0/results.tar.xz"; }
trap pack EXIT
mkdir -p "$C/n" && tar -C "$C/n" -xJf "$C/bench_next.tar.xz"
B="$C/n/bin/deepinfer_cuda_bench"
export LD_LIBRARY_PATH="/usr/local/cuda/lib64:/usr/local/cuda/targets/x86_64-linux/lib:${LD_LIBRARY_PATH:-}"
t0=$(date +%s)
ts() { echo "[$(date -u +%H:%M:%S) +$(( $(date +%s) - t0 ))s]"; }
{ date -u; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,power.limit --format=csv; } > "$OUT/env.log" 2>&1
declare -A FL=([base]="" [ropeside]="--rope-side" [chunk64]="--attn-chunk 64" [chunk32]="--attn-chunk 32")
for round in 1 2; do
  arms="base ropeside chunk64 chunk32"; [[ $round == 2 ]] && arms="chunk32 chunk64 ropeside base"
  for dt in bf16 fp8; do
    f=""; [[ $dt == fp8 ]] && f="--fp8"
    for arm in $arms; do
      timeout -k 5 40 "$B" $f ${FL[$arm]} --graphs --decode-only --decode-batches 1,8 \
        --out "$OUT/ab_${arm}.jsonl" > "$OUT/ab_${arm}_${dt}_r${round}.log" 2>&1
      echo "$(ts) r$round $dt $arm: $(grep graph "$OUT/ab_${arm}_${dt}_r${round}.log" | awk '{printf "b%s %sms | ", $5, $11}')"
    done
  done
  pack
done
echo "$(ts) == ablate --rope-side, bf16 b1"
timeout -k 3 30 "$B" --rope-side --graphs --ablate --decode-batches 1 --out "$OUT/ablate_ropeside.jsonl" \
  > "$OUT/ablate_ropeside_bf16.log" 2>&1
grep -iE "  none|gemm_heads|attention paged|rope|small ops" "$OUT/ablate_ropeside_bf16.log" | head -8
echo "$(ts) done"
