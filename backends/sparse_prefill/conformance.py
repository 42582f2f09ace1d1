"""Conformance cases of ``sparse_prefill``: the inputs every implementation must get right.

The conformance kit (``pytest --kreg-conformance PLUGIN``, :mod:`registry.testing`) runs each
case against each implementation a plugin registers and compares the result with the reference
through :mod:`backends.sparse_prefill.compare`. ``OpSpec.conformance`` names this module.

A case is a name, a one-line statement of what it pins, and ``make(device, dtype, seed) ->
(args, kwargs)`` building a ``dispatch`` call. Sizes are small so that the Triton interpreter runs
every case in well under a second on a CPU; the shapes still cover what the contract promises
(invalid and duplicate indices, empty rows, lengths, ragged chunk batches with page tables and
prefixes that are not multiples of the page size, both TP rank shapes and the seed head dim,
NaN and inf where the op's rules say what comes out, every tensor argument as a strided view).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["CASES", "DTYPES", "Case", "chunk_call", "prefill_call"]

Call = tuple[tuple[Any, ...], dict[str, Any]]

#: dtypes to run per device type. The interpreter's bfloat16 ``tl.dot`` is broken, so CPU runs
#: float32 and float16 only.
DTYPES: dict[str, tuple[str, ...]] = {"cpu": ("float32", "float16"),
                                      "cuda": ("bfloat16", "float16", "float32")}


@dataclass(frozen=True)
class Case:
    name: str
    doc: str
    make: Callable[[Any, Any, int], Call]


def _gen(seed: int) -> Any:
    import torch

    return torch.Generator().manual_seed(seed)


def _qkv(g: Any, device: Any, dtype: Any, total_q: int, group: int, hkv: int, d: int,
         num_slots: int, scale: float = 1.0) -> tuple[Any, Any, Any]:
    import torch

    q = torch.randn(total_q, group * hkv, d, generator=g) * scale
    k = torch.randn(num_slots, hkv, d, generator=g)
    v = torch.randn(num_slots, hkv, d, generator=g)
    return (q.to(device=device, dtype=dtype), k.to(device=device, dtype=dtype),
            v.to(device=device, dtype=dtype))


def _i32(x: Any, device: Any) -> Any:
    import torch

    return torch.as_tensor(x, dtype=torch.int32).to(device).contiguous()


def _prefill(*, total_q: int = 8, group: int = 6, hkv: int = 1, d: int = 64, topk: int = 32,
             num_slots: int = 48, lo: int = 0, hi: int | None = None, lengths: Any = None,
             edit: Callable[[Any, Any], None] | None = None, scale: float = 1.0,
             sm_scale: float | None = None) -> Callable[[Any, Any, int], Call]:
    """A ``kind="prefill"`` case: random slots in ``[lo, hi)``, then ``edit(indices, g)``."""

    def make(device: Any, dtype: Any, seed: int) -> Call:
        import torch

        g = _gen(seed)
        q, k, v = _qkv(g, device, dtype, total_q, group, hkv, d, num_slots, scale)
        idx = torch.randint(lo, num_slots if hi is None else hi, (total_q, topk), generator=g,
                            dtype=torch.int64)
        if edit is not None:
            edit(idx, g)
        kwargs: dict[str, Any] = {"kind": "prefill"}
        if lengths is not None:
            kwargs["lengths"] = _i32(lengths(topk, total_q), device)
        if sm_scale is not None:
            kwargs["sm_scale"] = sm_scale
        return (q, k, v, _i32(idx, device)), kwargs

    return make


def _invalid(idx: Any, g: Any) -> None:
    import torch

    n_slots = 48
    bad = torch.tensor([-1, -7, n_slots, n_slots + 5, 2**31 - 1, -(2**31)], dtype=torch.int64)
    mask = torch.rand(idx.shape, generator=g) < 0.35
    pick = bad[torch.randint(0, bad.numel(), idx.shape, generator=g)]
    idx[mask] = pick[mask]
    idx[0, :] = -1  # a row with nothing valid: zeros
    idx[1, -1] = n_slots  # the last entry out of range


def _duplicates(idx: Any, g: Any) -> None:
    idx[:, 1::2] = idx[:, 0::2][:, : idx[:, 1::2].shape[1]]  # every slot listed twice
    idx[2, :] = 5  # one slot listed topk times
    idx[3, :4] = idx[3, 4:8]


def _empty(idx: Any, g: Any) -> None:
    idx[1, :] = -1
    idx[4, :] = 48  # all out of range


def _chunk(*, q_rows: tuple[int, ...], prefixes: tuple[int, ...], page_size: int,
           group: int = 6, hkv: int = 1, d: int = 64, topk: int = 24, unmapped: int = 0,
           lengths: bool | Callable[[int, int], Any] = True) -> Callable[[Any, Any, int], Call]:
    """A ``kind="chunk"`` case: requests of ``q_rows`` new rows after ``prefixes`` cached
    tokens, pages scattered through the cache, ``unmapped`` trailing logical pages set to -1;
    ``lengths``: random per row (True), none (False), or ``lengths(topk, total_q)``."""

    def make(device: Any, dtype: Any, seed: int) -> Call:
        import torch

        g = _gen(seed)
        nreq = len(q_rows)
        total_q = sum(q_rows)
        tokens = [p + r for p, r in zip(prefixes, q_rows, strict=True)]
        pages = [-(-t // page_size) for t in tokens]
        max_pages = max(pages) + 1
        phys = torch.randperm(sum(pages) + 3, generator=g)  # scattered, some pages unused
        pt = torch.full((nreq, max_pages), -1, dtype=torch.int64)
        at = 0
        for b, n in enumerate(pages):
            pt[b, :n] = phys[at:at + n]
            at += n
            if unmapped and n > unmapped:
                pt[b, n - unmapped:n] = -1
        num_slots = (sum(pages) + 3) * page_size
        q, k, v = _qkv(g, device, dtype, total_q, group, hkv, d, num_slots)
        cu = [0]
        for r in q_rows:
            cu.append(cu[-1] + r)
        idx = torch.empty((total_q, topk), dtype=torch.int64)
        for b in range(nreq):
            for r in range(q_rows[b]):
                pos = prefixes[b] + r
                # mostly visible positions, some in the future or negative (skipped)
                idx[cu[b] + r] = torch.randint(-2, pos + 4, (topk,), generator=g)
        kwargs: dict[str, Any] = {
            "kind": "chunk", "cu_seqlens_q": _i32(cu, device),
            "prefix_lens": _i32(prefixes, device),
            "page_table": _i32(pt, device), "page_size": page_size, "max_q": max(q_rows)}
        if callable(lengths):
            kwargs["lengths"] = _i32(lengths(topk, total_q), device)
        elif lengths:
            lens = torch.randint(0, topk + 1, (total_q,), generator=g)
            lens[0] = topk
            kwargs["lengths"] = _i32(lens, device)
        return (q, k, v, _i32(idx, device)), kwargs

    return make


def _non_finite() -> Callable[[Any, Any, int], Call]:
    """NaN and inf where the op's rules (``backends.sparse_prefill``, "Non-finite values") say
    what comes out: in unused cache slots (never read), in a query head (its row-head NaN; of
    an empty row: zeros), in a selected K row (NaN for its KV head's query heads), in selected V
    elements (NaN or inf at that element), -inf scores (weights 0; all -inf: zeros) and +inf
    ones (NaN)."""

    def make(device: Any, dtype: Any, seed: int) -> Call:
        import torch

        nan, inf = float("nan"), float("inf")
        g = _gen(seed)
        total_q, group, hkv, d, topk, n_slots = 8, 3, 2, 64, 32, 48
        q, k, v = _qkv(g, "cpu", torch.float32, total_q, group, hkv, d, n_slots)
        idx = torch.randint(0, n_slots - 1, (total_q, topk), generator=g, dtype=torch.int64)
        idx[:, ::7] = -1
        idx[1] = -1  # nothing valid
        idx[(idx >= 10) & (idx <= 12)] = 13
        idx[2, 0], idx[3, 0], idx[4, 0] = 10, 11, 12  # each selected by one row only
        k[n_slots - 1], v[n_slots - 1] = nan, inf  # a slot no row selects: never read
        q[0, 1, 3] = nan  # row 0, head 1: NaN
        q[1] = nan  # an empty row: zeros all the same
        k[10, 1, 5] = nan  # row 2: KV head 1's query heads NaN
        v[11, 0, 7] = nan  # row 3: element 7 of KV head 0's query heads NaN
        v[12, 0, 2] = inf  # row 4: element 2 of KV head 0's query heads inf
        k[:, 0, 0] = k[:, 0, 0].abs() + 0.1
        q[5, 0, 0] = -inf  # row 5, head 0: every score -inf: weights 0
        q[6, 4, 0] = inf  # row 6, head 4: +inf (or NaN) scores: NaN
        q, k, v = (t.to(device=device, dtype=dtype) for t in (q, k, v))
        return (q, k, v, _i32(idx, device)), {"kind": "prefill"}

    return make


def _strided(base: Callable[[Any, Any, int], Call]) -> Callable[[Any, Any, int], Call]:
    """``base``'s call with every tensor argument a non-contiguous view (rows of a buffer twice
    as tall, padded axes; 1-D: every second or third element) whose gaps hold poison (NaN, huge
    ints). Paddings are multiples of 16 elements, so 16-byte aligned kernels can take it."""

    def strided(t: Any, gap: Any) -> Any:
        import torch

        if t.dim() == 1:
            step = 3 if t.numel() % 2 else 2
            buf = torch.full((step * t.numel() + 1,), gap, dtype=t.dtype, device=t.device)
            view = buf[1::step][: t.numel()]
        else:
            shape = (2 * t.shape[0], *(n + 2 for n in t.shape[1:-1]), t.shape[-1] + 16)
            buf = torch.full(shape, gap, dtype=t.dtype, device=t.device)
            view = buf[(slice(None, None, 2), *(slice(0, n) for n in t.shape[1:]))]
        view.copy_(t)
        return view

    def make(device: Any, dtype: Any, seed: int) -> Call:
        args, kwargs = base(device, dtype, seed)
        gaps = {"indices": 0, "lengths": 1 << 20, "cu_seqlens_q": 1 << 20,
                "prefix_lens": 1 << 20, "page_table": 0}
        q, k, v, idx = args
        out = (strided(q, float("nan")), strided(k, float("nan")), strided(v, float("nan")),
               strided(idx, gaps["indices"]))
        return out, {n: (strided(t, gaps[n]) if n in gaps and t is not None else t)
                     for n, t in kwargs.items()}

    return make
def prefill_call(*, total_q: int = 8, group: int = 6, hkv: int = 1, d: int = 64, topk: int = 32,
                 num_slots: int = 48, lengths: Callable[[int, int], Any] | None = None,
                 scale: float = 1.0, sm_scale: float | None = None
                 ) -> Callable[[Any, Any, int], Call]:
    """``make(device, dtype, seed)`` of a ``kind="prefill"`` case, for a plugin's own cases
    (``Implementation.conformance_cases``) at the shapes its capability allows: ``total_q``
    rows of ``group * hkv`` heads of ``d``, ``topk`` random slots of ``num_slots`` per row,
    ``lengths(topk, total_q)`` valid leading entries per row (None: all ``topk``)."""
    return _prefill(total_q=total_q, group=group, hkv=hkv, d=d, topk=topk, num_slots=num_slots,
                    lengths=lengths, scale=scale, sm_scale=sm_scale)


def chunk_call(*, q_rows: tuple[int, ...], prefixes: tuple[int, ...], page_size: int,
               group: int = 6, hkv: int = 1, d: int = 64, topk: int = 24, unmapped: int = 0,
               lengths: bool | Callable[[int, int], Any] = True
               ) -> Callable[[Any, Any, int], Call]:
    """``make(device, dtype, seed)`` of a ``kind="chunk"`` case (see :func:`prefill_call`):
    requests of ``q_rows`` rows after ``prefixes`` cached tokens in pages of ``page_size``."""
    return _chunk(q_rows=q_rows, prefixes=prefixes, page_size=page_size, group=group, hkv=hkv,
                  d=d, topk=topk, unmapped=unmapped, lengths=lengths)


def _ragged_lengths(topk: int, total_q: int) -> list[int]:
    base = [0, 1, topk - 1, topk, 2, topk // 2, 3, topk - 2]
    return [base[i % len(base)] for i in range(total_q)]


CASES: tuple[Case, ...] = (
    Case("random", "in-range slots, lengths omitted (= topk)", _prefill()),
    Case("invalid_indices", "negative and out-of-range slots are skipped; an all-invalid row "
         "is zeros", _prefill(edit=_invalid)),
    Case("duplicates", "a slot listed twice counts twice", _prefill(edit=_duplicates)),
    Case("empty_rows", "rows with lengths 0 or nothing valid yield zeros",
         _prefill(edit=_empty, lengths=lambda t, n: [t, 0, t, 5, t, 0, 1, t])),
    Case("lengths", "entries past lengths[r] are skipped (0, 1, topk-1, topk), topk not a "
         "multiple of the tile", _prefill(topk=37, lengths=_ragged_lengths)),
    Case("rank_12x1", "rank shape group_size 12, one KV head", _prefill(group=12, hkv=1)),
    Case("rank_12x2", "rank shape group_size 12, two KV heads (head j reads KV head j // 12)",
         _prefill(group=12, hkv=2, total_q=6)),
    Case("head_dim_256", "the seed head dim", _prefill(d=256, topk=20, total_q=4)),
    Case("head_dim_80", "a head dim that is not a power of two", _prefill(d=80, topk=20)),
    Case("sm_scale_large_logits", "explicit sm_scale and large logits (online-softmax rescaling)",
         _prefill(scale=6.0, sm_scale=0.3)),
    Case("chunk_ragged", "chunk: ragged requests, page size 1, future/negative positions skipped",
         _chunk(q_rows=(3, 1, 5), prefixes=(4, 0, 9), page_size=1)),
    Case("chunk_paged_prefix", "chunk: page size 4, prefixes not multiples of 4, unmapped pages",
         _chunk(q_rows=(2, 4, 1), prefixes=(5, 13, 7), page_size=4, unmapped=1)),
    Case("non_finite", "NaN / inf in q, selected K and V rows, unused slots: NaN exactly where "
         "the op's rules say, zeros for empty rows", _non_finite()),
    Case("strided_views", "chunk: every tensor argument a strided view (1-D lengths, "
         "cu_seqlens_q, prefix_lens included) over poisoned gaps",
         _strided(_chunk(q_rows=(3, 1, 4), prefixes=(6, 0, 9), page_size=4, unmapped=1))),
)
