#!/usr/bin/env bash
# Pareto sweep of the bench model on one H200 (issue 17 item 5): bf16 and FP8 random weights,
# prefill 512/4096 at batch 1..8 and decode at batch 1..256 for contexts 512 and 4096.
# PACK: a folder with bin/deepinfer (CUDA build) and lib/. Records go to $OUT/sweep.jsonl.
set -u
P=${PACK:-$(pwd)/.gpucarry/sweep}
export LD_LIBRARY_PATH=$P/lib:${LD_LIBRARY_PATH:-}
CFG=bench/cuda/bench-v3-7b.config.json
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,power.draw,temperature.gpu --format=csv
for DT in bf16 fp8; do
  PEAK=777; [[ $DT == fp8 ]] && PEAK=1419
  common=(bench --config $CFG --random-weights --backend cuda --dtype $DT --gen-len 64 --repeats 2 --warmup 1
          --roofline-gbps 4160 --peak-tflops $PEAK --tag "h200 $DT: " --output $OUT/sweep.jsonl)
  # Context 4096 stops at batch 64: its prompts alone (64 x 4096) take ~8 s per run to prefill.
  timeout ${SWEEP_BUDGET_S:-200} "$P/bin/deepinfer" "${common[@]}" --prefill 512,4096 --prefill-batch 1,2,4,8 \
    --batch 1,2,4,8,16,32,64,128,256 --contexts 512 > $OUT/sweep_$DT.log 2>&1
  echo "sweep $DT ctx 512 rc=$?"
  timeout ${SWEEP_BUDGET_S:-200} "$P/bin/deepinfer" "${common[@]}" --batch 1,2,4,8,16,32,64 --contexts 4096 \
    >> $OUT/sweep_$DT.log 2>&1
  echo "sweep $DT ctx 4096 rc=$? records=$(grep -c . $OUT/sweep.jsonl)"
done
