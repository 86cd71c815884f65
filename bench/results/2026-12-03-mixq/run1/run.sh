#!/usr/bin/env bash
# mixq device run 1 (binaries of mixq e9a51c0): parity (MoE / FP8 / V4 ops), V4-Flash 4-layer FP4
# A/B (--qgemm 1 new / 0 old), bench-model prefill A/B (layer bench: bf16, fp8, fp8 --qgemm),
# golden V4 on CUDA, second rounds. Raw logs under $OUT.
cd "$(dirname "$0")/.."
C=.carry-mixq
mkdir -p /work && ln -sfn "$PWD" /work/wt-mixq   # fixture paths baked from the worktree
tar -C $C -xJf $C/bin.tar.xz && tar -C $C -xJf $C/v4b.tar.xz
B=$C/bin
S=$SECONDS
t() { echo "== $* (t=$((SECONDS - S)) s, $(date -u +%H:%M:%S))"; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv > $OUT/gpu.txt 2>&1
t parity
DEEPINFER_CUDA_SYNC=1 timeout 100 $B/test_ops --gtest_filter='AttentionMoe.Moe*:AttentionMoe.BatchInvariant*:AttentionMoe.PipeExperts*:AttentionMoe.CutlassExperts*:AttentionMoe.Quantized*:Fp8Ops.*:V4Ops.*:AttentionMoe.MlaPrefill*' > $OUT/parity.log 2>&1
tail -3 $OUT/parity.log; grep -E "FAILED|Failure|error" $OUT/parity.log | head -20
V="--config bench/cuda/bench-v4-flash-4l.config.json --experts fp4 --reps 3 --out $OUT/v4.jsonl"
v4() { timeout 60 $B/deepinfer_v4_model_bench $V "$@" 2>&1 | tee -a $OUT/v4.log | grep -E "prefill|^ +(1|8|32|64) " | cut -c1-150; }
lb() { timeout 50 $B/deepinfer_cuda_bench --prefill-only "$@" 2>&1 | tee -a $OUT/layer.log | grep -E "^(prefill|weights)" | cut -c1-150; }
t "v4 new r0"; v4 --qgemm 1 --batches 1,8,32,64 --contexts 4096 --prefill 512,4096,32768
t "v4 old r0"; v4 --qgemm 0 --batches 1,8,32,64 --contexts 4096 --prefill 512
t "layer fp8 r0"; lb --fp8 --out $OUT/layer_fp8.jsonl
t "layer fp8 qgemm r0"; lb --fp8 --qgemm --out $OUT/layer_fp8q.jsonl
t "layer bf16 r0"; lb --out $OUT/layer_bf16.jsonl
t golden_v4
DEEPINFER_ACCELERATOR=cuda DEEPINFER_BACKEND=cuda timeout 100 $B/test_golden_v4 > $OUT/golden_v4.log 2>&1
tail -3 $OUT/golden_v4.log; grep -E "FAILED|SKIPPED|golden v4\]" $OUT/golden_v4.log | head -12
t "v4 new r1"; v4 --qgemm 1 --batches 1,8,32,64 --contexts 4096 --prefill 512,4096
t "v4 old r1"; v4 --qgemm 0 --batches 1,8,32,64 --contexts 4096 --prefill 512
t "layer fp8 qgemm r1"; lb --fp8 --qgemm --out $OUT/layer_fp8q.jsonl
t "layer fp8 r1"; lb --fp8 --out $OUT/layer_fp8.jsonl
t "v4 main 70d91fb"; timeout 40 $C/deepinfer_v4_model_bench --config bench/cuda/bench-v4-flash-4l.config.json --experts fp4 --reps 3 --batches 1,8,64 --contexts 4096 --prefill 512 2>&1 | tee $OUT/v4_main.log | grep -E "prefill|^ +(1|8|32|64) " | cut -c1-150
t done
