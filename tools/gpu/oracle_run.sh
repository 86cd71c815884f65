#!/usr/bin/env bash
# The single oracle run on the GPU machine (H200, no network):
#     OUT=/path/to/outdir bash tools/gpu/oracle_run.sh
# 1. tools/golden/make_golden.py  -> tests/golden/fixtures/{v3_tiny,v2_lite_tiny,v3_fp8_yarn}/
# 2. tools/train_tiny/train.py    -> models/deepseek-v3-tiny-code/ + tests/golden/tiny_code_fixture.json
# 3. packs everything (repo-relative paths) into $OUT/oracle.tar.gz; if that is larger than 15 MiB it is split into
#    $OUT/oracle.tar.gz.part0, .part1, ... (each < 15 MiB).  Unpack at the repo root with
#        cat oracle.tar.gz.part* | tar xzf -        (or: tar xzf oracle.tar.gz)
#    and check with: sha256sum -c SHA256SUMS (also in $OUT, repo-relative paths)
# Logs: $OUT/golden.log, $OUT/train.log.  Whole run is kept under ~9.5 minutes.
# (ORACLE_QUICK=1 passes --quick to train.py: local smoke test of this script only.)
set -uo pipefail
: "${OUT:?set OUT to the output directory}"
mkdir -p "$OUT"
ROOT="${ORACLE_ROOT:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)}"
cd "$ROOT"
export PYTHONUNBUFFERED=1
export TOKENIZERS_PARALLELISM=true
PY="${PYTHON:-python3}"
T0=$(date +%s)
LIMIT=${ORACLE_LIMIT_S:-560}   # whole-script budget (seconds)
elapsed() { echo $(( $(date +%s) - T0 )); }

echo "== oracle_run $(date -u +%FT%TZ)  repo $ROOT  commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv || echo "nvidia-smi failed"
$PY -c "import torch, transformers, tokenizers; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(), 'transformers', transformers.__version__, 'tokenizers', tokenizers.__version__)"

STAGE="$(mktemp -d /tmp/oracle_stage.XXXXXX)"
MODEL_REL=models/deepseek-v3-tiny-code
FIX_REL=tests/golden/fixtures
TINYFIX_REL=tests/golden/tiny_code_fixture.json
mkdir -p "$STAGE/$FIX_REL" "$STAGE/models"

echo "== [$(elapsed)s] golden fixtures"
timeout "${GOLDEN_TIMEOUT_S:-150}" $PY tools/golden/make_golden.py --out "$STAGE/$FIX_REL" --device cuda > "$OUT/golden.log" 2>&1
RC_G=$?
grep '^\[golden\]' "$OUT/golden.log" | tail -3
[ $RC_G -ne 0 ] && { echo "make_golden FAILED rc=$RC_G; tail of log:"; tail -30 "$OUT/golden.log"; }

REMAIN=$(( LIMIT - $(elapsed) - 25 ))
TRAIN_S=$(( REMAIN - 200 )); [ $TRAIN_S -gt 300 ] && TRAIN_S=300; [ $TRAIN_S -lt 60 ] && TRAIN_S=60
echo "== [$(elapsed)s] train tiny code model (training budget ${TRAIN_S}s, hard timeout ${REMAIN}s)"
timeout --signal=KILL "$REMAIN" $PY tools/train_tiny/train.py --out-model "$STAGE/$MODEL_REL" \
    --out-fixture "$STAGE/$TINYFIX_REL" --device cuda --train-seconds "$TRAIN_S" --total-seconds $(( REMAIN - 15 )) \
    ${ORACLE_QUICK:+--quick} \
    > "$OUT/train.log" 2>&1
RC_T=$?
[ $RC_T -ne 0 ] && { echo "train.py FAILED rc=$RC_T; tail of log:"; tail -40 "$OUT/train.log"; }

echo "== [$(elapsed)s] pack"
( cd "$STAGE" && find . -type f | sed 's|^\./||' | sort | xargs -r sha256sum > "$OUT/SHA256SUMS" ; \
  tar czf "$OUT/oracle.tar.gz" -- * )
SZ=$(stat -c %s "$OUT/oracle.tar.gz")
if [ "$SZ" -gt $(( 15 * 1024 * 1024 )) ]; then
  split -b 15000000 -d -a 1 "$OUT/oracle.tar.gz" "$OUT/oracle.tar.gz.part"
  rm -f "$OUT/oracle.tar.gz"
fi

echo
echo "==================================== ORACLE SUMMARY ===================================="
printf "%-14s %s\n" "make_golden" "rc=$RC_G"
grep '^\[golden\]' "$OUT/golden.log" | tail -3 | sed 's/^/    /'
printf "%-14s %s\n" "train.py" "rc=$RC_T"
awk '/^=====/{f=!f; next} f' "$OUT/train.log" | tail -12 | sed 's/^/    /'
grep -E 'GUARD FIRED|STEP COUNT REDUCED|VERIFICATION MISMATCH|MtpModel check failed' "$OUT/train.log" | sed 's/^/    !! /'
echo "files in \$OUT:"
ls -l "$OUT" | awk 'NR>1{printf "    %-28s %10d bytes\n", $9, $5}'
echo "staged: $(cd "$STAGE" && find . -type f | wc -l) files; unpack at repo root: cat oracle.tar.gz.part* | tar xzf -  (or tar xzf oracle.tar.gz)"
echo "total time: $(elapsed)s"
[ $RC_G -eq 0 ] && [ $RC_T -eq 0 ]
