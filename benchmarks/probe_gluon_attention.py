"""Probe: a hand-written Gluon (Hopper) sparse_prefill kernel for prefill rows (prototype).

One program a query row and KV head; the group's heads tile BM padded lines. K/V rows are
gathered by cp.async into a 2-stage shared-memory ring of BN keys; S = Q K^T and O += P V run on
``mma_v2`` with ``warps_per_cta = [1, W]``, so the warps split S's keys and O's head_dim (no
product is computed twice); Q is read from shared memory; P goes to the A operand by a layout
conversion. Invalid, negative and out-of-range entries and entries past ``lengths`` are masked
(zero-filled copies, -inf scores). Checked against the fp32 reference and timed next to the
table geometry and the H200 family (CUDA-graph replays, one window per case).

    python benchmarks/probe_gluon_attention.py
"""
from __future__ import annotations

import sys
from functools import partial
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy as cp
from triton.experimental.gluon.language.nvidia.ampere import mma_v2


@gluon.jit
def _issue(K_h, V_h, IDX_row, kbuf, vbuf, tile, n, num_slots, s_kt, s_vt, offs_n, offs_d,
           BN: gl.constexpr, D: gl.constexpr):
    j = tile * BN + offs_n
    t = gl.load(IDX_row + j, mask=j < n, other=-1)
    ok = (t >= 0) & (t < num_slots) & (j < n)
    slot = gl.where(ok, t, 0).to(gl.int64)
    m = ok[:, None] & (offs_d < D)[None, :]
    cp.async_copy_global_to_shared(kbuf.index(tile % 2), K_h + slot[:, None] * s_kt
                                   + offs_d[None, :], mask=m)
    cp.async_copy_global_to_shared(vbuf.index(tile % 2), V_h + slot[:, None] * s_vt
                                   + offs_d[None, :], mask=m)
    cp.commit_group()


@gluon.jit
def _attn_gl(Q, K, V, IDX, LENS, OUT, qk_scale, num_slots, topk, group, s_qt, s_qh, s_kt, s_kh,
             s_vt, s_vh, s_it, s_ot, s_oh, D: gl.constexpr, BM: gl.constexpr, BN: gl.constexpr,
             num_warps: gl.constexpr):
    r = gl.program_id(0).to(gl.int64)
    h = gl.program_id(1)
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[1, num_warps],
                                                  instr_shape=[16, 8])
    a_op: gl.constexpr = gl.DotOperandLayout(0, mma, 2)
    b_op: gl.constexpr = gl.DotOperandLayout(1, mma, 2)
    ld: gl.constexpr = gl.BlockedLayout([1, 8], [1, 32], [num_warps, 1], [1, 0])
    sw: gl.constexpr = gl.SwizzledSharedLayout(8, 1, 8, [1, 0])
    n = gl.minimum(gl.maximum(gl.load(LENS + r), 0), topk)
    IDX_row = IDX + r * s_it
    K_h = K + h.to(gl.int64) * s_kh
    V_h = V + h.to(gl.int64) * s_vh
    offs_n = gl.arange(0, BN, layout=gl.SliceLayout(1, ld))
    offs_d = gl.arange(0, D, layout=gl.SliceLayout(0, ld))
    kbuf = gl.allocate_shared_memory(gl.bfloat16, [2, BN, D], sw)
    vbuf = gl.allocate_shared_memory(gl.bfloat16, [2, BN, D], sw)
    ntiles = gl.cdiv(n, BN)
    _issue(K_h, V_h, IDX_row, kbuf, vbuf, 0, n, num_slots, s_kt, s_vt, offs_n, offs_d, BN, D)
    offs_m = gl.arange(0, BM, layout=gl.SliceLayout(1, ld))
    heads = h * group + offs_m
    q = gl.load(Q + r * s_qt + heads[:, None] * s_qh + offs_d[None, :],
                mask=(offs_m < group)[:, None] & (offs_d < D)[None, :], other=0.0)
    qsm = gl.allocate_shared_memory(gl.bfloat16, [BM, D], sw, q)
    acc = gl.zeros([BM, D], gl.float32, mma)
    m_i = gl.full([BM], float("-inf"), gl.float32, gl.SliceLayout(1, mma))
    l_i = gl.zeros([BM], gl.float32, gl.SliceLayout(1, mma))
    cols = gl.arange(0, BN, layout=gl.SliceLayout(0, mma))
    for tile in range(ntiles):
        _issue(K_h, V_h, IDX_row, kbuf, vbuf, tile + 1, n, num_slots, s_kt, s_vt, offs_n,
               offs_d, BN, D)
        jc = tile * BN + cols
        tc = gl.load(IDX_row + jc, mask=jc < n, other=-1)
        okc = (tc >= 0) & (tc < num_slots) & (jc < n)
        cp.wait_group(1)
        gl.thread_barrier()
        st = tile % 2
        kt = kbuf.index(st).permute([1, 0]).load(b_op)
        s = mma_v2(qsm.load(a_op), kt, gl.zeros([BM, BN], gl.float32, mma))
        s = gl.where(okc[None, :], s * qk_scale, float("-inf"))
        m_new = gl.maximum(m_i, gl.max(s, 1))
        m_use = gl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = gl.exp2(m_i - m_use)
        p = gl.exp2(s - m_use[:, None])
        l_i = l_i * alpha + gl.sum(p, 1)
        m_i = m_new
        pa = gl.convert_layout(p.to(gl.bfloat16), a_op)
        acc = mma_v2(pa, vbuf.index(st).load(b_op), acc * alpha[:, None])
        gl.thread_barrier()
    cp.wait_group(0)
    l_safe = gl.where(l_i > 0.0, l_i, 1.0)
    o = acc / l_safe[:, None]
    om = gl.arange(0, BM, layout=gl.SliceLayout(1, mma))
    od = gl.arange(0, D, layout=gl.SliceLayout(0, mma))
    optr = OUT + r * s_ot + (h * group + om)[:, None] * s_oh + od[None, :]
    gl.store(optr, o.to(gl.bfloat16), mask=(om < group)[:, None] & (od < D)[None, :])


