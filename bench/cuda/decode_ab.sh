#!/usr/bin/env bash
# Decode A/B of the runner's CUDA graphs and asynchronous scheduling through the real model
# (`deepinfer bench`, bench config, random bf16 weights, prompt 512 + 128 generated, the
# issue's batches), run on the H200 from the repo root (carry: ["$GPU_BIN"]):
#   graphs+async (default) | graphs, no async (--no-async-scheduling) | eager (--enforce-eager)
# ARMS picks arms (default all three), BATCHES the batch list, REPEATS the timed runs.
# Kernel A/B arm (default flags): old = $GPU_BIN/bin/deepinfer_old (a baseline binary copied
# there by hand). An arm may repeat in ARMS for an interleaved A/B.
# Env arms: NAME:VAR=VALUE[,VAR=VALUE...] runs the default flags with those variables set,
# e.g. "sync:DEEPINFER_CUDA_SYNC=1" (kernel variants have no switches left: a kernel A/B
# builds a binary per variant, or sets CudaOptions in code; bench/NOTES.md v32c).
# Records go to $OUT/decode_ab.jsonl with an "arm" field added; a table is printed last.
set -u
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"
OUT="${OUT:-/tmp/deepinfer_out}"
mkdir -p "$OUT"
bin="$root/${GPU_BIN:-build-gpu}/bin"
export LD_LIBRARY_PATH="/usr/local/cuda/lib64:/usr/local/cuda/targets/x86_64-linux/lib:${LD_LIBRARY_PATH:-}"
cfg="$root/../shared/models/bench-v3-7b/config.json"
[[ -f "$cfg" ]] || cfg="$root/bench/cuda/bench-v3-7b.config.json"
ARMS="${ARMS:-default no_async eager}"
BATCHES="${BATCHES:-1,8,32,64}"
for spec in $ARMS; do
  exe="$bin/deepinfer"
  envs=()
  arm="${spec%%:*}"
  if [[ "$spec" == *:* ]]; then
    IFS=',' read -r -a envs <<< "${spec#*:}"
    spec=env
  fi
  case "$spec" in
    env) flags=() ;;
    default) flags=() ;;
    old) flags=(); exe="$bin/deepinfer_old" ;;
    no_async) flags=(--no-async-scheduling) ;;
    eager) flags=(--enforce-eager --no-async-scheduling) ;;
    *) echo "unknown arm $arm"; continue ;;
  esac
  echo "=== arm $arm: ${envs[*]} ${flags[*]}"
  env "${envs[@]}" timeout -k 5 "${ARM_LIMIT_S:-120}" "$exe" bench --config "$cfg" --random-weights \
    --backend cuda --dtype "${DTYPE:-bf16}" --batch "$BATCHES" --prompt-len 512 --gen-len 128 \
    --repeats "${REPEATS:-2}" --warmup 1 --max-num-seqs 64 --max-num-batched-tokens 8192 \
    --roofline-gbps 4160 "${flags[@]}" 2> "$OUT/decode_ab_$arm.err" |
    sed "s/^{/{\"arm\":\"$arm\",/" | tee -a "$OUT/decode_ab.jsonl" | cut -c1-200
  tail -3 "$OUT/decode_ab_$arm.err"
done
echo "== decode tok/s by arm =="
python3 - "$OUT/decode_ab.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
for r in rows:
    if r.get("kind") == "decode":
        print(f'{r["arm"]:10s} {r.get("dtype",""):5s} bs{r["batch"]:<3d} {r["tokens_per_s"]:9.1f} tok/s  '
              f'roofline {r.get("fraction_of_roofline", 0) * 100:5.1f}%  runs {r.get("runs_s")}')
PY
