#!/usr/bin/env bash
# Lead, session 16 call F: the paged attention's chunk by context bound: parity, A/B at 576 / 1024 / 4096.
set -u
C="$PWD/.carry-lead"; R="${OUT:-/tmp/out}"; mkdir -p "$R"
W=/tmp/s16f; mkdir -p "$W"
pack() { tar -C "$W" -cJf "$R/results.tar.xz.tmp" . && mv "$R/results.tar.xz.tmp" "$R/results.tar.xz"; }
trap pack EXIT
mkdir -p "$C/g" && tar -C "$C/g" -xJf "$C/binf.tar.xz"; B="$C/g/bin"
export LD_LIBRARY_PATH="/usr/local/cuda/lib64:/usr/local/cuda/targets/x86_64-linux/lib:${LD_LIBRARY_PATH:-}"
{ date -u; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,power.limit --format=csv; } > "$W/env.log" 2>&1
DEEPINFER_CUDA_SYNC=1 timeout -k 5 60 "$B/test_ops" --gtest_filter='AttentionMoe.*:MlaAbsorbed.*' > "$W/parity.log" 2>&1
echo "parity rc $?"; grep -E "^\[  (PASSED|FAILED)" "$W/parity.log"
run() {  # tag ctx batches flags...
  local tag=$1 ctx=$2 bs=$3; shift 3
  timeout -k 5 60 "$B/deepinfer_cuda_bench" "$@" --graphs --decode-only --decode-batches $bs --decode-ctx $ctx \
    --out "$W/ab.jsonl" > "$W/${tag}.log" 2>&1
  echo "$tag: $(grep graph "$W/${tag}.log" | awk '{printf "b%s %s | ", $5, $11}')"
}
for r in 1 2; do
  if [[ $r == 1 ]]; then A="def c64"; else A="c64 def"; fi
  for a in $A; do x=""; [[ $a == c64 ]] && x="--attn-chunk 64"
    run "r${r}_576_${a}_bf16" 576 1,8,16,32,64 $x
    run "r${r}_576_${a}_fp8" 576 1,8,32,64 --fp8 $x
    run "r${r}_1024_${a}_bf16" 1024 8,32,64 $x
  done
  if [[ $r == 1 ]]; then A="c32 c64"; else A="c64 c32"; fi
  for a in $A; do run "r${r}_4096_${a}_bf16" 4096 1,2,3,4 --attn-chunk ${a#c}; done
  pack
done | tee "$W/summary.txt"
