#!/usr/bin/env bash
# A/B of the fused stream-kernel forms on one machine (DEEPINFER_CUDA_FUSE bit mask, see
# backend/cuda/cuda_backend.h), bf16 and fp8 decode with graphs; arms interleaved twice so
# run-to-run spread shows. Usage (device tool, carry build-gpu): bash tools/gpu/ab_fuse.sh
root="$(cd "$(dirname "$0")/../.." && pwd)"
OUT="${OUT:-/tmp/deepinfer_out}"; mkdir -p "$OUT"
export LD_LIBRARY_PATH="/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
b="$root/build-gpu/bin/deepinfer_cuda_bench"
for rep in 1 2; do
  for mask in ${FUSE_ARMS:-7 0 3 1}; do
    for w in "" --fp8; do
      DEEPINFER_CUDA_FUSE=$mask timeout 60 "$b" --graphs --decode-only $w --out "$OUT/ab.jsonl" 2>&1 |
        grep graph | sed "s/^/rep $rep fuse $mask: /" | cut -c1-110
    done
  done
done | tee "$OUT/ab.log"
