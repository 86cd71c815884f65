#!/usr/bin/env bash
# Prefill attention A/B on the H200 (helper attn17, 2026-12-03): the binaries of two builds
# (OLD_BIN, NEW_BIN: directories with deepinfer_cuda_bench and deepinfer) run interleaved.
#   1. layer bench, prefill only (512 / 4096, eager), old / new / old / new;
#   2. layer bench --profile-prefill of each (us per op: the attention op alone);
#   3. `deepinfer bench` prefill PREFILL (default 512,4096) of the bench model, bf16, old / new x ROUNDS;
#   4. LONG (e.g. 32768): one more old / new pair of `deepinfer bench --prefill LONG` (one step).
# Raw logs and JSONL under $OUT. Run from the repo root on the device.
set -u
OUT="${OUT:-/tmp/attn_ab}"; mkdir -p "$OUT"
OLD_BIN="${OLD_BIN:?}"; NEW_BIN="${NEW_BIN:?}"
ROUNDS="${ROUNDS:-2}"; PREFILL="${PREFILL:-512,4096}"
export LD_LIBRARY_PATH="/usr/local/cuda/lib64:$(dirname "$NEW_BIN")/lib:${LD_LIBRARY_PATH:-}"
py_cublas="$(python3 -c 'import nvidia.cublas, os; print(os.path.join(list(nvidia.cublas.__path__)[0], "lib"))' 2>/dev/null || true)"
[[ -n "$py_cublas" ]] && export LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$py_cublas"
cfg="../shared/models/bench-v3-7b/config.json"
[[ -f "$cfg" ]] || cfg="bench/cuda/bench-v3-7b.config.json"
if [[ -z "${SKIP_LAYER:-}" ]]; then
  for r in 1 2; do
    for v in old new; do
      b=OLD_BIN; [[ $v == new ]] && b=NEW_BIN
      echo "=== layer $v round $r $(date -u +%T)"
      timeout 120 "${!b}/deepinfer_cuda_bench" --prefill-only --out "$OUT/layer_$v.jsonl" 2>&1 | grep -E "prefill|weights|rror"
    done
  done
  for v in old new; do
    b=OLD_BIN; [[ $v == new ]] && b=NEW_BIN
    echo "=== profile $v $(date -u +%T)"
    timeout 120 "${!b}/deepinfer_cuda_bench" --profile-prefill > "$OUT/profile_$v.log" 2>&1
    grep -E "profile|attention|moe_experts|copy|gemm kv_b" "$OUT/profile_$v.log"
  done
fi
bench_run() {  # variant tag lengths
  local v=$1 tag=$2 lens=$3 b=OLD_BIN
  [[ $v == new ]] && b=NEW_BIN
  echo "=== deepinfer bench $v $tag ($lens) $(date -u +%T)"
  timeout 200 "${!b}/deepinfer" bench --config "$cfg" --random-weights --backend cuda --dtype bf16 \
    --prefill "$lens" --repeats 2 --warmup 1 --max-num-seqs 8 --max-num-batched-tokens 8192 \
    --roofline-gbps 4160 --peak-tflops 777 --tag "$v" --output "$OUT/deepinfer_bench_$v.jsonl" > "$OUT/deepinfer_bench_${v}_$tag.log" 2>&1
  echo "rc $?"; grep -iE "prefill|error" "$OUT/deepinfer_bench_${v}_$tag.log" | tail -4
}
for r in $(seq 1 "$ROUNDS"); do
  for v in old new; do bench_run $v "r$r" "$PREFILL"; done
done
if [[ -n "${LONG:-}" ]]; then
  for v in old new; do bench_run $v long "$LONG"; done
fi
exit 0
