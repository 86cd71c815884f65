#!/usr/bin/env bash
# DeepSeek-V3.2 against V3 at full width (issue 14 item 6), one H200 run (~5 min):
#  1. whole-model decode step (bench/cuda/model_decode_bench.cpp: random FP8 weights, random KV,
#     one graphed forward per step) of the 4-layer full-width configs (hidden 7168, 128 heads,
#     256 experts top-8, 1 dense + 3 MoE layers; V3.2 adds the indexer, 64 heads x 128, top 2048)
#     at batch 1 / 8 / 32 and contexts 4k / 32k / 128k, with the bytes-read roofline at 4800 GB/s;
#  2. the engine path on V3.2 random weights: deepinfer bench (prefill 4096, decode at 4k).
# Run from the repo root: BIN=build-gpu/bin OUT=/some/dir bench/cuda/v32_model_bench.sh
set -uo pipefail
bin="${BIN:-build-gpu/bin}"
out="${OUT:-.}"
for cfg in v32 v3; do
  timeout 150 "$bin/deepinfer_model_decode_bench" --config "bench/cuda/bench-$cfg-full-width-4l.config.json" \
    --dtype fp8 --batches 1,8,32 --contexts 4096,32768,131072 --reps 10 --gbps 4800 \
    --out "$out/model_decode.jsonl" 2>&1 | tee -a "$out/model_decode.txt"
  echo "rc=${PIPESTATUS[0]} ($cfg)" | tee -a "$out/model_decode.txt"
done
timeout 100 "$bin/deepinfer" bench --config bench/cuda/bench-v32-full-width-4l.config.json --random-weights \
  --dtype fp8 --backend cuda --prefill 4096 --batch 1,8 --prompt-len 4096 --gen-len 32 --repeats 2 --warmup 1 \
  --roofline-gbps 4800 --output "$out/engine_bench.jsonl" > "$out/engine_bench.txt" 2>&1
echo "rc=$? (deepinfer bench v32)" | tee -a "$out/engine_bench.txt"
