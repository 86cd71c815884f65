#!/usr/bin/env bash
# dec18 (one call): interleaved A/B of the layer bench (main's binary vs dec18's, with its
# switches as arms), parity of the touched ops, goldens on CUDA.
# switches as arms), parity of the touched ops, goldens on CUDA.
set -u
C="$PWD/.carry-dec18"
OUT0="${OUT:-/tmp/out}"; mkdir -p "$OUT0"
OUT=/tmp/dec18w; mkdir -p "$OUT"
pack() { tar -C "$OUT" -czf "$OUT0/results.tgz.tmp" . && mv "$OUT0/results.tgz.tmp" "$OUT0/results.tgz"; }
trap pack EXIT
mkdir -p "$C/g" && tar -C "$C/g" -xJf "$C/bin.tar.xz"
B="$C/g/bin"
export LD_LIBRARY_PATH="/usr/local/cuda/lib64:/usr/local/cuda/targets/x86_64-linux/lib:${LD_LIBRARY_PATH:-}"
mkdir -p /work && ln -sfn "$PWD" /work/wt-dec18
t0=$(date +%s)
{ date -u; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv; ls -la "$B"; } > "$OUT/env.log" 2>&1
echo "== A/B $(( $(date +%s) - t0 ))s"
for round in 1 2; do
  for dt in fp8 bf16; do
    f=""; arms="old new fs2 fs8 nodense nopdl normloop"
    [[ $dt == fp8 ]] && f="--fp8"
    [[ $dt == bf16 ]] && arms="old new densebf16 densebf16nopdl normloop"
    for arm in $arms; do
      exe="$B/bench_new"; extra=""
      [[ $arm == old ]] && exe="$B/bench_old"
      [[ $arm == fs2 ]] && extra="--pipe-fp8-stages 2"
      [[ $arm == fs8 ]] && extra="--pipe-fp8-stages 8"
      [[ $arm == nodense ]] && extra="--no-dense-pipe"
      [[ $arm == densebf16 ]] && extra="--dense-pipe-bf16"
      [[ $arm == normloop ]] && extra="--norm-loop"
      [[ $arm == nopdl ]] && extra="--no-pdl"
      [[ $arm == densebf16nopdl ]] && extra="--dense-pipe-bf16 --no-pdl"
      timeout -k 5 30 "$exe" $f --graphs --decode-only $extra --out "$OUT/ab_${arm}.jsonl" > "$OUT/ab_${arm}_${dt}_r${round}.log" 2>&1
      echo "r$round $dt $arm: $(grep graph "$OUT/ab_${arm}_${dt}_r${round}.log" | awk '{printf "b%s %sms | ", $5, $11}')"
    done
  done
done
pack
echo "== parity $(( $(date +%s) - t0 ))s"
DEEPINFER_CUDA_SYNC=1 timeout -k 5 80 "$B/test_ops" --gtest_filter='DenseOps.*:AttentionMoe.PipeExperts*:AttentionMoe.MoeExperts:AttentionMoe.SideLine*:Fp8Ops.*' \
  > "$OUT/parity.log" 2>&1; echo "rc $?"; grep -E "^\[  (PASSED|FAILED)|FAILED|tests ran|ms total" "$OUT/parity.log" | tail -14
echo "== pdl tests without DEEPINFER_CUDA_SYNC $(( $(date +%s) - t0 ))s"
timeout -k 5 40 "$B/test_ops" --gtest_filter='DenseOps.Pipe*:AttentionMoe.SideLine*' \
  > "$OUT/parity_nosync.log" 2>&1; echo "rc $?"; grep -E "^\[  (PASSED|FAILED)|FAILED|tests ran" "$OUT/parity_nosync.log" | tail -6
pack
echo "== golden $(( $(date +%s) - t0 ))s"
for g in test_golden test_golden_runner; do
  DEEPINFER_ACCELERATOR=cuda DEEPINFER_BACKEND=cuda timeout -k 5 60 "$B/$g" > "$OUT/golden_$g.log" 2>&1; echo "$g rc $?"
  grep -E "^\[  (PASSED|FAILED|SKIPPED)|tests ran|FAILED" "$OUT/golden_$g.log" | tail -5
done
echo "done $(( $(date +%s) - t0 ))s"
