#!/usr/bin/env bash
# Speculative decoding on the H200 (issue 13), run from the repo root with the binaries of
# tools/gpu/build_gpu.sh (DEEPINFER=path to the deepinfer CLI; OUT=where records go). One
# device call (PART=all, the default) measures:
#  1. tiny: the embedded model (trained MTP layer): decode at batch 1, 8, 64 for k = 0..3 and
#     the confidence-scheduled length (k <= 3), text prompts from bench/prompts/code.jsonl;
#     records carry acceptance by draft position and emitted tokens/s;
#  2. bench: the bench model with one random MTP layer (bench-v3-7b-mtp.config.json): drafts
#     are random, so nearly every verify step is 1 + k tokens per sequence and emits ~1: its
#     elapsed / steps is the step time of 1 + k tokens per sequence (MTP drafting included)
#     against k = 0's 1 token, at batch 1, 8, 32, 64; k = 3 once more with --enforce-eager
#     (no graphs) to show what the verify-step graphs give. Acceptance there is meaningless.
# PART=async (drafts in flight, issue 13 item 2): the embedded model at batch 1, 8, 64 for k = 0,
# k = 1 and 3 synchronous (--no-async-scheduling: a host sync per verify step) and asynchronous
# (the default: verify step N + 1 issued before N is read, drafts made on the device), and the
# default (k = 3 scheduled); then PART=equal's check over k = 0 / 3 sync / 3 async.
# Other parts (each its own device call): PART=varlen (k = 0, k = 3 fixed and the default,
# no flag: k = 3 with --spec-varlen 1 on the embedded model, k = 0 on random weights, at
# batch 1, 8, 64: the scheduled length must not lose to k = 0 where drafting does not pay;
# the bench model runs k = 3 --spec-varlen 1 explicitly, its random drafts never pay), PART=equal
# (k = 0 vs 3 vs the default token ids, with and without --batch-invariant), PART=nsys (kernel summary of the bench model at batch 64, k = 0 and 3,
# when nsys is installed). PART=tiny or PART=bench run one part alone.
# What comes back stays small (the device tool returns <= 8 files): $OUT/spec_tiny.jsonl,
# $OUT/spec_bench_model.jsonl, $OUT/spec.log (every run's log, appended), $OUT/summary.txt
# (the table printed last), and for PART=nsys $OUT/nsys_k0.txt, $OUT/nsys_k3.txt.
set -u
PART="${PART:-all}"
DEEPINFER="${DEEPINFER:-build-gpu/bin/deepinfer}"
OUT="${OUT:-/tmp/deepinfer_out}"
TMP="${TMPDIR:-/tmp}/spec_bench.$$"
mkdir -p "$OUT" "$TMP"
LOG="$OUT/spec.log"
# Binaries carried packed (tools/gpu/build_gpu.sh): unpack; libraries as tools/gpu/run_all.sh finds them.
if [[ ! -x "$DEEPINFER" && -f build-gpu/bin.tar.xz ]]; then tar -C build-gpu -xJf build-gpu/bin.tar.xz; fi
export LD_LIBRARY_PATH="/usr/local/cuda/lib64:/usr/local/cuda/targets/x86_64-linux/lib:$PWD/build-gpu/lib:${LD_LIBRARY_PATH:-}"
py_cublas="$(python3 -c 'import nvidia.cublas, os; print(os.path.join(list(nvidia.cublas.__path__)[0], "lib"))' 2>/dev/null || true)"
[[ -n "$py_cublas" ]] && export LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$py_cublas"
want() { [[ $PART == all || $PART == "$1" ]]; }
# The whole script stays within BUDGET_S (default 540: the device tool's per-command limit is
# 600), so the table below always prints; runs that no longer fit are skipped and say so.
BUDGET_S="${BUDGET_S:-540}"
start_s=$(date +%s)
# run LIMIT_S LABEL CMD...: time-boxed, output appended to spec.log under a header.
run() {
  local limit="$1" label="$2"; shift 2
  local left=$(( BUDGET_S - ($(date +%s) - start_s) - 15 ))
  if (( left < 20 )); then echo "$label skipped (time budget)" | tee -a "$LOG"; return; fi
  (( limit > left )) && limit=$left
  echo "=== $label: $*" >> "$LOG"
  local t0; t0=$(date +%s)
  timeout -k 5 "$limit" "$@" >> "$LOG" 2>&1
  local rc=$?
  echo "=== $label: rc $rc, $(( $(date +%s) - t0 )) s" >> "$LOG"
  (( rc == 0 )) || echo "$label failed (rc $rc): $(tail -2 "$LOG" | head -1)"
}
BENCH_CONFIG=bench/cuda/bench-v3-7b-mtp.config.json

