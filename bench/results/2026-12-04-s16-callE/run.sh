#!/usr/bin/env bash
# Lead, session 16 call E: the final main: attention parity, graph decode 2 rounds, chunk at batch 1-4 long context.
set -u
C="$PWD/.carry-lead"; R="${OUT:-/tmp/out}"; mkdir -p "$R"
W=/tmp/s16e; mkdir -p "$W"
pack() { tar -C "$W" -cJf "$R/results.tar.xz.tmp" . && mv "$R/results.tar.xz.tmp" "$R/results.tar.xz"; }
trap pack EXIT
mkdir -p "$C/g" && tar -C "$C/g" -xJf "$C/bine.tar.xz"; B="$C/g/bin"
export LD_LIBRARY_PATH="/usr/local/cuda/lib64:/usr/local/cuda/targets/x86_64-linux/lib:${LD_LIBRARY_PATH:-}"
{ date -u; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,power.limit --format=csv; } > "$W/env.log" 2>&1
DEEPINFER_CUDA_SYNC=1 timeout -k 5 60 "$B/test_ops" --gtest_filter='AttentionMoe.*:MlaAbsorbed.*:DenseOps.*' > "$W/parity.log" 2>&1
echo "parity rc $?"; grep -E "^\[  (PASSED|FAILED)" "$W/parity.log"
for r in 1 2; do for dt in bf16 fp8; do f=""; [[ $dt == fp8 ]] && f="--fp8"
  timeout -k 5 40 "$B/deepinfer_cuda_bench" $f --graphs --decode-only --decode-batches 1,8,16,32,64 --out "$W/bench_$dt.jsonl" > "$W/bench_${dt}_r$r.log" 2>&1
  echo "r$r $dt: $(grep graph "$W/bench_${dt}_r$r.log" | awk '{printf "b%s %s (%s) | ", $5, $11, $16}')"
done; done | tee "$W/bench_summary.txt"
for r in 1 2; do for a in def c64; do x=""; [[ $a == c64 ]] && x="--attn-chunk 64"
  timeout -k 5 60 "$B/deepinfer_cuda_bench" $x --graphs --decode-only --decode-batches 1,4 --decode-ctx 4096 --out "$W/ctx_$a.jsonl" > "$W/ctx_${a}_r$r.log" 2>&1
  echo "r$r ctx 4096 $a: $(grep graph "$W/ctx_${a}_r$r.log" | awk '{printf "b%s %s | ", $5, $11}')"
done; done | tee "$W/ctx_summary.txt"