_SHAPES = ((16, 1), (16, 2), (16, 4), (32, 2), (32, 4))   # (BN, warps)


def launch(q: Any, k: Any, v: Any, idx: Any, lens: Any, out: Any, bn: int, w: int) -> Any:
    g = q.shape[1] // k.shape[1]
    d = q.shape[2]
    return _attn_gl[(q.shape[0], k.shape[1])](
        q, k, v, idx, lens, out, d ** -0.5 * 1.4426950408889634, k.shape[0], idx.shape[1], g,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        idx.stride(0), out.stride(0), out.stride(1), D=d, BM=16, BN=bn, num_warps=w)


def main() -> None:
    import torch

    from backends.sparse_prefill import triton_kernels as tk
    from backends.sparse_prefill.bench import BenchCase, make_inputs, probe_header
    from backends.sparse_prefill.reference import sparse_prefill_reference
    from plugins.generic import sparse_prefill_table_config
    from plugins.nvidia_hopper import H200_PREFILL_CONFIGS
    from registry._timing import interleaved_median_ms

    print(probe_header("graph replays, ms; err = max |out - fp32 reference|"))
    for kv in (32768, 8192):
        for g in (6, 12):
            x = make_inputs(BenchCase(kind="prefill", group_size=g, kv_len=kv, total_q=8192))
            q, k, v, idx, kw = x["q"], x["k"], x["v"], x["indices"], x["kwargs"]
            ref = sparse_prefill_reference(q, k, v, idx, lengths=kw["lengths"],
                                           out_dtype=torch.float32)
            table = sparse_prefill_table_config(g, 8192)
            fam = H200_PREFILL_CONFIGS[("prefill", g)]
            fns: dict[str, Any] = {
                "table": partial(tk.sparse_prefill_triton, q, k, v, idx, config=table, **kw),
                "family": partial(tk.sparse_prefill_triton, q, k, v, idx, config=fam, **kw)}
            errs = {}
            for bn, w in _SHAPES:
                out = torch.full_like(q, float("nan"))
                name = f"gluon bn{bn} {w}w"
                try:
                    launch(q, k, v, idx, kw["lengths"], out, bn, w)
                    torch.cuda.synchronize()
                except Exception as exc:  # a shape that does not build is reported
                    print(f"  {name}: {type(exc).__name__}: {str(exc)[:600]}")
                    continue
                errs[name] = (out.float() - ref).abs().max().item()
                fns[name] = partial(launch, q, k, v, idx, kw["lengths"], out, bn, w)
            res = interleaved_median_ms(fns, warmup=3, iters=15, graphs=True)
            print(f"\nprefill g{g} KV {kv}, 8192 rows: table / 1.3 = {res['table'] / 1.3:.4f} ms")
            for name, ms in res.items():
                err = f"err {errs[name]:.2e}" if name in errs else ""
                print(f"  {name:18s} {ms:8.4f} ms  {res['table'] / ms:5.3f}x  {err}")


if __name__ == "__main__":
    main()
