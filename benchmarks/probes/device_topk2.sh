#!/bin/bash
# Second device call (issue 25, session 8): the distributions the first call moved, then the
# GPU k=2048 distribution tests on the rare tiers' distributions. Logs under $OUT.
set -o pipefail
export PYTHONUNBUFFERED=1
echo "kernel commit $(cat REV 2>/dev/null)"
timeout "${T_BENCH:-100}" python3 cli.py bench indexer_topk --rows 1,64,1024,4096 --keys 131072 \
    --dist randn,ramp,relu,ties,zeros --providers torch-topk,auto --graphs --warmup 3 \
    --iters 20 2>&1 | tee "$OUT/bench2.txt"
timeout "${T_TESTS:-60}" python3 -m pytest -v -p no:cacheprovider -m gpu \
    tests/kernels/test_indexer_topk_distributions.py -k "ramp or relu or ties or zeros" \
    2>&1 | tee "$OUT/tests2.txt"
grep -E "x131072 .*(auto|torch-topk)" "$OUT/bench2.txt" | awk '{print $1, $2, $4, $5, $6, $7}'
grep -E "PASS|FAIL|passed|failed|error" "$OUT/tests2.txt" | tail -12