if want tiny; then
  for k in 0 1 2 3 v3; do
    if [[ $k == v3 ]]; then a=(--num-speculative-tokens 3 --spec-varlen 1); else a=(--num-speculative-tokens "$k"); fi
    run 90 "tiny k=$k" "$DEEPINFER" bench --backend cuda --model models/deepseek-v3-tiny-code --batch 1,8,64 \
      --gen-len 128 --prompt-file bench/prompts/code.jsonl --repeats 3 --warmup 1 "${a[@]}" \
      --output "$OUT/spec_tiny.jsonl"
  done
fi
# spec_args K: the flags of variant K (v3: k = 3 scheduled; default: none, the engine's default;
# Ns: k = N with synchronous scheduling).
spec_args() {
  case "$1" in
    v3) a=(--num-speculative-tokens 3 --spec-varlen 1) ;;
    default) a=() ;;
    *s) a=(--num-speculative-tokens "${1%s}" --no-async-scheduling) ;;
    *) a=(--num-speculative-tokens "$1") ;;
  esac
}
if [[ $PART == async ]]; then
  for k in 0 1s 1 3s 3 default; do
    spec_args "$k"
    run 80 "tiny k=$k" "$DEEPINFER" bench --backend cuda --model models/deepseek-v3-tiny-code --batch 1,8,64 \
      --gen-len 128 --prompt-file bench/prompts/code.jsonl --repeats 3 --warmup 1 "${a[@]}" \
      --output "$OUT/spec_tiny.jsonl"
  done
fi
if [[ $PART == varlen ]]; then
  for k in 0 3 default; do
    spec_args "$k"
    run 80 "tiny k=$k" "$DEEPINFER" bench --backend cuda --model models/deepseek-v3-tiny-code --batch 1,8,64 \
      --gen-len 128 --prompt-file bench/prompts/code.jsonl --repeats 3 --warmup 1 "${a[@]}" \
      --output "$OUT/spec_tiny.jsonl"
  done
  for k in 0 3 v3; do
    if [[ $k == v3 ]]; then a=(--num-speculative-tokens 3 --spec-varlen 1); else a=(--num-speculative-tokens "$k"); fi
    run 80 "bench model k=$k" "$DEEPINFER" bench --backend cuda --config "$BENCH_CONFIG" --random-weights \
      --dtype bf16 --batch 1,8,64 --prompt-len 512 --gen-len 64 --repeats 2 --warmup 1 "${a[@]}" \
      --output "$OUT/spec_bench_model.jsonl"
  done
fi
if want bench; then
  for k in 0 1 2 3 3e; do
    a=(--num-speculative-tokens "${k%e}")
    [[ $k == *e ]] && a+=(--enforce-eager)
    run 100 "bench model k=$k" "$DEEPINFER" bench --backend cuda --config "$BENCH_CONFIG" --random-weights \
      --dtype bf16 --batch 1,8,32,64 --prompt-len 512 --gen-len 64 --repeats 2 --warmup 1 "${a[@]}" \
      --output "$OUT/spec_bench_model.jsonl"
  done
fi
# PART=nsys: GPU kernel time by kernel (top 25) of the bench model's decode at batch 64.
if [[ $PART == nsys ]]; then
  if command -v nsys > /dev/null; then
    for k in 0 3; do
      run 200 "nsys k=$k" nsys profile -o "$TMP/k$k" --force-overwrite true -t cuda "$DEEPINFER" bench --backend cuda \
        --config "$BENCH_CONFIG" --random-weights --dtype bf16 --batch 64 --prompt-len 512 --gen-len 32 --repeats 1 \
        --warmup 0 --num-speculative-tokens "$k"
      nsys stats --report cuda_gpu_kern_sum --format csv "$TMP/k$k.nsys-rep" 2> /dev/null | head -30 > "$OUT/nsys_k$k.txt"
    done
  else
    echo "nsys not installed on this machine" | tee -a "$LOG"
  fi
fi
# PART=equal: greedy and seeded batch generate on CUDA, k = 0 vs 3, with and without
# --batch-invariant: how many requests' token ids differ (0 expected with the flag).
if [[ $PART == equal || $PART == async ]]; then
  if [[ $PART == async ]]; then variants=(3s 3); else variants=(3 default); fi
  python3 - "$TMP/equal_in.jsonl" <<'PY'
import json, sys
prompts = [json.loads(l)["prompt"] for l in open("bench/prompts/code.jsonl")]
with open(sys.argv[1], "w") as f:
    for i in range(64):
        p = {"prompt": prompts[i % len(prompts)], "max_tokens": 96}
        p.update({"temperature": 0} if i % 2 == 0 else {"temperature": 0.8, "top_p": 0.95, "seed": i})
        f.write(json.dumps(p) + "\n")
