#!/usr/bin/env bash
# The one script run on the H200 machine (device tool, repo root, carry: ["$GPU_BIN/bin.tar.xz"] or ["$GPU_BIN"]).
# Uses the binaries prebuilt on the dev machine by tools/gpu/build_gpu.sh into $GPU_BIN/bin
# (GPU_BIN defaults to build-gpu; carry ["$GPU_BIN/bin.tar.xz"], unpacked here):
#   1. environment: GPU, driver, shared libraries the binaries need (ldd)
#   2. parity: tests/ops (every CUDA op vs the CPU reference) with DEEPINFER_CUDA_SYNC=1
#   3. golden tests on the GPU backend (when their binary exists)
#   4. op-sequence bench of the bench model (bench/cuda/layer_bench.cpp): bf16 with graphs,
#      bf16 on own GEMMs only, fp8, bf16 batch-invariant
#   5. `deepinfer bench` on the bench config (when the CLI implements it)
#   6. offline throughput through the engine (`deepinfer bench --throughput`; stage
#      "throughput", not in the default set: THROUGHPUT=RxPxG overrides 1000x512x128)
# Each stage is time-boxed, logs to $OUT/<stage>.log, and a failure never stops the script.
# The whole run stays under ~9.5 minutes (the device tool's per-command limit is 10).
set -u
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"
OUT="${OUT:-/tmp/deepinfer_out}"
mkdir -p "$OUT"
gpu_bin="${GPU_BIN:-build-gpu}"
bin="$root/$gpu_bin/bin"
# Binaries carried packed (tools/gpu/build_gpu.sh writes $GPU_BIN/bin.tar.xz): unpack them.
if [[ ! -d "$bin" && -f "$root/$gpu_bin/bin.tar.xz" ]]; then
  tar -C "$root/$gpu_bin" -xJf "$root/$gpu_bin/bin.tar.xz" || echo "could not unpack $gpu_bin/bin.tar.xz"
fi
budget_s="${RUN_ALL_BUDGET_S:-560}"
start_s=$(date +%s)
export LD_LIBRARY_PATH="/usr/local/cuda/lib64:/usr/local/cuda/targets/x86_64-linux/lib:$root/$gpu_bin/lib:${LD_LIBRARY_PATH:-}"
# pip's cuBLAS as a fallback location for libcublasLt.so.13
py_cublas="$(python3 -c 'import nvidia.cublas, os; print(os.path.join(list(nvidia.cublas.__path__)[0], "lib"))' 2>/dev/null || true)"
[[ -n "$py_cublas" ]] && export LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$py_cublas"
# pip's NCCL as a fallback location for libnccl.so.2 (several GPUs; dist/ loads it at run time)
py_nccl="$(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))' 2>/dev/null || true)"
[[ -n "$py_nccl" ]] && export LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$py_nccl"

# STAGES: space-separated subset of "parity golden bench_bf16 bench_fp8 bench_inv
# deepinfer_bench throughput" (default: all but throughput);
# BENCH_ARGS: extra flags for the op bench (e.g. --decode-only).
STAGES="${STAGES:-parity golden bench_bf16 bench_fp8 bench_inv deepinfer_bench}"
want() { [[ " $STAGES " == *" $1 "* ]]; }
BENCH_ARGS="${BENCH_ARGS:-}"
declare -a rows=()
remaining() { echo $(( budget_s - ($(date +%s) - start_s) )); }
# stage NAME LIMIT_S CMD...: runs CMD with a time box, logs, records status.
stage() {
  local name="$1" limit="$2"; shift 2
  local left; left=$(remaining)
  if (( left < 15 )); then rows+=("$name|SKIPPED (time budget)|0"); return; fi
  (( limit > left - 10 )) && limit=$(( left - 10 ))
  local t0; t0=$(date +%s)
  echo "=== $name (limit ${limit}s): $*" | tee -a "$OUT/run_all.log"
  timeout -k 5 "$limit" "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  local dt=$(( $(date +%s) - t0 ))
  local st="ok"
  (( rc == 124 || rc == 137 )) && st="TIMEOUT"
  (( rc != 0 && rc != 124 && rc != 137 )) && st="FAIL rc=$rc"
  rows+=("$name|$st|$dt")
  tail -n 5 "$OUT/$name.log" | sed 's/^/    /'
}

