"""compute-sanitizer target: the indexer_topk tiers on small batches of every distribution
(the default config's paths at 131072 keys, 2-4 rows; FUSED 0 and 1, one and two programs a
row, 16- and 32-bit maxima, ONE_PASS), each checked against the reference."""
import sys

import torch

from backends.indexer_topk import triton_kernels as tk
from backends.indexer_topk.distributions import make_scores
from backends.indexer_topk.reference import indexer_topk_reference, topk_mismatches

n, k = 131072, 2048
bad = 0
for name in sys.argv[1].split(","):
    s = make_scores(name, 3, n, seed=2, device="cuda")
    ln = torch.tensor([n, n - 3, 3 * k], dtype=torch.int32, device="cuda")
    want = indexer_topk_reference(s, ln, k)
    for cfg in ({"FUSED": 0}, {"FUSED": 1, "ROW_SPLIT": 2}, {"FUSED": 1, "ROW_SPLIT": 1},
                {"FUSED": 1, "ROW_SPLIT": 1, "GMAX_BITS": 32}, {"ONE_PASS": 1}):
        mm = topk_mismatches(tk.indexer_topk_triton(s, ln, k, config=cfg), want)
        bad += bool(mm)
        print(name, cfg, "exact" if not mm else mm[0], flush=True)
torch.cuda.synchronize()
sys.exit(1 if bad else 0)
