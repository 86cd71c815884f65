#!/usr/bin/env bash
# DeepSeek-V4.1-Flash speculative decoding with its DSpark drafter on one H200 (issue 19 item 6;
# helper v41spec19, session 13; bench/NOTES.md "v41spec19"). Run by the lead inside a merged-main
# call, from the repository root:
#   BIN=<path>/deepinfer_v4_model_bench OUT=$OUT bash bench/cuda/v41_spec_h200.sh
# BIN: deepinfer_v4_model_bench built for sm_90a from a tree with this script (its --spec mode).
# Configs (this folder): bench-v41-flash-12l-dspark.config.json (v41bench's 12-layer full-width
# V4.1-Flash plus the released drafter: 3 stages of 128 experts top-3, block of 5, Markov rank 256,
# confidence head; random weights made on the device, FP8 32x32 dense and FP4 experts, the drafter's
# too: ~113 GB) and bench-v41-flash-12l.config.json (no drafter: the plain decode re-run).
# Stages, each its own process and time box (150 s in all, ~110 s expected):
#   1. spec_engine (50 s): the engine on random weights, greedy, k = 0 and k = 5 (DsparkProposer,
#      exact verification): decode tok/s with / without drafts at batch 1 and 8 (prompts of 512
#      tokens, 32 generated), the drafter's measured acceptance, mismatched tokens against k = 0;
#      then batch 2 with the batch-invariant kernels (must be 0 mismatched: exit 4 if not).
#   2. spec32k (50 s): batch 1, 8, 32, 64 at context 32k (2 reps after a warm-up): plain decode
#      step, drafter block (5 drafts + Markov + confidence heads), verify step of 1 + 5 tokens per
#      sequence; the speedup at per-position acceptance 0 .. 1 and at stage 1's measured tokens per
#      verify step.
#   3. spec128k (20 s): the same at batch 1, context 128k.
#   4. decode128k_b64 (30 s): plain decode at batch 64 x 128k on the config without the drafter
#      (out of memory in session 12 before 0b7f9f2's per-sequence arena scope).
# Records: $OUT/v41_spec.jsonl (v41_spec_engine, v41_spec_check, v41_spec_step, v41_model and
# v41_decode_step lines), each stage's output in $OUT/<stage>.log, rc and seconds in
# $OUT/summary.log. A stage that fails or times out keeps the records it flushed (one per line as
# each finishes); the later stages still run.
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
out="${OUT:-$here/out-v41spec}"
mkdir -p "$out"
bin="${BIN:?BIN must name deepinfer_v4_model_bench}"
[[ -x "$bin" ]] || { echo "BIN=$bin is not an executable" | tee -a "$out/summary.log"; exit 1; }
cfg="${CFG:-$here/bench-v41-flash-12l-dspark.config.json}"    # CFG / PLAIN_CFG / BACKEND: a local dry run
plain="${PLAIN_CFG:-$here/bench-v41-flash-12l.config.json}"
{ date -u; nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used,clocks.max.sm --format=csv;
  echo "BIN=$bin"; sha256sum "$bin"; } > "$out/gpu.txt" 2>&1
stage() {
  local name="$1" limit="$2" config="$3"; shift 3
  local t0; t0=$(date +%s)
  timeout -k 5 "$limit" "$bin" --backend "${BACKEND:-cuda}" --config "$config" --experts fp4 --out "$out/v41_spec.jsonl" "$@" > "$out/$name.log" 2>&1
  local rc=$?
  echo "== $name rc=$rc ($(( $(date +%s) - t0 )) s) $(date -u +%H:%M:%S)" | tee -a "$out/summary.log"
  return $rc
}
# 1. The engine: acceptance, tok/s with and without drafts, outputs against k = 0.
stage spec_engine 50 "$cfg" --spec dspark --batches '' --contexts '' --prefill '' \
  --spec-engine "${ENGINE_BATCHES:-1,8}" --spec-prompt "${ENGINE_PROMPT:-512}" --spec-tokens "${ENGINE_TOKENS:-32}" \
  --spec-check 2 --spec-check-prompt 160 --spec-check-tokens 12
# Stage 1's tokens per verify step (over its batches) for the projected speedups of 2 and 3.
tpv=$(sed -n 's/^spec engine: \([0-9.]*\) tokens per verify step.*/\1/p' "$out/spec_engine.log" | tail -1)
tpv_flag=()
[[ -n "$tpv" ]] && tpv_flag=(--tokens-per-verify "$tpv")
# 2-3. Speculation's parts at 32k (batch 1-64) and 128k (batch 1).
stage spec32k 50 "$cfg" --spec dspark --batches "${SPEC_BATCHES:-1,8,32,64}" --contexts "${SPEC_CONTEXT:-32768}" \
  --prefill '' --reps 2 ${tpv_flag[@]+"${tpv_flag[@]}"}
stage spec128k 20 "$cfg" --spec dspark --batches 1 --contexts "${LONG_CONTEXT:-131072}" --prefill '' --reps 3 ${tpv_flag[@]+"${tpv_flag[@]}"}
# 4. Plain decode at batch 64 x 128k, the text model alone (session 12's configuration).
stage decode128k_b64 30 "$plain" --batches "${LONG_BATCH:-64}" --contexts "${LONG_CONTEXT:-131072}" --prefill '' --reps 2
{ date -u; nvidia-smi --query-gpu=memory.used --format=csv; } >> "$out/gpu.txt" 2>&1
grep -hE '^spec |^ +[0-9]+ +[0-9]+ |out of|rror|NOT FINITE|OUTPUTS DIFFER' "$out"/*.log > "$out/digest.txt" 2>/dev/null
exit 0
