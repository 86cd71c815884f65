#!/usr/bin/env bash
# Lead, session 16 call D: merged main: parity, goldens, side-priority A/B, chunk at long contexts, bench, ablation.
set -u
C="$PWD/.carry-lead"; R="${OUT:-/tmp/out}"; mkdir -p "$R"
W=/tmp/s16d; mkdir -p "$W"
pack() { tar -C "$W" -cJf "$R/results.tar.xz.tmp" . && mv "$R/results.tar.xz.tmp" "$R/results.tar.xz"; }
trap pack EXIT
mkdir -p "$C/g" && tar -C "$C/g" -xJf "$C/bind.tar.xz"; B="$C/g/bin"
export LD_LIBRARY_PATH="/usr/local/cuda/lib64:/usr/local/cuda/targets/x86_64-linux/lib:${LD_LIBRARY_PATH:-}"
t0=$(date +%s); ts() { echo "[$(date -u +%H:%M:%S) +$(( $(date +%s) - t0 ))s]"; }
{ date -u; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,power.limit --format=csv; } > "$W/env.log" 2>&1
echo "$(ts) == parity (SYNC)"
DEEPINFER_CUDA_SYNC=1 timeout -k 5 90 "$B/test_ops" > "$W/parity.log" 2>&1; echo "test_ops rc $?"
grep -E "^\[  (PASSED|FAILED)|FAILED|SKIPPED \]" "$W/parity.log" | tail -8
timeout -k 5 60 "$B/test_ops" --gtest_filter='AttentionMoe.DecodeStepPdl*:AttentionMoe.SideLine*' --gtest_repeat=3 > "$W/parity_nosync.log" 2>&1
echo "no-SYNC rc $?"; grep -E "^\[  (PASSED|FAILED)" "$W/parity_nosync.log" | sort | uniq -c
echo "$(ts) == golden"
DEEPINFER_ACCELERATOR=cuda DEEPINFER_BACKEND=cuda timeout -k 5 40 "$B/test_golden" > "$W/golden.log" 2>&1
echo "test_golden rc $?"; grep -E "^\[  (PASSED|FAILED|SKIPPED)|FAILED" "$W/golden.log" | tail -4
pack
echo "$(ts) == A/B main vs --side-priority (graph decode, 3 rounds)"
for r in 1 2 3; do
  arms="main prio"; [[ $r == 2 ]] && arms="prio main"
  for dt in bf16 fp8; do f=""; [[ $dt == fp8 ]] && f="--fp8"
    for a in $arms; do x=""; [[ $a == prio ]] && x="--side-priority"
      timeout -k 5 40 "$B/deepinfer_cuda_bench" $f $x --graphs --decode-only --decode-batches 1,8,32,64 \
        --out "$W/ab_$a.jsonl" > "$W/ab_${a}_${dt}_r$r.log" 2>&1
      echo "r$r $dt $a: $(grep graph "$W/ab_${a}_${dt}_r$r.log" | awk '{printf "b%s %s | ", $5, $11}')"
    done
  done
  pack
done | tee "$W/ab_summary.txt"
echo "$(ts) == chunk at long contexts (bf16, graph)"
declare -A FL=([def]="" [c32]="--attn-chunk 32" [c64]="--attn-chunk 64")
for r in 1 2; do
  arms="def c32 c64"; [[ $r == 2 ]] && arms="c64 c32 def"
  for ctx in 4096 8192; do
    for a in $arms; do
      timeout -k 5 90 "$B/deepinfer_cuda_bench" ${FL[$a]} --graphs --decode-only --decode-batches 8,16,32,64 --decode-ctx $ctx \
        --out "$W/ctx_$a.jsonl" > "$W/ctx_${a}_${ctx}_r$r.log" 2>&1
      echo "r$r ctx $ctx $a: $(grep graph "$W/ctx_${a}_${ctx}_r$r.log" | awk '{printf "b%s %s | ", $5, $11}')"
    done
  done
  pack
done | tee "$W/ctx_summary.txt"
echo "$(ts) == bench (prefill too)"
for dt in bf16 fp8; do f=""; [[ $dt == fp8 ]] && f="--fp8"
  timeout -k 5 60 "$B/deepinfer_cuda_bench" $f --graphs --out "$W/bench_${dt}.jsonl" > "$W/bench_${dt}.log" 2>&1
  echo "$dt rc $?"; grep -E "graph|prefill" "$W/bench_${dt}.log" | sed 's/  */ /g'
done
pack
echo "$(ts) == ablate (bf16, batch 1)"
timeout -k 5 60 "$B/deepinfer_cuda_bench" --ablate --decode-batches 1 --out "$W/ablate.jsonl" > "$W/ablate_bf16.log" 2>&1; echo "ablate rc $?"
grep "batch   1" "$W/ablate_bf16.log" | sed 's/  */ /g' | awk '{$1=$2=$3=$4=""; print}' | head -30
echo "$(ts) done"
