#!/usr/bin/env bash
# Lease steps on the lent H200 for docs/BENCHMARKS.md. Usage:
#   bash benchmarks/probes/device_run.sh STEP [STEP...]
# Steps: tests (pytest -m gpu, then the torch.compile tests, which are CPU tests that -m gpu
# deselects), hit-paths (bench_select on the device host), tune-sparse and regret-sparse (the
# whole sparse_prefill grid of issue 6), tune-indexer and regret-indexer, profile-indexer (the
# per-kernel split and the row kernel by phase), ncu-indexer (counters of the row kernel),
# slices-indexer (gmax slices a row against the default, graph replays), tests-indexer (the
# indexer's GPU tests only), ncu-source (stall
# samples per SASS instruction of the row kernel at 64 and 4096 rows, CSV), ab-indexer (fused
# path variants side by side), shapes-indexer (8K and 512K keys, causal),
# gmax16-indexer (GMAX_BITS=16 against the default, and the k2048 GPU tests),
# ab-sparse (sparse_prefill: double-buffered 16-key tiles against the family),
# stage-sparse (chunk: CHUNK_MODE=staged against pretranslate; the sparse GPU tests),
# lean-sparse (LEAN and SPLIT_V=2 against the family, all four cells; the sparse GPU tests),
# lean2-sparse (LEAN and OFFS32 apart, register caps),
# onewarp-sparse (group 6 on one warp), dense-sparse (DENSE thresholds, KV and total_q
# sweeps; DENSE6/DENSE12=denseN pick the swept ones), envelope-sparse (chunk: 2 KV heads,
# 16 requests), kv32k-sparse (prefill at KV 32K, 8192 rows: schedules around the family),
# gluon-sparse (ENGINE=gluon: its GPU tests unless SKIP_TESTS is set, the group-6 prefill
# total_q sweep at KV 8K-32K against the Triton family and the table, long KV, group 12),
# wgmma-sparse (ENGINE=gluon_wgmma: the Gluon and dispatch GPU tests unless SKIP_TESTS is set,
# the group-12 and group-6 prefill total_q sweeps at KV 8K-32K),
# ncu-cuda (counters, stalls and SASS samples of the streaming select at 64 and 1024 rows
# and of the CUDA union pre-pass), ncu-union (counters of the union kernel `_union_fwd`,
# top-k rows and the walk), ncu-sparse (counters of the sparse_prefill table and
# the H200 family), hit-paths-ab (bench_select before/after, the older tree in .dev-base),
# contracts (issue #29: the contracts' GPU tests and the batch-invariance cost sweep),
# dists-indexer (issue #25: every score distribution through kreg bench), stream (the CUDA
# streaming kernel: GPU tests, A/B against the Triton kernels and STREAM_VARIANTS), stream-bench
# (its docs table through kreg bench), union-prep (issue #26: the one-kernel CUDA union
# pre-pass's GPU tests and its A/B in union_phases), union-stages (issue #26: the union kernel at 2-4 pipeline stages),
# prep-stats (issue #26: the CUDA pre-pass counting its tiles' statistics, A/B against the
# previous commit's kernels in .device/old),
# union-dense (issue #26: UNION_DENSE's A/B at prefill g6), union-ws (issue #26: the
# warp-specialized Gluon union kernel's GPU tests and A/B at g6, ncu), gpu26 (issue #26: union GPU tests through dispatch and of the CUDA pre-pass, the dispatch GPU
# tests, memcheck of sparse_prefill when GPU26_SANITIZE is set), exact-heads (issue #26: union tiles of the
# group's heads exactly, TILE_HEADS="group": GPU tests and union_phases), fi-build and fi-wait (FlashInfer's top-k JIT build
# in the background, then its modules packed into $OUT/fiws.tgz), cluster (the CUDA
# cluster kernel: GPU tests, memcheck, A/B against CLUSTER_PATCHES, the docs table), sanitize
# (compute-sanitizer memcheck on both ops' kernels),
# flashinfer (issue #27: the conformance kit on the flashinfer plugin, kreg bench of both ops
# with auto, the kreg families and flashinfer.* at the seed's shapes, a small kreg tune grid of
# both ops and the regret bench on it; its parts flashinfer-kit, flashinfer-bench and
# flashinfer-tune run alone too: FlashInfer's first JIT builds take more than 3 minutes here,
# so a lease can give the kit one call and the rest the next; the builds are cached in
# $PWD/.fi-ws, kept between calls while the machine stays warm).
# Logs go to $OUT (or ./device-out); the tuning store is copied there at the end.
#
# The device image has no kreg installed, and plugins load through entry points only, so carry an
# installed copy: before the call, here, `rm -f .whl/kreg-*.whl && .venv/bin/pip wheel --no-deps
# -w .whl .` (next to the pydantic wheels the device README lists), and name `.whl` in `carry`.
# The flashinfer steps need nothing else: the flashinfer-python and apache-tvm-ffi wheels are in
# /work/main/.whl beside those (copy them into this tree's .whl if it lacks them), installed with
# the rest below; the image has FlashInfer's other imports (torch, ninja, nvcc, pynvml).
set -u
ls .whl/kreg-*.whl >/dev/null 2>&1 || { echo "no .whl/kreg-*.whl: build it first (see above)"; exit 2; }
OUT=${OUT:-device-out}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD
# the installed copy shadows the tree: refuse a wheel built before the tree's last edit
python3 benchmarks/probes/check_installed.py /tmp/site || exit 2
export PYTHONUNBUFFERED=1 KREG_HOME=${KREG_HOME:-/tmp/kreg_home}
# A tuning store an earlier call brought back ($OUT/tuning.json, copied here to
# .tcarry/tuning.json and carried): kreg tune resumes after the buckets it holds.
if [ -f .tcarry/tuning.json ] && [ ! -f "$KREG_HOME/tuning.json" ]; then
  mkdir -p "$KREG_HOME" && cp .tcarry/tuning.json "$KREG_HOME/tuning.json"
