#!/usr/bin/env bash
# Session 17 call G: where call E's bf16 batch-64 loss comes from. Arms (graph decode): new (main,
# 1241050), v1 (new + the index kernel at 1,024 threads above 256 pairs), v2 (new + the routing's old
# butterfly top-k), old (main before call E, call D's binary with --pipe-wide 0); batches 32,64 bf16 +
# fp8 three rounds, batches 1,8 bf16 two rounds.
set -u
C="$PWD/.carry-lead"
OUT0="${OUT:-/tmp/out}"; mkdir -p "$OUT0"
OUT=/tmp/s17g; mkdir -p "$OUT"
pack() { tar -C "$OUT" -cJf "$OUT0/results.tar.xz.tmp" . && mv "$OUT0/results.tar.xz.tmp" "$OUT0/results.tar.xz"; }
trap pack EXIT
mkdir -p "$C/g" && tar -C "$C/g" -xJf "$C/bin.tar.xz"
B="$C/g/bin"
export LD_LIBRARY_PATH="/usr/local/cuda/lib64:/usr/local/cuda/targets/x86_64-linux/lib:${LD_LIBRARY_PATH:-}"
t0=$(date +%s)
ts() { echo "[$(date -u +%H:%M:%S) +$(( $(date +%s) - t0 ))s]"; }
left() { echo $(( ${BUDGET:-200} - ($(date +%s) - t0) )); }
{ date -u; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,power.limit --format=csv; } > "$OUT/env.log" 2>&1
cat "$OUT/env.log"
ab() {  # rounds batches dtypes
  for round in $(seq 1 $1); do
    arms="new v1 v2 old"; [[ $((round % 2)) == 0 ]] && arms="old v2 v1 new"
    for dt in $3; do
      f=""; [[ $dt == fp8 ]] && f="--fp8"
      for arm in $arms; do
        [[ $(left) -lt 15 ]] && { echo "$(ts) out of time"; return; }
        a=""; [[ $arm == old ]] && a="--pipe-wide 0"
        lg="$OUT/ab_${arm}_${dt}_b${2//,/-}_r${round}.log"
        timeout -k 5 40 "$B/deepinfer_cuda_bench_$arm" $a $f --graphs --decode-only --decode-batches $2 --out "$OUT/ab_${arm}.jsonl" > "$lg" 2>&1
        echo "$(ts) r$round $dt $arm: $(grep graph "$lg" | awk '{printf "b%s %sms | ", $5, $11}')"
      done
    done
    pack
  done
}
ab 3 32,64 "bf16 fp8"
ab 2 1,8 "bf16"
echo "$(ts) done"
