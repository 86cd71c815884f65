#!/usr/bin/env bash
# fa3 helper: parity of the wgmma prefill kernels, then an interleaved A/B (FA3_AB: 0 = mma.sync, 1 = wgmma, 2 = wgmma + overlap).
set -o pipefail
cd "$(dirname "$0")" && tar xJf bins.tar.xz || exit 1
{ nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw --format=csv; date -u; } | tee $OUT/ab.log
for v in 2 1 0; do
  echo "== parity FA3_AB=$v" | tee -a $OUT/parity.log
  FA3_AB=$v DEEPINFER_CUDA_SYNC=1 timeout 60 ./test_ops_ab --gtest_filter='AttentionMoe.MlaPrefill*' 2>&1 | tee -a $OUT/parity.log | grep -E "^\[  |Failure|error" | head -20
done
for v in 0 1 2 2 1 0; do
  echo "== FA3_AB=$v $(date -u +%T)" | tee -a $OUT/ab.log
  FA3_AB=$v timeout 60 ./bench_ab --prefill-only --prefill-lens 512,4096,32768 --out $OUT/ab_$v.jsonl 2>&1 | tee -a $OUT/ab.log | grep prefill
done
for v in 2 0 1; do
  echo "== profile FA3_AB=$v $(date -u +%T)" | tee -a $OUT/ab.log
  FA3_AB=$v timeout 60 ./bench_ab --prefill-only --profile-prefill --prefill-lens 512,4096,32768 2>&1 | tee $OUT/profile_$v.log | grep -E "profile|attention"
done
for v in 0 2; do
  echo "== context FA3_AB=$v $(date -u +%T)" | tee -a $OUT/ab.log
  FA3_AB=$v timeout 90 ./bench_ab --prefill-only --prefill-lens 4096 --prefill-context 2>&1 | tee -a $OUT/ab.log | grep prefill
done
date -u | tee -a $OUT/ab.log