fi
# Compiled kernels: kept in the tree (reused while the machine stays warm), restored from
# .tcarry/tcache.tgz when an earlier call packed them (PACK_TCACHE=1; benchmarks/probes/tcache.sh)
export TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-$PWD/.tcache}
bash benchmarks/probes/tcache.sh restore
stage() { echo "=== $1 ($(date +%T))"; }
# ab_cells NAME G6 G12 SED6 SED12: sparse_prefill provider lists G6 (group 6) and G12 (group
# 12; empty: skipped) side by side, prefill then chunk, 8192 rows, KV 8K, graph replays, into
# $OUT/NAME.log; SED6/SED12 turn a prefill list into its chunk list (e.g. s/:rev/:pre:rev/g).
# sparse_gpu_tests NAME [EXTRA]: the sparse_prefill GPU tests into $OUT/NAME.log, with the
# comma-separated geometries EXTRA as extra candidates (KREG_SP_EXTRA_GEOMETRIES)
sparse_gpu_tests() {
  KREG_SP_EXTRA_GEOMETRIES="${2:-}" timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu \
    tests/kernels/test_sparse_prefill_triton.py > "$OUT/$1.log" 2>&1
  echo "sparse_prefill gpu tests rc=$?"; tail -3 "$OUT/$1.log"
}
# ncu_kernel 'KERNEL|TAG|COMMAND': one launch of KERNEL (a regex) in COMMAND under ncu: the
# details page's headline lines into $OUT/ncu_KERNEL_TAG.log, the SASS with its samples
# (CSV, gzipped), the stall reasons of at least 0.1 cycles an issue
ncu_kernel() {
  IFS='|' read -r kern tag cmd <<< "$1"
  stage "ncu $kern ($tag)"
  timeout 180 ncu --clock-control none -k regex:$kern -c 1 -f \
    --section SpeedOfLight --section WarpStateStats --section Occupancy \
    --section LaunchStats --section SchedulerStats --section SourceCounters \
    --section MemoryWorkloadAnalysis -o /tmp/ncu_${kern}_${tag} $cmd \
    > "$OUT/ncu_${kern}_${tag}_run.log" 2>&1
  echo "ncu rc=$?"
  ncu -i /tmp/ncu_${kern}_${tag}.ncu-rep --page details > "$OUT/ncu_${kern}_${tag}.log" 2>&1
  grep -E "Duration|Registers Per|Achieved Occupancy|Warp Cycles Per Issued|Mem Busy|Memory Throughput|Issue Slots Busy" \
    "$OUT/ncu_${kern}_${tag}.log" | head -12
  ncu -i /tmp/ncu_${kern}_${tag}.ncu-rep --page source --csv --print-source sass 2>/dev/null \
    | gzip > "$OUT/ncu_${kern}_${tag}_sass.csv.gz"
  ncu -i /tmp/ncu_${kern}_${tag}.ncu-rep --page raw --csv 2>/dev/null > /tmp/ncu_raw.csv
  python3 -c "
import csv, sys; rows = list(csv.reader(open('/tmp/ncu_raw.csv')))
if len(rows) < 3: sys.exit('  no counters (see the run log)')
hdr = rows[0]; data = [r for r in rows[2:] if r]
for i, h in enumerate(hdr):
    if h.startswith('smsp__average_warps_issue_stalled_') and h.endswith('_per_issue_active.ratio'):
        v = max(float(r[i].replace(',', '') or 0) for r in data)
        if v >= 0.1: print(f'  stall {h[34:-23]:<24} {v:7.2f}')
" | sort -k3 -n -r | head -8
}
# union_gpu_tests NAME TIMEOUT KEXPR: the union path's GPU tests selected by `-k KEXPR` into
# $OUT/NAME_tests.log, the verdict and (on a failure) the failing lines printed
union_gpu_tests() {
  stage "$1: GPU tests"
  timeout "$2" python3 -m pytest -q -p no:cacheprovider -m gpu \
    tests/kernels/test_sparse_prefill_union.py -k "$3" > "$OUT/$1_tests.log" 2>&1
  local rc=$?; echo "$1 gpu tests rc=$rc"; tail -1 "$OUT/$1_tests.log"
  [ $rc = 0 ] || grep -E "^E |FAILED" "$OUT/$1_tests.log" | head -20
}
ab_cells() {
  local name=$1 kind g p
  for kind in prefill chunk; do
    stage "sparse_prefill $kind: $name"
    for g in 6 12; do
      if [ $g = 6 ]; then p=$2; else p=$3; fi
      [ -n "$p" ] || continue
      if [ $kind = chunk ]; then p=$(echo "$p" | sed "$([ $g = 6 ] && echo "$4" || echo "$5")"); fi
      timeout 200 python3 cli.py bench sparse_prefill --kind $kind --group-size $g \
        --kv-len 8192 --total-q 8192 --graphs --providers "$p" 2>/dev/null \
        | tee -a "$OUT/$name.log" | grep -v "^-"
    done
  done
}
# flashinfer_part PART: one part of the flashinfer step (issue #27), logs into $OUT/fi_*.log;
# each part fits one 10-minute call (kit: the JIT builds; bench: ~9 min; tune: ~9 min).
# fi_restore: FlashInfer's JIT workspace in $PWD/.fi-ws; on a cold machine the modules an earlier
# call built, carried back as .fi-ws/fiws.tgz (the kit's call packs them into $OUT), become
# FlashInfer's AOT modules, which load unbuilt (ninja would rebuild a JIT module whose objects
# are gone). The pip install above replaces /tmp/site/flashinfer, so every call copies them.
fi_restore() {
  export FLASHINFER_WORKSPACE_BASE=$PWD/.fi-ws
  mkdir -p "$FLASHINFER_WORKSPACE_BASE"
  if [ -f .fi-ws/fiws.tgz ]; then
    [ -d .fi-ws/.cache ] || tar xzf .fi-ws/fiws.tgz
    mkdir -p /tmp/site/flashinfer/data/aot \
      && cp -r .fi-ws/.cache/flashinfer/*/*/cached_ops/* /tmp/site/flashinfer/data/aot/
  fi
}
flashinfer_part() {
  fi_restore
  local FG="--grid kind=prefill,chunk --grid group_size=6,12 --grid kv_len=8192"
  FG="$FG --grid total_q=8192 --grid space=tiny"
  # 64 rows on two distributions: the first indexer tune compiles every candidate (~13) cold
  local FI="--grid rows=64 --grid keys=131072 --grid dist=randn,ties"
  case "$1" in
    kit)
      stage "flashinfer: availability, then the conformance kit (the first call JIT-builds)"
      python3 -c "import plugins.flashinfer as p, flashinfer; print(p.availability(), \
        flashinfer.__version__)" 2>&1 | tail -2
      # one small test file to collect beside the kit's items (-m keeps the kit alone); a
      # timeout leaves the finished JIT builds in .fi-ws: the next call goes on from there
      timeout 540 python3 -m pytest -q -p no:cacheprovider tests/unit/test_requirements.py \
        --kreg-conformance flashinfer -m kreg_conformance -rs > "$OUT/fi_conformance.log" 2>&1
      echo "conformance rc=$?"; grep -E "passed|failed|SKIPPED|FAILED" "$OUT/fi_conformance.log" \
        | cut -c1-220 | tail -30
      timeout 150 python3 -m pytest -q -p no:cacheprovider -m gpu \
        tests/unit/test_flashinfer_plugin.py > "$OUT/fi_gpu_tests.log" 2>&1
      echo "gpu tests rc=$?"; tail -4 "$OUT/fi_gpu_tests.log"
      find .fi-ws -name '*.so' | tar czf "$OUT/fiws.tgz" -T - ;;
    bench)
      stage "flashinfer: kreg bench indexer_topk (graph replays)"
      timeout 300 python3 cli.py bench indexer_topk --rows 1,64,1024,4096 --keys 131072 \
        --graphs --warmup 3 --iters 20 --providers torch-topk,auto,flashinfer.indexer_topk \
        2>&1 | tee "$OUT/fi_bench_indexer.log" | grep -v "^-"
      for kind in prefill chunk; do
        stage "flashinfer: kreg bench sparse_prefill $kind, the seed's shapes (graph replays)"
        timeout 200 python3 cli.py bench sparse_prefill --kind $kind --group-size 6,12 \
          --kv-len 8192,32768 --total-q 8192 --graphs --warmup 3 --iters 15 \
          --providers table,h200,auto,flashinfer.sparse_prefill 2>&1 \
          | tee -a "$OUT/fi_bench_sparse.log" | grep -v "^-"
      done ;;
    tune)
      # FI_TUNE_OPS: the ops to tune (default both; "indexer_topk" alone fits one call
      # with other steps)
      stage "flashinfer: kreg tune, a small grid of both ops, FlashInfer among the candidates"
      case " ${FI_TUNE_OPS:-sparse_prefill indexer_topk} " in *" sparse_prefill "*)
      timeout 120 python3 -m cli tune sparse_prefill $FG --warmup 3 --iters 10 \
        > "$OUT/fi_tune_sparse.log" 2>&1
      echo "rc=$?"; grep -E "^(prefill|chunk)|flashinfer" "$OUT/fi_tune_sparse.log" | cut -c1-200
      timeout 90 python3 benchmarks/bench_regret.py sparse_prefill $FG --top 3 --warmup 3 \
        --iters 15 > "$OUT/fi_regret_sparse.log" 2>&1
      echo "regret rc=$?"; tail -10 "$OUT/fi_regret_sparse.log" ;; esac
      case " ${FI_TUNE_OPS:-sparse_prefill indexer_topk} " in *" indexer_topk "*)
      timeout 240 python3 -m cli tune indexer_topk $FI --warmup 3 --iters 15 \
        > "$OUT/fi_tune_indexer.log" 2>&1
      echo "rc=$?"; grep -E "^[0-9]|flashinfer" "$OUT/fi_tune_indexer.log" | cut -c1-200
      timeout 90 python3 benchmarks/bench_regret.py indexer_topk $FI --warmup 3 --iters 20 \
        > "$OUT/fi_regret_indexer.log" 2>&1
      echo "regret rc=$?"; tail -12 "$OUT/fi_regret_indexer.log" ;; esac ;;
  esac
}
GRID="--grid kind=prefill,chunk --grid group_size=6,12 --grid kv_len=8192,32768,131072"
GRID="$GRID --grid total_q=32,64,128,256,512,1024,2048,4096,8192 --grid space=tiny"
IGRID="--grid rows=${IROWS:-1,64,1024,4096} --grid keys=131072"  # IROWS=1024: one row count a call
stage "environment"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
for step in "$@"; do
  case "$step" in
    tests)
      stage "gpu tests"
      timeout 330 python3 -m pytest -q -p no:cacheprovider -m gpu tests > "$OUT/gpu_tests.log" 2>&1
      echo "pytest rc=$?"; tail -4 "$OUT/gpu_tests.log"
      timeout 200 python3 -m pytest -q -p no:cacheprovider tests/unit/test_torch_ops.py \
        >> "$OUT/gpu_tests.log" 2>&1
      echo "torch.compile tests rc=$?"; tail -2 "$OUT/gpu_tests.log" ;;
    hit-paths)
      stage "hit paths"
      timeout 60 python3 benchmarks/bench_select.py 2>&1 | tee "$OUT/bench_select.log" ;;
    hit-paths-ab)
      # bench_select on an older tree (.dev-base: its own kreg wheel in .dev-base/kwhl, carried)
      # and on this one, alternating twice: the before/after of a hot-path change.
      stage "hit paths, before/after"
      python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site_base .whl/pydantic*.whl .whl/annotated*.whl .whl/typing*.whl \
        .dev-base/kwhl/*.whl
      for round in 1 2; do
        (cd .dev-base && PYTHONPATH=/tmp/site_base:$PWD timeout 60 python3 benchmarks/bench_select.py) \
          2>&1 | sed "s/^/before $round: /" | tee -a "$OUT/bench_select_ab.log"
        timeout 60 python3 benchmarks/bench_select.py 2>&1 | sed "s/^/after $round:  /" \
          | tee -a "$OUT/bench_select_ab.log"
      done ;;
    contracts)
      # issue #29: the contracts' GPU tests, then what batch invariance costs sparse_prefill
      # across the total_q sweep (auto against auto+batch_invariant, one window per case).
      stage "contracts: gpu tests"
      timeout 240 python3 -m pytest -q -p no:cacheprovider -m gpu tests/kernels/test_guarantees.py \
        > "$OUT/contracts_tests.log" 2>&1
      echo "pytest rc=$?"; tail -3 "$OUT/contracts_tests.log"
      for kind in prefill chunk; do
        stage "batch-invariance cost: $kind"
        timeout 200 python3 cli.py bench sparse_prefill --kind $kind --group-size 6,12 \
          --kv-len 8192,32768 --total-q 64,512,2048,8192 --graphs --warmup 3 --iters 15 \
          --providers auto,auto+batch_invariant --baseline auto 2>/dev/null \
          | tee -a "$OUT/batch_invariance.log" | grep -v "^-"
      done ;;
    dists-indexer)
      # issue #25: every distribution through the product command, graph replays.
      # DIST_PROVIDERS: e.g. torch-topk,auto,flashinfer-topk (FlashInfer's raw kernel; its
      # modules restored as in the flashinfer steps)
      stage "indexer_topk distributions"
      case "${DIST_PROVIDERS:-}" in *flashinfer*) fi_restore ;; esac
      timeout ${DIST_TIMEOUT:-300} python3 cli.py bench indexer_topk \
        --rows ${DIST_ROWS:-64,1024,4096} --keys 131072 \
        --dist ${DISTS:-randn,ties,zeros,recent,lowbits,relu,quant256,fp8,ramp} \
        --providers ${DIST_PROVIDERS:-torch-topk,auto} --graphs --warmup 3 --iters 20 \
        2>"$OUT/dists_indexer.err" | tee "$OUT/dists_indexer.log" | grep -v "^-"
      tail -3 "$OUT/dists_indexer.err" ;;
    sanitize)
      # compute-sanitizer memcheck on the indexer's tiers (every distribution, the default
      # config's paths) and on the sparse_prefill kernels (every family, DENSE, UNION, Gluon)
      stage "compute-sanitizer: indexer_topk"
      D=randn,ties,zeros,recent,lowbits,relu,relu10,quant256,fp8,ramp
      timeout 60 python3 benchmarks/probes/sanitize_topk.py $D > /dev/null 2>&1  # compile
      timeout 200 compute-sanitizer --tool memcheck --error-exitcode 3 \
        python3 benchmarks/probes/sanitize_topk.py $D > "$OUT/sanitizer_topk.log" 2>&1
      echo "compute-sanitizer rc=$?"; grep -c exact "$OUT/sanitizer_topk.log"; tail -3 "$OUT/sanitizer_topk.log"
      stage "compute-sanitizer: sparse_prefill"
      timeout 90 python3 benchmarks/probes/sanitize_sparse.py  # compiles outside the sanitizer
      timeout 240 compute-sanitizer --tool memcheck --error-exitcode 3 \
        python3 benchmarks/probes/sanitize_sparse.py > "$OUT/sanitizer_sparse.log" 2>&1
      echo "compute-sanitizer rc=$?"; tail -3 "$OUT/sanitizer_sparse.log" ;;
    cluster)
      # the cluster kernel (nvidia_hopper.indexer_topk_cluster) after a change: its GPU tests
      # (every dtype), memcheck over seven distributions in three dtypes, the A/B against the
      # patches in CLUSTER_PATCHES (space-separated; each turns the source into an older kernel,
      # e.g. `git diff -U8 -R OLD -- backends/indexer_topk/cuda/cluster_topk.cu`) in fp32 and
      # bf16, then docs/BENCHMARKS.md's table ("the cluster kernel at 1-64 rows"). About four
      # minutes; each part stops at the first failure before it.
      stage "cluster: GPU tests"
      timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu \
        tests/kernels/test_indexer_topk_cluster.py > "$OUT/cluster_tests.log" 2>&1
      rc=$?; echo "cluster gpu tests rc=$rc"; tail -1 "$OUT/cluster_tests.log"
      [ $rc = 0 ] || { grep -E "^E |FAILED" "$OUT/cluster_tests.log" | head -12; continue; }
      stage "cluster: compute-sanitizer memcheck"
      timeout 120 compute-sanitizer --tool memcheck --error-exitcode 9 python3 \
        benchmarks/probes/sanitize_cluster.py randn,lowbits,zeros,ties,recent,relu,ramp \
        > "$OUT/cluster_memcheck.log" 2>&1
      echo "memcheck rc=$? ($(grep -c exact "$OUT/cluster_memcheck.log") of 22 exact)"
      tail -1 "$OUT/cluster_memcheck.log"
      if [ -n "${CLUSTER_PATCHES:-}" ]; then
        pa=""; for f in $CLUSTER_PATCHES; do pa="$pa --patch $f"; done
        for dt in float32 bfloat16; do
          stage "cluster: A/B against$pa ($dt)"
          timeout 200 python3 benchmarks/probes/cluster_ab.py $pa --dtype $dt \
            --rows 1,16,32,64 --iters 12 > "$OUT/cluster_ab_$dt.log" 2>&1
          grep -A30 "^| dist" "$OUT/cluster_ab_$dt.log"; grep -E "MISMATCH" "$OUT/cluster_ab_$dt.log"
        done
      fi
      stage "cluster: kreg bench (docs/BENCHMARKS.md)"
      timeout 300 python3 cli.py bench indexer_topk --rows 1,2,4,8,16,32,64 --keys 131072 \
        --dist randn,ties,zeros,recent,lowbits,relu,ramp --providers \
        torch-topk,triton,auto,nvidia_hopper.indexer_topk_cluster:measure --baseline triton \
        --graphs --warmup 3 --iters 15 2>&1 | tee "$OUT/cluster_bench.log" | grep -v "^-" | tail -3 ;;
    stream)
      # the streaming kernel (nvidia_hopper.indexer_topk_stream): its GPU tests, the A/B against
      # the Triton kernels and the compile-time variants in STREAM_VARIANTS (space-separated
      # NAME=-DX=1,-DY=2) at STREAM_ROWS (fp32, every distribution; bf16 on three), then memcheck
      # (unless SKIP_MEMCHECK is set). The A/B times every geometry (w0 / w1 / w2 / w4) unless
      # STREAM_GEOM is set, empty (STREAM_GEOM= drops those columns).
      stage "stream: GPU tests"
      timeout ${STREAM_TEST_TIMEOUT:-300} python3 -m pytest -q -p no:cacheprovider -m gpu -x \
        tests/kernels/test_indexer_topk_stream.py > "$OUT/stream_tests.log" 2>&1
      rc=$?; echo "stream gpu tests rc=$rc"; tail -1 "$OUT/stream_tests.log"
      [ $rc = 0 ] || { grep -E "^E |FAILED|Error" "$OUT/stream_tests.log" | head -20; continue; }
      va=""; for v in ${STREAM_VARIANTS:-}; do va="$va --variant $v"; done
      stage "stream: A/B fp32"
      timeout ${STREAM_AB_TIMEOUT:-280} python3 benchmarks/probes/stream_ab.py $va ${STREAM_GEOM---geometries} --rows ${STREAM_ROWS:-32,64,1024,4096} \
        --dists ${STREAM_DISTS:-randn,ties,zeros,recent,lowbits,relu,ramp} --iters 12 \
        ${STREAM_CLUSTER:+--cluster} > "$OUT/stream_ab_fp32.log" 2>&1
      echo "rc=$?"; grep -A60 "^| dist" "$OUT/stream_ab_fp32.log"; grep MISMATCH "$OUT/stream_ab_fp32.log"
      [ -n "${SKIP_BF16:-}" ] || stage "stream: A/B bf16"
      [ -n "${SKIP_BF16:-}" ] || timeout 150 python3 benchmarks/probes/stream_ab.py $va --dtype bfloat16 \
        --rows ${STREAM_BF16_ROWS:-${STREAM_ROWS:-32,64,1024,4096}} --dists randn,ties,recent --iters 12 \
        > "$OUT/stream_ab_bf16.log" 2>&1
      [ -n "${SKIP_BF16:-}" ] || { echo "rc=$?"; grep -A30 "^| dist" "$OUT/stream_ab_bf16.log"; grep MISMATCH "$OUT/stream_ab_bf16.log"; }
      if [ -z "${SKIP_MEMCHECK:-}" ]; then
        stage "stream: compute-sanitizer memcheck"
        timeout 150 compute-sanitizer --tool memcheck --error-exitcode 9 python3 \
          benchmarks/probes/sanitize_stream.py randn,ties,zeros,recent,lowbits,relu,ramp \
          > "$OUT/stream_memcheck.log" 2>&1
        echo "memcheck rc=$? ($(grep -c exact "$OUT/stream_memcheck.log") of 25 exact)"
        tail -1 "$OUT/stream_memcheck.log"
      fi ;;
    stream-bench)
      # docs/BENCHMARKS.md's table of the streaming kernel: kreg bench of every distribution at
      # STREAM_ROWS (default 32,64,1024,4096) in fp32, then bf16 at STREAM_BF16_ROWS (default
      # 64,1024,4096) (auto = the
      # policy's choice, triton = the Triton kernels at their default config)
      # the streaming kernel by its name too (auto takes it only where the policy does), and
      # FlashInfer's raw top-k (flashinfer-topk: what a framework calls instead of kreg; kreg's
      # exact wrapper flashinfer.indexer_topk adds a key transform and a sort) when STREAM_FI is
      # set (its JIT build is cached in .fi-ws: carry it)
      sb_providers="torch-topk,triton,nvidia_hopper.indexer_topk_stream:measure,auto"
      [ -z "${STREAM_FI:-}" ] || { fi_restore; sb_providers="$sb_providers,flashinfer-topk"; }
      stage "stream-bench: fp32"
      timeout ${SB_FP32_TIMEOUT:-330} python3 cli.py bench indexer_topk --rows ${STREAM_ROWS:-32,64,1024,4096} \
        --keys 131072 --dist randn,ties,zeros,recent,lowbits,relu,ramp \
        --providers $sb_providers --baseline triton --graphs --warmup 3 --iters 15 \
        2>&1 | tee "$OUT/stream_bench_fp32.log" | grep -v "^-" | tail -40
      stage "stream-bench: bf16"
      timeout ${SB_BF16_TIMEOUT:-200} python3 cli.py bench indexer_topk --rows ${STREAM_BF16_ROWS:-64,1024,4096} --keys 131072 \
        --dtype bfloat16 --dist randn,ties,recent,relu --providers $sb_providers \
        --baseline triton --graphs --warmup 3 --iters 15 2>&1 | tee "$OUT/stream_bench_bf16.log" \
        | grep -v "^-" | tail -20 ;;
    gpu26)
      # issue 26 after a policy change: the union path's GPU tests through dispatch and of the
      # CUDA pre-pass (GPU26_K narrows them), the dispatch GPU tests, then compute-sanitizer
      # memcheck of the sparse_prefill kernels (the policy's union configs included)
      union_gpu_tests gpu26 "${GPU26_TIMEOUT:-240}" "${GPU26_K:-through_dispatch or cuda_pre_pass}"
      stage "gpu26: dispatch GPU tests"
      timeout 150 python3 -m pytest -q -p no:cacheprovider -m gpu tests/gpu/test_dispatch_gpu.py \
        > "$OUT/gpu26_dispatch.log" 2>&1
      echo "dispatch gpu tests rc=$?"; tail -1 "$OUT/gpu26_dispatch.log"
      grep -E "^E |FAILED" "$OUT/gpu26_dispatch.log" | head -10
      [ -n "${GPU26_SANITIZE:-}" ] || continue
      stage "gpu26: compute-sanitizer sparse_prefill"
      timeout 120 python3 benchmarks/probes/sanitize_sparse.py > "$OUT/sanitize_warm.log" 2>&1
      echo "uninstrumented rc=$?"; tail -1 "$OUT/sanitize_warm.log"
      timeout 240 compute-sanitizer --tool memcheck --error-exitcode 3 \
        python3 benchmarks/probes/sanitize_sparse.py > "$OUT/sanitizer_sparse.log" 2>&1
      echo "compute-sanitizer rc=$?"; tail -3 "$OUT/sanitizer_sparse.log" ;;
    union-prep)
      # issue 26: the union pre-pass in one CUDA kernel (UNION_PREP="cuda", `:uc`): its GPU tests
      # unless UP_SKIP_TESTS is set (output by output against the Triton pre-pass; through dispatch at the seed's shapes),
      # then union_phases (per-kernel GPU us and one window of graph replays) of the union tiles
      # with each pre-pass beside h200, at KV 8K (UP_KV), group 6, the kinds in UP_KINDS (default
      # "prefill chunk") and both index sets (each run at most UP_TIMEOUT seconds, default 150)
      [ -n "${UP_SKIP_TESTS:-}" ] || union_gpu_tests union_prep "${UP_TEST_TIMEOUT:-240}" \
        "cuda_pre_pass or (through_dispatch and cuda)"
      for kind in ${UP_KINDS:-prefill chunk}; do
        F=8x16x1x2:rev:split2:v2:lean:o32; [ $kind = chunk ] && F=$F:pre
        U=geometry=$F:union300:dt128x64x8x2
        # prefill: also the family's dense tiles with union tiles at their own geometry
        # (UNION_TILE) and the CUDA pre-pass, the candidate for the walk's 2%
        DU=""; [ $kind = prefill ] && DU=",geometry=$F:dense250:union300:ut128x64x8x2:uc"
        for ix in topk walk; do
          stage "union-prep: $kind g6 KV ${UP_KV:-8192} $ix"
          timeout ${UP_TIMEOUT:-150} python3 benchmarks/probes/union_phases.py --kind $kind --group-size 6 \
            --kv-len ${UP_KV:-8192} --indices $ix --configs "h200,$U,$U:uc$DU" \
            > "$OUT/union_prep_${kind}_$ix.log" 2>&1
          echo "rc=$?"; grep -v "^#" "$OUT/union_prep_${kind}_$ix.log" | tail -25
        done
      done ;;
    union-dense)
      # issue 26: UNION_DENSE (the union pre-pass first, DENSE's tiles to the union path where
      # their union is at most N% of their span) on the H200 family's prefill g6 config (dense +
      # union tiles, the CUDA pre-pass) at UD_KV (default 8192 4096), both index sets, against
      # h200 (the policy) and the union tiles alone; then h200 against h200@old on the walk at
      # KV 8192 (UD_OLD, default .device/old: the previous tile_kernels.py, without the dense
      # kernel's early return)
      F=8x16x1x2:rev:split2:v2:lean:o32
      DU=geometry=$F:uc:dense250:union300:ut128x64x8x2
      old=${UD_OLD:-.device/old}
      if [ -f "$old/tile_kernels.py" ]; then
        stage "union-dense: h200 against h200@old, prefill g6 KV 8192 walk"
        timeout 90 python3 benchmarks/probes/union_phases.py --kind prefill --group-size 6 \
          --kv-len 8192 --indices walk --old "$old/tile_kernels.py" --configs h200 \
          > "$OUT/union_dense_old_walk.log" 2>&1
        echo "rc=$?"; grep -v "^#" "$OUT/union_dense_old_walk.log" | grep -v "max err" | tail -16
      fi
      for kv in ${UD_KV:-8192 4096}; do
        for ix in topk walk; do
          stage "union-dense: prefill g6 KV $kv $ix"
          timeout ${UD_TIMEOUT:-110} python3 benchmarks/probes/union_phases.py --kind prefill \
            --group-size 6 --kv-len $kv --indices $ix \
            --configs "h200,$DU:ud${UD_A:-60},$DU:ud${UD_B:-80},$DU:ud${UD_C:-100},geometry=$F:union300:dt128x64x8x2:uc" \
            > "$OUT/union_dense_${kv}_$ix.log" 2>&1
          echo "rc=$?"; grep -v "^#" "$OUT/union_dense_${kv}_$ix.log" | grep -v "max err" | tail -40
        done
      done ;;
    union-ws)
      # issue 26: UNION_ENGINE="gluon_ws*", the warp-specialized Gluon
      # union kernel (session 47, not yet run on a GPU): its GPU tests unless UWS_SKIP_TESTS is
      # set, then union_phases at group 6, KV 8192, the kinds in UWS_KINDS (default prefill
      # chunk), both index sets: h200 against the same config (the policy's) with its union
      # tiles on gluon_ws (:uws), gluon_ws_overlap (:uwso) and gluon_ws_2wg (:uws2); then ncu
      # of _union_ws (in order)
      # on top-k rows unless UWS_SKIP_NCU is set
      [ -n "${UWS_SKIP_TESTS:-}" ] || union_gpu_tests union_ws "${UWS_TEST_TIMEOUT:-240}" "union_ws"
      F=8x16x1x2:rev:split2:v2:lean:o32
      PF=geometry=$F:uc:dense250:union300:ut128x64x8x2:ud60
      for kind in ${UWS_KINDS:-prefill chunk}; do
        P=$PF; [ $kind = chunk ] && P=geometry=$F:pre:union300:dt128x64x8x2:uc
        for ix in topk walk; do
          stage "union-ws: $kind g6 KV 8192 $ix"
          timeout ${UWS_TIMEOUT:-100} python3 benchmarks/probes/union_phases.py --kind $kind \
            --group-size 6 --kv-len 8192 --indices $ix --iters 3 --configs "h200,$P:uws,$P:uwso,$P:uws2" \
            > "$OUT/union_ws_${kind}_$ix.log" 2>&1
          echo "rc=$?"; grep -v "^#" "$OUT/union_ws_${kind}_$ix.log" | grep -v "max err" | tail -16
        done
      done
      [ -n "${UWS_SKIP_NCU:-}" ] || ncu_kernel "_union_ws|topk|python3 benchmarks/probes/union_phases.py --kind prefill --group-size 6 --kv-len 8192 --indices topk --iters 1 --configs $PF:uws" ;;
    prep-stats)
      # issue 26: the CUDA pre-pass taking its tiles' statistics from their ids (no _row_stats
      # launch without DENSE tiles) against the same tree's kernels with the statistics given:
      # the pre-pass's GPU tests, then union_phases of the union tiles (128x64x8x2, :uc) at
      # group 6, KV 8K, both kinds and index sets, each run again as NAME@old on PS_OLD (default
      # .device/old: copies of the previous commit's triton_kernels.py and tile_kernels.py,
      # .device carried)
      [ -n "${PS_SKIP_TESTS:-}" ] || union_gpu_tests prep_stats 240 "cuda_pre_pass"
      old=${PS_OLD:-.device/old}
      for kind in ${PS_KINDS:-prefill chunk}; do
        F=8x16x1x2:rev:split2:v2:lean:o32; [ $kind = chunk ] && F=$F:pre
        for ix in topk walk; do
          stage "prep-stats: $kind g6 KV 8192 $ix"
          timeout ${PS_TIMEOUT:-90} python3 benchmarks/probes/union_phases.py --kind $kind \
            --group-size 6 --kv-len 8192 --indices $ix \
            --configs "geometry=$F:union300:dt128x64x8x2:uc" \
            --old "$old/triton_kernels.py,$old/tile_kernels.py" \
            > "$OUT/prep_stats_${kind}_$ix.log" 2>&1
          echo "rc=$?"; grep -v "^#" "$OUT/prep_stats_${kind}_$ix.log" | grep -v "max err" | tail -14
        done
      done ;;
    union-stages)
      # issue 26: the union kernel's pipeline depth. At 2 stages its gathers' slots are a
      # global load in the loop that the K/V addresses wait on (ncu-union: 12% of the stall
      # samples, besides 17% at the loop head's wait for the K/V copies); at 3+ stages Triton
      # stages the slots through shared memory a step ahead at the same K/V buffers (201 KB at
      # 128x64, cross-compiled). The CUDA pre-pass's GPU tests unless US_SKIP_TESTS is set, then
      # union_phases at group 6, KV 8K, the kinds in US_KINDS (default prefill chunk), both index
      # sets: h200, the union tiles at 128x64 with 2 and 3 stages and at 128x32 with 4 (CUDA
      # pre-pass), and 128x64x3 with the Triton pre-pass (chunk g6's policy takes that one at 2);
      # then ncu of `_union_fwd` at 3 stages on top-k rows
      [ -n "${US_SKIP_TESTS:-}" ] || union_gpu_tests union_stages 200 "cuda_pre_pass and 16"
      for kind in ${US_KINDS:-prefill chunk}; do
        F=8x16x1x2:rev:split2:v2:lean:o32; [ $kind = chunk ] && F=$F:pre
        U=geometry=$F:union300
        for ix in ${US_INDICES:-topk walk}; do
          stage "union-stages: $kind g6 KV 8192 $ix"
          timeout ${US_TIMEOUT:-150} python3 benchmarks/probes/union_phases.py --kind $kind \
            --group-size 6 --kv-len 8192 --indices $ix \
            --configs "h200,$U:dt128x64x8x2:uc,$U:dt128x64x8x3:uc,$U:dt128x32x8x4:uc,$U:dt128x64x8x3" \
            > "$OUT/union_stages_${kind}_$ix.log" 2>&1
          echo "rc=$?"; grep -v "^#" "$OUT/union_stages_${kind}_$ix.log" | grep -v "max err" | tail -26
        done
      done
      [ -n "${US_SKIP_NCU:-}" ] || ncu_kernel "_union_fwd|topk3|python3 benchmarks/probes/union_phases.py --kind prefill --group-size 6 --kv-len 8192 --indices topk --iters 1 --configs geometry=8x16x1x2:rev:split2:v2:lean:o32:union300:dt128x64x8x3:uc" ;;
    exact-heads)
      # issue 26: union tiles of the group's heads exactly (TILE_HEADS="group", `:xh`: group 6
      # is 21 rows in 126 of 128 lines, not 16 in 128): the GPU tests of the exact-head tiles
      # unless XH_SKIP_TESTS is set (through dispatch, both pre-passes; the CUDA pre-pass at
      # RP 21 against the Triton one), then union_phases at KV 8K (XH_KV), group 6, the kinds
      # in XH_KINDS (default prefill), both index sets: h200, the union tiles with the CUDA
      # pre-pass at 16 and at 21 rows (a line's counts by the one-hot MMAs), and dense + union
      # (UNION_TILE) at both (session 43: the 21-row tiles lost, 1.2-1.6x; see the notes)
      [ -n "${XH_SKIP_TESTS:-}" ] || union_gpu_tests exact_heads "${XH_TEST_TIMEOUT:-240}" \
        "(through_dispatch and group) or (cuda_pre_pass and 21)"
      for kind in ${XH_KINDS:-prefill}; do
        F=8x16x1x2:rev:split2:v2:lean:o32; [ $kind = chunk ] && F=$F:pre
        U=geometry=$F:union300:dt128x64x8x2:uc
        DU=""; [ $kind = prefill ] && DU=",geometry=$F:dense250:union300:ut128x64x8x2:uc"
        DUX=""; [ -n "$DU" ] && DUX="$DU:xh"
        for ix in ${XH_INDICES:-topk walk}; do
          stage "exact-heads: $kind g6 KV ${XH_KV:-8192} $ix"
          timeout ${XH_TIMEOUT:-150} python3 benchmarks/probes/union_phases.py --kind $kind \
            --group-size 6 --kv-len ${XH_KV:-8192} --indices $ix \
            --configs "h200,$U,$U:xh$DU$DUX" > "$OUT/exact_heads_${kind}_$ix.log" 2>&1
          echo "rc=$?"; grep -v "^#" "$OUT/exact_heads_${kind}_$ix.log" | tail -25
        done
      done ;;
    fi-build)
      # FlashInfer's top-k JIT build (fp32 and bf16 keys) in the background while later steps
      # run; fi-wait waits for it and packs the built modules into $OUT/fiws.tgz (carry them back
      # as .fi-ws/fiws.tgz). For correctness steps beside it: its compiles load the CPU.
      stage "fi-build: FlashInfer's top-k JIT build in the background"
      fi_restore
      ( timeout 540 python3 -c "
import torch, plugins.flashinfer as p
for dt in (torch.float32, torch.bfloat16):
    s = torch.randn(4, 131072, device='cuda').to(dt)
    ln = torch.full((4,), 131072, dtype=torch.int32, device='cuda')
    print(dt, p.indexer_topk(s, ln, 2048)[0, :4].tolist(), flush=True)
" > "$OUT/fi_build.log" 2>&1; echo "fi-build rc=$?" >> "$OUT/fi_build.log"
        # and FlashInfer's paged attention at the sparse_prefill seed's shapes (flashinfer-paged)
        timeout 300 python3 cli.py bench sparse_prefill --kind prefill --group-size 6,12 \
          --kv-len 8192 --total-q 256 --providers flashinfer-paged --baseline flashinfer-paged \
          --warmup 1 --iters 2 >> "$OUT/fi_build.log" 2>&1
        echo "fi-build paged rc=$?" >> "$OUT/fi_build.log" ) &
      FI_PID=$! ;;
    fi-wait)
      stage "fi-wait"
      [ -n "${FI_PID:-}" ] && wait "$FI_PID"; tail -3 "$OUT/fi_build.log"
      find .fi-ws -name '*.so' | tar czf "$OUT/fiws.tgz" -T - ; ls -la "$OUT/fiws.tgz" ;;
    flashinfer)
      flashinfer_part kit; flashinfer_part bench; flashinfer_part tune ;;
    flashinfer-kit|flashinfer-bench|flashinfer-tune)
      flashinfer_part "${step#flashinfer-}" ;;
    tune-sparse)
      stage "tune sparse_prefill"
      timeout 330 python3 -m cli tune sparse_prefill $GRID --warmup 3 --iters 10 \
        ${PLOT:+--plot "$OUT/tune_sparse_prefill.png"} > "$OUT/tune_sparse_prefill.log" 2>&1
      echo "rc=$?"; tail -5 "$OUT/tune_sparse_prefill.log" ;;
    regret-sparse)
      stage "regret sparse_prefill"
      timeout 240 python3 benchmarks/bench_regret.py sparse_prefill $GRID --top 3 --warmup 3 \
        --iters 15 > "$OUT/regret_sparse_prefill.log" 2>&1
      echo "rc=$?"; tail -8 "$OUT/regret_sparse_prefill.log" ;;
    tune-indexer)
      # Every candidate compiled first, 16 processes at once (the tuner compiles one after
      # another: about 40 configs at this grid did not fit a call, session 17), then the tune
      # (7 distributions a point), its entries exported to $OUT/indexer_table.json.
      stage "precompile the indexer_topk tuner's candidates"
      timeout ${PRECOMPILE_TIMEOUT:-240} python3 benchmarks/probes/precompile_topk.py \
        --rows 1,64,1024,4096 --keys 131072 --workers 16 > "$OUT/precompile_indexer.log" 2>&1
      echo "rc=$?"; tail -2 "$OUT/precompile_indexer.log"
      stage "tune indexer_topk"
      timeout ${TUNE_TIMEOUT:-300} python3 -m cli tune indexer_topk $IGRID --warmup 3 --iters 15 \
        > "$OUT/tune_indexer_topk.log" 2>&1
      echo "rc=$?"; tail -30 "$OUT/tune_indexer_topk.log"
      python3 -m cli tuning export --op indexer_topk "$OUT/indexer_table.json" ;;
    regret-indexer)
      stage "regret indexer_topk"
      timeout 100 python3 benchmarks/bench_regret.py indexer_topk $IGRID --warmup 3 --iters 20 \
        > "$OUT/regret_indexer_topk.log" 2>&1
      echo "rc=$?"; tail -8 "$OUT/regret_indexer_topk.log" ;;
    profile-indexer)
      stage "profile indexer_topk"
      timeout 120 python3 benchmarks/probes/profile_indexer.py --rows 1,64,1024,4096 --phases \
        2>&1 | grep -v -i warn | tee "$OUT/profile_indexer.log" ;;
    ncu-indexer)
      stage "ncu indexer_topk row kernel (1024 rows)"
      timeout 240 ncu --clock-control none -k regex:_row_kernel --set full -c 1 \
        python3 benchmarks/probes/profile_indexer.py --rows 1024 --iters 1 > "$OUT/ncu_row_kernel.log" 2>&1
      echo "rc=$?"; grep -E "Duration|Registers|Achieved Occupancy|Warp Cycles Per Issued|Stall" \
        "$OUT/ncu_row_kernel.log" | head -20 ;;
    slices-indexer)
      # The gmax slices a row when rows < SMs (kreg tune: 8 a row at 64 rows beat the default
      # 5 by 7%) and at 4096 rows (2 beat 1 by 3%): the data for default_config's rule.
      stage "indexer_topk gmax slices a row"
      S="torch-topk,triton"
      for sk in 8192 16384 32768 65536; do S="$S,geometry=SLICE_KEYS=$sk"; done
      timeout 150 python3 cli.py bench indexer_topk --rows 32,64,128,256,4096 \
        --keys 131072 --graphs --warmup 5 --iters 30 --providers "$S" 2>/dev/null \
        | tee "$OUT/slices_indexer.log" | grep -v "^-" ;;
    tests-indexer)
      stage "gpu tests: indexer_topk kernels and graphs"
      timeout ${TESTS_TIMEOUT:-450} python3 -m pytest -q -p no:cacheprovider -m gpu \
        tests/kernels/test_indexer_topk_triton.py tests/gpu/test_graphs.py \
        > "$OUT/gpu_tests_indexer.log" 2>&1
      echo "pytest rc=$?"; tail -3 "$OUT/gpu_tests_indexer.log" ;;
    ncu-source)
      # Per-instruction stall samples of the fused row kernel (SASS), 64 and 4096 rows.
      for r in 64 4096; do
        stage "ncu source counters, row kernel, $r rows"
        timeout 150 ncu --clock-control none -k regex:_row_kernel -c 1 -f \
          --section SourceCounters --section WarpStateStats --section Occupancy \
          --section LaunchStats --section SpeedOfLight --section MemoryWorkloadAnalysis \
          -o "/tmp/row$r" python3 benchmarks/probes/profile_indexer.py --rows $r --iters 1 \
          > /dev/null 2>&1
        echo "ncu rc=$?"
        ncu -i "/tmp/row$r.ncu-rep" --page details >> "$OUT/ncu_row_details.log" 2>&1
        ncu -i "/tmp/row$r.ncu-rep" --page source --csv --print-source sass 2>/dev/null \
          | gzip > "$OUT/row${r}_sass.csv.gz"
        grep -E "Duration|Registers Per|Achieved Occupancy|Warp Cycles Per Issued" \
          "$OUT/ncu_row_details.log" | tail -4
      done ;;
    ab-indexer)
      # Variants of the fused path side by side (graph replays); AB_PROVIDERS overrides.
      stage "indexer_topk variants"
      S="torch-topk,triton,geometry=SLICE_KEYS=16384,geometry=SLICE_KEYS=65536"
      timeout 330 python3 cli.py bench indexer_topk --rows ${AB_ROWS:-64,1024,4096} \
        --keys 131072 --graphs --warmup 5 --iters 30 --providers "${AB_PROVIDERS:-$S}" \
        2>/dev/null | tee "$OUT/ab_indexer.log" | grep -v "^-" ;;
    shapes-indexer)
      # The other shapes of docs/BENCHMARKS.md: 8K and 512K keys, and a causal batch.
      stage "indexer_topk other shapes"
      W=${SHAPES_PROVIDERS:-torch-topk,torch-topk-unsorted,triton}
      timeout 150 python3 cli.py bench indexer_topk --rows 1,64 --keys 8192,524288 \
        --graphs --providers "$W" 2>/dev/null | tee "$OUT/shapes_indexer.log" | grep -v "^-"
      timeout 100 python3 cli.py bench indexer_topk --rows 1024 --keys 131072 --ragged \
        --graphs --providers "$W" 2>/dev/null | tee -a "$OUT/shapes_indexer.log" | grep -v "^-" ;;
    gmax16-indexer)
      # GMAX_BITS=16 (group maxima as the keys' top 16 bits) against the default, graph
      # replays, and its GPU tests.
      stage "indexer_topk GMAX_BITS=16"
      S="torch-topk,triton,geometry=GMAX_BITS=16"
      timeout 150 python3 cli.py bench indexer_topk --rows 64,1024,4096 --keys 131072 \
        --graphs --warmup 5 --iters 30 --providers "$S" 2>/dev/null \
        | tee "$OUT/gmax16_indexer.log" | grep -v "^-"
      timeout 100 python3 cli.py bench indexer_topk --rows 1024 --keys 131072 --ragged \
        --graphs --providers "$S" 2>/dev/null | tee -a "$OUT/gmax16_indexer.log" | grep -v "^-"
      timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu \
        tests/kernels/test_indexer_topk_triton.py -k "k2048" 2>&1 | tail -2 ;;
    ab-sparse)
      # sparse_prefill: the gathered K/V double-buffered in 16-key tiles (num_stages 5: two
      # buffers; 7: three) against the family's single-buffered 32-key tiles, at the same
      # shared memory (8x16x4x5 and 8x32x4x2 both 37,504 B, 96 registers, cross-compiled with
      # Triton 3.6): each program then overlaps its next gather with its compute without
      # losing resident programs (v5's deeper 32-key variants halved them).
      G6="table,h200,geometry=8x16x4x5:rev:split2:r96,geometry=8x16x4x5:rev:split2"
      G6="$G6,geometry=8x16x4x7:rev:split2:r96,geometry=8x16x2x5:rev:split2"
      G12="table,h200,geometry=16x16x2x5:rev:split2,geometry=16x16x2x5:rev:split2:r128"
      G12="$G12,geometry=16x16x1x5:rev:split2,geometry=16x16x4x5:rev:split2:r96"
      ab_cells ab_sparse "$G6" "$G12" 's/:rev/:pre:rev/g' 's/:rev/:pre:rev/g' ;;
    stage-sparse)
      # chunk: CHUNK_MODE=staged (each program translates its own row into a scratch before its
      # loop) against pretranslate (a separate kernel) at the family geometries; the
      # pretranslate kernel timed alone; the sparse_prefill GPU tests (staged included).
      stage "sparse_prefill chunk: staged against pretranslate"
      timeout 60 python3 benchmarks/probes/time_chunk_translate.py 2>&1 | tee -a "$OUT/stage_sparse.log"
      S6="table,h200,geometry=8x32x4x2:stage:rev:split2:r96"
      S12="table,h200,geometry=16x16x1x2:stage:rev:split2"
      timeout 120 python3 cli.py bench sparse_prefill --kind chunk --group-size 6 \
        --kv-len 8192 --total-q 8192 --graphs --providers "$S6" 2>/dev/null \
        | tee -a "$OUT/stage_sparse.log" | grep -v "^-"
      timeout 200 python3 cli.py bench sparse_prefill --kind chunk --group-size 12 \
        --kv-len 8192,32768,131072 --total-q 8192 --graphs --providers "$S12" 2>/dev/null \
        | tee -a "$OUT/stage_sparse.log" | grep -v "^-"
      timeout 120 python3 cli.py bench sparse_prefill --kind chunk --group-size 6,12 \
        --kv-len 8192 --req-lens $(python3 -c "print(','.join(['512'] * 16))") --graphs \
        --providers "table,h200,geometry=8x32x4x2:stage:rev:split2:r96,geometry=16x16x1x2:stage:rev:split2" \
        2>/dev/null | tee -a "$OUT/stage_sparse.log" | grep -v "^-"
      sparse_gpu_tests stage_sparse_tests ;;
    lean-sparse)
      # LEAN (then with int32 row offsets, K of invalid entries read unmasked from slot 0) and
      # SPLIT_V=2 (V gathered in the K halves' layout: one offset per row for K and V) against
      # the family, all four cells; then the sparse GPU tests with them as extra geometries.
      L6="table,h200,geometry=8x32x4x2:rev:split2:v2:lean,geometry=8x32x4x2:rev:split2:lean:r96"
      L6="$L6,geometry=8x32x4x2:rev:split2:v2:r96,geometry=8x32x4x2:rev:split2:v2:lean:r80"
      L6="$L6,geometry=16x32x4x2:rev:split2:v2:lean,geometry=16x32x4x2:rev:split2:v2:lean:r96"
      L12="table,h200,geometry=16x16x1x2:rev:split2:lean,geometry=16x16x1x2:rev:split2:v2:lean"
      L12="$L12,geometry=16x32x4x2:rev:split2:v2:lean,geometry=16x32x4x2:rev:split2:v2:lean:r96"
      L12="$L12,geometry=16x16x2x2:rev:split2:v2:lean,geometry=16x16x2x2:rev:split2:v2:lean:r128"
      ab_cells lean_sparse "$L6" "$L12" \
        's/:rev/:stage:rev/g; s/$/,geometry=8x32x4x2:pre:rev:split2:v2:lean/' \
        's/:rev/:pre:rev/g; s/$/,geometry=16x16x1x2:stage:rev:split2:lean/'
      X="8x32x4x2:rev:split2:v2:lean,16x16x1x2:rev:split2:lean,16x16x1x2:rev:split2:v2:lean"
      sparse_gpu_tests lean_sparse_tests "$X,8x32x4x2:stage:rev:split2:v2:lean" ;;
    lean2-sparse)
      # second round: LEAN (unmasked K) and OFFS32 (int32 row offsets) apart, register caps
      # for six (group 6) or nine (group 12) resident programs; all four cells
      M6="table,h200,geometry=8x32x4x2:rev:split2:v2:r96,geometry=8x32x4x2:rev:split2:v2:r80"
      M6="$M6,geometry=8x32x4x2:rev:split2:v2:o32:r80,geometry=8x32x4x2:rev:split2:v2:o32:r96"
      M6="$M6,geometry=8x32x4x2:rev:split2:v2:lean:r96,geometry=8x32x4x2:rev:split2:v2:lean:r80"
      M12="table,h200,geometry=16x16x1x2:rev:split2:v2:lean:o32"
      M12="$M12,geometry=16x16x1x2:rev:split2:v2:lean,geometry=16x16x1x2:rev:split2:v2:o32"
      M12="$M12,geometry=16x16x1x2:rev:split2:v2:lean:o32:r224"
      M12="$M12,geometry=16x16x1x2:rev:split2:v2:lean:o32:r240"
      M12="$M12,geometry=16x16x1x2:rev:split2:lean:o32:r224"
      ab_cells lean2_sparse "$M6" "$M12" 's/:rev/:stage:rev/g' 's/:rev/:pre:rev/g' ;;
    onewarp-sparse)
      # group 6 on one warp (BLOCK_M 8, BLOCK_N 16), against the best
      # four-warp geometry; prefill and chunk (staged)
      W6="table,h200,geometry=8x32x4x2:rev:split2:v2:o32:r80"
      W6="$W6,geometry=8x16x1x2:rev:split2:v2:lean:o32,geometry=8x16x1x2:rev:split2:v2:o32"
      W6="$W6,geometry=8x16x1x2:rev:split2:lean:o32"
      ab_cells onewarp_sparse "$W6" "" 's/:rev/:stage:rev/g; s/:o32:r80/:o32:r96/g' "" ;;
    envelope-sparse)
      # the other chunk shapes nvidia_hopper serves with the family: 2 KV heads, and 16 requests
      # of 512 rows (8192 rows, KV 8K, graph replays; family against the table)
      stage "sparse_prefill chunk: 2 KV heads, 16 requests"
      timeout 150 python3 cli.py bench sparse_prefill --kind chunk --group-size 6,12 \
        --kv-heads 2 --kv-len 8192 --total-q 8192 --graphs --providers table,h200 2>/dev/null \
        | tee -a "$OUT/envelope_sparse.log" | grep -v "^-"
      timeout 150 python3 cli.py bench sparse_prefill --kind chunk --group-size 6,12 \
        --kv-len 8192,131072 --req-lens $(python3 -c "print(','.join(['512'] * 16))") --graphs \
        --providers table,h200 2>/dev/null | tee -a "$OUT/envelope_sparse.log" | grep -v "^-" ;;
    ncu-cuda)
      # Counters and stall samples of the two CUDA kernels whose time is left to explain: the
      # streaming select (fp32 random rows, one launch each at 64 and 1024 rows) and the union
      # pre-pass (prefill g6 KV 8K, top-k rows, union tiles with UNION_PREP="cuda"). Per kernel:
      # the details page's headline lines, the stall reasons, and the SASS with its samples
      # (CSV, gzipped) for the hot loops.
      for spec in "stream_topk_kernel|64|python3 benchmarks/probes/stream_ab.py --rows 64 --dists randn --iters 1" \
                  "stream_topk_kernel|1024|python3 benchmarks/probes/stream_ab.py --rows 1024 --dists randn --iters 1" \
                  "union_prep_kernel|topk|python3 benchmarks/probes/union_phases.py --kind prefill --group-size 6 --kv-len 8192 --indices topk --iters 1 --configs geometry=8x16x1x2:rev:split2:v2:lean:o32:union300:dt128x64x8x2:uc"; do
        ncu_kernel "$spec"
      done ;;
    ncu-union)
      # issue 26: where the union kernel's time goes (78% of the union path on top-k rows):
      # `_union_fwd` of the union tiles (16 rows, CUDA pre-pass), prefill g6 KV 8K, top-k rows
      # and the walk, one launch each under ncu (ncu_kernel)
      for ix in ${NU_INDICES:-topk walk}; do
        ncu_kernel "_union_fwd|$ix|python3 benchmarks/probes/union_phases.py --kind prefill --group-size 6 --kv-len 8192 --indices $ix --iters 1 --configs geometry=8x16x1x2:rev:split2:v2:lean:o32:union300:dt128x64x8x2:uc"
      done ;;
    ncu-sparse)
      # Counters and stall samples of the sparse_prefill kernel: the table geometry and the
      # H200 family, prefill group 6, 8192 rows, KV 8K (the first two launches of the bench).
      stage "ncu sparse_prefill (prefill g6, 8192 rows, KV 8K)"
      timeout 200 ncu --clock-control none -k regex:_sparse_prefill_fwd -c 2 -f \
        --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats \
        --section Occupancy --section LaunchStats --section SchedulerStats \
        --section SourceCounters --section MemoryWorkloadAnalysis_Tables \
        -o /tmp/sparse python3 cli.py bench sparse_prefill --kind prefill \
        --group-size 6 --kv-len 8192 --total-q 8192 --providers table,h200 --iters 1 \
        --warmup 0 > "$OUT/ncu_sparse_run.log" 2>&1
      echo "ncu rc=$?"
      ncu -i /tmp/sparse.ncu-rep --page details > "$OUT/ncu_sparse_details.log" 2>&1
      ncu -i /tmp/sparse.ncu-rep --page source --csv --print-source sass 2>/dev/null \
        | gzip > "$OUT/sparse_sass.csv.gz"
      grep -E "Duration|Registers Per|Achieved Occupancy|Warp Cycles Per Issued|Mem Busy|L1/TEX Hit|Shared" \
        "$OUT/ncu_sparse_details.log" | head -24
      # warp stall reasons (cycles per issued instruction) of both launches
      ncu -i /tmp/sparse.ncu-rep --page raw --csv 2>/dev/null > /tmp/sparse_raw.csv
      python3 -c "
import csv; rows = list(csv.reader(open('/tmp/sparse_raw.csv')))
hdr = rows[0]; data = [r for r in rows[2:] if r]
cols = [i for i, h in enumerate(hdr) if h.startswith('smsp__average_warps_issue_stalled_') and h.endswith('_per_issue_active.ratio')]
out = []
for i in cols:
    vals = [float(r[i].replace(',', '') or 0) for r in data]
    if max(vals) >= 0.05: out.append((max(vals), hdr[i][34:-23], vals))
for _, name, vals in sorted(out, reverse=True): print(f'{name:<28}', ' '.join(f'{v:7.2f}' for v in vals))
" | tee "$OUT/ncu_sparse_stalls.log" ;;
    gluon-sparse)
      if [ -z "${SKIP_TESTS:-}" ]; then
        stage "sparse_prefill ENGINE=gluon: GPU tests"
        timeout 300 python3 -m pytest -q -p no:cacheprovider -m gpu \
          tests/kernels/test_sparse_prefill_gluon.py > "$OUT/gluon_tests.log" 2>&1
        echo "gluon gpu tests rc=$?"; tail -3 "$OUT/gluon_tests.log"
      fi
      SBG="python3 cli.py bench sparse_prefill --kind prefill --graphs --warmup 3 --iters 15"
      GL6="geometry=8x16x2x1:gl:o32"
      stage "prefill group 6: Gluon against the Triton family and the table, total_q sweep"
      timeout 330 $SBG --group-size 6 --kv-len 8192,16384,32768 \
        --total-q 32,64,128,256,512,1024,2048,4096,8192 --providers \
        "table,geometry=8x16x1x2:rev:split2:v2:lean:o32,$GL6,geometry=8x32x2x1:gl:o32" \
        2>/dev/null | tee "$OUT/gluon_sweep.log" | grep -v "^-"
      stage "long KV (slot ordering), and group 12 on the 16-line kernel, 8192 rows"
      timeout 200 $SBG --group-size 6 --kv-len 65536,131072 --total-q 8192 --providers \
        "table,h200,$GL6:ord1" 2>/dev/null | tee -a "$OUT/gluon_sweep.log" | grep -v "^-"
      timeout 200 $SBG --group-size 12 --kv-len 32768 --total-q 8192 --providers \
        "table,h200,geometry=16x16x2x1:gl:o32,geometry=16x16x1x1:gl:o32" 2>/dev/null \
        | tee -a "$OUT/gluon_sweep.log" | grep -v "^-" ;;
    wgmma-sparse)
      # ENGINE=gluon_wgmma (session 12): its GPU tests and the dispatch tests unless SKIP_TESTS
      # is set, then the prefill total_q sweeps at KV 8K-32K against the Triton family, the
      # mma_v2 Gluon kernel (group 6), the table and the h200 policy, graph replays
      if [ -z "${SKIP_TESTS:-}" ]; then
        stage "sparse_prefill Gluon engines and dispatch: GPU tests"
        timeout 300 python3 -m pytest -q -p no:cacheprovider -m gpu \
          tests/kernels/test_sparse_prefill_gluon.py tests/gpu/test_dispatch_gpu.py \
          > "$OUT/wgmma_tests.log" 2>&1
        echo "gluon + dispatch gpu tests rc=$?"; tail -3 "$OUT/wgmma_tests.log"
      fi
      SBG="python3 cli.py bench sparse_prefill --kind prefill --graphs --warmup 3 --iters 15"
      for g in 12 6; do
        if [ "$g" = 6 ]; then
          provs="table,geometry=8x16x1x2:rev:split2:v2:lean:o32,geometry=8x16x2x1:gl:o32"
          provs="$provs,geometry=8x64x4x2:wg:o32:r96"
        else
          provs="table,geometry=16x16x1x2:rev:split2:v2:lean:o32,geometry=16x64x4x2:wg:o32:r96"
          provs="$provs,geometry=16x64x4x2:wg:o32:r128"
        fi
        stage "prefill group $g: wgmma against the family, total_q sweep"
        timeout 300 $SBG --group-size $g --kv-len 8192,16384,32768 \
          --total-q ${WG_TOTAL_Q:-512,1024,2048,4096,8192} --providers "$provs,h200" 2>/dev/null \
          | tee -a "$OUT/wgmma_sweep.log" | grep -v "^-"
      done ;;
    kv32k-sparse)
      stage "sparse_prefill prefill KV 32K: schedules around the family"
      for g in 6 12; do
        if [ "$g" = 6 ]; then
          geos="8x32x1x2:rev:split2:v2:lean:o32 8x16x1x3:rev:split2:v2:lean:o32
                8x16x2x2:rev:split2:v2:lean:o32 8x32x2x2:rev:split2:v2:lean:o32
                16x16x1x2:rev:split2:v2:lean:o32 8x16x1x2:rev:split2:v2:o32
                8x32x4x2:rev:split2:v2:o32:r80 8x16x1x2:split2:v2:lean:o32"
        else
          geos="16x16x1x3:rev:split2:v2:lean:o32 16x16x2x2:rev:split2:v2:lean:o32
                16x32x1x2:rev:split2:v2:lean:o32 16x32x2x2:rev:split2:v2:lean:o32
                16x16x1x2:rev:split2:v2:o32 16x32x4x2:rev:split2:v2:o32:r96"
        fi
        provs="table,h200"
        for p in $geos; do provs="$provs,geometry=$p"; done
        timeout 250 python3 cli.py bench sparse_prefill --kind prefill --group-size $g \
          --kv-len 32768 --total-q 8192 --graphs --warmup 3 --iters 15 --providers "$provs" \
          2>&1 | tee -a "$OUT/kv32k_sweep.log" | grep -v "^-"
      done ;;
    dense-sparse)
      # DENSE=N (dense tiles walk the KV blocks with per-slot counts, the rest gathers) against
      # the table and the family: prefill, 8192 rows, KV 8K, thresholds N; then KV-length and
      # total_q sweeps of DENSE6 / DENSE12 (graph replays)
      F6=8x16x1x2:rev:split2:v2:lean:o32 F12=16x16x1x2:rev:split2:v2:lean:o32
      D6="table,h200,geometry=$F6:dense1000000,geometry=$F6:dense250,geometry=$F6:dense370"
      D6="$D6,geometry=$F6:dense500,geometry=$F6:dense370:dt128x64x8x2"
      D12="table,h200,geometry=$F12:dense1000000,geometry=$F12:dense150"
      D12="$D12,geometry=$F12:dense200,geometry=$F12:dense250,geometry=$F12:dense300"
      for g in 6 12; do
        stage "sparse_prefill prefill g$g: DENSE thresholds"
        if [ $g = 6 ]; then p=$D6; else p=$D12; fi
        timeout 300 python3 cli.py bench sparse_prefill --kind prefill --group-size $g \
          --kv-len 8192 --total-q 8192 --graphs --warmup 3 --iters 20 --providers "$p" \
          2>&1 | tee -a "$OUT/dense_sparse.log" | grep -v "^-"
      done
      for g in 6 12; do
        if [ $g = 6 ]; then p=$F6:${DENSE6:-dense370}; else p=$F12:${DENSE12:-dense150}; fi
        stage "sparse_prefill prefill g$g: sweeps of $p"
        timeout 300 python3 cli.py bench sparse_prefill --kind prefill --group-size $g \
          --kv-len 4096,16384,32768 --total-q 8192 --graphs --warmup 3 --iters 15 \
          --providers "table,h200,geometry=$p" 2>&1 | tee -a "$OUT/dense_sweep.log" \
          | grep -v "^-"
        timeout 300 python3 cli.py bench sparse_prefill --kind prefill --group-size $g \
          --kv-len 8192 --total-q 512,1024,2048,4096 --graphs --warmup 3 --iters 15 \
          --providers "table,h200,geometry=$p" 2>&1 | tee -a "$OUT/dense_sweep.log" \
          | grep -v "^-"
      done ;;
    *) echo "unknown step $step"; exit 2 ;;
  esac
done
cp "$KREG_HOME/tuning.json" "$OUT/tuning.json" 2>/dev/null
[ "${PACK_TCACHE:-0}" = 1 ] && bash benchmarks/probes/tcache.sh pack "$OUT"
bash benchmarks/probes/pack_out.sh "$OUT"   # at most 8 files come back
stage "done"
