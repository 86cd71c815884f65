#!/usr/bin/env bash
# Issue 20 on several H200s (nvidia-h200-x2 / -x4 / -x8): every run that remains for the
# multi-GPU kinds, in one call (bench/NOTES.md "dp20" says what each part checks).
#
# On the device (one call; BIN = a folder with deepinfer and test_ops, or a .tar.xz of bin/ as
# tools/gpu/build_gpu.sh packs it):
#   run(kind="nvidia-h200-x2", carry=[".carry-NAME"], timeout_s=600,
#       command="bash bench/cuda/multi_gpu_h200.sh .carry-NAME/bin.tar.xz")
# Here, on the CPU (a check of the script itself: the same steps over mpirun, no GPU parts):
#   bash bench/cuda/multi_gpu_h200.sh build/ci/bin
#
# Steps (each logged to $OUT/multi_gpu.log; a failing step does not stop the next):
#  1. parity of the combine kernel (test_ops *MoeCombine*, DEEPINFER_CUDA_SYNC=1), one GPU;
#  2. same output over NCCL: tests/e2e/test_parallel.py, one process per GPU (torchrun's
#     variables), on the tiny model: --ep N and --dp N --ep N held to the single process's bits
#     (DEEPINFER_BATCH_INVARIANT=1); then --tp / --dp x --tp layouts on bf16 random weights of the
#     tiny model's config (its FP8 head shards are not 128-aligned): greedy tokens equal, logprobs
#     within 1e-3, batch invariant;
#  3. NCCL's own bandwidth (bench/cuda/nccl_bw.py: all-reduce, all-to-all, and the all-to-all of
#     MoE dispatch sizes), the reference for deepinfer's collectives;
#  4. throughput scaling on the bench model (bench/cuda/bench-v3-7b.config.json, random weights,
#     DTYPE, default bf16: sharded random weights are made on the host, FP8 quantizes there too):
#     one GPU, then --ep N, --dp N --ep N and --tp 2 --ep N (prefill 4096, decode batches),
#     records in $OUT/bench.jsonl ("parallel" names the layout).
# STEPS="1 2 3 4" picks steps; NP overrides the process count (default: the GPUs, or 2 on the CPU).
set -uo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"
bin_arg="${1:?usage: multi_gpu_h200.sh BIN_DIR|BIN.tar.xz}"
OUT="${OUT:-/tmp/multi_gpu_out}"
mkdir -p "$OUT"
log="$OUT/multi_gpu.log"
steps="${STEPS:-1 2 3 4}"
dtype="${DTYPE:-bf16}"
# NVLink multicast stays off (the device's rule: it can take the host's GPUs out of service).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1

if [[ "$bin_arg" == *.tar.xz ]]; then
  mkdir -p /tmp/multi_gpu_bin && tar -C /tmp/multi_gpu_bin -xJf "$bin_arg" && bin=/tmp/multi_gpu_bin/bin
else
  bin="$(cd "$bin_arg" && pwd)"
fi
[[ -x "$bin/deepinfer" ]] || { echo "no deepinfer in $bin" | tee -a "$log"; exit 1; }

gpus=0
command -v nvidia-smi >/dev/null && gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
if (( gpus > 0 )); then
  backend=cuda
  np="${NP:-$gpus}"
  # libnccl.so.2 from pip's nvidia-nccl-cu13 (deepinfer dlopens it).
  nccl_lib=$(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))' 2>/dev/null)
  export LD_LIBRARY_PATH="${nccl_lib:+$nccl_lib:}${LD_LIBRARY_PATH:-}"
  # One process per GPU in torchrun's convention (no mpirun in the image); the test calls
  # "$spawn -np N cmd...". Exit status: the first failing rank's.
  spawn=/tmp/multi_gpu_spawn
  cat > "$spawn" <<'X'
#!/bin/bash
n=$2; shift 2
port=$((29500 + RANDOM % 2000))
pids=()
for ((r = 0; r < n; r++)); do
  RANK=$r WORLD_SIZE=$n LOCAL_RANK=$r MASTER_ADDR=127.0.0.1 MASTER_PORT=$port "$@" & pids+=($!)
done
rc=0
for p in "${pids[@]}"; do wait "$p" || { s=$?; (( rc == 0 )) && rc=$s; }; done
exit $rc
X
  chmod +x "$spawn"
else
  backend=cpu
  np="${NP:-2}"
  spawn="$(command -v mpirun)"
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1 \
    OMPI_MCA_hwloc_base_binding_policy=none DEEPINFER_NUM_THREADS=1
fi
{
  echo "== multi_gpu_h200.sh $(date -u +%FT%TZ): backend $backend, $gpus GPUs, $np processes, binaries $bin"
  nvidia-smi -L 2>/dev/null
  "$bin/deepinfer" --version 2>/dev/null | head -1
} | tee -a "$log"

