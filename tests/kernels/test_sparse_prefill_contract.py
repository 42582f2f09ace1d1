"""sparse_prefill's contract, held the same way by every implementation (issue #24, "Silent wrong
answers"): one input check (``backends.sparse_prefill.check_inputs``) at every entry, the NaN/inf
rules of the op docstring in the reference, the kernels and ``compare``, and tensor arguments
read at the strides they have.

Kernels run under the Triton interpreter on a CPU (tests/conftest.py), float32 and float16 at
tiny sizes, against the float64 reference, on outputs and scratch poisoned first.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

import registry  # noqa: E402
from backends.sparse_prefill import check_inputs  # noqa: E402
from backends.sparse_prefill.compare import compare, max_abs_error  # noqa: E402
from backends.sparse_prefill.reference import sparse_prefill_reference  # noqa: E402
from backends.sparse_prefill.triton_kernels import sparse_prefill_triton  # noqa: E402
from registry.errors import WorkloadError  # noqa: E402

from kernel_helpers import poison_empty  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"
BASE = {"BLOCK_M": 8, "BLOCK_N": 16, "num_warps": 2, "num_stages": 1}
GLUON = {"BLOCK_M": 8, "BLOCK_N": 16, "num_warps": 2, "num_stages": 1, "ENGINE": "gluon"}
NAN, INF = float("nan"), float("inf")
# the interpreter's numpy warns on the NaN and inf arithmetic these tests make on purpose
pytestmark = pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning",
                                        "ignore:overflow encountered:RuntimeWarning",
                                        "ignore:All-NaN slice encountered:RuntimeWarning")


@pytest.fixture
def poisoned(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Every torch.empty / empty_like (outputs and scratch) comes back poisoned: NaN floats, a
    large int, so an element an implementation never writes cannot pass for a right one."""
    poison_empty(monkeypatch)
    yield


def _i32(x: Any) -> Any:
    return torch.as_tensor(x, dtype=torch.int32)


