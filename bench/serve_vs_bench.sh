#!/usr/bin/env bash
# The server's overhead: bench/serve_load.py against `deepinfer serve` vs `deepinfer bench --throughput`
# on the same workload (R = WAVES x C requests of PROMPT random tokens, GEN output tokens each, greedy,
# ignore_eos) and the same scheduler settings (--max-num-seqs C, --max-num-batched-tokens, no prefix
# caching: bench turns it off). Each record has the engine's step counts (steps, prefill steps, mean
# batch) on both sides, and the server's engine-thread time (step / output / task / idle) and the load
# client's own CPU.
#   B=build/app/deepinfer MODEL_ARGS="--backend cpu" CONC="64 256" PROMPT=32 GEN=32 bench/serve_vs_bench.sh
# Env: B (binary), MODEL_ARGS (model and backend flags for both), SERVE_ARGS (serve only, e.g.
# --tokenizer DIR), CONC (concurrencies), PROMPT, GEN, WAVES (requests per slot, default 4), PROCS
# (client process counts to try on each server, default "0": serve_load.py chooses),
# HTTP_THREADS (serve --http-threads values, one server each, default "0": serve chooses),
# TOKENS (--max-num-batched-tokens, default 8192), PORT, OUT (folder for the logs, serve
# --step-log files and records, default a temporary one).
set -u
B=${B:-build/app/deepinfer}
MODEL_ARGS=${MODEL_ARGS:-}
SERVE_ARGS=${SERVE_ARGS:-}
CONC=${CONC:-"64 256"}
PROMPT=${PROMPT:-32}
GEN=${GEN:-32}
WAVES=${WAVES:-4}
PROCS=${PROCS:-0}
HTTP_THREADS=${HTTP_THREADS:-0}
TOKENS=${TOKENS:-8192}
PORT=${PORT:-18000}
LOAD=${LOAD:-$(dirname "$0")/serve_load.py}
OUT=${OUT:-$(mktemp -d)}
python3 -c "import httpx; print('httpx', httpx.__version__)" || exit 3
echo "records in $OUT"
for C in $CONC; do
  N=$((C * WAVES))
  # shellcheck disable=SC2086
  $B bench $MODEL_ARGS --throughput ${N}x${PROMPT}x${GEN} --max-num-seqs $C --max-num-batched-tokens $TOKENS \
     --output $OUT/bench_c$C.jsonl > $OUT/bench_c$C.log 2>&1
  echo "bench c$C rc=$?"; tail -1 $OUT/bench_c$C.jsonl
  for H in $HTTP_THREADS; do
    # shellcheck disable=SC2086
    $B serve $MODEL_ARGS $SERVE_ARGS --max-num-seqs $C --max-num-batched-tokens $TOKENS --no-prefix-caching \
       --http-threads $H --step-log $OUT/steps_c${C}_h$H.log --port $PORT --served-model-name bench \
       > $OUT/serve_c${C}_h$H.log 2>&1 &
    SP=$!
    for _ in $(seq 1 600); do curl -sf http://127.0.0.1:$PORT/health >/dev/null && break; sleep 0.5; done
    for P in $PROCS; do
      R=$OUT/load_c${C}_h${H}_p$P.json
      python3 "$LOAD" --url http://127.0.0.1:$PORT --concurrency $C --num-requests $N --duration 600 \
         --prompt-len $PROMPT --max-tokens $GEN --processes $P > $R 2>>$OUT/serve_c${C}_h$H.log
      echo "load c$C http-threads $H processes $P rc=$?"; cat $R
      python3 - "$OUT/bench_c$C.jsonl" "$R" <<'PY'
import json, sys
b = [json.loads(l) for l in open(sys.argv[1]) if l.strip()][-1]
s = json.loads(open(sys.argv[2]).read())
print(f"ratio serve/bench {s['output_tok_per_s'] / b['output_tokens_per_s']:.3f}: "
      f"steps {s['engine_steps']} vs {b['steps']}, prefill steps {s['engine_prefill_steps']} vs {b['prefill_steps']}, "
      f"mean batch {s['engine_mean_batch']} vs {b['mean_batch']:.2f}, wall {s['wall_s']} vs {b['elapsed_s']:.2f} s "
      f"(server steps {s['engine_step_s']} s, idle {s['engine_idle_s']} s, tasks {s['engine_task_s']} s; "
      f"client cpu {s['client_cpu_frac']})")
PY
    done
    kill -TERM $SP; wait $SP; echo "serve exit $?"; grep "engine thread" $OUT/serve_c${C}_h$H.log
  done
done
