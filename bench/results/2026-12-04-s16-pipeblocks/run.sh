#!/usr/bin/env bash
# Lead, session 16 call C: the pipeline kernel's grid capped per SM (dense / grouped), interleaved A/B.
set -u
C="$PWD/.carry-lead"; R="${OUT:-/tmp/out}"; mkdir -p "$R"
W=/tmp/s16c; mkdir -p "$W"
pack() { tar -C "$W" -cJf "$R/results.tar.xz.tmp" . && mv "$R/results.tar.xz.tmp" "$R/results.tar.xz"; }
trap pack EXIT
mkdir -p "$C/g" && tar -C "$C/g" -xJf "$C/binc.tar.xz"; B="$C/g/bin"
export LD_LIBRARY_PATH="/usr/local/cuda/lib64:/usr/local/cuda/targets/x86_64-linux/lib:${LD_LIBRARY_PATH:-}"
{ date -u; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,power.limit --format=csv; } > "$W/env.log" 2>&1
timeout -k 5 60 "$B/test_ops" --gtest_filter='DenseOps.Pipe*:AttentionMoe.DecodeStepPdl*' > "$W/parity_nosync.log" 2>&1
echo "parity rc $?"; grep -E "^\[  (PASSED|FAILED)" "$W/parity_nosync.log"
declare -A FL=([main]="0,0" [d1]="1,0" [g1]="0,1" [dg1]="1,1" [d2]="2,0" [g2]="0,2")
for r in 1 2; do
  arms="main d1 g1 dg1 d2 g2"; [[ $r == 2 ]] && arms="g2 d2 dg1 g1 d1 main"
  for dt in bf16 fp8; do f=""; [[ $dt == fp8 ]] && f="--fp8"
    for a in $arms; do
      timeout -k 5 40 "$B/deepinfer_cuda_bench" $f --pipe-blocks ${FL[$a]} --graphs --decode-only --decode-batches 1,8,32,64 \
        --out "$W/ab_$a.jsonl" > "$W/ab_${a}_${dt}_r$r.log" 2>&1
      echo "r$r $dt $a: $(grep graph "$W/ab_${a}_${dt}_r$r.log" | awk '{printf "b%s %s | ", $5, $11}')"
    done
  done
  pack
done | tee "$W/ab_summary.txt"
