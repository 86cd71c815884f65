#!/usr/bin/env bash
# fp8grp device run (binaries of branch fp8grp 9cd33d0 since 17:48 UTC, aabea80 in run 1; main's deepinfer_cuda_bench of 14:31 UTC for the A/B):
# parity of what changed (Fp8Ops, AttentionMoe), test_golden on CUDA, interleaved layer-bench
# prefill 512 / 4096 A/B: main vs new, FP8 and BF16, plus the new binary's variants
# (FP8 experts off CUTLASS: --no-fp8-cutlass). Raw logs under $OUT (8 files at most).
cd "$(dirname "$0")/.."
C=.carry-fp8grp
mkdir -p /work && ln -sfn "$PWD" /work/wt-fp8grp   # fixture paths baked from the worktree
tar -C $C -xJf $C/bin.tar.xz
B=$C/bin
M=$C/bin/main_deepinfer_cuda_bench
N=$B/deepinfer_cuda_bench
S=$SECONDS
t() { echo "== $* (t=$((SECONDS - S)) s, $(date -u +%H:%M:%S))"; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv > $OUT/layer.log 2>&1
t parity
DEEPINFER_CUDA_SYNC=1 timeout 100 $B/test_ops --gtest_filter='Fp8Ops.*:AttentionMoe.*:V4Ops.MoeExpertsFp4' > $OUT/parity.log 2>&1
echo "test_ops rc=$?"; tail -2 $OUT/parity.log; grep -E "FAILED|Failure|normalised" $OUT/parity.log | head -40
t golden
DEEPINFER_ACCELERATOR=cuda DEEPINFER_BACKEND=cuda timeout 40 $B/test_golden > $OUT/golden.log 2>&1
echo "golden rc=$?"; tail -2 $OUT/golden.log; grep -E "FAILED|SKIP" $OUT/golden.log | head
lb() { local tag=$1 bin=$2; shift 2; echo "-- $tag $*" >> $OUT/layer.log; timeout 30 $bin --prefill-only "$@" --out $OUT/lb_$tag.jsonl 2>&1 | tee -a $OUT/layer.log | grep -E "^prefill" | sed "s/^/$tag /" | cut -c1-120; }
for r in 0 1; do
  t "round $r"
  lb main_fp8 $M --fp8
  lb new_fp8 $N --fp8
  lb new_fp8_noc $N --fp8 --no-fp8-cutlass
  lb main_bf16 $M
  lb new_bf16 $N
done
t "profile fp8 prefill (new)"
timeout 40 $N --prefill-only --fp8 --profile-prefill 2>&1 | tee -a $OUT/layer.log | head -40
t done
