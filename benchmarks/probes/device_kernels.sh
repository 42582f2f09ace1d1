#!/usr/bin/env bash
# Kernel tables for docs/BENCHMARKS.md on the lent H200, in two parts that fit one call each:
#   bash benchmarks/probes/device_kernels.sh indexer   # GPU tests, then indexer_topk variants/shapes
#   bash benchmarks/probes/device_kernels.sh sparse    # sparse_prefill seed tables, candidates, ablations
# Before the call, here: `rm -f .whl/kreg-*.whl && .venv/bin/pip wheel --no-deps -w .whl .` and
# name `.whl` in `carry` (see benchmarks/probes/device_run.sh). Logs and JSON go to $OUT.
set -u
part=${1:?usage: device_kernels.sh indexer|sparse}
OUT=${OUT:-device-out}
mkdir -p "$OUT"
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD
  # the installed copy shadows the tree: refuse a wheel built before the tree's last edit
  python3 benchmarks/probes/check_installed.py /tmp/site || exit 2
fi
export PYTHONPATH=${PYTHONPATH:-$PWD} PYTHONUNBUFFERED=1 KREG_HOME=/tmp/kreg_home
stage() { echo "=== $1 ($(date +%T))"; }
stage "environment"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"

if [ "$part" = indexer ]; then
  stage "gpu tests (warnings as the project configures them)"
  [ -n "${SKIP_TESTS:-}" ] || timeout 300 python3 -m pytest -q -p no:cacheprovider -m gpu tests ${GPU_TESTS_K:+-k "$GPU_TESTS_K"} \
    > "$OUT/gpu_tests.log" 2>&1
  echo "pytest rc=$?"; tail -6 "$OUT/gpu_tests.log"
  IB="python3 cli.py bench indexer_topk --warmup 5 --iters 30"
  V="torch-topk,torch-topk-unsorted,triton,auto,geometry=FUSED=0,geometry=SEARCH_WARPS=16"
  V="$V,geometry=SEARCH_WARPS=8,geometry=PLACE_KEYS=4096:SEARCH_WARPS=8"
  V="$V,geometry=PLACE_KEYS=4096"
  V=${IDX_PROVIDERS:-$V}
  for g in "" "--graphs"; do
    stage "indexer 131072 keys $g"
    timeout 240 $IB --rows 1,64,1024,4096 --keys 131072 --providers "$V" $g 2>/dev/null \
      | tee -a "$OUT/indexer.log"; echo "rc=$?"
  done
  stage "indexer other shapes"
  W="torch-topk,torch-topk-unsorted,triton,geometry=FUSED=0,geometry=SEARCH_WARPS=8"
  W=${IDX_PROVIDERS_OTHER:-$W}
  timeout 150 $IB --rows 1,64 --keys 8192,524288 --providers "$W" 2>/dev/null \
    | tee -a "$OUT/indexer.log"; echo "rc=$?"
  timeout 100 $IB --rows 1024 --keys 131072 --ragged --providers "$W" 2>/dev/null \
    | tee -a "$OUT/indexer.log"; echo "rc=$?"
fi

if [ "$part" = sparse ]; then
  stage "sparse_prefill gpu tests"
  timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu \
    tests/kernels/test_sparse_prefill_triton.py > "$OUT/sparse_gpu_tests.log" 2>&1
  echo "pytest rc=$?"; tail -2 "$OUT/sparse_gpu_tests.log"
  SB="python3 cli.py bench sparse_prefill --iters 20 --warmup 3 --total-q 8192"
  for kind in chunk prefill; do
    stage "seed table $kind"
    timeout 200 $SB --kind $kind --group-size 6,12 --kv-len 8192,32768,131072 \
      --providers table,h200,gather-sdpa,reference 2>/dev/null >> "$OUT/sparse.log"
    echo "rc=$?"
  done
  stage "seed ablations (chunk kernel, KV 8K/32K/128K)"
  timeout 150 $SB --kind chunk --group-size 6 --kv-len 8192,32768,131072 --providers \
    table,geometry=8x16x1x2,geometry=16x16x4x3,geometry=8x16x4x3,h200 2>/dev/null \
    >> "$OUT/sparse.log"; echo "rc=$?"
  timeout 150 $SB --kind chunk --group-size 12 --kv-len 8192,32768,131072 --providers \
    table,geometry=16x16x2x3,geometry=16x16x4x3,h200 2>/dev/null \
    >> "$OUT/sparse.log"; echo "rc=$?"
  stage "compute-sanitizer memcheck"
  timeout 60 python3 benchmarks/probes/sanitize_sparse.py  # compiles outside the sanitizer
  timeout 240 compute-sanitizer --tool memcheck --error-exitcode 3 \
    python3 benchmarks/probes/sanitize_sparse.py > "$OUT/sanitizer.log" 2>&1
  echo "compute-sanitizer rc=$?"; tail -3 "$OUT/sanitizer.log"
  grep -v "^---" "$OUT/sparse.log" | cut -c1-130
fi
stage "done"
