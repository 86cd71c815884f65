#!/usr/bin/env bash
# rowepi17 (one call): the row epilogue's PDL / graph tests without DEEPINFER_CUDA_SYNC, the
# interleaved A/B of the layer bench (one binary: --row-epi-rows 0 = off, the default = on with the
# rows split, --row-epi-last = on, last block only), parity with SYNC, goldens on CUDA, a profile.
set -u
C="$PWD/.carry-rowepi17"
OUT0="${OUT:-/tmp/out}"; mkdir -p "$OUT0"
OUT=/tmp/rowepi17w; mkdir -p "$OUT"
pack() { tar -C "$OUT" -cJf "$OUT0/results.tar.xz.tmp" . && mv "$OUT0/results.tar.xz.tmp" "$OUT0/results.tar.xz"; }
trap pack EXIT
mkdir -p "$C/g" && tar -C "$C/g" -xJf "$C/bin.tar.xz"
B="$C/g/bin"
export LD_LIBRARY_PATH="/usr/local/cuda/lib64:/usr/local/cuda/targets/x86_64-linux/lib:${LD_LIBRARY_PATH:-}"
mkdir -p /work && ln -sfn "$PWD" /work/wt-rowepi17
t0=$(date +%s)
ts() { echo "[$(date -u +%H:%M:%S) +$(( $(date +%s) - t0 ))s]"; }
{ date -u; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,power.limit --format=csv; ls -la "$B"
  cuobjdump -res-usage "$B/deepinfer_cuda_bench" 2>&1 | grep -A1 "pipe_gemm_kernel" | head -8; } > "$OUT/env.log" 2>&1
echo "$(ts) == no-SYNC: row epilogue, PDL, side line, pipe"
timeout -k 5 45 "$B/test_ops" --gtest_filter='DenseOps.RowEpilogue*:DenseOps.GemmRowEpilogue*:AttentionMoe.DecodeStepPdl*:DenseOps.Pipe*:AttentionMoe.SideLine*' \
  --gtest_repeat=2 > "$OUT/parity_nosync.log" 2>&1; rc=$?; echo "rc $rc"
grep -E "^\[  (PASSED|FAILED)|^\[  FAILED|tests ran" "$OUT/parity_nosync.log" | sort | uniq -c | tail -8
grep -m3 -B2 -A6 "Failure" "$OUT/parity_nosync.log" | head -30
pack
echo "$(ts) == A/B"
[[ $rc == 124 || $rc == 137 ]] && { echo "no-SYNC tests timed out: a hang; no A/B"; exit 1; }
for round in 1 2; do
  arms="off on last"; [[ $round == 2 ]] && arms="last on off"
  for dt in bf16 fp8; do
    f=""; [[ $dt == fp8 ]] && f="--fp8"
    for arm in $arms; do
      extra=""; exe="$B/deepinfer_cuda_bench"
      [[ $arm == off ]] && extra="--row-epi-rows 0"
      [[ $arm == last ]] && extra="--row-epi-last"
      timeout -k 5 20 "$exe" $f --graphs --decode-only --decode-batches 1,8,16,32,64 $extra \
        --out "$OUT/ab_${arm}.jsonl" > "$OUT/ab_${arm}_${dt}_r${round}.log" 2>&1
      echo "$(ts) r$round $dt $arm: $(grep graph "$OUT/ab_${arm}_${dt}_r${round}.log" | awk '{printf "b%s %sms | ", $5, $11}')"
    done
  done
done
pack
echo "$(ts) == parity (SYNC)"
DEEPINFER_CUDA_SYNC=1 timeout -k 5 70 "$B/test_ops" --gtest_filter='AttentionMoe.*:DenseOps.*:FusedMla.*:MlaAbsorbed.*' \
  > "$OUT/parity.log" 2>&1; echo "rc $?"
grep -E "^\[  (PASSED|FAILED)|^\[  FAILED|tests ran|ms total" "$OUT/parity.log" | tail -14
grep -m3 -B2 -A6 "Failure" "$OUT/parity.log" | head -30
pack
echo "$(ts) == golden"
for t in test_golden test_golden_runner; do
  DEEPINFER_ACCELERATOR=cuda DEEPINFER_BACKEND=cuda timeout -k 5 40 "$B/$t" > "$OUT/$t.log" 2>&1; echo "$t rc $?"
  grep -E "^\[  (PASSED|FAILED|SKIPPED)|tests ran|^\[  FAILED" "$OUT/$t.log" | tail -6
done
pack
echo "$(ts) done"
