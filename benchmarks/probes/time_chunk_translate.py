"""Time the chunk kind's pretranslate kernel alone (the part CHUNK_MODE=staged folds into the
attention kernel), on the benchmark's inputs. GPU only.

    python benchmarks/probes/time_chunk_translate.py --total-q 8192 --kv-len 8192
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main() -> None:
    import torch
    import triton

    from backends.sparse_prefill import triton_kernels as tk
    from backends.sparse_prefill.bench import BenchCase, make_inputs
    from registry.tuning.timing import interleaved_median_ms

    ap = argparse.ArgumentParser()
    ap.add_argument("--total-q", type=int, default=8192)
    ap.add_argument("--kv-len", type=int, default=8192)
    ap.add_argument("--iters", type=int, default=50)
    a = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("time_chunk_translate.py needs a GPU")
    inp = make_inputs(BenchCase(kind="chunk", total_q=a.total_q, kv_len=a.kv_len), "cuda")
    idx, kw = inp["indices"], inp["kwargs"]
    tq, topk = idx.shape
    slots = torch.empty_like(idx)
    pt = kw["page_table"]

    def run() -> None:
        tk._translate_chunk[(tq, triton.cdiv(topk, 256))](
            idx, kw["lengths"], slots, kw["cu_seqlens_q"], kw["prefix_lens"], pt,
            inp["k"].shape[0], topk, kw["page_size"], pt.shape[1], 1, idx.stride(0),
            slots.stride(0), pt.stride(0), HAS_LENS=True, BLOCK=256, num_warps=4)

    ms = interleaved_median_ms({"translate": run}, warmup=5, iters=a.iters,
                               graphs=True)["translate"]
    mb = 2 * idx.numel() * 4 / 1e6
    print(f"pretranslate kernel, {tq} rows x topk {topk}: {ms * 1e3:.1f} us "
          f"({mb:.0f} MB of entries read and written, {mb / ms / 1e3:.2f} TB/s)")


if __name__ == "__main__":
    main()
