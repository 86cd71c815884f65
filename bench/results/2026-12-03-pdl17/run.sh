#!/usr/bin/env bash
# pdl17 (one call): PDL parity without SYNC, interleaved A/B of the layer bench (main's binary of
# 7f24f78 vs pdl17's, and pdl17's --no-pdl), parity of the touched ops with SYNC, goldens on CUDA.
set -u
C="$PWD/.carry-pdl17"
OUT0="${OUT:-/tmp/out}"; mkdir -p "$OUT0"
OUT=/tmp/pdl17w; mkdir -p "$OUT"
pack() { tar -C "$OUT" -czf "$OUT0/results.tgz.tmp" . && mv "$OUT0/results.tgz.tmp" "$OUT0/results.tgz"; }
trap pack EXIT
mkdir -p "$C/g" && tar -C "$C/g" -xJf "$C/bin.tar.xz"
B="$C/g/bin"
export LD_LIBRARY_PATH="/usr/local/cuda/lib64:/usr/local/cuda/targets/x86_64-linux/lib:${LD_LIBRARY_PATH:-}"
mkdir -p /work && ln -sfn "$PWD" /work/wt-pdl17
t0=$(date +%s)
{ date -u; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv; ls -la "$B"; } > "$OUT/env.log" 2>&1
echo "== pdl tests without DEEPINFER_CUDA_SYNC $(( $(date +%s) - t0 ))s"
timeout -k 5 50 "$B/test_ops" --gtest_filter='AttentionMoe.DecodeStepPdl*:DenseOps.Pipe*:AttentionMoe.SideLine*' --gtest_repeat=3 \
  > "$OUT/parity_nosync.log" 2>&1; echo "rc $?"; grep -E "^\[  (PASSED|FAILED)|FAILED|tests ran" "$OUT/parity_nosync.log" | sort | uniq -c | tail -8
pack
echo "== A/B $(( $(date +%s) - t0 ))s"
for round in 1 2; do
  for dt in bf16 fp8; do
    f=""; [[ $dt == fp8 ]] && f="--fp8"
    for arm in old new nopdl; do
      exe="$B/bench_new"; extra=""
      [[ $arm == old ]] && exe="$B/bench_old"
      [[ $arm == nopdl ]] && extra="--no-pdl"
      timeout -k 5 30 "$exe" $f --graphs --decode-only $extra --out "$OUT/ab_${arm}.jsonl" > "$OUT/ab_${arm}_${dt}_r${round}.log" 2>&1
      echo "r$round $dt $arm: $(grep graph "$OUT/ab_${arm}_${dt}_r${round}.log" | awk '{printf "b%s %sms | ", $5, $11}')"
    done
  done
done
pack
echo "== parity (SYNC) $(( $(date +%s) - t0 ))s"
DEEPINFER_CUDA_SYNC=1 timeout -k 5 70 "$B/test_ops" --gtest_filter='AttentionMoe.*:DenseOps.*:FusedMla.*:MlaAbsorbed.*' \
  > "$OUT/parity.log" 2>&1; echo "rc $?"; grep -E "^\[  (PASSED|FAILED)|FAILED|tests ran|ms total" "$OUT/parity.log" | tail -14
pack
echo "== golden $(( $(date +%s) - t0 ))s"
if [[ -x "$B/test_golden" ]]; then
  DEEPINFER_ACCELERATOR=cuda DEEPINFER_BACKEND=cuda timeout -k 5 45 "$B/test_golden" > "$OUT/golden_test_golden.log" 2>&1; echo "test_golden rc $?"
  grep -E "^\[  (PASSED|FAILED|SKIPPED)|tests ran|FAILED" "$OUT/golden_test_golden.log" | tail -5
fi
echo "done $(( $(date +%s) - t0 ))s"
