#!/usr/bin/env bash
# Speculative decoding on the H200 (issue 13), run from the repo root with the binaries of
# tools/gpu/build_gpu.sh (DEEPINFER=path to the deepinfer CLI; OUT=where records go):
#  1. the embedded model (trained MTP layer): decode at batch 1, 8, 64 for k = 0..3 and the
#     confidence-scheduled length (k <= 3), text prompts from bench/prompts/code.jsonl;
#     records carry acceptance by position and emitted tokens/s;
#  2. the bench model with one random MTP layer (bench-v3-7b-mtp.config.json): drafts are
#     random, so nearly every verify step is 1 + k tokens per sequence and emits ~1: its
#     elapsed / steps is the step time of 1 + k tokens per sequence (MTP drafting included)
#     against k = 0's 1 token; acceptance there is meaningless.
# Speculating steps run eagerly (no CUDA graph for verify steps) and synchronously.
# PART=tiny | bench | all (default all; each part stays under ~8 minutes).
set -u
PART="${PART:-all}"
DEEPINFER="${DEEPINFER:-build-gpu/bin/deepinfer}"
OUT="${OUT:-/tmp/deepinfer_out}"
mkdir -p "$OUT"
[[ $PART == tiny || $PART == all ]] && for k in 0 1 2 3 v3; do
  if [[ $k == v3 ]]; then a=(--num-speculative-tokens 3 --spec-varlen 1); else a=(--num-speculative-tokens "$k"); fi
  timeout 90 "$DEEPINFER" bench --backend cuda --model models/deepseek-v3-tiny-code --batch 1,8,64 --gen-len 128 \
    --prompt-file bench/prompts/code.jsonl --repeats 3 --warmup 1 "${a[@]}" --output "$OUT/spec_tiny.jsonl" \
    > "$OUT/spec_tiny_$k.log" 2>&1 || echo "tiny k=$k failed: $(tail -2 "$OUT/spec_tiny_$k.log")"
done
[[ $PART == bench || $PART == all ]] && for k in 0 1 2 3; do
  timeout 110 "$DEEPINFER" bench --backend cuda --config bench/cuda/bench-v3-7b-mtp.config.json --random-weights \
    --dtype bf16 --batch 1,8,64 --prompt-len 512 --gen-len 64 --repeats 2 --warmup 1 --num-speculative-tokens "$k" \
    --output "$OUT/spec_bench_model.jsonl" > "$OUT/spec_bench_model_$k.log" 2>&1 ||
    echo "bench model k=$k failed: $(tail -2 "$OUT/spec_bench_model_$k.log")"
done
python3 - "$OUT" <<'PY'
import json, sys, os
out = sys.argv[1]
for f in ("spec_tiny.jsonl", "spec_bench_model.jsonl"):
    p = os.path.join(out, f)
    if not os.path.exists(p): continue
    print("==", f)
    for line in open(p):
        r = json.loads(line); s = r["spec_decode"]
        pos = [round(a / d, 3) if d else 0 for a, d in zip(s["accepted_per_position"], s["drafts_per_position"])]
        print(f"batch {r['batch']:3d} k {r['num_speculative_tokens']} varlen {r['spec_varlen']}: "
              f"{r['tokens_per_s']:9.1f} emitted tok/s, {r['steps']:.0f} steps, step {1e3 * r['elapsed_s'] / max(r['steps'], 1):.3f} ms, "
              f"accept {s['acceptance_rate']:.3f} by position {pos}, mean accepted length {s['mean_accepted_length']:.2f}")
PY
