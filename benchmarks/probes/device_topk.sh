#!/bin/bash
# One device call for indexer_topk (issue 25): the product bench on every distribution, the
# session-start kernel beside the current one on random rows, then the GPU kernel tests.
# Run from the tree's root (the copy in .dev-topk); logs under $OUT.
set -o pipefail
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv \
    | tee "$OUT/smi.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
git_rev=$(cat REV 2>/dev/null); echo "kernel commit ${git_rev:-?}"
# Two bench commands (each prints its table only at its end): the second reuses the first's
# compiled kernels from the on-disk cache.
for d in randn,ramp,ties zeros,recent,lowbits,relu; do
    timeout "${T_BENCH:-90}" python3 cli.py bench indexer_topk --rows 1,64,1024,4096 \
        --keys 131072 --dist "$d" --providers torch-topk,auto --graphs --warmup 3 --iters 20 \
        2>&1 | tee -a "$OUT/bench.txt"
done
if [ -f old_tk.py ]; then
    timeout "${T_OLD:-70}" python3 benchmarks/probes/topk_dists.py --rows 1,64,1024,4096 \
        --dists randn --old old_tk.py --iters 20 2>&1 | tee "$OUT/old.txt"
fi
timeout "${T_TESTS:-100}" python3 -m pytest -q -p no:cacheprovider -m gpu \
    tests/kernels/test_indexer_topk_triton.py tests/kernels/test_indexer_topk_distributions.py \
    2>&1 | tee "$OUT/tests.txt"
echo "== bench table"; grep -E "^\|" "$OUT/bench.txt" | head -60
echo "== old"; grep -E "^\|" "$OUT/old.txt" 2>/dev/null
echo "== tests"; tail -3 "$OUT/tests.txt"
