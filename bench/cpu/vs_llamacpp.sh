#!/usr/bin/env bash
# deepinfer's CPU backend against llama.cpp on this machine, same model, same threads, rounds
# interleaved (issue 21): prefill 512, decode batch 1 and batch 8 after a 512-token prompt.
#
# llama.cpp is built from its source beside the project, never committed (e.g. the copy inside
# the llama-cpp-python sdist from PyPI: `pip download --no-deps --no-binary :all: llama-cpp-python`),
# CPU only, AVX2 like our build:
#   cmake -B build -DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DLLAMA_CURL=OFF
#   cmake --build build --target llama-batched-bench
# and the model converted with its own converter (BF16 and Q8_0), through
# bench/cpu/convert_for_llamacpp.py (torch + the converter's gguf-py in a venv).
#
#   LLAMA_CPP=/path/to/llama.cpp GGUF_DIR=/path/to/ggufs bench/cpu/vs_llamacpp.sh [OUT_DIR]
# GGUF_DIR holds tiny-bf16.gguf and tiny-q8_0.gguf. Records: OUT_DIR/deepinfer.jsonl and
# OUT_DIR/llamacpp.jsonl (raw, every round), OUT_DIR/summary.txt (medians and ratios).
# DI_FLAGS (default: --num-speculative-tokens 0, since llama-batched-bench does not speculate:
# kernels against kernels) go to `deepinfer bench`; PRIO prefixes both engines' commands, e.g.
# PRIO="chrt -f 10" on a machine shared with builds (both engines then preempt them alike).
# DEEPINFER_BASE=/path/to/another/deepinfer adds an A/B: that binary runs in the same rounds,
# beside ours, first in every second round (OUT_DIR/deepinfer_base.jsonl), and the summary gains
# its column and ours / its.
# Under chrt, llama.cpp's OpenMP build dropped its batch-8 row now and then (no row, exit 0)
# with GOMP's default spin count; GOMP_SPINCOUNT=100000 in the environment ran every row.
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
out="${1:-$root/bench/results/$(date -u +%F)-cpu-vs-llamacpp}"
threads="${THREADS:-$(nproc)}"
rounds="${ROUNDS:-6}"
di_flags="${DI_FLAGS---num-speculative-tokens 0}"
prio="${PRIO:-}"
gen="${GEN_LEN:-64}"
di="${DEEPINFER:-$root/build/ci/app/deepinfer}"
di_base="${DEEPINFER_BASE:-}"
lb="${LLAMA_CPP:?set LLAMA_CPP to a llama.cpp checkout with build/bin/llama-batched-bench}/build/bin/llama-batched-bench"
gguf="${GGUF_DIR:?set GGUF_DIR to the folder with tiny-bf16.gguf and tiny-q8_0.gguf}"
mkdir -p "$out"
: > "$out/deepinfer.jsonl"
: > "$out/llamacpp.jsonl"
: > "$out/deepinfer_base.jsonl"
echo "load before: $(cut -d' ' -f1-3 /proc/loadavg) (an idle machine reads ~0); PRIO='$prio' DI_FLAGS='$di_flags'" | tee "$out/summary.txt"
run_di() {  # binary, records file, round
  # shellcheck disable=SC2086
  $prio "$1" bench --threads "$threads" --prefill 512 --batch 1,8 --prompt-len 512 --gen-len "$gen" \
    --repeats 1 --warmup 1 --tag "round$3" $di_flags >> "$2" 2>/dev/null
}
for r in $(seq 1 "$rounds"); do
  # With a base binary the two alternate which runs first: the first of a pair read a few
  # percent faster on a 2-core VM (2026-12-04, bench/NOTES.md session 18).
  if [[ -n "$di_base" && $((r % 2)) -eq 0 ]]; then
    run_di "$di_base" "$out/deepinfer_base.jsonl" "$r"
    run_di "$di" "$out/deepinfer.jsonl" "$r"
  else
    run_di "$di" "$out/deepinfer.jsonl" "$r"
    if [[ -n "$di_base" ]]; then run_di "$di_base" "$out/deepinfer_base.jsonl" "$r"; fi
  fi
  for q in bf16 q8_0; do
    $prio "$lb" -m "$gguf/tiny-$q.gguf" -c 8192 -b 2048 -ub 512 -npp 512 -ntg "$gen" -npl 1,8 -t "$threads" \
      --output-format jsonl 2>/dev/null | grep '^{' | sed "s/^{/{\"quant\": \"$q\", \"round\": $r, /" >> "$out/llamacpp.jsonl" || true  # a missing row is reported below
  done
  echo "round $r done"
done
python3 - "$out" "$threads" <<'EOF' | tee -a "$out/summary.txt"
import json, statistics, sys
out, threads = sys.argv[1], sys.argv[2]
di = [json.loads(l) for l in open(f"{out}/deepinfer.jsonl")]
base = [json.loads(l) for l in open(f"{out}/deepinfer_base.jsonl")]
lc = [json.loads(l) for l in open(f"{out}/llamacpp.jsonl")]
def med(xs): return statistics.median(xs) if xs else float("nan")
def rows(recs):
    return {
        "prefill 512": med([r["tokens_per_s"] for r in recs if r["kind"] == "prefill"]),
        "decode batch 1": med([r["tokens_per_s"] for r in recs if r["kind"] == "decode" and r["batch"] == 1]),
        "decode batch 8": med([r["tokens_per_s"] for r in recs if r["kind"] == "decode" and r["batch"] == 8]),
    }
ours, theirs = rows(di), rows(base)
def peer(q, row):
    if row == "prefill 512":
        return med([r["speed_pp"] for r in lc if r["quant"] == q and r["pl"] == 1])
    pl = 1 if row.endswith(" 1") else 8
    return med([r["speed_tg"] for r in lc if r["quant"] == q and r["pl"] == pl])
for q in ("bf16", "q8_0"):
    for pl in (1, 8):
        n = sum(1 for r in lc if r["quant"] == q and r["pl"] == pl)
        if n < len(di) // 3:
            print(f"note: llama.cpp {q} batch {pl} reported {n} of {len(di) // 3} rounds")
print(f"threads {threads}, rounds {len(di) // 3}, tok/s medians (deepinfer FP8 checkpoint; llama.cpp BF16 / Q8_0)")
ab = f" {'base':>10} {'vs base':>8} {'base/BF16':>9}" if base else ""
print(f"{'figure':16} {'deepinfer':>10} {'llama BF16':>11} {'llama Q8_0':>11} {'vs BF16':>8} {'vs Q8_0':>8}{ab}")
for row, v in ours.items():
    b, q = peer("bf16", row), peer("q8_0", row)
    extra = f" {theirs[row]:10.1f} {v / theirs[row]:8.2f} {theirs[row] / b:9.2f}" if base else ""
    print(f"{row:16} {v:10.1f} {b:11.1f} {q:11.1f} {v / b:8.2f} {v / q:8.2f}{extra}")
EOF
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$out/summary.txt"