PY
  for inv in "" --batch-invariant; do
    for k in 0 "${variants[@]}"; do
      spec_args "$k"
      run 100 "generate k=$k $inv" "$DEEPINFER" generate --backend cuda --input "$TMP/equal_in.jsonl" \
        --output "$TMP/equal_k${k}${inv}.jsonl" "${a[@]}" $inv
    done
    for k in "${variants[@]}"; do
    python3 - "$TMP/equal_k0${inv}.jsonl" "$TMP/equal_k${k}${inv}.jsonl" "${inv:-default kernels} k=$k" <<'PY' | tee -a "$OUT/summary.txt"
import json, sys
try:
    # Result lines come in completion order (each carries its input line's `index`).
    a = sorted((json.loads(l) for l in open(sys.argv[1])), key=lambda r: r["index"])
    b = sorted((json.loads(l) for l in open(sys.argv[2])), key=lambda r: r["index"])
except OSError as e:
    sys.exit(f"missing output: {e}")
diff = [x["index"] for x, y in zip(a, b) if x.get("token_ids") != y.get("token_ids") or x["index"] != y["index"]]
print(f"{sys.argv[3]}: {len(diff)} of {len(a)} requests differ from k = 0: {diff}")
PY
    done
    cp "$TMP/equal_k0${inv}.jsonl" "$TMP/equal_k3${inv}.jsonl" "$OUT/" 2>/dev/null
  done
fi
rm -rf "$TMP"
# The table, last: per record, and the ratios against k = 0 at the same batch.
python3 - "$OUT" <<'PY' | tee -a "$OUT/summary.txt"
import json, os, sys
out = sys.argv[1]
def records(name):
    p = os.path.join(out, name)
    return [json.loads(l) for l in open(p)] if os.path.exists(p) else []
def label(r):
    k = r["num_speculative_tokens"]
    return (f"k{k}" + (" varlen" if (r.get("spec_varlen") or 0) > 0 else "") + (" eager" if r.get("enforce_eager") else "")
            + (" sync" if r.get("async_scheduling") is False else ""))
for name, title in (("spec_tiny.jsonl", "embedded model (trained MTP): emitted tok/s, speed-up vs k0, acceptance by position"),
                    ("spec_bench_model.jsonl", "bench model (random MTP): ms per step, ratio to k0 (1 + k tokens per sequence vs 1)")):
    recs = [r for r in records(name) if r.get("kind", "decode") == "decode" and "steps" in r]
    if not recs:
        continue
    print("==", title)
    base = {r["batch"]: r for r in recs if r["num_speculative_tokens"] == 0}
    for r in recs:
        s = r.get("spec_decode", {})
        step_ms = 1e3 * r["elapsed_s"] / max(r["steps"], 1)
        b = base.get(r["batch"])
        if name == "spec_tiny.jsonl":
            pos = [round(a / d, 3) if d else 0 for a, d in zip(s.get("accepted_per_position", []), s.get("drafts_per_position", []))]
            ratio = r["tokens_per_s"] / b["tokens_per_s"] if b else float("nan")
            print(f"batch {r['batch']:3d} {label(r):10s} {r['tokens_per_s']:10.1f} tok/s {ratio:5.2f}x  step {step_ms:7.3f} ms"
                  f"  accept {pos}  mean len {s.get('mean_accepted_length', 0):.2f}"
                  f"  undrafted steps {r.get('steps_without_drafts', 0):.0f}"
                  f"  ahead {r.get('spec_steps_ahead_total', 0)} mtp graphs {r.get('mtp_graph_runs_total', 0)}")
        else:
            b_ms = 1e3 * b["elapsed_s"] / max(b["steps"], 1) if b else float("nan")
            ratio = r["tokens_per_s"] / b["tokens_per_s"] if b else float("nan")
            print(f"batch {r['batch']:3d} {label(r):10s} step {step_ms:8.3f} ms  {step_ms / b_ms:5.2f}x of k0"
                  f"  {r['tokens_per_s']:10.1f} tok/s {ratio:5.2f}x  undrafted steps {r.get('steps_without_drafts', 0):.0f}")
# The step-time tables --spec-varlen measured (one line per model: ms by batch x tokens per sequence).
for name in ("spec_tiny.jsonl", "spec_bench_model.jsonl"):
    for r in records(name):
        t = r.get("spec_step_times")
        if t and r.get("batch") == 1:
            q = t["max_tokens_per_seq"]
            rows = [f"b{b}: " + "/".join(f"{1e3 * v:.3f}" for v in t["verify_s"][i * q:(i + 1) * q]) +
                    (f" ahead {1e3 * t['decode_ahead_s'][i]:.3f}" if t["decode_ahead_s"] else "") +
                    (f" mixed {1e3 * t['mixed_s'][i]:.3f}" if t["mixed_s"] else "") +
                    (f" mtp {1e3 * t['mtp_first_s'][i]:.3f}+{1e3 * t['mtp_chain_s'][i]:.3f}" if t["mtp_first_s"] else "")
                    for i, b in enumerate(t["batches"])]
            print(f"== {name} step times (ms; measured in {t['measure_s']:.2f} s): " + " | ".join(rows))
            break
PY
