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
# PART=tiny | bench | equal | all (default all; run one part per device call: each stays
# under ~8 minutes).
set -u
PART="${PART:-all}"
DEEPINFER="${DEEPINFER:-build-gpu/bin/deepinfer}"
OUT="${OUT:-/tmp/deepinfer_out}"
mkdir -p "$OUT"
# Binaries carried packed (tools/gpu/build_gpu.sh): unpack; libraries as tools/gpu/run_all.sh finds them.
if [[ ! -x "$DEEPINFER" && -f build-gpu/bin.tar.xz ]]; then tar -C build-gpu -xJf build-gpu/bin.tar.xz; fi
export LD_LIBRARY_PATH="/usr/local/cuda/lib64:/usr/local/cuda/targets/x86_64-linux/lib:${LD_LIBRARY_PATH:-}"
py_cublas="$(python3 -c 'import nvidia.cublas, os; print(os.path.join(list(nvidia.cublas.__path__)[0], "lib"))' 2>/dev/null || true)"
[[ -n "$py_cublas" ]] && export LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$py_cublas"
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
# PART=equal: greedy and seeded batch generate on CUDA, k = 0 vs 3, with and without
# --batch-invariant: how many requests' token ids differ (0 expected with the flag).
if [[ $PART == equal || $PART == all ]]; then
  python3 - "$OUT/equal_in.jsonl" <<'PY'
import json, sys
prompts = [json.loads(l)["prompt"] for l in open("bench/prompts/code.jsonl")]
with open(sys.argv[1], "w") as f:
    for i in range(64):
        p = {"prompt": prompts[i % len(prompts)], "max_tokens": 96}
        p.update({"temperature": 0} if i % 2 == 0 else {"temperature": 0.8, "top_p": 0.95, "seed": i})
        f.write(json.dumps(p) + "\n")
PY
  for inv in "" --batch-invariant; do
    for k in 0 3; do
      timeout 100 "$DEEPINFER" generate --backend cuda --input "$OUT/equal_in.jsonl" --output "$OUT/equal_k${k}${inv}.jsonl" \
        --num-speculative-tokens "$k" $inv > "$OUT/equal_k${k}${inv}.log" 2>&1 || echo "generate k=$k $inv failed"
    done
    python3 - "$OUT/equal_k0${inv}.jsonl" "$OUT/equal_k3${inv}.jsonl" "${inv:-default kernels}" <<'PY'
import json, sys
try:
    a = [json.loads(l) for l in open(sys.argv[1])]; b = [json.loads(l) for l in open(sys.argv[2])]
except OSError as e:
    sys.exit(f"missing output: {e}")
diff = [i for i, (x, y) in enumerate(zip(a, b)) if x.get("token_ids") != y.get("token_ids")]
print(f"{sys.argv[3]}: {len(diff)} of {len(a)} requests differ between k = 0 and k = 3: {diff}")
PY
  done
fi
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
