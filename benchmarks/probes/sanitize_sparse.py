"""Drive the sparse_prefill kernels for compute-sanitizer (GPU only):

    compute-sanitizer --tool memcheck --error-exitcode 3 \\
        python3 benchmarks/probes/sanitize_sparse.py

Small shapes with every hazard the kernels must skip: 192 rows, groups 6 and 12, 2 KV heads,
1024 KV slots; chunk as 2 requests on 16-token pages (one page unmapped) with prefixes that are
not multiples of 16; 5% of the entries negative or past the cache, some rows empty. Runs the
table geometries and the H200 family (every CHUNK_MODE, SPLIT_V, LEAN, OFFS32, SLOT_ORDER,
DENSE, UNION: the run fails unless some tiles took each row-tile path) and the Gluon kernels
(ENGINE=gluon; ENGINE=gluon_wgmma on sm_90) on both kinds and checks each output against the
fp32 reference, so a run is also a correctness check.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _inputs(kind: str, group: int, gen):  # type: ignore[no-untyped-def]
    import torch

    total_q, hkv, d, topk, slots, ps = 192, 2, 256, 300, 1024, 16
    q = torch.randn((total_q, group * hkv, d), generator=gen).to(torch.bfloat16).cuda()
    k = torch.randn((slots, hkv, d), generator=gen).to(torch.bfloat16).cuda()
    v = torch.randn((slots, hkv, d), generator=gen).to(torch.bfloat16).cuda()
    kw: dict = {"kind": kind}
    if kind == "chunk":
        reqs, prefixes = (100, 92), (203, 419)
        pages = slots // ps // 2
        pt = torch.arange(2 * pages, dtype=torch.int32).reshape(2, pages).flip(1).contiguous()
        pt[1, 3] = -1  # unmapped page
        ctx = max(p + r for p, r in zip(prefixes, reqs, strict=True))
        idx = torch.randint(0, ctx, (total_q, topk), generator=gen, dtype=torch.int32)
        kw.update(cu_seqlens_q=torch.tensor([0, reqs[0], total_q], dtype=torch.int32).cuda(),
                  prefix_lens=torch.tensor(prefixes, dtype=torch.int32).cuda(),
                  page_table=pt.cuda(), page_size=ps, max_q=max(reqs))
    else:
        idx = torch.randint(0, slots, (total_q, topk), generator=gen, dtype=torch.int32)
    bad = torch.rand((total_q, topk), generator=gen) < 0.05
    idx[bad] = torch.where(torch.rand(int(bad.sum()), generator=gen) < 0.5, -7, 10**6).to(
        torch.int32)
    lengths = torch.randint(0, topk + 1, (total_q,), generator=gen, dtype=torch.int32)
    lengths[::17] = 0
    kw["lengths"] = lengths.cuda()
    return q, k, v, idx.cuda(), kw


def main() -> None:
    import torch

    from backends.sparse_prefill import tile_kernels
    from backends.sparse_prefill.reference import sparse_prefill_reference
    from backends.sparse_prefill.triton_kernels import sparse_prefill_triton
    from plugins.generic import sparse_prefill_table_config
    from plugins.nvidia_hopper import H200_LONG_KV_CONFIGS, H200_PREFILL_CONFIGS, H200_UNION_CONFIGS

    if not torch.cuda.is_available():
        sys.exit("sanitize_sparse.py needs a GPU")
    gen = torch.Generator().manual_seed(0)
    worst, runs = 0.0, 0
    tile_kernels.TILE_PATHS = []   # every UNION call's per-tile path (0 gather, 1 dense, 2 union)
    for kind in ("prefill", "chunk"):
        for group in (6, 12):
            q, k, v, idx, kw = _inputs(kind, group, gen)
            ref = sparse_prefill_reference(q, k, v, idx, out_dtype=torch.float32, **kw)
            cfgs = [sparse_prefill_table_config(group, 8192), H200_PREFILL_CONFIGS[(kind, group)]]
            if kind == "chunk":  # the family's other chunk modes too, and slot ordering
                cfgs += [{**cfgs[1], "CHUNK_MODE": m} for m in ("fused", "pretranslate", "staged")
                         if m != cfgs[1].get("CHUNK_MODE")]
            cfgs.append(H200_LONG_KV_CONFIGS[(kind, group)])  # the pre-pass, then the kernel
            # DENSE: every tile dense, and a threshold that leaves some tiles to the gathers
            dense = {**cfgs[1], "CHUNK_MODE": "pretranslate"} if kind == "chunk" else cfgs[1]
            cfgs += [{**dense, "DENSE": 10**6}, {**dense, "DENSE": 600}]
            # UNION (issue 26): every tile on the union path, a threshold that leaves some
            # tiles to the gathers, and DENSE taking every tile before UNION is tried
            cfgs += [{**dense, "UNION": 10**6}, {**dense, "UNION": 700},
                     {**dense, "DENSE": 10**6, "UNION": 10**6}]
            # the union tiles the policy and the tuner run (128 lines x 64 slots, 64 x 32)
            cfgs += [{**dense, "UNION": 10**6, "DENSE_TILE": t} for t in ("128x64x8x2",
                                                                          "64x32x4x3")]
            # the union pre-pass in one CUDA kernel (UNION_PREP="cuda", sm_90): every tile
            # union, some tiles gathered, DENSE before it
            if torch.cuda.get_device_capability() == (9, 0):
                cfgs += [{**dense, "UNION": u, "UNION_PREP": "cuda", "DENSE_TILE": "128x64x8x2"}
                         for u in (10**6, 700)]
                cfgs.append({**dense, "DENSE": 600, "UNION": 700, "UNION_PREP": "cuda"})
                # the policy's own union config for the cell (prefill g6: dense tiles beside
                # union tiles, UNION_TILE; chunk g6: union tiles alone), as shipped
                cfgs.append(H200_UNION_CONFIGS[(kind, group)])
            # ENGINE=gluon (chunk rows pretranslated): the shipped ring, two stages of 32
            # keys, int64 offsets, slot ordering
            gl = {"BLOCK_M": 8 if group <= 8 else 16, "BLOCK_N": 16, "num_warps": 2,
                  "num_stages": 1, "ENGINE": "gluon", "OFFS32": 1,
                  **({"CHUNK_MODE": "pretranslate"} if kind == "chunk" else {})}
            cfgs += [gl, {**gl, "BLOCK_N": 32, "num_stages": 2}, {**gl, "OFFS32": 0},
                     {**gl, "SLOT_ORDER": 1}]
            # ENGINE=gluon_wgmma (sm_90): the shipped config (MAXNREG 96 for 8 lines, 128 for
            # 16), the other register cap, int64 offsets, slot ordering
            if torch.cuda.get_device_capability() == (9, 0):
                wg = {**gl, "BLOCK_N": 64, "num_warps": 4, "num_stages": 2,
                      "ENGINE": "gluon_wgmma", "MAXNREG": 96 if group <= 8 else 128}
                cfgs += [wg, {**wg, "MAXNREG": 224 - wg["MAXNREG"]}, {**wg, "OFFS32": 0},
                         {**wg, "SLOT_ORDER": 1}]
            for cfg in cfgs:
                out = sparse_prefill_triton(q, k, v, idx, config=cfg, **kw)
                err = (out.float() - ref).abs().max().item()
                if not (torch.isfinite(out).all() and err <= 2e-2):
                    sys.exit(f"{kind} g{group} {cfg}: max abs err {err}")
                worst, runs = max(worst, err), runs + 1
    torch.cuda.synchronize()
    paths = torch.cat([f.flatten().cpu() for f in tile_kernels.TILE_PATHS])
    taken = {p: int((paths == p).sum()) for p in (0, 1, 2)}
    if not all(taken.values()):
        sys.exit(f"row-tile paths taken {taken}: some path was never exercised")
    print(f"sanitize_sparse: {runs} launches checked, worst max-abs err {worst:.2e}; "
          f"tiles by path (gather/dense/union): {taken[0]}/{taken[1]}/{taken[2]}")


if __name__ == "__main__":
    main()
