"""The sparse_prefill torch reference against a naive per-row loop in float64."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from backends.sparse_prefill import reference as refmod  # noqa: E402
from backends.sparse_prefill.reference import sparse_prefill_reference  # noqa: E402


def _naive(q, k, v, indices, *, kind="prefill", lengths=None, sm_scale=None, cu_seqlens_q=None,
           prefix_lens=None, page_table=None, page_size=1):
    """One row, one head at a time, straight from the contract text (float64)."""
    total_q, hq, d = q.shape
    num_slots, hkv, _ = k.shape
    group = hq // hkv
    scale = sm_scale if sm_scale is not None else d ** -0.5
    out = torch.zeros((total_q, hq, d), dtype=torch.float64)
    for r in range(total_q):
        n = int(lengths[r]) if lengths is not None else indices.shape[1]
        slots = []
        for j in range(indices.shape[1]):
            if j >= n:
                continue
            t = int(indices[r, j])
            if kind == "prefill":
                s = t
            else:
                b = max(i for i in range(len(cu_seqlens_q) - 1) if int(cu_seqlens_q[i]) <= r)
                p = int(prefix_lens[b]) + r - int(cu_seqlens_q[b])
                if t < 0 or t > p or t // page_size >= page_table.shape[1]:
                    continue
                page = int(page_table[b, t // page_size])
                if page < 0:
                    continue
                s = page * page_size + t % page_size
            if 0 <= s < num_slots:
                slots.append(s)
        for h in range(hq):
            kh = h // group
            if not slots:
                continue
            scores = [float(q[r, h].double() @ k[s, kh].double()) * scale for s in slots]
            m = max(scores)
            w = [math.exp(x - m) for x in scores]
            tot = sum(w)
            o = sum(wi * v[s, kh].double() for wi, s in zip(w, slots, strict=True))
            out[r, h] = o / tot
    return out


def _inputs(seed, total_q=6, hq=6, hkv=1, d=16, num_slots=20, topk=11):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn((total_q, hq, d), generator=g, dtype=torch.float64)
    k = torch.randn((num_slots, hkv, d), generator=g, dtype=torch.float64)
    v = torch.randn((num_slots, hkv, d), generator=g, dtype=torch.float64)
    idx = torch.randint(-3, num_slots + 3, (total_q, topk), generator=g, dtype=torch.int32)
    idx[0, :4] = 5  # duplicates count twice
    lengths = torch.randint(0, topk + 1, (total_q,), generator=g, dtype=torch.int32)
    lengths[1] = 0  # empty row
    return q, k, v, idx, lengths


@pytest.mark.parametrize("hq,hkv", [(6, 1), (12, 2), (2, 2)])
def test_prefill_matches_naive(hq, hkv):
    q, k, v, idx, lengths = _inputs(1, hq=hq, hkv=hkv)
    idx[2] = -1  # all-invalid row
    got = sparse_prefill_reference(q, k, v, idx, lengths=lengths, sm_scale=0.3)
    want = _naive(q, k, v, idx, lengths=lengths, sm_scale=0.3)
    assert got.dtype == torch.float64
    torch.testing.assert_close(got, want, atol=1e-12, rtol=1e-12)
    assert torch.all(got[1] == 0) and torch.all(got[2] == 0)


def test_prefill_default_lengths_and_scale():
    q, k, v, idx, _ = _inputs(2)
    got = sparse_prefill_reference(q, k, v, idx)
    want = _naive(q, k, v, idx)
    torch.testing.assert_close(got, want, atol=1e-12, rtol=1e-12)


@pytest.mark.parametrize("page_size", [1, 3])
def test_chunk_matches_naive(page_size):
    q, k, v, _, lengths = _inputs(3, total_q=7, hq=4, hkv=2, num_slots=30)
    g = torch.Generator().manual_seed(4)
    cu = torch.tensor([0, 3, 7], dtype=torch.int32)
    prefix = torch.tensor([5, 2], dtype=torch.int32)
    max_pages = 4
    pt = torch.randint(-1, 30 // page_size + 2, (2, max_pages), generator=g, dtype=torch.int32)
    idx = torch.randint(-2, 14, (7, 11), generator=g, dtype=torch.int32)
    kw = dict(kind="chunk", lengths=lengths, cu_seqlens_q=cu, prefix_lens=prefix,
              page_table=pt, page_size=page_size)
    got = sparse_prefill_reference(q, k, v, idx, **kw)
    want = _naive(q, k, v, idx, **kw)
    torch.testing.assert_close(got, want, atol=1e-12, rtol=1e-12)


def test_row_chunking_is_invisible(monkeypatch):
    q, k, v, idx, lengths = _inputs(5, total_q=9)
    whole = sparse_prefill_reference(q, k, v, idx, lengths=lengths)
    monkeypatch.setattr(refmod, "_CHUNK_ELEMS", 1)  # one row per chunk
    pieces = sparse_prefill_reference(q, k, v, idx, lengths=lengths)
    torch.testing.assert_close(whole, pieces, atol=0, rtol=0)


def test_out_dtype_and_float32_compute():
    q, k, v, idx, lengths = _inputs(6)
    got = sparse_prefill_reference(q.float(), k.float(), v.float(), idx, lengths=lengths,
                                   out_dtype=torch.float16)
    assert got.dtype == torch.float16
    want = _naive(q, k, v, idx, lengths=lengths)
    torch.testing.assert_close(got.double(), want, atol=2e-3, rtol=2e-3)


def test_nan_in_unselected_slots_does_not_leak():
    q, k, v, idx, lengths = _inputs(7)
    k[0] = float("nan")
    v[0] = float("nan")
    idx = torch.where(idx == 0, torch.ones_like(idx), idx)
    idx[3, 0] = -1
    got = sparse_prefill_reference(q, k, v, idx, lengths=lengths)
    assert torch.isfinite(got).all()
