#!/usr/bin/env bash
# One lease on the lent H200: GPU tests, hit-path benchmark on its quiet host CPU, kreg tune and
# the selection-regret run. Logs go to $OUT (or ./device-out). Usage: bash benchmarks/device_run.sh
#
# The device image has no kreg installed, and plugins load through entry points only, so carry an
# installed copy: before the call, here, `rm -f .whl/kreg-*.whl && .venv/bin/pip wheel --no-deps
# -w .whl .` (next to the pydantic wheels the device README lists), and name `.whl` in `carry`.
set -u
ls .whl/kreg-*.whl >/dev/null 2>&1 || { echo "no .whl/kreg-*.whl: build it first (see above)"; exit 2; }
OUT=${OUT:-device-out}
mkdir -p "$OUT"
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD
fi
export PYTHONPATH=${PYTHONPATH:-$PWD} PYTHONUNBUFFERED=1 KREG_HOME=/tmp/kreg_home
kreg() { python3 -m cli "$@"; }
stage() { echo "=== $1 ($(date +%T))"; }

stage "environment"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"

stage "gpu tests"
timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu tests 2>&1 | tee "$OUT/gpu_tests.log" | tail -15

stage "hit paths"
timeout 60 python3 benchmarks/bench_select.py 2>&1 | tee "$OUT/bench_select.log"

GRID="--grid kind=prefill,chunk --grid group_size=6,12 --grid total_q=128,512,1024,8192 --grid space=tiny"
stage "tune sparse_prefill"
timeout 150 python3 -m cli tune sparse_prefill $GRID --warmup 3 --iters 10 \
  --plot "$OUT/tune_sparse_prefill.png" > "$OUT/tune_sparse_prefill.log" 2>&1
tail -40 "$OUT/tune_sparse_prefill.log"
stage "regret sparse_prefill"
timeout 120 python3 benchmarks/bench_regret.py sparse_prefill $GRID --warmup 3 --iters 15 2>&1 | tee "$OUT/regret_sparse_prefill.log"

IGRID="--grid rows=1,64,1024 --grid keys=131072"
stage "tune indexer_topk"
timeout 60 python3 -m cli tune indexer_topk $IGRID --warmup 3 --iters 10 \
  > "$OUT/tune_indexer_topk.log" 2>&1; tail -25 "$OUT/tune_indexer_topk.log"
stage "regret indexer_topk"
timeout 60 python3 benchmarks/bench_regret.py indexer_topk $IGRID --warmup 3 --iters 15 2>&1 | tee "$OUT/regret_indexer_topk.log"
cp "$KREG_HOME/tuning.json" "$OUT/tuning.json" 2>/dev/null
stage "done"
