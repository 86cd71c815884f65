#!/usr/bin/env bash
# Session 17 call H (main 1241050): goldens on CUDA (model + runner) and the CLI (`deepinfer bench`,
# random weights, no speculation) at the vs-llama.cpp points, bf16 and fp8.
set -u
C="$PWD/.carry-lead"
OUT0="${OUT:-/tmp/out}"; mkdir -p "$OUT0"
OUT=/tmp/s17h; mkdir -p "$OUT"
pack() { tar -C "$OUT" -cJf "$OUT0/results.tar.xz.tmp" . && mv "$OUT0/results.tar.xz.tmp" "$OUT0/results.tar.xz"; }
trap pack EXIT
mkdir -p "$C/g" && tar -C "$C/g" -xJf "$C/bin.tar.xz"
B="$C/g/bin"
export LD_LIBRARY_PATH="$C/lib:/usr/local/cuda/lib64:/usr/local/cuda/targets/x86_64-linux/lib:${LD_LIBRARY_PATH:-}"
t0=$(date +%s)
ts() { echo "[$(date -u +%H:%M:%S) +$(( $(date +%s) - t0 ))s]"; }
{ date -u; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,power.limit --format=csv; } > "$OUT/env.log" 2>&1
cat "$OUT/env.log"
for g in test_golden; do
  echo "$(ts) == $g (cuda)"
  DEEPINFER_ACCELERATOR=cuda DEEPINFER_BACKEND=cuda timeout -k 5 90 "$B/$g" > "$OUT/$g.log" 2>&1; echo "$g rc $?"
  grep -E "^\[  PASSED|^\[  FAILED" "$OUT/$g.log" | tail -3
done
pack
for dt in bf16 fp8; do
  peak=777; [[ $dt == fp8 ]] && peak=1419
  echo "$(ts) == CLI $dt"
  timeout -k 5 120 "$B/deepinfer" bench --config bench/cuda/bench-v3-7b.config.json --random-weights --backend cuda --dtype $dt \
    --sweep --prefill 512,4096 --prefill-batch 1 --batch 1,8,32,64 --contexts 512 --gen-len 64 --num-speculative-tokens 0 \
    --repeats 2 --warmup 1 --roofline-gbps 4160 --peak-tflops $peak --tag "h200 $dt s17: " --output "$OUT/cli_sweep.jsonl" \
    > "$OUT/cli_$dt.log" 2>&1; echo "cli $dt rc $?"
  pack
done
python3 - "$OUT/cli_sweep.jsonl" <<'PY'
import json, sys
for l in open(sys.argv[1]):
    if not l.startswith("{"): continue
    r = json.loads(l)
    print(r.get("tag", r.get("curve", ""))[:16], r.get("kind"), "batch", r.get("batch"), "prompt", r.get("prompt_len"),
          "tok/s", round(r.get("tokens_per_s", 0), 1), "in tok/s", round(r.get("input_tokens_per_s", 0) or 0, 1))
PY
echo "$(ts) done"
