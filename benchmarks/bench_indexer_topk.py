"""Benchmark indexer_topk providers against torch.topk (thin wrapper of
backends.indexer_topk.bench).

Examples (run from the repository root):

    python benchmarks/bench_indexer_topk.py --rows 1,64,1024,4096 --keys 131072
    python benchmarks/bench_indexer_topk.py --rows 1024 --keys 131072 --ragged
    python benchmarks/bench_indexer_topk.py --rows 64 --keys 131072 \
        --providers torch-topk,triton,geometry=1024x64x4,geometry=131072x1x4:SPARSE=0

Same options as ``kreg bench indexer_topk``; ``--help`` lists them. Exits 1 when a kreg provider
is not bitwise equal to the reference.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from backends.indexer_topk.bench import bench_command

if __name__ == "__main__":
    bench_command(prog_name="bench_indexer_topk.py")
