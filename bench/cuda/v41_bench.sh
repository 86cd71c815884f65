#!/usr/bin/env bash
# DeepSeek-V4.1-Flash at full width on one H200 (issue 19 item 6; helper v41bench, session 12,
# branch v41bench). One device call, ~6-8 min of run:
#   run(command="bash .carry-v41bench/run.sh", carry=[".carry-v41bench"], kind="nvidia-h200", timeout_s=600)
# Binary: deepinfer_v4_model_bench of branch v41bench (bin.tar.xz, built by tools/gpu/build_gpu.sh,
# sm_90a; commit in bin/COMMIT). Config: bench-v41-flash-12l.config.json (V4.1-Flash dims, 12 layers:
# 0 window-only, 1 window-only + Engram (table of 2,403,994 rows instead of ~384M), 2 / 4 ratio-2 KV
# + index sources, 3 / 5 their readers, 6 the ratio-1 KV source, index and candidate source, 7-11
# truncated (8 and 10 index sources under the candidates)); random weights made on the device: FP8
# e4m3 dense with 32x32 E8M0 blocks, routed experts FP4 e2m1 + E8M0 per 32; ~93 GB (NOTES v41bench).
# Every record goes to $OUT/v41.jsonl (JSON lines), each stage's stdout to $OUT/<stage>.log, rc and
# seconds to $OUT/summary.log. A stage that fails or times out leaves the records it flushed.
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
out="${OUT:-$here/out}"
mkdir -p "$out"
[[ -x "$here/bin/deepinfer_v4_model_bench" ]] || tar -C "$here" -xJf "$here/bin.tar.xz"
bin="$here/bin/deepinfer_v4_model_bench"
cfg="${CFG:-$here/bench-v41-flash-12l.config.json}"  # CFG / BACKEND: a local dry run (tiny config, cpu)
cat "$here/bin/COMMIT" > "$out/commit.txt" 2>/dev/null
{ date -u; nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used,clocks.max.sm --format=csv; } > "$out/gpu.txt" 2>&1
stage() {
  local name="$1" limit="$2"; shift 2
  local t0; t0=$(date +%s)
  timeout -k 5 "$limit" "$bin" --backend "${BACKEND:-cuda}" --config "$cfg" --experts fp4 --out "$out/v41.jsonl" "$@" > "$out/$name.log" 2>&1
  local rc=$?
  echo "== $name rc=$rc ($(( $(date +%s) - t0 )) s) $(date -u +%H:%M:%S)" | tee -a "$out/summary.log"
  return $rc
}
# 1. Prefill 4096, bounded replay off and compact (keep 140): the quickest full check of the path.
stage prefill4k 90 --batches '' --contexts '' --prefill 4096
# 2. Decode, one new token per sequence, batch 1-64 at 32k then 128k contexts (random packed KV).
stage decode32k 120 --batches 1,8,32,64 --contexts 32768 --prefill '' --reps 5
stage decode128k 120 --batches 1,8,32,64 --contexts 131072 --prefill '' --reps 3
# 3. Prefill 32k in one step, replay off and compact; chunks of 4096 (as the engine would) if not.
stage prefill32k 120 --batches '' --contexts '' --prefill 32768 ||
  stage prefill32k_chunked 120 --batches '' --contexts '' --prefill 32768 --prefill-chunk 4096
{ date -u; nvidia-smi --query-gpu=memory.used --format=csv; } >> "$out/gpu.txt" 2>&1
exit 0
