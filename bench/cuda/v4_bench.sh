#!/usr/bin/env bash
# DeepSeek-V4 on one H200 (issue 16), one device call (~3 min; time boxes sum to 445 s), in this order:
#  1. bench/cuda/v4_model_bench.cpp on bench-v4-flash-4l.config.json (V4-Flash at full width,
#     its layers 2-5: CSA, HCA, CSA, HCA, the first hash-routed): decode at batch 1/8/32/64 and
#     contexts 4k/32k with FP4 experts, then prefill 4096 and 32k (and decode at 4k) with FP8
#     experts (the FP4 kernel runs on CUDA cores, sized for decode);
#  2. parity of the V4 ops (tests/ops V4Ops.*, DEEPINFER_CUDA_SYNC=1);
#  3. golden V4 on CUDA: the model against the oracle and, through the engine (continuous
#     batching, chunked prefill, MTP drafts, random weights), batched = alone with
#     batch-invariant kernels (test_golden_v4, DEEPINFER_ACCELERATOR=cuda);
#  4. the CLI on CUDA through the engine: `deepinfer generate` (batch mode) on the v4_tiny
#     fixture and on the full-width config with random weights, `deepinfer bench` on the latter.
# Run from the repo root: BIN=build-gpu/bin OUT=/some/dir bench/cuda/v4_bench.sh
#
# PART=graphs: decode as CUDA graphs instead (issue 16 item 5; ~4 min): parity of the V4 ops (the
# decode step's device-built addressing too: v4_decode_rows, compressor_pool_rows, the indexer with
# per-query keys), golden V4 on CUDA (EngineV4Cuda.GraphDecodeEqualsEagerDecode: graphed decode =
# eager decode bit for bit), then the model bench at batch 1/8/64 and 4k context, eager and graph
# replay interleaved over 3 rounds, FP8 then FP4 experts (EXPERTS), and FP4 with 34 layers (CFG34,
# bench-v4-flash-34l.config.json: what one H200 holds with KV for 64 x 32k tokens), one round.
set -uo pipefail
bin="${BIN:-build-gpu/bin}"
out="${OUT:-.}"
cfg="${CFG:-bench/cuda/bench-v4-flash-4l.config.json}"
stage() {
  local name="$1" limit="$2"; shift 2
  local t0; t0=$(date +%s)
  timeout -k 5 "$limit" "$@" > "$out/$name.log" 2>&1
  local rc=$?
  echo "== $name rc=$rc ($(( $(date +%s) - t0 )) s)" | tee -a "$out/summary.log"
  tail -n "${TAIL:-12}" "$out/$name.log"
}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee -a "$out/summary.log"

if [[ "${PART:-}" == graphs ]]; then
  cfg34="${CFG34:-bench/cuda/bench-v4-flash-34l.config.json}"
  date -u +"start %H:%M:%S UTC" | tee -a "$out/summary.log"
  DEEPINFER_CUDA_SYNC=1 stage parity_v4 40 "$bin/test_ops" --gtest_filter='V4Ops.*'
  DEEPINFER_ACCELERATOR=cuda DEEPINFER_BACKEND=cuda TAIL=30 stage golden_v4 120 "$bin/test_golden_v4"
  for experts in ${EXPERTS:-fp8 fp4}; do
    TAIL=40 stage "graphs_$experts" 60 "$bin/deepinfer_v4_model_bench" --config "$cfg" --experts "$experts" \
      --batches 1,8,64 --contexts 4096 --prefill "" --reps 5 --graphs 1 --rounds 3 --out "$out/v4_model_bench.jsonl"
  done
  TAIL=12 stage graphs_fp4_34l 100 "$bin/deepinfer_v4_model_bench" --config "$cfg34" --experts fp4 --batches 1,8,64 \
    --contexts 4096 --prefill "" --reps 3 --graphs 1 --rounds 1 --out "$out/v4_model_bench.jsonl"
  date -u +"end %H:%M:%S UTC" | tee -a "$out/summary.log"
  cat "$out/summary.log"
  exit 0
fi

# The measurements first (item 6), then the checks; every stage time-boxed (~7.5 min at most).
TAIL=20 stage v4_bench_fp4 90 "$bin/deepinfer_v4_model_bench" --config "$cfg" --experts fp4 --batches 1,8,32,64 \
  --contexts 4096,32768 --prefill "" --reps 5 --out "$out/v4_model_bench.jsonl"
TAIL=20 stage v4_bench_fp8 90 "$bin/deepinfer_v4_model_bench" --config "$cfg" --experts fp8 --batches 1,64 \
  --contexts 4096 --prefill 4096,32768 --reps 5 --out "$out/v4_model_bench.jsonl"
[[ -x "$bin/test_ops" ]] && DEEPINFER_CUDA_SYNC=1 stage parity_v4 30 "$bin/test_ops" --gtest_filter='V4Ops.*'
DEEPINFER_ACCELERATOR=cuda DEEPINFER_BACKEND=cuda TAIL=30 stage golden_v4 100 "$bin/test_golden_v4"

# Requests by token ids (the random-weight config has no tokenizer).
python3 - > "$out/requests.jsonl" <<'EOF'
import json, random
r = random.Random(5)
for n in (7, 40, 130, 300):
    print(json.dumps({"prompt_token_ids": [r.randrange(2, 250) for _ in range(n)], "max_tokens": 24,
                      "temperature": 0, "ignore_eos": True}))
EOF
stage generate_tiny 30 "$bin/deepinfer" generate --model tests/golden/fixtures/v4_tiny --backend cuda \
  --input "$out/requests.jsonl" --output "$out/generate_tiny.jsonl" --max-num-seqs 4
stage generate_flash 45 "$bin/deepinfer" generate --config "$cfg" --random-weights --dtype fp8 --backend cuda \
  --input "$out/requests.jsonl" --output "$out/generate_flash.jsonl" --max-num-seqs 4
stage engine_bench 60 "$bin/deepinfer" bench --config "$cfg" --random-weights --dtype fp8 --backend cuda \
  --prefill 1024 --batch 1,8 --prompt-len 1024 --gen-len 16 --repeats 1 --warmup 1 --max-num-seqs 8 \
  --roofline-gbps 4800 --output "$out/engine_bench.jsonl"

cat "$out/summary.log"