step() { [[ " $steps " == *" $1 "* ]]; }
run_logged() {  # name, command...: its output to the log, its time and status after
  local name=$1; shift
  echo "-- $name: $*" | tee -a "$log"
  local t0=$SECONDS
  "$@" >> "$log" 2>&1
  local rc=$?
  echo "-- $name: rc $rc, $((SECONDS - t0)) s" | tee -a "$log"
  return $rc
}

# 1. The combine kernel's parity (CUDA; the CPU twin runs in test_backend_cpu).
if step 1 && [[ $backend == cuda && -x "$bin/test_ops" ]]; then
  DEEPINFER_CUDA_SYNC=1 run_logged "1 moe_combine parity" "$bin/test_ops" --gtest_filter='*MoeCombine*'
fi

# 2. Same output as one process, over NCCL (or MPI here).
if step 2; then
  ep_layouts="ep2 dp2_ep2"
  tp_layouts="tp2 tp2_ep2 dp2"
  if (( np >= 4 )); then
    ep_layouts="$ep_layouts ep4 dp4_ep4"
    tp_layouts="$tp_layouts dp2_tp2 dp2_tp2_ep4"
  fi
  if [[ $backend == cuda ]]; then
    DEEPINFER_PARALLEL_FLAGS="--backend cuda" DEEPINFER_PARALLEL_LAYOUTS="$ep_layouts" \
      run_logged "2a ep layouts, tiny FP8 checkpoint, bitwise" python3 tests/e2e/test_parallel.py "$bin/deepinfer" . "$spawn"
    DEEPINFER_PARALLEL_FLAGS="--backend cuda --random-weights --dtype bf16" DEEPINFER_PARALLEL_LAYOUTS="$tp_layouts" \
      run_logged "2b tp layouts, bf16 random weights" python3 tests/e2e/test_parallel.py "$bin/deepinfer" . "$spawn"
  else  # the script's check: one layout of each kind (ctest e2e_parallel runs them all)
    DEEPINFER_PARALLEL_LAYOUTS="ep2" \
      run_logged "2a ep2 (CPU)" python3 tests/e2e/test_parallel.py "$bin/deepinfer" . "$spawn"
    DEEPINFER_PARALLEL_FLAGS="--random-weights --dtype bf16" DEEPINFER_PARALLEL_LAYOUTS="tp2" \
      run_logged "2b tp2, bf16 random weights (CPU)" python3 tests/e2e/test_parallel.py "$bin/deepinfer" . "$spawn"
  fi
fi

# 3. NCCL's own bandwidth (all-reduce, all-to-all; MoE dispatch sizes at the V3 hidden size).
if step 3 && [[ $backend == cuda ]] && (( np > 1 )); then
  run_logged "3 nccl bandwidth" python3 -m torch.distributed.run --nproc-per-node "$np" bench/cuda/nccl_bw.py \
    --output "$OUT/nccl_bw.jsonl"
fi

# 4. Throughput: one GPU, then the layouts over np (prefill 4096 at batch 1; decode batches).
if step 4; then
  config=bench/cuda/bench-v3-7b.config.json
  prefill=(--prefill 4096)
  shape=(--batch 1,8,32,64 --repeats 3 --warmup 1 --kv-cache-bytes $((8 << 30)))
  if [[ $backend == cpu ]]; then
    config=models/deepseek-v3-tiny-code/config.json
    prefill=(--prefill 64)
    shape=(--batch 1,2 --repeats 1 --warmup 0 --kv-cache-bytes 64000000)
  fi
  base=(bench --backend "$backend" --random-weights --config "$config" --dtype "$dtype" --num-speculative-tokens 0
        "${shape[@]}" --output "$OUT/bench.jsonl")
  common=("${base[@]}" "${prefill[@]}")
  run_logged "4 bench 1 process" "$bin/deepinfer" "${common[@]}" --tag 1proc_
  for layout in "--ep $np" "--dp $np --ep $np" "--tp 2 --ep $np"; do
    read -r -a flags <<< "$layout"
    if [[ $layout == "--tp 2 --ep $np" ]] && (( np != 2 )); then flags=(--dp $((np / 2)) --tp 2 --ep "$np"); fi
    run_logged "4 bench ${flags[*]}" "$spawn" -np "$np" "$bin/deepinfer" "${common[@]}" "${flags[@]}" \
      --tag "$(echo "${flags[*]}" | tr -d ' -')_"
  done
  # The dispatch's collectives timed (device synchronized around them): ep_comm_s_per_step and
  # ep_comm_bytes_per_step in the decode records, against step 3's all-to-all bandwidth.
  DEEPINFER_EP_COMM_TIMING=1 run_logged "4 bench --dp $np --ep $np, collectives timed" "$spawn" -np "$np" \
    "$bin/deepinfer" "${base[@]}" --dp "$np" --ep "$np" --tag "dp${np}ep${np}_commtimed_"
fi
echo "== done $(date -u +%FT%TZ); results in $OUT" | tee -a "$log"
ls -la "$OUT" | tee -a "$log"
