#!/usr/bin/env bash
# l2pf19: parity of prefetch_weights, then interleaved A/B of the --prefetch schedules.
set -u
start=$(date +%s)
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p /tmp/l2 && tar -xJf "$here/bin.tar.xz" -C /tmp/l2
B=/tmp/l2/bin
export DEEPINFER_ACCELERATOR=cuda DEEPINFER_BACKEND=cuda
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $OUT/parity.log 2>&1
for sync in 1 0; do
  DEEPINFER_CUDA_SYNC=$sync $B/test_ops --gtest_filter='*Prefetch*:*SideLine*' >> $OUT/parity.log 2>&1; echo "test_ops sync=$sync rc=$?" >> $OUT/parity.log
done
for dt in "" "--fp8"; do
  DEEPINFER_CUDA_SYNC=1 $B/deepinfer_cuda_bench $dt --prefetch qosn --prefetch-parity --decode-batches 1,8 >> $OUT/parity.log 2>&1; echo "parity sync $dt rc=$?" >> $OUT/parity.log
  $B/deepinfer_cuda_bench $dt --prefetch qosn --prefetch-parity --decode-batches 1,8,64 >> $OUT/parity.log 2>&1; echo "parity $dt rc=$?" >> $OUT/parity.log
done
echo "parity done at $(( $(date +%s) - start )) s" >> $OUT/parity.log
for round in 1 2 3; do
  for dt in "" "--fp8"; do
    for arm in none o os qos osn; do
      if (( $(date +%s) - start > 165 )); then echo "stopped at round $round (time)" >> $OUT/ab.log; break 3; fi
      echo "=== round $round ${dt:-bf16} prefetch $arm" >> $OUT/ab.log
      $B/deepinfer_cuda_bench --graphs --decode-only $dt --prefetch $arm --decode-batches 1,8,32,64 \
        --out $OUT/ab-$arm.jsonl 2>&1 | grep -E "graph|error|fail" >> $OUT/ab.log
    done
  done
done
echo "ab done at $(( $(date +%s) - start )) s" >> $OUT/ab.log
