#!/usr/bin/env bash
# Issue 26's union path on the lent H200, one device call: the GPU tests of the union path, the
# interleaved CUDA-graph timing of the H200 family (h200), auto and the union configs on both
# index sets, then the other sparse_prefill GPU tests. Logs under $OUT (or ./union26-out).
# usage: bash benchmarks/probes/union26.sh [STEPS]   (STEPS: tests,bench,moretests; default all;
# confirm: the policy's union cell (chunk g6, KV 8192) against the staged family it replaces,
# at 8192 and 4096 rows, on the walk and an overlap sweep of top-k rows, and the dispatch GPU
# tests)
set -u
OUT=${OUT:-./union26-out}
mkdir -p "$OUT"
STEPS=${1:-tests,bench,moretests}
T0=$(date +%s)
log() { echo "[$(( $(date +%s) - T0 ))s] $*" | tee -a "$OUT/steps.log"; }
{
  nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, 'cuda', torch.version.cuda)"
  git rev-parse HEAD 2>/dev/null || cat COMMIT 2>/dev/null
} > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"
FAM6=8x16x1x2:rev:split2:v2:lean:o32
FAM12=16x16x1x2:rev:split2:v2:lean:o32
if [[ $STEPS == *tests* ]]; then
  log "union GPU tests"
  timeout 150 python3 -m pytest -q -m gpu -p no:cacheprovider tests/kernels/test_sparse_prefill_union.py \
    > "$OUT/tests_union.log" 2>&1; log "rc=$? $(tail -1 "$OUT/tests_union.log")"
  grep -E "passed|failed|Error" "$OUT/tests_union.log" | tail -5
fi
if [[ $STEPS == *bench* ]]; then
  for kind in prefill chunk; do
    for g in 6 12; do
      fam=$FAM6; [[ $g == 12 ]] && fam=$FAM12
      pre=""; [[ $kind == chunk ]] && pre=":pre"
      base=${fam/x2:rev/x2${pre}:rev}
      u1="geometry=${base}:union300"
      u2="geometry=${base}:union150"
      if [[ $kind == prefill ]]; then
        d=250; [[ $g == 12 ]] && d=150
        u3="geometry=${base}:dense${d}:union150"
      else
        u3=""
      fi
      for ix in topk walk; do
        log "bench $kind g$g $ix"
        timeout 150 python3 cli.py bench sparse_prefill --kind $kind --group-size $g \
          --kv-len 8192,32768 --total-q 8192 --indices $ix --graphs --warmup 3 --iters 12 \
          --providers "h200,auto,$u1,$u2${u3:+,$u3}" --baseline h200 \
          > "/tmp/bench_${kind}_g${g}_${ix}.txt" 2>&1
        log "rc=$?"; cat "/tmp/bench_${kind}_g${g}_${ix}.txt" >> "$OUT/bench_all.txt"
      done
    done
  done
fi
if [[ $STEPS == *moretests* ]]; then
  log "triton + contract GPU tests"
  timeout 120 python3 -m pytest -q -m gpu -p no:cacheprovider tests/kernels/test_sparse_prefill_triton.py \
    tests/kernels/test_sparse_prefill_contract.py > "$OUT/tests_more.log" 2>&1
  log "rc=$? $(tail -1 "$OUT/tests_more.log")"
fi
if [[ $STEPS == *confirm* ]]; then
  FAMC=config=nvidia_hopper.family.chunk_g6
  for ix in walk topk; do
    ov=""; [[ $ix == topk ]] && ov="--overlap 0.5,0.8,0.95,0.99"
    log "confirm chunk g6 kv 8192 $ix"
    timeout 120 python3 cli.py bench sparse_prefill --kind chunk --group-size 6 --kv-len 8192 \
      --total-q 4096,8192 --indices $ix $ov --graphs --warmup 3 --iters 12 \
      --providers "h200,auto,$FAMC" --baseline $FAMC >> "$OUT/confirm.txt" 2>&1
    log "rc=$?"
  done
  log "dispatch GPU tests"
  timeout 90 python3 -m pytest -q -m gpu -p no:cacheprovider tests/gpu/test_dispatch_gpu.py \
    > "$OUT/tests_dispatch.log" 2>&1; log "rc=$? $(tail -1 "$OUT/tests_dispatch.log")"
fi
log done
