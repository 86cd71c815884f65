#!/usr/bin/env bash
# fp8items17 (one call, <= 240 s): interleaved A/B of the pipeline kernel's 32-column items
# (CudaOptions::pipe_wide_*, deepinfer_cuda_bench --pipe-wide F,B,MIN,STAGES) against 16-column
# items and main's binary, FP8 and bf16, batches 1 8 32 64, 3 rounds (order reversed in round 2);
# parity (DEEPINFER_CUDA_SYNC=1) AttentionMoe.*, Fp8Ops.*, DenseOps.*; test_golden on CUDA; ncu
# durations of every pipe_gemm_kernel launch of one eager step at batch 1 and 64 (FP8 16 / 32
# columns, bf16).
# Run from /work/main's tree on the device: bash .carry-fp8items17/run.sh (carry [".carry-fp8items17"]).
set -u
C="$PWD/.carry-fp8items17"
OUT0="${OUT:-/tmp/out}"; mkdir -p "$OUT0"
W=/tmp/fp8items17; mkdir -p "$W"
pack() { tar -C "$W" -cJf "$OUT0/results.tar.xz.tmp" . && mv "$OUT0/results.tar.xz.tmp" "$OUT0/results.tar.xz"; }
trap pack EXIT
t0=$(date +%s)
el() { echo $(( $(date +%s) - t0 )); }
mkdir -p "$C/g" && tar -C "$C/g" -xJf "$C/bin.tar.xz"
B="$C/g/bin"
export LD_LIBRARY_PATH="/usr/local/cuda/lib64:/usr/local/cuda/targets/x86_64-linux/lib:${LD_LIBRARY_PATH:-}"
mkdir -p /work && ln -sfn "$PWD" /work/wt-fp8items17  # test_golden's fixtures (the build tree's source path)
{ date -u; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,power.limit --format=csv; ls -la "$B"; } > "$W/env.log" 2>&1
echo "== A/B $(el)s"
# arms: name|binary|flags
FP8_ARMS=("old|bench_old|" "narrow|bench|--pipe-wide 0,0,0,0" "wide4|bench|" "wide0|bench|--pipe-wide 1,0,0,0"
          "wide4s3|bench|--pipe-wide 1,0,4,3")
BF16_ARMS=("old|bench_old|" "narrow|bench|--pipe-wide 0,0,0,0" "bf16wide|bench|--pipe-wide 1,1,4,0")
for round in 1 2 3; do
  for dt in fp8 bf16; do
    if [[ $dt == fp8 ]]; then f="--fp8"; arms=("${FP8_ARMS[@]}"); else f=""; arms=("${BF16_ARMS[@]}"); fi
    order=$(seq 0 $(( ${#arms[@]} - 1 ))); [[ $round == 2 ]] && order=$(echo "$order" | tac)
    for i in $order; do
      IFS='|' read -r name exe extra <<< "${arms[$i]}"
      log="$W/ab_${name}_${dt}_r${round}.log"
      timeout -k 5 40 "$B/$exe" $f --graphs --decode-only $extra --out "$W/ab_${name}_${dt}.jsonl" > "$log" 2>&1
      echo "r$round $dt $name: $(grep graph "$log" | awk '{printf "b%s %sms | ", $5, $11}')"
    done
  done
  [[ $(el) -gt 100 ]] && { echo "A/B: stopping after round $round (time)"; break; }
done | tee "$W/ab_summary.txt"
pack
echo "== parity (SYNC) $(el)s"
DEEPINFER_CUDA_SYNC=1 timeout -k 5 75 "$B/test_ops" --gtest_filter='AttentionMoe.*:Fp8Ops.*:DenseOps.*' \
  > "$W/parity.log" 2>&1; echo "rc $?"; grep -E "^\[  (PASSED|FAILED)|FAILED|tests ran|ms total" "$W/parity.log" | tail -14
pack
echo "== golden $(el)s"
DEEPINFER_ACCELERATOR=cuda DEEPINFER_BACKEND=cuda timeout -k 5 40 "$B/test_golden" > "$W/golden.log" 2>&1
echo "test_golden rc $?"; grep -E "^\[  (PASSED|FAILED|SKIPPED)|tests ran|FAILED" "$W/golden.log" | tail -6
pack
echo "== ncu $(el)s"
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
for arm in fp8narrow fp8wide bf16; do
  left=$(( 228 - $(el) )); [[ $left -lt 12 ]] && { echo "ncu $arm: no time left"; continue; }
  case $arm in
    fp8narrow) a="--fp8 --pipe-wide 0,0,0,0" ;;
    fp8wide) a="--fp8" ;;
    bf16) a="" ;;
  esac
  timeout -k 3 $(( left / 2 > 40 ? 40 : left / 2 )) "$NCU" --clock-control none --profile-from-start off -k regex:pipe_gemm_kernel \
    --metrics gpu__time_duration.sum,dram__bytes_read.sum,smsp__inst_executed.sum,sm__warps_active.avg.pct_of_peak_sustained_active,smsp__issue_active.avg.pct_of_peak_sustained_active,launch__grid_size,launch__registers_per_thread \
    --csv --page raw "$B/bench" $a --ncu-steps 1,64 > "$W/ncu_$arm.csv" 2> "$W/ncu_$arm.err"
  echo "ncu $arm rc $? $(wc -l < "$W/ncu_$arm.csv") lines"
done
echo "done $(el)s"
