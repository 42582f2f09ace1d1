"""Benchmark sparse_prefill providers side by side (thin wrapper of backends.sparse_prefill.bench).

Examples (run from the repository root):

    python benchmarks/bench_sparse_prefill.py --kind chunk --group-size 6,12 \
        --providers table,h200,geometry=8x32x4x5:pre --baseline table
    python benchmarks/bench_sparse_prefill.py --kind prefill --total-q 32,64,128,256,512,1024,8192

Same options as ``kreg bench sparse_prefill``; ``--help`` lists them.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from backends.sparse_prefill.bench import bench_command

if __name__ == "__main__":
    bench_command(prog_name="bench_sparse_prefill.py")
