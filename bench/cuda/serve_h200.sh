#!/usr/bin/env bash
# Server overhead on the H200: bench/serve_vs_bench.sh with the bench model (64 and 256 streams,
# prompt 512, 128 tokens, 4 requests per slot) against `deepinfer bench --throughput`.
# PACK: a folder with bin/deepinfer (CUDA build), lib/ (prometheus-cpp .so) and tok/ (DeepSeek-V3
# tokenizer). OUT: where the records go. PROCS / HTTP_THREADS: as serve_vs_bench.sh (default: its
# automatic choices: 4 client processes and 4 I/O threads on the 16-core host).
set -u
P=${PACK:-$(pwd)/.gpucarry/pack}
export LD_LIBRARY_PATH=$P/lib:${LD_LIBRARY_PATH:-}
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,power.draw --format=csv
B=$P/bin/deepinfer MODEL_ARGS="--config bench/cuda/bench-v3-7b.config.json --random-weights --backend cuda --dtype bf16" \
SERVE_ARGS="--tokenizer $P/tok" CONC="${CONC:-64 256}" PROMPT=512 GEN=128 WAVES=4 \
  exec "$(dirname "$0")/../serve_vs_bench.sh"
