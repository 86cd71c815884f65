#!/usr/bin/env bash
# Server overhead on the H200: serve_load.py vs deepinfer bench --throughput on the same workload.
set -u
# PACK: a folder with bin/deepinfer (CUDA build), lib/ (prometheus-cpp .so) and tok/ (DeepSeek-V3 tokenizer)
P=${PACK:-$(pwd)/.gpucarry/pack}
export LD_LIBRARY_PATH=$P/lib:${LD_LIBRARY_PATH:-}
B=$P/bin/deepinfer
CFG=bench/cuda/bench-v3-7b.config.json
python3 -c "import httpx; print('httpx', httpx.__version__)" || exit 3
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,power.draw --format=csv
for C in 64 256; do
  N=$((C*4))
  $B bench --config $CFG --random-weights --backend cuda --dtype bf16 --throughput ${N}x512x128 \
     --max-num-seqs $C --max-num-batched-tokens 8192 --output $OUT/bench_c$C.jsonl > $OUT/bench_c$C.log 2>&1
  echo "bench c$C rc=$?"; tail -2 $OUT/bench_c$C.jsonl
  $B serve --config $CFG --random-weights --backend cuda --dtype bf16 --tokenizer $P/tok \
     --max-num-seqs $C --max-num-batched-tokens 8192 --port 18000 --served-model-name bench > $OUT/serve_c$C.log 2>&1 &
  SP=$!
  for i in $(seq 1 240); do curl -sf http://127.0.0.1:18000/health >/dev/null && break; sleep 0.5; done
  python3 bench/serve_load.py --url http://127.0.0.1:18000 --concurrency $C --num-requests $N --duration 600 \
     --prompt-len 512 --max-tokens 128 > $OUT/load_c$C.json 2>>$OUT/serve_c$C.log
  echo "load c$C rc=$?"; cat $OUT/load_c$C.json
  curl -s http://127.0.0.1:18000/metrics | grep -E "^deepinfer:(generation_tokens_total|prompt_tokens_total|num_preemptions|request_success_total)" | head
  kill -TERM $SP; wait $SP; echo "serve exit $?"
done
