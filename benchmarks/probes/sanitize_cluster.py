"""compute-sanitizer target: the cluster radix select (``backends/indexer_topk/cluster.py``) on
small batches of every distribution at 131072 keys (full, short and ragged rows), a row of fewer
than k keys, bf16 and fp16, each checked against the reference."""
import sys

import torch

from backends.indexer_topk import cluster
from backends.indexer_topk.distributions import make_scores
from backends.indexer_topk.reference import indexer_topk_reference, topk_mismatches

n, k = 131072, 2048
bad = 0
for name in sys.argv[1].split(","):
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        s = make_scores(name, 3, n, dtype=dtype, seed=2, device="cuda")
        ln = torch.tensor([n, n - 3, 3 * k], dtype=torch.int32, device="cuda")
        mm = topk_mismatches(cluster.indexer_topk_cluster(s, ln, k),
                             indexer_topk_reference(s, ln, k))
        bad += bool(mm)
        print(name, dtype, "exact" if not mm else mm[0], flush=True)
s = torch.randn(2, 5000, device="cuda")
ln = torch.tensor([5000, 1000], dtype=torch.int32, device="cuda")
mm = topk_mismatches(cluster.indexer_topk_cluster(s, ln, k), indexer_topk_reference(s, ln, k))
bad += bool(mm)
print("short rows", "exact" if not mm else mm[0])
torch.cuda.synchronize()
sys.exit(1 if bad else 0)
