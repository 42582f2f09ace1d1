#!/usr/bin/env bash
# Issue 26's union path on the lent H200, one device call: the GPU tests of the union path, the
# interleaved CUDA-graph timing of the H200 family (h200), auto and the union configs on both
# index sets, then the other sparse_prefill GPU tests. Logs under $OUT (or ./union26-out).
# usage: bash benchmarks/probes/union26.sh [STEPS]   (STEPS: tests,bench,moretests; default all;
# confirm: the policy's union cell (chunk g6, KV 8192) against the staged family it replaces,
# at 8192 and 4096 rows, on the walk and an overlap sweep of top-k rows, and the dispatch GPU
# tests; tiles: the union path's tile height (DENSE_TILE 128/64/32 lines: 16/8/4 rows at group 6,
# 8/4/2 at group 12) and threshold (UNION 300/200) on top-k rows, both kinds, KV 8K and 32K;
# flashinfer: the table, the family, auto and FlashInfer's raw paged attention (flashinfer-paged, when
# importable) at KV 8K and 32K on both index sets; kv128k: the same at KV 128K; overlap: the
# --overlap sweep plotted for prefill g6 and g12 at KV 8K, $OUT/overlap_g*.png, the union path
# at the default tile and at the one measured fastest for the group). U26_TEST_TIMEOUT and
# U26_TEST_K (a -k filter) for the tests step; U26_GROUPS, U26_KV and U26_FI_TIMEOUT narrow the
# flashinfer step (default groups 6,12, KV 8192,32768, 200 s a kind and index set)
set -u
OUT=${OUT:-./union26-out}
mkdir -p "$OUT"
STEPS=${1:-tests,bench,moretests}
export TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-$PWD/.tcache}
bash benchmarks/probes/tcache.sh restore   # kernels an earlier call packed (PACK_TCACHE=1)
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
# fam_base KIND G: the family's one-warp Triton config for the kind and group (pretranslated
# for chunk), the base of the union configs
fam_base() {
  local fam=$FAM6 pre=""
  [[ $2 == 12 ]] && fam=$FAM12
  [[ $1 == chunk ]] && pre=":pre"
  echo "${fam/x2:rev/x2${pre}:rev}"
}
if [[ $STEPS == *tests* ]]; then
  log "union GPU tests"
  timeout ${U26_TEST_TIMEOUT:-150} python3 -m pytest -q -m gpu -p no:cacheprovider \
    tests/kernels/test_sparse_prefill_union.py ${U26_TEST_K:+-k "$U26_TEST_K"} \
    > "$OUT/tests_union.log" 2>&1; log "rc=$? $(tail -1 "$OUT/tests_union.log")"
  grep -E "passed|failed|Error" "$OUT/tests_union.log" | tail -5
fi
if [[ $STEPS == *bench* ]]; then
  for kind in prefill chunk; do
    for g in 6 12; do
      base=$(fam_base $kind $g)
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
if [[ $STEPS == *tiles* ]]; then
  for kind in prefill chunk; do
    for g in 6 12; do
      base=$(fam_base $kind $g)
      prov="h200,auto"
      for u in 300 200; do
        for dt in 128x32x8x3 64x32x4x2 32x32x4x2; do
          prov="$prov,geometry=${base}:union${u}:dt${dt}"
        done
      done
      log "tiles $kind g$g"
      timeout 200 python3 cli.py bench sparse_prefill --kind $kind --group-size $g \
        --kv-len 8192,32768 --total-q 8192 --indices topk --graphs --warmup 3 --iters 10 \
        --providers "$prov" --baseline h200 >> "$OUT/tiles.txt" 2>&1
      log "rc=$?"
    done
  done
fi
if [[ $STEPS == *flashinfer* || $STEPS == *kv128k* ]]; then
  # FlashInfer's built modules (.fi-ws/fiws.tgz, carried) as AOT modules, as device_run.sh's
  # fi_restore does; without FlashInfer the flashinfer-paged column is dropped
  export FLASHINFER_WORKSPACE_BASE=$PWD/.fi-ws
  if [ -f .fi-ws/fiws.tgz ]; then
    [ -d .fi-ws/.cache ] || tar xzf .fi-ws/fiws.tgz
    site=$(python3 -c "import flashinfer, os; print(os.path.dirname(flashinfer.__file__))" 2>/dev/null)
    [ -n "$site" ] && mkdir -p "$site/data/aot" \
      && cp -r .fi-ws/.cache/flashinfer/*/*/cached_ops/* "$site/data/aot/"
  fi
  FIP=""; python3 -c "import flashinfer" 2>/dev/null && FIP=",flashinfer-paged"
fi
if [[ $STEPS == *flashinfer* ]]; then
  for kind in prefill chunk; do
    for ix in topk walk; do
      log "flashinfer $kind $ix"
      timeout ${U26_FI_TIMEOUT:-200} python3 cli.py bench sparse_prefill --kind $kind \
        --group-size ${U26_GROUPS:-6,12} --kv-len ${U26_KV:-8192,32768} --total-q 8192 \
        --indices $ix --graphs --warmup 3 --iters 10 \
        --providers "table,h200,auto$FIP" --baseline h200 >> "$OUT/sparse_fi.txt" 2>&1
      log "rc=$?"
    done
  done
fi
if [[ $STEPS == *kv128k* ]]; then
  for kind in prefill chunk; do
    for ix in topk walk; do
      log "kv128k $kind $ix"
      timeout 200 python3 cli.py bench sparse_prefill --kind $kind --group-size 6,12 \
        --kv-len 131072 --total-q 8192 --indices $ix --graphs --warmup 3 --iters 10 \
        --providers "table,h200,auto$FIP" --baseline h200 >> "$OUT/kv128k.txt" 2>&1
      log "rc=$?"
    done
  done
fi
if [[ $STEPS == *overlap* ]]; then
  for g in 6 12; do
    fam=$FAM6; tile=128x64x8x2; [[ $g == 12 ]] && fam=$FAM12 && tile=64x32x4x3
    log "overlap sweep prefill g$g"
    timeout 200 python3 cli.py bench sparse_prefill --kind prefill --group-size $g \
      --kv-len 8192 --total-q 8192 --indices topk --overlap 0,0.5,0.8,0.95,0.99 --graphs \
      --warmup 3 --iters 10 --providers "table,h200,auto,geometry=${fam}:union300,geometry=${fam}:union300:dt$tile" \
      --baseline h200 --plot "$OUT/overlap_g$g.png" >> "$OUT/overlap.txt" 2>&1
    log "rc=$?"
  done
fi
log done
[ "${PACK_TCACHE:-0}" = 1 ] && bash benchmarks/probes/tcache.sh pack "$OUT"
bash benchmarks/probes/pack_out.sh "$OUT"   # at most 8 files come back