def _prefill(seed: int = 0, *, total_q: int = 6, group: int = 3, hkv: int = 2, d: int = 16,
             num_slots: int = 40, topk: int = 24, dtype: Any = torch.float32
             ) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """Random rows with the hazards: duplicates, negative / out-of-range / far entries, a row
    past its length, an empty row, an all-invalid row."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(total_q, group * hkv, d, generator=g).to(dtype)
    k = torch.randn(num_slots, hkv, d, generator=g).to(dtype)
    v = torch.randn(num_slots, hkv, d, generator=g).to(dtype)
    idx = torch.randint(-3, num_slots + 3, (total_q, topk), generator=g)
    idx[0, 1:5] = idx[0, 0].clamp(0, num_slots - 1)  # duplicates count twice
    idx[2, ::4] = 2**31 - 1
    idx[-1] = -1  # nothing valid: zeros
    lengths = torch.randint(1, topk + 1, (total_q,), generator=g)
    lengths[0], lengths[1], lengths[3] = topk, 0, topk + 7  # full, empty, past topk (clamped)
    return (q, k, v, _i32(idx)), {"kind": "prefill", "lengths": _i32(lengths)}


def _chunk(seed: int = 0, *, reqs: tuple[int, ...] = (2, 3), prefixes: tuple[int, ...] = (5, 3),
           group: int = 3, hkv: int = 2, d: int = 16, page_size: int = 2, topk: int = 20,
           dtype: Any = torch.float32) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """Ragged requests after cached prefixes, scattered pages, an unmapped page, future and
    negative positions, lengths."""
    g = torch.Generator().manual_seed(seed)
    total_q, nreq = sum(reqs), len(reqs)
    ctx = max(p + r for p, r in zip(prefixes, reqs, strict=True))
    max_pages = -(-ctx // page_size) + 1
    num_slots = nreq * max_pages * page_size - 1  # the last page partly out of range
    q = torch.randn(total_q, group * hkv, d, generator=g).to(dtype)
    k = torch.randn(num_slots, hkv, d, generator=g).to(dtype)
    v = torch.randn(num_slots, hkv, d, generator=g).to(dtype)
    pt = torch.randperm(nreq * max_pages, generator=g).reshape(nreq, max_pages)
    pt[0, 1] = -1
    idx = torch.randint(-2, ctx + 2, (total_q, topk), generator=g)
    idx[0, :3] = 0
    lengths = torch.randint(0, topk + 1, (total_q,), generator=g)
    lengths[0] = topk
    cu = [0]
    for r in reqs:
        cu.append(cu[-1] + r)
    return (q, k, v, _i32(idx)), {
        "kind": "chunk", "lengths": _i32(lengths), "cu_seqlens_q": _i32(cu),
        "prefix_lens": _i32(prefixes), "page_table": _i32(pt), "page_size": page_size,
        "max_q": max(reqs)}


def _triton(cfg: dict[str, Any]) -> Callable[..., Any]:
    def run(*args: Any, **kwargs: Any) -> Any:
        return sparse_prefill_triton(*args, config=cfg, **kwargs)
    return run


# ============================================================================ input validation

def _bad_calls() -> Iterator[tuple[str, str, Callable[[], tuple[tuple[Any, ...], dict]]]]:
    """(id, the message it must contain, a builder of the call's (args, kwargs))."""

    def edit(chunk: bool = False, **changes: Any) -> Callable[[], tuple[tuple[Any, ...], dict]]:
        def make() -> tuple[tuple[Any, ...], dict]:
            (q, k, v, idx), kw = _chunk() if chunk else _prefill()
            named = {"q": q, "k": k, "v": v, "indices": idx}
            for name, fn in changes.items():
                if name in named:
                    named[name] = fn(named[name])
                else:
                    kw[name] = fn(kw.get(name))
            return (named["q"], named["k"], named["v"], named["indices"]), kw
        return make

    def chunk(**changes: Any) -> Callable[[], tuple[tuple[Any, ...], dict]]:
        return edit(True, **changes)

    meta = torch.device("meta")
    # raw exceptions before (shapes the reference did not check)
    yield "v-head-dim", r"v.shape=\[40, 2, 8\] != k.shape=\[40, 2, 16\].*head_dim", \
        edit(v=lambda v: v[..., :8].contiguous())
    yield "v-fewer-slots", r"v.shape=\[5, 2, 16\] != k.shape=\[40, 2, 16\].*num_slots", \
        edit(v=lambda v: v[:5])
    yield "indices-fewer-rows", r"indices.shape=\[2, 24\]: must be \[total_q=6, topk\]", \
        edit(indices=lambda i: i[:2])
    yield "indices-3d", r"indices.shape=\[6, 24, 1\]: must be \[total_q=6, topk\]", \
        edit(indices=lambda i: i[..., None])
    yield "lengths-shorter", r"lengths.shape=\[2\]: must be \[6\]", \
        edit(lengths=lambda n: n[:2])
    yield "lengths-2d", r"lengths.shape=\[6, 1\]: must be \[6\]", \
        edit(lengths=lambda n: n[:, None])
    yield "lengths-list", r"lengths: must be an int32 tensor .*got list", \
        edit(lengths=lambda n: n.tolist())
    yield "sm_scale-str", r"sm_scale='abc': must be None \(head_dim \*\* -0.5\) or a finite", \
        edit(sm_scale=lambda _: "abc")
    yield "k-on-meta", r"k is on meta but q is on cpu: every tensor argument must be on q's", \
        edit(k=lambda k: k.to(meta))
    yield "indices-on-meta", r"indices is on meta but q is on cpu", \
        edit(indices=lambda i: i.to(meta))
    yield "lengths-on-meta", r"lengths is on meta but q is on cpu", \
        edit(lengths=lambda n: n.to(meta))
    yield "page_table-on-meta", r"page_table is on meta but q is on cpu", \
        chunk(page_table=lambda t: t.to(meta))
    yield "prefix_lens-too-few", r"prefix_lens.shape=\[1\]: must be \[2\]", \
        chunk(prefix_lens=lambda t: t[:1])
    yield "page_table-too-few", r"page_table: must be an int32 tensor \[num_requests=2, " \
        r"max_pages\].*got \[1, ", chunk(page_table=lambda t: t[:1])
    # silently accepted before
    yield "indices-float", r"indices.dtype=torch.float32: must be torch.int32", \
        edit(indices=lambda i: i.float() + 0.5)
    yield "indices-int64", r"indices.dtype=torch.int64: must be torch.int32.*wrap", \
        edit(indices=lambda i: i.long())
    yield "indices-more-rows", r"indices.shape=\[12, 24\]: must be \[total_q=6, topk\]", \
        edit(indices=lambda i: torch.cat([i, i]))
    yield "v-more-slots", r"v.shape=\[80, 2, 16\] != k.shape=\[40, 2, 16\].*num_slots", \
        edit(v=lambda v: torch.cat([v, v]))
    yield "lengths-longer", r"lengths.shape=\[12\]: must be \[6\]", \
        edit(lengths=lambda n: torch.cat([n, n]))
    yield "lengths-float", r"lengths: must be an int32 tensor .*got float", \
        edit(lengths=lambda _: 1.5)
    yield "lengths-int64", r"lengths.dtype=torch.int64: must be torch.int32", \
        edit(lengths=lambda n: n.long())
    yield "cu_seqlens_q-float", r"cu_seqlens_q.dtype=torch.float32: must be torch.int32", \
        chunk(cu_seqlens_q=lambda t: t.float())
    yield "prefix_lens-float", r"prefix_lens.dtype=torch.float32: must be torch.int32", \
        chunk(prefix_lens=lambda t: t.float())
    yield "page_table-float", r"page_table.dtype=torch.float32: must be torch.int32", \
        chunk(page_table=lambda t: t.float())
    yield "kv-fp16-q-fp32", r"dtypes q=torch.float32, k=torch.float16, v=torch.float16: must " \
        r"all be equal", edit(k=lambda k: k.half(), v=lambda v: v.half())
    # and the rest of the rules
    yield "q-not-tensor", r"q must be a torch.Tensor \[total_q, num_q_heads, head_dim\]; got " \
        r"list", edit(q=lambda q: q.tolist())
    yield "q-2d", r"q.shape=\[6, 96\]: q must be 3-D", edit(q=lambda q: q.flatten(1))
    yield "q-int", r"q.dtype=torch.int32: must be float16, bfloat16, float32 or float64", \
        edit(q=lambda q: q.int(), k=lambda k: k.int(), v=lambda v: v.int())
    yield "gqa", r"num_q_heads=6 is not a multiple of num_kv_heads=4", \
        edit(k=lambda k: k.repeat(1, 2, 1), v=lambda v: v.repeat(1, 2, 1))
    yield "kind", r"kind='decode' must be 'prefill' or 'chunk'", edit(kind=lambda _: "decode")
    yield "sm_scale-nan", r"sm_scale=nan: must be None", edit(sm_scale=lambda _: NAN)
    yield "sm_scale-bool", r"sm_scale=True: must be None", edit(sm_scale=lambda _: True)
    yield "sm_scale-tensor", r"sm_scale=tensor\(0.5000\): .*a tensor would have to be read", \
        edit(sm_scale=lambda _: torch.tensor(0.5))
    yield "page_size-0", r"page_size=0: must be a python int >= 1", \
        chunk(page_size=lambda _: 0)
    yield "page_size-float", r"page_size=2.0: must be a python int >= 1", \
        chunk(page_size=lambda _: 2.0)
    yield "max_q-float", r"max_q=1.5: must be None or a python int in \[0, total_q=5\]", \
        chunk(max_q=lambda _: 1.5)
    yield "max_q-past-total_q", r"max_q=9: must be None or a python int in \[0, total_q=5\]", \
        chunk(max_q=lambda _: 9)
    yield "chunk-without-page_table", r"page_table is required for kind='chunk'", \
        chunk(page_table=lambda _: None)
    yield "cu_seqlens_q-2d", r"cu_seqlens_q: must be a 1-D int32 tensor \[num_requests \+ 1\]", \
        chunk(cu_seqlens_q=lambda t: t[None])
    yield "chunk-args-on-prefill", r"kind='prefill' takes no cu_seqlens_q, prefix_lens, " \
        r"page_table.*need kind='chunk'", chunk(kind=lambda _: "prefill")
    yield "q-stride", r"q.stride\(-1\)=6: the last axis of q must be contiguous", \
        edit(q=lambda q: q.transpose(1, 2).contiguous().transpose(1, 2))
    yield "indices-stride", r"indices.stride\(-1\)=6: the last axis of indices", \
        edit(indices=lambda i: i.t().contiguous().t())
    yield "page_table-stride", r"page_table.stride\(-1\)=2: the last axis of page_table", \
        chunk(page_table=lambda t: t.t().contiguous().t())


BAD = {name: (match, make) for name, match, make in _bad_calls()}
IMPLS = {"reference": sparse_prefill_reference, "triton": _triton(BASE),
         "gluon": _triton(GLUON), "check_inputs": check_inputs}


@pytest.mark.parametrize("impl", sorted(IMPLS))
@pytest.mark.parametrize("name", list(BAD))
def test_every_entry_refuses_a_bad_call_with_the_same_message(name: str, impl: str) -> None:
    match, make = BAD[name]
    args, kwargs = make()
    with pytest.raises(WorkloadError, match=match) as exc:
        IMPLS[impl](*args, **kwargs)
    assert str(exc.value).startswith("sparse_prefill: ")


@pytest.mark.parametrize("forced", [None, "reference.sparse_prefill"])
@pytest.mark.parametrize("name", list(BAD))
def test_dispatch_refuses_a_bad_call_with_a_workload_error(name: str, forced: str | None
                                                           ) -> None:
    # through what is selected here, and through the reference (a CPU without Triton): never
    # a raw exception, never an answer
    args, kwargs = BAD[name][1]()
    ctx = registry.override("sparse_prefill", forced) if forced else contextlib.nullcontext()
    with ctx, pytest.raises(WorkloadError):
        registry.dispatch("sparse_prefill", *args, **kwargs)



@pytest.mark.parametrize("name", ["v-more-slots", "indices-int64", "kv-fp16-q-fp32",
                                  "lengths-longer", "page_table-too-few", "q-stride"])
def test_the_compiled_op_refuses_at_trace_time(name: str) -> None:
    # the fake kernel (torch.compile's tracing) runs the same check on fake tensors
    from torch._subclasses.fake_tensor import FakeTensorMode

    import backends.sparse_prefill.torch_op  # noqa: F401  (registers kreg::sparse_prefill)

    match, make = BAD[name]
    args, kwargs = make()
    with FakeTensorMode(allow_non_fake_inputs=True), pytest.raises(WorkloadError, match=match):
        torch.ops.kreg.sparse_prefill(*args, **kwargs)


def test_check_inputs_is_the_contract_and_reads_no_data() -> None:
    import backends.sparse_prefill as op

    assert "check_inputs" in op.__all__ and "check_inputs" in (op.__doc__ or "")
    # meta tensors have shapes, dtypes, devices and strides but no data: a check that read a
    # value (or synchronized) would raise here
    for make in (_prefill, _chunk):
        (q, k, v, idx), kw = make()
        to = {n: (t.to("meta") if isinstance(t, torch.Tensor) else t) for n, t in kw.items()}
        assert check_inputs(q.to("meta"), k.to("meta"), v.to("meta"), idx.to("meta"),
                            **to) is None


def test_accepted_corner_calls() -> None:
    # what the rules allow: int and numpy sm_scale, size-1 last axes of any stride, an empty
    # batch, no KV slots, strided 1-D views
    import numpy as np

    (q, k, v, idx), kw = _prefill()
    for scale in (1, np.float32(0.25), 0.0, -0.5):
        check_inputs(q, k, v, idx, sm_scale=scale, **kw)
    one = idx[:, :1].t().contiguous().t()  # topk 1 with stride(-1) 6
    assert one.stride(-1) != 1
    check_inputs(q, k, v, one, lengths=kw["lengths"])
    check_inputs(q[:0], k, v, idx[:0])
    check_inputs(q, k[:0], v[:0], idx)
    check_inputs(q, k, v, idx, lengths=torch.cat([kw["lengths"], kw["lengths"]])[::2])


# ============================================================================ NaN and inf

def _contract(q: Any, k: Any, v: Any, idx: Any, lengths: Any, sm_scale: float | None = None
              ) -> Any:
    """The op docstring's "Non-finite values" rules, read literally, per (row, head), float64
    (prefill rows)."""
    total_q, hq, d = q.shape
    num_slots, hkv, _ = k.shape
    group = hq // hkv
    scale = d ** -0.5 if sm_scale is None else sm_scale
    out = torch.zeros(total_q, hq, d, dtype=torch.float64)
    for r in range(total_q):
        n = max(0, min(int(lengths[r]), idx.shape[1]))
        slots = [int(s) for s in idx[r, :n] if 0 <= int(s) < num_slots]
        for j in range(hq):
            h = j // group
            if not slots:
                continue  # nothing valid: zeros, whatever q holds
            s = [scale * float((q[r, j].double() * k[e, h].double()).sum()) for e in slots]
            if any(math.isnan(x) or x == INF for x in s):
                out[r, j] = NAN
                continue
            m = max(s)
            w = [0.0 if x == -INF else math.exp(x - m) for x in s]
            tot = sum(w) or 1.0
            acc = torch.zeros(d, dtype=torch.float64)
            for we, e in zip(w, slots, strict=True):
                acc = acc + we * v[e, h].double()  # 0 * inf and 0 * NaN are NaN
            out[r, j] = acc / tot
    return out


def _hazards(dtype: Any = torch.float32, seed: int = 3) -> tuple[tuple[Any, ...], dict]:
    """A prefill call with every non-finite hazard of the rules, at known places."""
    (q, k, v, idx), kw = _prefill(seed, dtype=torch.float64)
    n_slots = k.shape[0]
    idx = torch.where(idx == n_slots - 1, n_slots - 2, idx)  # the last slot: selected nowhere
    kw["lengths"][4] = idx.shape[1]

    def valid(r: int) -> list[int]:
        row = idx[r, : max(0, min(int(kw["lengths"][r]), idx.shape[1]))]
        return sorted({int(s) for s in row if 0 <= int(s) < n_slots})

    sel = valid(4)
    only0 = sorted(set(valid(0)) - set(sel))
    assert len(sel) >= 5 and only0
    k[n_slots - 1] = NAN  # NaN and inf in a cache slot no row selects: never read
    v[n_slots - 1, 0, 1::2], v[n_slots - 1, 1] = NAN, INF
    q[0, 1, 3] = NAN  # a NaN query head: that row-head all NaN
    q[1, 2, 0] = NAN  # ... of an empty row (lengths 0): zeros
    q[5, 4] = NAN  # ... of an all-invalid row: zeros
    k[sel[0], 1, 5] = NAN  # a NaN K row: KV head 1's heads of every row selecting it
    v[sel[-1], 0, 7] = NAN  # a NaN V element: that element of KV head 0's heads selecting it
    v[sel[1], 0, 2] = INF  # an infinite V element: inf there (positive weights; 0 x inf: NaN)
    k[sel[4], 1, 0] = -INF  # -inf or +inf scores, by the sign of the query element
    k[:, 0, 0] = k[:, 0, 0].abs() + 0.1
    q[4, 0, 0] = -INF  # every score of row 4 head 0 -inf: weights 0 (but 0 x NaN at V's NaN)
    q[0, 2, 0] = -INF  # row 0 head 2: -inf scores, and one -inf x 0 = NaN score: NaN
    k[only0[0], 0, 0] = 0.0
    q[2, 5, 0] = INF  # a +inf query element: +inf (or NaN) scores: NaN where it sees a row
    return (q.to(dtype), k.to(dtype), v.to(dtype), idx), kw


def test_the_reference_follows_the_non_finite_rules() -> None:
    (q, k, v, idx), kw = _hazards(torch.float64)
    got = sparse_prefill_reference(q, k, v, idx, **kw)
    want = _contract(q, k, v, idx, kw["lengths"])
    assert got.isnan().any() and got.isinf().any() and (got[1] == 0).all()
    torch.testing.assert_close(got, want, atol=1e-12, rtol=1e-12, equal_nan=True)
    assert compare(got, want) is None
    # before, the reference turned a NaN query head into zeros
    assert got[0, 1].isnan().all() and torch.isfinite(got[0, 0]).all()


def test_minus_inf_scores_are_weights_of_zero() -> None:
    # a valid entry whose score is -inf is skipped (finite V); every entry -inf: zeros
    (q, k, v, idx), kw = _prefill(4, dtype=torch.float64)
    kw["lengths"] = None
    idx = torch.arange(8, dtype=torch.int32).repeat(q.shape[0], 1)
    k[3, 0, 0] = -INF
    q[:, :, 0] = q[:, :, 0].abs() + 0.1
    got = sparse_prefill_reference(q, k, v, idx, **kw)
    kept = idx[:, [0, 1, 2, 4, 5, 6, 7]].contiguous()
    torch.testing.assert_close(got[:, :3], sparse_prefill_reference(q, k, v, kept)[:, :3],
                               atol=1e-12, rtol=1e-12)
    k[:8, :, 0] = -INF
    got = sparse_prefill_reference(q, k, v, idx)
    assert (got == 0).all()


NAN_CONFIGS = [
    pytest.param(BASE, torch.float32, id="plain-fp32"),
    pytest.param(BASE, torch.float16, id="plain-fp16"),
    pytest.param({**BASE, "SPLIT_QK": 2, "SPLIT_V": 2, "LEAN": 1, "OFFS32": 1},
                 torch.float16, id="split-lean-fp16"),
    pytest.param({**BASE, "SLOT_ORDER": 1}, torch.float32, id="slot-order"),
]


@pytest.mark.parametrize("cfg,dtype", NAN_CONFIGS)
def test_the_triton_kernels_follow_the_non_finite_rules(cfg: dict[str, Any], dtype: Any,
                                                        poisoned: None) -> None:
    (q, k, v, idx), kw = _hazards(dtype)
    out = sparse_prefill_triton(q, k, v, idx, config=cfg, **kw)
    ref = sparse_prefill_reference(q.double(), k.double(), v.double(), idx, **kw)
    assert ref.isnan().any() and ref.isinf().any()
    assert compare(out, ref) is None, compare(out, ref)
    assert torch.equal(out.isnan(), ref.isnan()), "NaN exactly where the contract says"


def test_the_chunk_kernels_follow_the_non_finite_rules(poisoned: None) -> None:
    (q, k, v, idx), kw = _chunk(5, dtype=torch.float64)
    q[0, 1] = NAN
    q[1, :, 0] = INF
    v[:, 0, 3] = NAN  # every V row of KV head 0, element 3: NaN wherever head 0 sees a row
    ref = sparse_prefill_reference(q, k, v, idx, **kw)
    assert ref.isnan().any() and torch.isfinite(ref).any()
    for mode in ("fused", "pretranslate", "staged"):
        for dtype in (torch.float32, torch.float16) if mode == "fused" else (torch.float32,):
            out = sparse_prefill_triton(q.to(dtype), k.to(dtype), v.to(dtype), idx,
                                        config={**BASE, "CHUNK_MODE": mode}, **kw)
            assert compare(out, ref) is None, (mode, dtype, compare(out, ref))


def test_dense_follows_the_rules_for_what_it_selects(poisoned: None) -> None:
    (q, k, v, idx), kw = _hazards(torch.float16)
    # the non-finite values of q only: DENSE reads unselected K/V inside a tile's span
    finite = {"nan": 0.0, "posinf": 0.0, "neginf": 0.0}
    k[:, :, :], v[:, :, :] = torch.nan_to_num(k, **finite), torch.nan_to_num(v, **finite)
    cfg = {**BASE, "DENSE": 10**6, "DENSE_TILE": "16x16x4x2"}
    out = sparse_prefill_triton(q, k, v, idx, config=cfg, **kw)
    ref = sparse_prefill_reference(q.double(), k.double(), v.double(), idx, **kw)
    assert compare(out, ref) is None, compare(out, ref)


@pytest.mark.parametrize("cfg", [
    pytest.param({**BASE, "DENSE": 10**6, "DENSE_TILE": "16x16x4x2"}, id="dense"),
    pytest.param({**BASE, "UNION": 10**6, "DENSE_TILE": "16x16x4x2"}, id="union"),
])
def test_row_tiles_never_let_an_unselected_nan_in(cfg: dict[str, Any], poisoned: None) -> None:
    # (DENSE was a strict xfail here until its P V masked V's non-finite values by count.)
    (q, k, v, idx), kw = _prefill(6, dtype=torch.float16, num_slots=30)
    kw["lengths"] = None
    idx = torch.arange(0, 24, dtype=torch.int32).repeat(q.shape[0], 1)
    idx[:, 5] = 7  # slot 5, inside every row's span, is selected by no row
    v[5] = NAN
    idx[1::2, 9] = 7  # slot 9: selected by the even rows only, NaN / inf in two columns
    v[9, :, 2] = NAN
    v[9, :, 4] = INF
    k[11] = NAN  # slot 11 (K): selected by rows 0 and 3 only (rows 1 and 5 select neither)
    idx[1::3, 11] = 7
    idx[2::3, 11] = 7
    out = sparse_prefill_triton(q, k, v, idx, config=cfg, **kw)
    ref = sparse_prefill_reference(q.double(), k.double(), v.double(), idx, **kw)
    assert ref.isnan().any() and torch.isfinite(ref).any()
    assert compare(out, ref) is None, compare(out, ref)
    assert torch.equal(out.isnan() & ~ref.isinf(), ref.isnan()), "NaN where the contract says"


def test_compare_holds_nan_and_inf_to_the_contract() -> None:
    ref = torch.zeros(3, 2, 4, dtype=torch.float64)
    ref[0, 1] = NAN
    ref[1, 0, 2] = INF
    ref[1, 1, 3] = -INF
    same = ref.clone().float()
    assert compare(same, ref) is None and max_abs_error(same, ref) == 0.0
    nan_for_inf = same.clone()
    nan_for_inf[1, 0, 2] = NAN  # an infinity's weight rounded to 0: NaN is accepted
    assert compare(nan_for_inf, ref) is None
    for where, value, rule in (((0, 1, 0), 0.0, "the contract says NaN"),
                               ((2, 0, 0), NAN, "the contract says finite"),
                               ((2, 0, 1), INF, "the contract says finite"),
                               ((1, 0, 2), -INF, "the contract says inf or NaN"),
                               ((1, 0, 2), 1.0, "the contract says inf or NaN")):
        bad = same.clone()
        bad[where] = value
        msg = compare(bad, ref)
        assert msg is not None and rule in msg and str(where) in msg, (where, value, msg)
        assert max_abs_error(bad, ref) == INF
    off = same.clone()
    off[2, 1, 1] = 0.5
    assert "max |out - ref| = 0.5" in (compare(off, ref) or "")
    assert max_abs_error(off, ref) == 0.5


# ============================================================================ strides

def _strided(t: Any, gap: Any) -> Any:
    """``t``'s values in a view on ``t``'s device that is strided on every axis but the last (a
    buffer twice as tall, the other axes padded) whose gaps hold ``gap``; 1-D: every second or
    third element."""
    if t.dim() == 1:
        step = 3 if t.numel() % 2 else 2
        buf = torch.full((step * t.numel() + 1,), gap, dtype=t.dtype, device=t.device)
        view = buf[1::step][: t.numel()]
    else:
        shape = (2 * t.shape[0], *(n + 3 for n in t.shape[1:-1]), t.shape[-1] + 5)
        buf = torch.full(shape, gap, dtype=t.dtype, device=t.device)
        view = buf[(slice(None, None, 2), *(slice(0, n) for n in t.shape[1:]))]
    view.copy_(t)
    assert torch.equal(view, t) and not view.is_contiguous()
    return view


_GAPS = {"q": NAN, "k": NAN, "v": NAN, "indices": 0, "lengths": 10**6, "cu_seqlens_q": 10**6,
         "prefix_lens": 10**6, "page_table": 0}


def _all_strided(args: tuple[Any, ...], kw: dict[str, Any]) -> tuple[tuple[Any, ...], dict]:
    names = ("q", "k", "v", "indices")
    sargs = tuple(_strided(t, _GAPS[n]) for n, t in zip(names, args, strict=True))
    skw = {n: (_strided(t, _GAPS[n]) if isinstance(t, torch.Tensor) else t)
           for n, t in kw.items()}
    return sargs, skw


STRIDE_PREFILL = [
    pytest.param(BASE, torch.float32, id="plain"),
    pytest.param({**BASE, "SPLIT_QK": 2, "SPLIT_V": 2, "LEAN": 1, "OFFS32": 1},
                 torch.float16, id="split-lean-fp16"),
    pytest.param({**BASE, "REVERSE_ROWS": 1}, torch.float32, id="rev"),
    pytest.param({**BASE, "SLOT_ORDER": 1}, torch.float32, id="slot-order"),
    pytest.param({**BASE, "DENSE": 10**6, "DENSE_TILE": "16x16x4x2"}, torch.float16,
                 id="dense"),
    pytest.param({**BASE, "UNION": 10**6, "DENSE_TILE": "16x16x4x2"}, torch.float16,
                 id="union"),
]


@pytest.mark.parametrize("cfg,dtype", STRIDE_PREFILL)
def test_prefill_kernels_read_every_argument_at_its_strides(cfg: dict[str, Any], dtype: Any,
                                                            poisoned: None) -> None:
    args, kw = _prefill(7, dtype=dtype)
    ref = sparse_prefill_reference(*(a.double() if a.is_floating_point() else a for a in args),
                                   **kw)
    sargs, skw = _all_strided(args, kw)
    out = sparse_prefill_triton(*sargs, config=cfg, **skw)
    assert compare(out, ref) is None, compare(out, ref)
    assert torch.isfinite(out).all()
    assert compare(sparse_prefill_reference(*sargs, **skw), ref) is None


@pytest.mark.parametrize("mode,extra,dtype", [
    ("fused", {}, torch.float32),
    ("fused", {"SPLIT_QK": 2, "SPLIT_V": 2, "LEAN": 1}, torch.float16),
    ("pretranslate", {}, torch.float32),
    ("pretranslate", {"SLOT_ORDER": 1}, torch.float32),
    ("pretranslate", {"DENSE": 10**6, "DENSE_TILE": "16x16x4x2"}, torch.float16),
    ("pretranslate", {"UNION": 10**6, "DENSE_TILE": "16x16x4x2"}, torch.float16),
    ("staged", {}, torch.float32),
])
def test_chunk_kernels_read_every_argument_at_its_strides(mode: str, extra: dict[str, Any],
                                                          dtype: Any, poisoned: None) -> None:
    args, kw = _chunk(8, dtype=dtype)
    ref = sparse_prefill_reference(*(a.double() if a.is_floating_point() else a for a in args),
                                   **kw)
    sargs, skw = _all_strided(args, kw)
    out = sparse_prefill_triton(*sargs, config={**BASE, "CHUNK_MODE": mode, **extra}, **skw)
    assert compare(out, ref) is None, compare(out, ref)
    assert compare(sparse_prefill_reference(*sargs, **skw), ref) is None


@pytest.mark.parametrize("name", ["lengths", "cu_seqlens_q", "prefix_lens"])
def test_one_strided_int_view_at_a_time(name: str, poisoned: None) -> None:
    # the repro: only the 1-D view is strided (max abs error 0.6-2.7 before)
    args, kw = _chunk(9) if name != "lengths" else _prefill(9)
    ref = sparse_prefill_reference(*args, **kw)
    skw = {**kw, name: _strided(kw[name], _GAPS[name])}
    out = sparse_prefill_triton(*args, config=BASE, **skw)
    assert compare(out, ref) is None, compare(out, ref)


@pytest.mark.gpu
def test_strided_calls_under_cuda_graph_capture() -> None:
    # the check and the strided copies are capture-safe: captured, replayed, right
    args, kw = _chunk(10, dtype=torch.bfloat16)
    args = tuple(a.cuda() for a in args)
    kw = {n: (t.cuda() if isinstance(t, torch.Tensor) else t) for n, t in kw.items()}
    sargs, skw = _all_strided(args, kw)
    cfg = {**BASE, "CHUNK_MODE": "pretranslate"}
    ref = sparse_prefill_reference(*args, out_dtype=torch.float32, **kw)
    sparse_prefill_triton(*sargs, config=cfg, **skw)  # compiled before the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = sparse_prefill_triton(*sargs, config=cfg, **skw)
    graph.replay()
    torch.cuda.synchronize()
    assert compare(out, ref) is None
