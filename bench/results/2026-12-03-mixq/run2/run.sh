#!/usr/bin/env bash
# mixq device run 2 (binaries of mixq 8b95b9b): FP8 experts' new default (FP8 activations first,
# then moe_qgemm.cu): parity, layer-bench prefill A/B (fp8 default / fp8 --no-qgemm / bf16),
# V4-Flash 34 layers FP4 (prefill 4096 + decode, prefill 32k), golden V3 on CUDA. Raw logs under $OUT.
cd "$(dirname "$0")/.."
C=.carry-mixq
mkdir -p /work && ln -sfn "$PWD" /work/wt-mixq   # fixture paths baked from the worktree
tar -C $C -xJf $C/bin.tar.xz
B=$C/bin
S=$SECONDS
t() { echo "== $* (t=$((SECONDS - S)) s, $(date -u +%H:%M:%S))"; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv > $OUT/gpu.txt 2>&1
t parity
DEEPINFER_CUDA_SYNC=1 timeout 60 $B/test_ops --gtest_filter='AttentionMoe.Moe*:AttentionMoe.BatchInvariant*:AttentionMoe.PipeExperts*:AttentionMoe.Quantized*:Fp8Ops.*:V4Ops.MoeExpertsFp4' > $OUT/parity.log 2>&1
tail -2 $OUT/parity.log; grep -E "FAILED|Failure" $OUT/parity.log | head -20
lb() { timeout 30 $B/deepinfer_cuda_bench --prefill-only "$@" 2>&1 | tee -a $OUT/layer.log | grep -E "^prefill" | cut -c1-150; }
for r in 0 1; do
  t "layer fp8 (default) r$r"; lb --fp8 --out $OUT/layer_fp8.jsonl
  t "layer fp8 --no-qgemm r$r"; lb --fp8 --no-qgemm --out $OUT/layer_fp8_noq.jsonl
done
t "layer bf16"; lb --out $OUT/layer_bf16.jsonl
V="--config bench/cuda/bench-v4-flash-34l.config.json --experts fp4 --reps 3 --out $OUT/v4_34l.jsonl"
v4() { timeout 90 $B/deepinfer_v4_model_bench $V "$@" 2>&1 | tee -a $OUT/v4_34l.txt | grep -E "prefill|^ +(1|8|32|64) |loaded" | cut -c1-190; }
t "v4 34l decode + prefill 4096"; v4 --batches 1,8,32,64 --contexts 4096 --prefill 4096
t golden
DEEPINFER_ACCELERATOR=cuda DEEPINFER_BACKEND=cuda timeout 60 $B/test_golden > $OUT/golden.log 2>&1
tail -2 $OUT/golden.log; grep -E "FAILED" $OUT/golden.log | head
t "v4 34l prefill 32768"; v4 --batches 1 --contexts 4096 --prefill 32768
t done
