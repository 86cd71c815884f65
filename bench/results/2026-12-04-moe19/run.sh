#!/usr/bin/env bash
# moe19 (one call): route17's routing + MoE index in one block (moe_route_index_kernel) on main after
# moe18. Parity with DEEPINFER_CUDA_SYNC=1, then without (reads before pdl_wait happen only then),
# then the interleaved A/B of the graph decode step, one binary: --route-fused-tokens 0 (main's ops)
# vs 64 (fused), bf16 and fp8, batches 1,8 (3 rounds) then 32,64 (2 rounds), arms reversed in
# alternate rounds; then --ablate --decode-batches 1,8 of the fused arm if time is left.
set -u
C="$PWD/.carry-moe19"; R="${OUT:-/tmp/out}"; mkdir -p "$R"
W=/tmp/moe19w; mkdir -p "$W"
pack() { tar -C "$W" -cJf "$R/results.tar.xz.tmp" . && mv "$R/results.tar.xz.tmp" "$R/results.tar.xz"; }
trap pack EXIT
mkdir -p "$C/g" && tar -C "$C/g" -xJf "$C/bin.tar.xz"; B="$C/g/bin"
export LD_LIBRARY_PATH="/usr/local/cuda/lib64:/usr/local/cuda/targets/x86_64-linux/lib:${LD_LIBRARY_PATH:-}"
t0=$(date +%s); ts() { echo "[$(date -u +%H:%M:%S) +$(( $(date +%s) - t0 ))s]"; }
{ date -u; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,power.limit --format=csv; ls -la "$B"; } > "$W/env.log" 2>&1
echo "$(ts) == parity (SYNC)"
DEEPINFER_CUDA_SYNC=1 timeout -k 5 60 "$B/test_ops" --gtest_filter='AttentionMoe.RouteExperts*:AttentionMoe.MoeExperts*:AttentionMoe.Pipe*:AttentionMoe.DecodeStepPdl*:AttentionMoe.BatchInvariant*:AttentionMoe.SideLine*' > "$W/parity.log" 2>&1; rc=$?; echo "rc $rc"
grep -E "^\[  PASSED|^\[  FAILED|tests ran|OK \] AttentionMoe.Route" "$W/parity.log" | tail -12
grep -m3 -B2 -A8 "Failure" "$W/parity.log" | head -30
echo "$(ts) == no-SYNC"
timeout -k 5 40 "$B/test_ops" --gtest_filter='AttentionMoe.RouteExperts*:AttentionMoe.DecodeStepPdl*:AttentionMoe.PipeSwiglu*:AttentionMoe.SideLine*' \
  --gtest_repeat=2 > "$W/parity_nosync.log" 2>&1; rc2=$?; echo "rc $rc2"
grep -E "^\[  PASSED|^\[  FAILED|tests ran" "$W/parity_nosync.log" | sort | uniq -c | tail -6
grep -m3 -B2 -A8 "Failure" "$W/parity_nosync.log" | head -30
pack
[[ $rc == 124 || $rc == 137 || $rc2 == 124 || $rc2 == 137 ]] && { echo "tests timed out: a hang; no A/B"; exit 1; }
declare -A SW=([main]=0 [fused]=64)
ab() {  # ab ROUND BATCHES ARMS
  for dt in bf16 fp8; do f=""; [[ $dt == fp8 ]] && f="--fp8"
    for a in $3; do
      lg="$W/ab_${a}_${dt}_b${2//,/-}_r$1.log"
      timeout -k 5 30 "$B/deepinfer_cuda_bench" $f --graphs --decode-only --decode-batches "$2" --route-fused-tokens ${SW[$a]} \
        --out "$W/ab_$a.jsonl" > "$lg" 2>&1
      echo "$(ts) r$1 $dt $a: $(grep graph "$lg" | awk '{printf "b%s %sms | ", $5, $11}')"
    done
  done
}
echo "$(ts) == A/B"
ab 1 1,8 "main fused"; ab 2 1,8 "fused main"; ab 3 1,8 "main fused"; pack
ab 1 32,64 "fused main"; ab 2 32,64 "main fused"; pack
left=$(( 192 - ($(date +%s) - t0) ))
if (( left > 14 )); then
  echo "$(ts) == ablate, fused arm, bf16 b1,8"
  timeout -k 3 $(( left - 3 )) "$B/deepinfer_cuda_bench" --graphs --ablate --decode-batches 1,8 --route-fused-tokens 64 \
    --out "$W/ablate.jsonl" > "$W/ablate_bf16.log" 2>&1
  grep -iE "moe|whole|side|shared" "$W/ablate_bf16.log" | head -12
fi
echo "$(ts) done"
