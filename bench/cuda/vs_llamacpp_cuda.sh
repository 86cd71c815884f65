#!/usr/bin/env bash
# deepinfer's CUDA backend against llama.cpp's CUDA build on the same card, the same day, the same
# weights (issue 17 item 4): prefill 512 and 4096 at batch 1, decode at batch 1, 8 and 64 after a
# 512-token prompt, rounds interleaved. Runs on the device machine in one call (~10 min):
#   1. llama.cpp built from its source (a tar.xz of llama.cpp's tree, never committed; e.g. the copy
#      inside the llama-cpp-python sdist from PyPI), CUDA for sm_90a, only llama-batched-bench;
#   2. a random BF16 checkpoint of the bench config under the released names
#      (bench/cuda/random_hf_checkpoint.py), the tokenizer beside it;
#   3. the GGUF made by llama.cpp's own converter (bench/cpu/convert_for_llamacpp.py), BF16;
#   4. ROUNDS rounds of `deepinfer bench` (--backend cuda, no speculation: kernels against kernels)
#      and llama-batched-bench (all layers on the GPU, flash attention on), same model files;
#   5. medians and ratios in $OUT/summary.txt; raw records deepinfer.jsonl and llamacpp.jsonl.
# SWEEP=1 replaces 4-5 by the Pareto sweep of both engines at the same points (prefill 512 / 4096 at
# batch 1-8, decode of 64 tokens after 512 at batch 1-64), ROUNDS rounds interleaved: sweep.jsonl,
# llamacpp_sweep.jsonl, llamacpp_pareto.jsonl (plot with bench/plot_pareto.py sweep.jsonl
# llamacpp_pareto.jsonl --out-dir D).
#
#   LLAMA_SRC_TAR=llama.tar.xz TOKENIZER_TAR=tok.tar.xz DEEPINFER=path/to/deepinfer \
#   CONFIG=bench-v3-7b/config.json OUT=dir bench/cuda/vs_llamacpp_cuda.sh
# (TOKENIZER_TAR holds one folder with tokenizer.json and tokenizer_config.json. Without it the
# embedded model's tokenizer is used: DeepSeek-V3's pre-tokenizer with 8,177 tokens, the rest of
# the bench config's vocabulary padded by llama.cpp's converter; speed does not depend on it, and
# it saves 1.3 MB of the 64 MiB a device call carries.)
set -uo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
out="${OUT:-/tmp/vs_llamacpp_cuda}"
work="${WORK:-/tmp/vsllama}"
rounds="${ROUNDS:-3}"
# PREP_ONLY=1 stops after step 3 (no DEEPINFER needed). Seen 2026-12-03: a second call on the same
# warm machine did NOT find a WORK kept in a folder ignored only by .git/info/exclude (the tree is
# re-synced); the whole run (~9 min: llama.cpp's build ~4.6 min on 16 cores, checkpoint + GGUF
# ~1.7 min) has to fit one call.
if [[ "${PREP_ONLY:-0}" == 1 ]]; then di=""; else di="${DEEPINFER:?set DEEPINFER to a CUDA build of the deepinfer CLI}"; fi
config="${CONFIG:?set CONFIG to the bench config.json}"
mkdir -p "$out" "$work/src" "$work/tok"
log() { echo "[$(date -u +%T)] $*" | tee -a "$out/summary.txt"; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,power.limit --format=csv,noheader | tee "$out/gpu.txt"

# Each step is skipped when its product is already in $work, so a call that ran out of time can
# be resumed by a second one on the same (still warm) machine with WORK inside the checkout.
lb="$work/build/bin/llama-batched-bench"
log "1. build llama.cpp (CUDA, sm_90a)"
[[ -f "$work/src/CMakeLists.txt" ]] || tar -C "$work/src" -xJf "${LLAMA_SRC_TAR:?}" || exit 1
# Only the two bench tools: the tree's own tools/CMakeLists.txt adds every tool (server, mtmd, ...).
printf 'find_package(Threads REQUIRED)\nllama_add_compile_flags()\nadd_subdirectory(batched-bench)\n' > "$work/src/tools/CMakeLists.txt"
cmake -S "$work/src" -B "$work/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON \
  -DCMAKE_CUDA_ARCHITECTURES=90a -DGGML_NATIVE=ON -DGGML_CUDA_NCCL=OFF -DLLAMA_CURL=OFF \
  -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF \
  > "$out/llama_cmake.log" 2>&1 || { tail -20 "$out/llama_cmake.log"; exit 1; }
cmake --build "$work/build" --target llama-batched-bench -j "$(nproc)" > "$out/llama_build.log" 2>&1 ||
  { tail -30 "$out/llama_build.log"; exit 1; }
log "llama.cpp built"

log "2. random BF16 checkpoint"
if [[ -z "${TOKENIZER_TAR:-}" ]]; then
  cp "$root/models/deepseek-v3-tiny-code/tokenizer.json" "$root/models/deepseek-v3-tiny-code/tokenizer_config.json" "$work/tok/"
else
  [[ -n "$(find "$work/tok" -name tokenizer.json)" ]] || tar -C "$work/tok" -xJf "$TOKENIZER_TAR" || exit 1
fi
tokdir="$(dirname "$(find "$work/tok" -name tokenizer.json | head -1)")"
[[ -f "$work/model/.complete" ]] || { python3 "$root/bench/cuda/random_hf_checkpoint.py" "$config" "$work/model" &&
  touch "$work/model/.complete"; } || exit 1
cp "$tokdir/tokenizer.json" "$tokdir/tokenizer_config.json" "$work/model/"

log "3. GGUF (llama.cpp's converter, BF16)"
[[ -f "$work/model-bf16.gguf.complete" ]] || {
  PYTHONPATH="$work/src/gguf-py:${PYTHONPATH:-}" python3 "$root/bench/cpu/convert_for_llamacpp.py" "$work/src" \
    "$work/model" "$tokdir/tokenizer.json" "$work/model-bf16.gguf" bf16 > "$out/convert.log" 2>&1 &&
    touch "$work/model-bf16.gguf.complete"; } || { tail -20 "$out/convert.log"; exit 1; }
log "converted: $(du -h "$work/model-bf16.gguf" | cut -f1)"
[[ "${PREP_ONLY:-0}" == 1 ]] && { log "prepared (PREP_ONLY=1)"; exit 0; }

export LD_LIBRARY_PATH="/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
if [[ "${SWEEP:-0}" == 1 ]]; then
  # Pareto sweep (issue 17 item 5) of both engines at the same points, ROUNDS rounds interleaved:
  # prefill 512 and 4096 at batch 1, 2, 4, 8 (no shared prefix), decode of 64 tokens after 512-token
  # prompts at batch 1 to 64. Records: sweep.jsonl (ours, curves tagged "h200 bf16 rN: "),
  # llamacpp_sweep.jsonl (llama-batched-bench's, with round and kind), and llamacpp_pareto.jsonl
  # (bench/llamacpp_pareto.py: theirs on our axes and configuration, for bench/plot_pareto.py).
  : > "$out/sweep.jsonl"
  : > "$out/llamacpp_sweep.jsonl"
  for r in $(seq 1 "$rounds"); do
    "$di" bench --backend cuda --model "$work/model" --skip-weight-check --sweep --prefill 512,4096 \
      --prefill-batch 1,2,4,8 --batch 1,2,4,8,16,32,64 --contexts 512 --gen-len 64 --num-speculative-tokens 0 \
      --repeats 2 --warmup 1 --roofline-gbps 4160 --peak-tflops 777 --tag "h200 bf16 r$r: " \
      --output "$out/sweep.jsonl" >> "$out/deepinfer.log" 2>&1 || log "deepinfer sweep round $r failed: rc $?"
    # The first configuration of a llama-batched-bench process pays one-time CUDA set-up (seen
    # 2026-12-03: prefill 512 at batch 1 took 0.33 s, the next 1,024 tokens 0.13 s): a 256-token
    # configuration goes first and is kept as kind "warmup" (bench/llamacpp_pareto.py skips it).
    "$lb" -m "$work/model-bf16.gguf" -ngl 99 -fa on -c 32800 -b 4096 -ub 4096 -npp 256,512,4096 -ntg 1 -npl 1,2,4,8 \
      --output-format jsonl 2>> "$out/llamacpp.err" | grep '^{' | sed "s/^{/{\"round\": $r, \"kind\": \"prefill\", /" |
      sed '/"pp": 256,/s/"kind": "prefill"/"kind": "warmup"/' >> "$out/llamacpp_sweep.jsonl"
    "$lb" -m "$work/model-bf16.gguf" -ngl 99 -fa on -c 36864 -b 4096 -ub 512 -npp 512 -ntg 64 -npl 1,2,4,8,16,32,64 \
      --output-format jsonl 2>> "$out/llamacpp.err" | grep '^{' | sed "s/^{/{\"round\": $r, \"kind\": \"decode\", /" >> "$out/llamacpp_sweep.jsonl"
    log "sweep round $r done: $(grep -c . "$out/sweep.jsonl") records of ours, $(grep -c . "$out/llamacpp_sweep.jsonl") of llama.cpp"
  done
  for r in $(seq 1 "$rounds"); do
    grep "\"round\": $r," "$out/llamacpp_sweep.jsonl" > "$work/lc_r$r.jsonl"
    grep "h200 bf16 r$r: " "$out/sweep.jsonl" > "$work/ours_r$r.jsonl"
    python3 "$root/bench/llamacpp_pareto.py" "$work/lc_r$r.jsonl" "$work/ours_r$r.jsonl" >> "$out/llamacpp_pareto.jsonl"
  done
  python3 - "$out" <<'PY' | tee -a "$out/summary.txt"
import json, statistics, sys
out = sys.argv[1]
recs = [json.loads(l) for f in ("sweep.jsonl", "llamacpp_pareto.jsonl") for l in open(f"{out}/{f}") if l.startswith("{")]
med = lambda xs: statistics.median(xs) if xs else float("nan")
print("Pareto sweep medians over rounds, bench config BF16, same weights; y = input tok/s (prefill), output tok/s (decode)")
print(f"{'point':24} {'deepinfer':>10} {'llama.cpp':>10} {'ratio':>7}")
for kind, plen, ykey, batches in (("prefill", 512, "input_tokens_per_s", (1, 2, 4, 8)),
                                 ("prefill", 4096, "input_tokens_per_s", (1, 2, 4, 8)),
                                 ("decode", 512, "tokens_per_s", (1, 2, 4, 8, 16, 32, 64))):
    for b in batches:
        vals = {e: med([r[ykey] for r in recs if r.get("engine", "deepinfer") == e and r["kind"] == kind
                        and r["prompt_len"] == plen and r["batch"] == b]) for e in ("deepinfer", "llama.cpp")}
        print(f"{kind + ' ' + str(plen) + ' b' + str(b):24} {vals['deepinfer']:10.1f} {vals['llama.cpp']:10.1f} "
              f"{vals['deepinfer'] / vals['llama.cpp']:7.2f}")
PY
  exit 0
fi

: > "$out/deepinfer.jsonl"
: > "$out/llamacpp.jsonl"
for r in $(seq 1 "$rounds"); do
  "$di" bench --backend cuda --model "$work/model" --skip-weight-check --prefill 512,4096 --batch 1,8,64 \
    --prompt-len 512 --gen-len 128 --num-speculative-tokens 0 --repeats 1 --warmup 1 --tag "round$r" \
    >> "$out/deepinfer.jsonl" 2>> "$out/deepinfer.err"
  "$lb" -m "$work/model-bf16.gguf" -ngl 99 -fa on -c 4608 -b 4096 -ub 4096 -npp 512,4096 -ntg 1 -npl 1 \
    --output-format jsonl 2>> "$out/llamacpp.err" | grep '^{' | sed "s/^{/{\"round\": $r, \"kind\": \"prefill\", /" >> "$out/llamacpp.jsonl"
  "$lb" -m "$work/model-bf16.gguf" -ngl 99 -fa on -c 41984 -b 4096 -ub 512 -npp 512 -ntg 128 -npl 1,8,64 \
    --output-format jsonl 2>> "$out/llamacpp.err" | grep '^{' | sed "s/^{/{\"round\": $r, \"kind\": \"decode\", /" >> "$out/llamacpp.jsonl"
  log "round $r done"
done
python3 - "$out" <<'PY' | tee -a "$out/summary.txt"
import json, statistics, sys
out = sys.argv[1]
di = [json.loads(l) for l in open(f"{out}/deepinfer.jsonl") if l.startswith("{")]
lc = [json.loads(l) for l in open(f"{out}/llamacpp.jsonl") if l.startswith("{")]
med = lambda xs: statistics.median(xs) if xs else float("nan")
rows = []
for n in (512, 4096):
    ours = med([r["tokens_per_s"] for r in di if r["kind"] == "prefill" and r["tokens"] == n])
    peer = med([r["speed_pp"] for r in lc if r["kind"] == "prefill" and r["pp"] == n])
    rows.append((f"prefill {n}", ours, peer))
for b in (1, 8, 64):
    ours = med([r["tokens_per_s"] for r in di if r["kind"] == "decode" and r["batch"] == b])
    peer = med([r["speed_tg"] for r in lc if r["kind"] == "decode" and r["pl"] == b])
    rows.append((f"decode batch {b}", ours, peer))
print("tok/s medians, bench config BF16, same weights (deepinfer safetensors / llama.cpp GGUF of them)")
print(f"{'figure':16} {'deepinfer':>10} {'llama.cpp':>10} {'ratio':>7}")
for name, a, b in rows:
    print(f"{name:16} {a:10.1f} {b:10.1f} {a / b:7.2f}")
PY