# 1. environment
{
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv 2>&1
  uname -a; ls -la "$bin" 2>&1
  for b in "$bin"/*; do echo "--- ldd $b"; ldd "$b" 2>&1 | grep -E "not found|cublas|cudart|pcre|stdc|GLIBC" ; done
} > "$OUT/env.log" 2>&1
missing=$(grep -c "=> not found" "$OUT/env.log" || true)
rows+=("env|missing libs: $missing|0")
grep "=> not found" "$OUT/env.log" | sort -u | sed 's/^/    MISSING: /'

# 1b. fallback: when the prebuilt binaries cannot start here (e.g. an older glibc), build the
#     op bench on the device with nvcc + g++ directly (no CMake deps; the parity test needs gtest
#     and is skipped then).
if [[ -x "$bin/test_ops" ]] && ! "$bin/test_ops" --gtest_list_tests > "$OUT/prebuilt_check.log" 2>&1; then
  echo "prebuilt binaries do not start (see $OUT/prebuilt_check.log); building the bench here"
  fb=/tmp/deepinfer_fallback; mkdir -p "$fb"
  build_fallback() {
    set -e
    local inc="-I$root -I$root/include -I/usr/local/cuda/include"
    # CUTLASS headers (backend/cuda/moe_cutlass.cu) from the nvidia-cutlass wheel, when installed here
    local cutlass_inc
    cutlass_inc="$(python3 -c 'import cutlass_library, os; print(os.path.join(os.path.dirname(cutlass_library.__file__), "source", "include"))' 2>/dev/null || true)"
    [[ -n "$cutlass_inc" ]] && inc="$inc -isystem $cutlass_inc"
    for f in core/*.cpp backend/*.cpp backend/cpu/*.cpp backend/cuda/*.cpp bench/cuda/layer_bench.cpp; do
      g++ -std=c++20 -O3 -DDEEPINFER_HAVE_CUDA=1 $inc -c "$root/$f" -o "$fb/$(echo "$f" | tr / _).o" &
    done
    for f in backend/cuda/*.cu; do
      nvcc -std=c++17 -O3 --expt-relaxed-constexpr -gencode=arch=compute_90a,code=sm_90a $inc -c "$root/$f" \
        -o "$fb/$(echo "$f" | tr / _).o" &
    done
    wait
    g++ -o "$fb/deepinfer_cuda_bench" "$fb"/*.o -L/usr/local/cuda/lib64 -lcudart_static -lcublasLt -lpthread -ldl -lrt
  }
  stage fallback_build 200 bash -c "$(declare -f build_fallback); root=$root fb=$fb build_fallback"
  if [[ -x "$fb/deepinfer_cuda_bench" ]]; then mkdir -p "$fb/bin"; cp "$fb/deepinfer_cuda_bench" "$fb/bin/"; bin="$fb/bin"; fi
fi

# 2. parity
if ! want parity; then
  rows+=("parity|not asked|0")
elif [[ -x "$bin/test_ops" ]]; then
  DEEPINFER_CUDA_SYNC=1 stage parity 200 "$bin/test_ops" --gtest_output="json:$OUT/test_ops.json"
else
  rows+=("parity|no binary|0")
fi

# 3. golden tests on the GPU backend
for g in "$bin"/test_golden*; do
  [[ -x "$g" ]] && want golden || continue
  DEEPINFER_ACCELERATOR=cuda DEEPINFER_BACKEND=cuda stage "golden_$(basename "$g")" 90 "$g"
done

# 4. op-sequence bench (figures for issue #4; JSONL in $OUT/bench.jsonl)
if [[ -x "$bin/deepinfer_cuda_bench" ]]; then
  want bench_bf16 && stage bench_bf16 110 "$bin/deepinfer_cuda_bench" --graphs $BENCH_ARGS --out "$OUT/bench.jsonl"
  want bench_fp8 && stage bench_fp8 100 "$bin/deepinfer_cuda_bench" --fp8 --graphs $BENCH_ARGS --out "$OUT/bench.jsonl"
  want bench_inv && DEEPINFER_BATCH_INVARIANT=1 stage bench_bf16_invariant 80 "$bin/deepinfer_cuda_bench" --graphs $BENCH_ARGS --out "$OUT/bench_invariant.jsonl"
  # dense few-row BF16 GEMMs on cuBLASLt instead of the stream kernel (A/B)
else
  rows+=("bench|no binary|0")
fi

# 5. deepinfer bench (the CLI): the real model through engine/runner on CUDA, random weights
#    made on the device; the issue's six bf16 figures, then fp8 (its random e4m3 weights are made
#    on the device too since session 3: the load was ~170 s of host quantization before).
cfg="$root/../shared/models/bench-v3-7b/config.json"
[[ -f "$cfg" ]] || cfg="$root/bench/cuda/bench-v3-7b.config.json"
if want deepinfer_bench && [[ -x "$bin/deepinfer" ]]; then
  common=(--config "$cfg" --random-weights --backend cuda --prefill 512,4096 --batch 1,8,32,64
          --prompt-len 512 --gen-len 128 --repeats 2 --warmup 1 --max-num-seqs 64
          --max-num-batched-tokens 8192 --roofline-gbps 4160)
  stage deepinfer_bench_bf16 150 "$bin/deepinfer" bench "${common[@]}" --dtype bf16 \
    --peak-tflops 777 --output "$OUT/deepinfer_bench.jsonl" ${DEEPINFER_BENCH_ARGS:-}
  want deepinfer_bench_fp8 && stage deepinfer_bench_fp8 150 "$bin/deepinfer" bench "${common[@]}" \
    --dtype fp8 --peak-tflops 1419 --output "$OUT/deepinfer_bench.jsonl" ${DEEPINFER_BENCH_ARGS:-}
else
  rows+=("deepinfer_bench|not available|0")
fi

# 6. offline throughput (issue #5 item 8): 1,000 requests of 512 random prompt tokens, 128
#    generated each (EOS ignored), all queued at once; the engine's continuous batching and
#    KV cache sized by --gpu-memory-utilization (default 0.9). The peer figure is llama.cpp's
#    best batched one in PERFORMANCE.md (decode batch 64, prompt 512 + 128: 6,307 output tok/s).
if want throughput && [[ -x "$bin/deepinfer" ]]; then
  stage throughput 280 "$bin/deepinfer" bench --config "$cfg" --random-weights --backend cuda \
    --dtype bf16 --throughput "${THROUGHPUT:-1000x512x128}" --max-num-seqs 256 \
    --max-num-batched-tokens 8192 --peer-tokens-per-s 6307 --output "$OUT/throughput.jsonl" \
    ${DEEPINFER_BENCH_ARGS:-}
  grep -h "throughput" "$OUT/throughput.log" | tail -2
elif want throughput; then
  rows+=("throughput|no binary|0")
fi

# Short table last.
echo
echo "== parity failures (first 20) =="
grep -E "^\[  FAILED  \]|Failure|error" "$OUT/parity.log" 2>/dev/null | head -20
echo
echo "== bench figures =="
for f in bench_bf16 bench_fp8 bench_bf16_invariant bench_bf16_cublas; do
  [[ -f "$OUT/$f.log" ]] && grep -E "^(prefill|decode|weights|graph)" "$OUT/$f.log" | sed "s/^/$f: /" | cut -c1-150
done
echo
echo "== summary (total $(( $(date +%s) - start_s ))s) =="
passed=$(grep -oE "\[  PASSED  \] [0-9]+" "$OUT/parity.log" 2>/dev/null | grep -oE "[0-9]+$")
failed=$(grep -oE "\[  FAILED  \] [0-9]+ test" "$OUT/parity.log" 2>/dev/null | grep -oE "[0-9]+" | head -1)
echo "parity tests: passed ${passed:-?} failed ${failed:-0}"
printf "%-28s %-24s %s\n" stage status seconds
for r in "${rows[@]}"; do IFS='|' read -r a b c <<< "$r"; printf "%-28s %-24s %s\n" "$a" "$b" "$c"; done
