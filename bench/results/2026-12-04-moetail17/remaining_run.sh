#!/usr/bin/env bash
# moetail17's remaining run (not made: the helper had one call): the tail in one kernel after the
# side line's join (CudaOptions::moe_tail, off by default) - parity, then the interleaved A/B.
# Binaries of branch moetail17 (final commit) in .carry-moetail17/bin.tar.xz (test_ops, deepinfer_cuda_bench).
set -u
cd "$(dirname "$0")/.."
R=$OUT; S=$R/summary.txt; T=/tmp/mt; mkdir -p $T/logs
log() { echo "[$(date -u +%T)] $*" | tee -a $S; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,power.limit --format=csv,noheader >> $S 2>&1
tar -C $T -xJf .carry-moetail17/bin.tar.xz; B=$T/bin
res() { grep -aE '^\[  (PASSED|FAILED)  \]' "$1" | tr '\n' ' '; }
DEEPINFER_CUDA_SYNC=1 timeout 110 $B/test_ops --gtest_filter='AttentionMoe.*:DenseOps.*' > $T/logs/parity.log 2>&1
log "parity (SYNC) rc=$? $(res $T/logs/parity.log)"
timeout 30 $B/test_ops --gtest_filter='AttentionMoe.MoeTail*:AttentionMoe.SideLine*:AttentionMoe.DecodeStepPdl*' > $T/logs/parity_nosync.log 2>&1
log "parity (no SYNC) rc=$? $(res $T/logs/parity_nosync.log)"
declare -A ARGS=([old]="" [tail]="--moe-tail")
for r in 1 2 3; do
  arms="old tail"; [ $r = 2 ] && arms="tail old"
  for dt in "" --fp8; do
    for a in $arms; do
      timeout 30 $B/deepinfer_cuda_bench --graphs --decode-only $dt ${ARGS[$a]} --out $T/ab_$a.jsonl > $T/logs/ab_${a}${dt}_r$r.log 2>&1
      log "r$r ${dt:-bf16} $a: $(awk '$3=="graph" {printf "b%s %sms | ", $5, $11}' $T/logs/ab_${a}${dt}_r$r.log)"
    done
  done
done
for a in old tail; do sed "s/^{/{\"arm\":\"$a\",/" $T/ab_$a.jsonl; done > $R/ab.jsonl
tar -C $T -cJf $R/logs.tar.xz logs
