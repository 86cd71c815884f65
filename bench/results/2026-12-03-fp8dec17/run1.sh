#!/usr/bin/env bash
# fp8dec17 (one call): parity of the FP8 conversion paths, interleaved A/B of the layer bench
# (main's binary = old, fp8dec17's = new, its --fp8-cvt-chain arm = chain), ncu of
# pipe_gemm_kernel<FP8> at batch 64 for new and chain.
set -u
C="$PWD/.carry-fp8dec17"
OUT0="${OUT:-/tmp/out}"; mkdir -p "$OUT0"
W=/tmp/fp8w; mkdir -p "$W"
pack() { tar -C "$W" -czf "$OUT0/results.tgz.tmp" . && mv "$OUT0/results.tgz.tmp" "$OUT0/results.tgz"; }
trap pack EXIT
mkdir -p "$C/g" && tar -C "$C/g" -xJf "$C/bin.tar.xz"
B="$C/g/bin"
export LD_LIBRARY_PATH="/usr/local/cuda/lib64:/usr/local/cuda/targets/x86_64-linux/lib:${LD_LIBRARY_PATH:-}"
t0=$(date +%s)
{ date -u; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv; ls -la "$B"; } > "$W/env.log" 2>&1
echo "== parity $(( $(date +%s) - t0 ))s"
DEEPINFER_CUDA_SYNC=1 timeout -k 5 60 "$B/test_ops" \
  --gtest_filter='Fp8Ops.*:AttentionMoe.PipeExperts*:AttentionMoe.MoeExperts:DenseOps.PipeDense*' > "$W/parity.log" 2>&1
echo "rc $?"; grep -E "^\[  (PASSED|FAILED)|FAILED|tests ran|OK \]" "$W/parity.log" | tail -16
pack
echo "== A/B $(( $(date +%s) - t0 ))s"
for round in 1 2; do
  for dt in fp8 bf16; do
    f=""; arms="old new chain"
    [[ $dt == fp8 ]] && f="--fp8"
    [[ $dt == bf16 ]] && arms="old new"
    for arm in $arms; do
      exe="$B/bench_new"; extra=""
      [[ $arm == old ]] && exe="$B/bench_old"
      [[ $arm == chain ]] && extra="--fp8-cvt-chain"
      [[ -x $exe ]] || continue
      timeout -k 5 30 "$exe" $f --graphs --decode-only $extra --out "$W/ab_${arm}.jsonl" > "$W/ab_${arm}_${dt}_r${round}.log" 2>&1
      echo "r$round $dt $arm: $(grep graph "$W/ab_${arm}_${dt}_r${round}.log" | awk '{printf "b%s %sms | ", $5, $11}')"
    done
  done
done
pack
echo "== ncu $(( $(date +%s) - t0 ))s"
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
for arm in new chain; do
  extra=""; [[ $arm == chain ]] && extra="--fp8-cvt-chain"
  timeout -k 5 45 "$NCU" --clock-control none --profile-from-start off -k regex:pipe_gemm_kernel -c 2 \
    --section SpeedOfLight --section ComputeWorkloadAnalysis --section SchedulerStats --section WarpStateStats \
    --section InstructionStats --section MemoryWorkloadAnalysis --csv --page details \
    "$B/bench_new" --fp8 --ncu-steps 64 $extra > "$W/ncu_$arm.csv" 2> "$W/ncu_$arm.err"
  echo "ncu $arm rc $? $(wc -l < "$W/ncu_$arm.csv") lines"
  grep -E '"(Duration|DRAM Throughput|Issue Slots Busy|Executed Ipc Active|No Eligible|Memory Throughput)"' "$W/ncu_$arm.csv" | cut -d, -f5,13- | head -12
done
echo "done $(( $(date +%s) - t0 ))s"
