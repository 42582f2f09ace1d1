"""Benchmark library for ``sparse_prefill`` and the click command ``bench_command``.

``kreg bench sparse_prefill`` runs it (``OpSpec.bench`` names :data:`bench_command`); every provider
goes through the one harness, :func:`registry.tuning.measure`, and ``--json`` prints its report.
Importing this module imports neither torch nor Triton (``kreg --help`` stays fast); both load
inside the functions that need them.

Inputs (deterministic, :func:`make_inputs`): q, k, v ~ N(0, 1) from a seeded generator (the
same tensors whatever the index set). Two index sets (``--indices``, built by
``backends/sparse_prefill/indices.py``), both with ``n = min(topk, V)`` valid leading entries for
a row of ``V`` visible positions, ``-1`` after them and ``lengths[r] = n`` (so rows whose visible
context is shorter than ``topk`` stream less, as in the seed):

* ``walk`` (the default): an *affine walk over each row's visible range*: ``t_j = (r * 7919 + j
  * 1000003) mod V`` for ``j < n`` (1000003 is a prime larger than any ``V`` here, so the walk
  visits ``n`` distinct positions in a scattered order). Neighbouring rows share about what two
  random subsets share.
* ``topk``: the real top-k of synthetic indexer scores, ascending as an indexer emits them:
  ``sqrt(overlap) * importance[t] + sqrt(1 - overlap) * noise[r, t]`` (a per-token importance
  shared by the rows of a request, per-row noise), the last ``--window`` visible positions
  always selected (``indices.topk_indices``). ``--overlap`` (a comma list, in [0, 1], default
  0.95) is the correlation of two rows' scores: 0 gives the walk's overlap, 1 near-identical
  rows.

Each case's measured neighbouring-row overlap (``indices.overlap_stats`` on the valid entries:
the mean Jaccard of rows r and r + 1, the mean union of 16 consecutive rows over topk; within a
request) is in the JSON record's ``extra`` and the table's ``# note`` line.

* ``prefill``: ``num_slots = kv_len``; row ``r`` sees ``V = min(kv_len, max(0, kv_len - total_q)
  + r + 1)`` slots (``kv_len == total_q`` is the seed's prefix-free ramp).
* ``chunk``: requests of ``req_lens`` rows (default one request of ``total_q`` rows); each has a
  context of ``kv_len`` tokens, so ``prefix = kv_len - rows`` and row ``i`` of it is at position
  ``prefix + i`` and sees ``V = prefix + i + 1`` tokens. The KV cache holds ``num_requests *
  kv_len`` slots; request ``b``'s page table maps its pages to a scattered permutation of its
  own page range (``page = b * P + (i * 1000003 + 17) mod P``), with ``page_size`` tokens a page.

Providers (``--providers``, comma separated):

* ``reference``: the torch reference (fp32 math), in its own short window.
* ``gather-sdpa``: materialize the selected K/V rows, then torch SDPA with a boolean mask (row
  chunks of 512), in its own short window.
* ``table``: the Triton kernel at the generic table geometry
  (``plugins.generic.sparse_prefill_table_config``).
* ``geometry=BMxBNxWxS[:opt...]``: the Triton kernel at a forced geometry; options ``pre``
  (CHUNK_MODE=pretranslate), ``stage`` (CHUNK_MODE=staged), ``rev`` (REVERSE_ROWS=1),
  ``split2`` (SPLIT_QK=2), ``v2`` (SPLIT_V=2), ``lean`` (LEAN=1), ``o32`` (OFFS32=1), ``ord1``
  (SLOT_ORDER=1), ``denseN`` (DENSE=N), ``unionN`` (UNION=N), ``uc`` (UNION_PREP=cuda: the
  union's pre-pass in one CUDA kernel), ``uws`` (UNION_ENGINE=gluon_ws: the union tiles on the
  warp-specialized Gluon kernel; ``uwso``: gluon_ws_overlap, its softmax under the PV MMAs;
  ``uws2``: gluon_ws_2wg, two consumer warpgroups),
  ``xh`` (TILE_HEADS=group: row tiles of the group's heads exactly), ``dtBMxBNxWxS``
  (DENSE_TILE), ``utBMxBNxWxS`` (UNION_TILE: the union tiles' own geometry, e.g.
  ``dense250:union300:ut128x64x8x2``),
  ``udN`` (UNION_DENSE=N: the union path may take DENSE's tiles, e.g. ``dense250:union300:ud80``),
  ``rN`` (MAXNREG=N), ``gl`` (ENGINE=gluon: the Gluon kernel, BM its query lines, S its ring
  stages), ``wg`` (ENGINE=gluon_wgmma: the Gluon wgmma kernel, BMx64x4x2),
  e.g. ``geometry=16x32x4x3:pre:r96``, ``geometry=8x16x2x1:gl:o32``,
  ``geometry=16x64x4x2:wg:o32:r96``.
* ``h200``: the measured H200 family for (kind, group) as its policy configures it at the
  case's KV length and rows (``plugins.nvidia_hopper.family_config``: slot ordering from KV 64K,
  dense tiles for prefill up to KV 8K, the Gluon kernels for prefill at KV 8K-64K on Triton
  3.6), forced whatever the device.
* ``auto`` and implementation names, optionally with ``:measure``: through the registry
  (``registry.select`` for the decision, ``registry.dispatch`` under ``registry.override``).
* ``flashinfer-paged``: FlashInfer's raw paged attention, what a framework would call instead
  of kreg: ``BatchDecodeWithPagedKVCacheWrapper(use_tensor_cores=True)`` with ``page_size`` 1,
  each row a request whose pages are its valid slots (``backends.sparse_prefill.paged``),
  ``plan()`` once before the window and only ``run()`` timed (captured in the CUDA graph with
  ``--graphs`` where FlashInfer allows it); checked against the reference like every provider.
  The registry implementation ``flashinfer.sparse_prefill`` also builds the page list and
  copies ``indptr`` to the host on every call. Needs FlashInfer importable.

Timed providers alternate in one window (``registry.tuning.timing.interleaved_median_ms``; with
``--graphs`` as CUDA-graph replays, a provider that cannot be captured timed plainly). Every
provider is checked against the fp32 reference on every run (output memory poisoned with NaN
first); the command exits non-zero when one is past ``error_bound(dtype)``.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from typing import Any

import click

from backends.sparse_prefill.indices import topk_indices, walk_indices

__all__ = ["BenchCase", "bench_command", "index_overlap", "make_inputs", "parse_provider",
           "run_case", "workload_of"]

_P = 1000003
_UNTIMED = ("reference", "gather-sdpa")


@dataclass
class BenchCase:
    kind: str = "chunk"
    group_size: int = 6
    kv_heads: int = 1
    kv_len: int = 8192
    total_q: int = 8192
    req_lens: tuple[int, ...] | None = None
    topk: int = 2051
    head_dim: int = 256
    dtype: str = "bfloat16"
    page_size: int = 1
    seed: int = 0
    extra: dict[str, Any] = field(default_factory=dict)
    indices: str = "walk"
    overlap: float = 0.95
    window: int = 64

    def label(self) -> str:
        req = f" reqs={len(self.req_lens)}" if self.req_lens and len(self.req_lens) > 1 else ""
        idx = f" topk@{self.overlap:g}" if self.indices == "topk" else ""
        return (f"{self.kind} g={self.group_size} hkv={self.kv_heads} kv={self.kv_len} "
                f"q={self.total_q}{req}{idx}")

    def topk_params(self) -> Any:
        """The synthetic indexer's parameters (``indices.TopkParams``) of an ``indices="topk"``
        case."""
        from backends.sparse_prefill.indices import TopkParams

        return TopkParams(overlap=self.overlap, window=self.window, seed=self.seed)


def make_inputs(case: BenchCase, device: Any = None) -> dict[str, Any]:
    """Deterministic inputs of ``case`` (see the module doc): the call's tensors and kwargs."""
    import torch

    dev = torch.device(device) if device is not None else (
        torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu"))
    dt = getattr(torch, case.dtype)
    gen = torch.Generator(device="cpu").manual_seed(case.seed)
    hq = case.group_size * case.kv_heads
    tq, kv, topk = case.total_q, case.kv_len, case.topk
    r = torch.arange(tq, device=dev, dtype=torch.int64)
    kw: dict[str, Any] = {"kind": case.kind}
    if case.indices not in ("walk", "topk"):
        raise click.BadParameter(f"indices={case.indices!r}: expected walk or topk")
    b_of_row = None
    nreq = 1
    if case.kind == "prefill":
        num_slots = kv
        vis = torch.clamp(max(0, kv - tq) + r + 1, max=kv)
    elif case.kind == "chunk":
        reqs = tuple(case.req_lens) if case.req_lens else (tq,)
        if sum(reqs) != tq:
            raise click.BadParameter(f"req_lens sum to {sum(reqs)} but total_q={tq}")
        if max(reqs) > kv:
            raise click.BadParameter(f"a request of {max(reqs)} rows exceeds kv_len={kv}")
        nreq = len(reqs)
        cu = torch.tensor([0, *torch.tensor(reqs).cumsum(0).tolist()], dtype=torch.int32)
        prefix = torch.tensor([kv - n for n in reqs], dtype=torch.int32)
        ps = case.page_size
        pages = -(-kv // ps)
        num_slots = nreq * pages * ps
        i = torch.arange(pages, dtype=torch.int64)
        pt = torch.stack([b * pages + (i * _P + 17) % pages for b in range(nreq)])
        b_of_row = torch.repeat_interleave(torch.arange(nreq), torch.tensor(reqs))
        pos = prefix.to(torch.int64)[b_of_row] + (torch.arange(tq) - cu[:-1].to(torch.int64)[
            b_of_row])
        vis = (pos + 1).to(dev)
        kw.update(cu_seqlens_q=cu.to(dev), prefix_lens=prefix.to(dev),
                  page_table=pt.to(torch.int32).to(dev), page_size=ps, max_q=max(reqs))
    else:
        raise click.BadParameter(f"kind={case.kind!r}: expected prefill or chunk")
    if case.indices == "walk":
        idx, n = walk_indices(vis, topk)
    else:
        idx, n = topk_indices(vis, topk, case.topk_params(), num_requests=nreq,
                              request=None if b_of_row is None else b_of_row.to(dev))
    q = torch.randn((tq, hq, case.head_dim), generator=gen).to(dt).to(dev)
    k = torch.randn((num_slots, case.kv_heads, case.head_dim), generator=gen).to(dt).to(dev)
    v = torch.randn((num_slots, case.kv_heads, case.head_dim), generator=gen).to(dt).to(dev)
    kw["lengths"] = n
    return {"q": q, "k": k, "v": v, "indices": idx, "kwargs": kw}


def index_overlap(case: BenchCase, inp: dict[str, Any]) -> dict[str, Any]:
    """The measured neighbouring-row overlap of ``make_inputs(case)``'s indices
    (``indices.overlap_stats``, within each request) and its ``# note`` line."""
    from backends.sparse_prefill.indices import overlap_stats

    groups = (list(case.req_lens) if case.kind == "chunk" and case.req_lens
              else [case.total_q])
    st = overlap_stats(inp["indices"], inp["kwargs"]["lengths"], width=case.kv_len,
                       row_groups=groups)
    desc = (f"topk overlap={case.overlap:g} window={case.window}" if case.indices == "topk"
            else "walk")
    note = (f"indices {desc}: rows r, r+1 Jaccard {st['jaccard']:.3f}; 16 consecutive rows' "
            f"union {st['union16']:.0f} = {st['union16_over_topk']:.2f} x topk")
    return {"jaccard": round(st["jaccard"], 4), "union16": round(st["union16"], 1),
            "union16_over_topk": round(st["union16_over_topk"], 4), "note": note}


def workload_of(case: BenchCase) -> dict[str, Any]:
    """The workload ``registry.dispatch`` derives from :func:`make_inputs` of ``case``, without
    building the inputs: ``kv_len`` is ``num_slots`` (``case.kv_len``) for prefill and the page
    table's reach (``ceil(kv_len / page_size) * page_size``) for chunk."""
    reqs = tuple(case.req_lens) if (case.kind == "chunk" and case.req_lens) else (case.total_q,)
    kv_len = case.kv_len if case.kind != "chunk" else \
        -(-case.kv_len // case.page_size) * case.page_size
    return {"kind": case.kind, "topk": case.topk, "head_dim": case.head_dim,
            "group_size": case.group_size, "num_kv_heads": case.kv_heads,
            "total_q": case.total_q, "num_requests": len(reqs) if case.kind == "chunk" else 1,
            "max_q": max(reqs), "dtype": case.dtype, "kv_len": kv_len or None}


_OPTS = {"pre": ("CHUNK_MODE", "pretranslate"), "stage": ("CHUNK_MODE", "staged"),
         "fused": ("CHUNK_MODE", "fused"), "rev": ("REVERSE_ROWS", 1),
         "split2": ("SPLIT_QK", 2), "v2": ("SPLIT_V", 2), "lean": ("LEAN", 1),
         "o32": ("OFFS32", 1), "ord1": ("SLOT_ORDER", 1), "gl": ("ENGINE", "gluon"),
         "wg": ("ENGINE", "gluon_wgmma"), "uc": ("UNION_PREP", "cuda"),
         "uws": ("UNION_ENGINE", "gluon_ws"), "uwso": ("UNION_ENGINE", "gluon_ws_overlap"),
         "uws2": ("UNION_ENGINE", "gluon_ws_2wg"),
         "xh": ("TILE_HEADS", "group")}


def probe_header(timing: str) -> str:
    """The first line of a ``benchmarks/probes/probe_*`` report: device, versions, the seed
    shape."""
    import torch
    import triton

    return (f"# {torch.cuda.get_device_name()}, torch {torch.__version__}, triton "
            f"{triton.__version__}; prefill, 8192 rows, top-k 2051, head_dim 256, bf16; {timing}")


def probe_grid(kv: str, groups: str) -> list[tuple[int, int]]:
    """``--kv`` and ``--groups`` comma lists of a probe -> its (KV length, group) cases."""
    return [(int(x), int(g)) for x in kv.split(",") for g in groups.split(",")]


def parse_geometry(spec: str) -> dict[str, Any]:
    """``BMxBNxWxS[:opt...]`` -> config dict (see the module doc for the options)."""
    head, *opts = spec.split(":")
    parts = head.lower().split("x")
    if len(parts) != 4 or not all(p.isdigit() for p in parts):
        raise click.BadParameter(f"geometry={spec!r}: expected BMxBNxWxS like 16x64x4x3")
    cfg: dict[str, Any] = dict(zip(("BLOCK_M", "BLOCK_N", "num_warps", "num_stages"),
                                   map(int, parts), strict=True))
    for o in opts:
        if o.startswith("dense") and o[5:].isdigit():
            cfg["DENSE"] = int(o[5:])
            continue
        if o.startswith("ud") and o[2:].isdigit():
            cfg["UNION_DENSE"] = int(o[2:])
            continue
        if o.startswith("union") and o[5:].isdigit():
            cfg["UNION"] = int(o[5:])
            continue
        if o.startswith("dt") and len(o[2:].split("x")) in (4, 5):
            cfg["DENSE_TILE"] = o[2:]
            continue
        if o.startswith("ut") and len(o[2:].split("x")) == 4:
            cfg["UNION_TILE"] = o[2:]
            continue
        if o[:1] == "r" and o[1:].isdigit():
            cfg["MAXNREG"] = int(o[1:])
            continue
        if o not in _OPTS:
            raise click.BadParameter(f"geometry option {o!r}: expected one of {sorted(_OPTS)}")
        key, val = _OPTS[o]
        cfg[key] = val
    return cfg


def format_geometry(cfg: dict[str, Any]) -> str:
    s = "x".join(str(cfg[k]) for k in ("BLOCK_M", "BLOCK_N", "num_warps", "num_stages"))
    rev = {v: k for k, v in _OPTS.items() if k != "fused"}
    for key in ("CHUNK_MODE", "REVERSE_ROWS", "SPLIT_QK", "SPLIT_V", "LEAN", "OFFS32",
                "SLOT_ORDER", "ENGINE", "UNION_PREP", "UNION_ENGINE", "TILE_HEADS"):
        if key in cfg and (key, cfg[key]) in rev:
            s += ":" + rev[(key, cfg[key])]
    if cfg.get("DENSE"):
        s += f":dense{cfg['DENSE']}"
    if cfg.get("UNION"):
        s += f":union{cfg['UNION']}"
    if (cfg.get("DENSE") or cfg.get("UNION")) and \
            cfg.get("DENSE_TILE", "128x32x8x3") != "128x32x8x3":
        s += f":dt{cfg['DENSE_TILE']}"
    if cfg.get("UNION") and cfg.get("UNION_TILE"):
        s += f":ut{cfg['UNION_TILE']}"
    if cfg.get("UNION_DENSE"):
        s += f":ud{cfg['UNION_DENSE']}"
    if cfg.get("MAXNREG"):
        s += f":r{cfg['MAXNREG']}"
    return s


def parse_provider(name: str, case: BenchCase) -> tuple[str, dict[str, Any] | None]:
    """-> (kind of provider, config or None). Kinds: reference, gather-sdpa, triton, registry.

    ``table`` and ``h200`` are the configs the generic table and the H200 family resolve for the
    case on this machine (asked of the registry: this module never imports a plugin);
    ``config=NAME`` a config a plugin offers (``kreg_configs``: ``registry.get_registry()
    .offered_configs("sparse_prefill")``)."""
    if name in _UNTIMED or name == "flashinfer-paged":
        return name, None
    if name in _RESOLVED:
        return "triton", _resolved_config(_RESOLVED[name], case)
    if name.startswith("config="):
        import registry

        offered = registry.get_registry().offered_configs("sparse_prefill")
        key = name.split("=", 1)[1]
        if key not in offered:
            raise click.BadParameter(f"{name}: no offered config {key!r}; offered: "
                                     f"{', '.join(offered) or '(none)'}")
        return "triton", offered[key]
    if name.startswith("geometry="):
        return "triton", parse_geometry(name.split("=", 1)[1])
    return "registry", None


# Named providers: the config an implementation's resolver gives for the case on this machine,
# run on the Triton kernel whatever the implementation's requirements say.
_RESOLVED = {"table": "generic.sparse_prefill_table", "h200": "nvidia_hopper.sparse_prefill_tuned"}


def _resolved_config(implementation: str, case: BenchCase) -> dict[str, Any]:
    import registry

    reg = registry.get_registry()
    try:
        impl = reg.implementation("sparse_prefill", implementation)
    except LookupError as exc:
        raise click.BadParameter(f"{implementation} is not loaded ({exc})") from None
    try:
        cfg = impl.resolve_config(registry.probe(), reg.workload("sparse_prefill",
                                                                 workload_of(case)))
    except (KeyError, ValueError) as exc:
        raise click.BadParameter(f"{implementation} has no config for ({case.kind}, group "
                                 f"{case.group_size}): {type(exc).__name__}: {exc}") from None
    return dict(cfg or {})


def _gather_sdpa(inp: dict[str, Any], rows_per_chunk: int = 512) -> Any:
    import torch
    import torch.nn.functional as F

    from backends.sparse_prefill.reference import resolve_slots

    q, k, v, idx, kw = inp["q"], inp["k"], inp["v"], inp["indices"], inp["kwargs"]
    tq, hq, d = q.shape
    hkv = k.shape[1]
    g = hq // hkv
    out = torch.empty_like(q)
    for r0 in range(0, tq, rows_per_chunk):
        r1 = min(tq, r0 + rows_per_chunk)
        slot, valid = resolve_slots(idx[r0:r1], kind=kw["kind"], lengths=kw.get("lengths"),
                                    num_slots=k.shape[0], cu_seqlens_q=kw.get("cu_seqlens_q"),
                                    prefix_lens=kw.get("prefix_lens"),
                                    page_table=kw.get("page_table"),
                                    page_size=kw.get("page_size", 1), row_start=r0)
        rows, topk = slot.shape
        kg = k[slot.reshape(-1)].reshape(rows, topk, hkv, d).permute(0, 2, 1, 3)
        vg = v[slot.reshape(-1)].reshape(rows, topk, hkv, d).permute(0, 2, 1, 3)
        kg = kg.repeat_interleave(g, dim=1)
        vg = vg.repeat_interleave(g, dim=1)
        qq = q[r0:r1].unsqueeze(2)  # [rows, hq, 1, d]
        o = F.scaled_dot_product_attention(qq, kg, vg, attn_mask=valid[:, None, None, :])
        o = torch.where(valid.any(dim=1)[:, None, None, None], o, torch.zeros_like(o))
        out[r0:r1] = o.squeeze(2)
    return out


#: FlashInfer's workspace for ``flashinfer-paged`` (as the plugin's).
_FI_WORKSPACE_BYTES = 256 << 20


def _flashinfer_paged(inp: dict[str, Any]) -> Any:
    """The ``flashinfer-paged`` trial: the decode wrapper planned once on the case's valid slots
    (page_size 1), then ``run()`` alone; rows with nothing valid zeroed as kreg's contract
    says (FlashInfer gives them one page, slot 0)."""
    import torch

    from backends import flashinfer_for_bench
    from backends.sparse_prefill.paged import paged_kv_args
    from backends.sparse_prefill.reference import resolve_slots
    from registry.tuning import Trial

    fi = flashinfer_for_bench("flashinfer-paged")
    q, k, v, idx, kw = inp["q"], inp["k"], inp["v"], inp["indices"], inp["kwargs"]
    _, hq, d = q.shape
    hkv = k.shape[1]
    slot, valid = resolve_slots(idx, kind=kw["kind"], lengths=kw.get("lengths"),
                                num_slots=k.shape[0], cu_seqlens_q=kw.get("cu_seqlens_q"),
                                prefix_lens=kw.get("prefix_lens"),
                                page_table=kw.get("page_table"),
                                page_size=kw.get("page_size", 1))
    pages = paged_kv_args(slot, valid)
    del slot, valid
    runs = ("flashinfer BatchDecodeWithPagedKVCacheWrapper(tensor cores, page_size 1): run() "
            "alone, plan() once before the window")
    try:
        ws = torch.zeros(_FI_WORKSPACE_BYTES, dtype=torch.uint8, device=q.device)
        wrapper = fi.BatchDecodeWithPagedKVCacheWrapper(ws, "NHD", use_tensor_cores=True)
        wrapper.plan(pages.indptr, pages.indices, pages.last_page_len, hq, hkv, d, 1,
                     pos_encoding_mode="NONE", q_data_type=q.dtype, kv_data_type=k.dtype,
                     sm_scale=d ** -0.5)
    except Exception as exc:   # FlashInfer refuses the case (a dtype, a head dim)
        why = (f"FlashInfer refused the case: plan() raised {type(exc).__name__}: {exc}")

        def refused() -> Any:   # provider fails, the others still run
            raise RuntimeError(why)

        return Trial("flashinfer-paged", refused, runs=runs)
    qc, cache, empty = q.contiguous(), (k.unsqueeze(1), v.unsqueeze(1)), pages.empty
    return Trial("flashinfer-paged",
                 lambda: wrapper.run(qc, cache).masked_fill_(empty[:, None, None], 0),
                 runs=runs)


def _trial(provider: str, case: BenchCase, inp: dict[str, Any]) -> Any:
    """The harness trial of one provider (``auto`` and implementation names go through the
    registry as a framework calls it)."""
    import registry
    from backends.sparse_prefill.reference import sparse_prefill_reference
    from backends.sparse_prefill.triton_kernels import sparse_prefill_triton
    from registry.tuning import Trial
    from registry.tuning.measure import registry_candidates

    kind, cfg = parse_provider(provider, case)
    q, k, v, idx, kw = inp["q"], inp["k"], inp["v"], inp["indices"], inp["kwargs"]
    if kind == "reference":
        return Trial(provider, lambda: sparse_prefill_reference(q, k, v, idx, **kw),
                     runs="torch reference", timed="isolated",
                     implementation="reference.sparse_prefill")
    if kind == "gather-sdpa":
        return Trial(provider, lambda: _gather_sdpa(inp), runs="gather + torch SDPA",
                     timed="isolated")
    if kind == "flashinfer-paged":
        return _flashinfer_paged(inp)
    if kind == "triton":
        geometry = dict(cfg or {})
        return Trial(provider,
                     lambda: sparse_prefill_triton(q, k, v, idx, config=geometry, **kw),
                     runs=format_geometry(geometry), config=geometry)
    try:
        trial, = registry_candidates(
            "sparse_prefill", [provider],
            lambda: registry.dispatch("sparse_prefill", q, k, v, idx, **kw), workload_of(case),
            inputs=((q, k, v, idx), kw))
    except LookupError as exc:  # UnknownImplementationError: a typo, not a failed check
        raise click.UsageError(f"provider {provider!r}: {exc}") from None
    return trial


def run_case(case: BenchCase, providers: list[str], *, warmup: int = 5, iters: int = 30,
             baseline: str | None = None, device: Any = None, graphs: bool = False) -> Any:
    """Check every provider against the fp32 reference, then time them, through the one
    harness (:func:`registry.tuning.measure`); returns a
    :class:`registry.tuning.measure.CaseResult`."""
    import torch

    import registry
    from backends.sparse_prefill.compare import max_abs_error
    from backends.sparse_prefill.reference import sparse_prefill_reference
    from registry.tuning import measure
    from registry.tuning.measure import CaseResult

    inp = make_inputs(case, device)
    extra = index_overlap(case, inp)
    ref = sparse_prefill_reference(inp["q"], inp["k"], inp["v"], inp["indices"],
                                   out_dtype=torch.float32, **inp["kwargs"])
    trials = [_trial(p, case, inp) for p in providers]
    spec = registry.get_registry().spec("sparse_prefill")
    results = measure(trials, expected=ref, compare=spec.load_compare(), metric=max_abs_error,
                      warmup=warmup, iters=iters, graphs=graphs, baseline=baseline)
    return CaseResult(case=case.label(), workload=workload_of(case), measurements=results,
                      params={"req_lens": list(case.req_lens or ()), "page_size": case.page_size,
                              "seed": case.seed, "indices": case.indices,
                              **({"overlap": case.overlap, "window": case.window}
                                 if case.indices == "topk" else {})},
                      baseline=baseline, extra=extra)


def _ints(text: str | None) -> list[int]:
    if not text:
        return []
    try:
        return [int(x) for x in text.replace(" ", "").split(",") if x]
    except ValueError:
        raise click.BadParameter(f"{text!r}: expected comma-separated integers") from None


def _overlaps(text: str) -> list[float]:
    try:
        vals = [float(x) for x in text.replace(" ", "").split(",") if x]
    except ValueError:
        raise click.BadParameter(f"--overlap={text!r}: expected comma-separated numbers in "
                                 f"[0, 1]") from None
    bad = [x for x in vals if not 0.0 <= x <= 1.0]
    if bad or not vals:
        raise click.BadParameter(f"--overlap={text!r}: every value must be in [0, 1] (the "
                                 f"correlation of neighbouring rows' scores)")
    return vals


def _plot(results: list[Any], path: str) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise click.UsageError("--plot needs matplotlib (pip install matplotlib)") from None
    fig, ax = plt.subplots(figsize=(8, 5))
    # an --overlap sweep (several overlaps of --indices topk) is plotted against the overlap
    sweep = len({r.params.get("overlap") for r in results}) > 1
    by_prov: dict[str, list[tuple[float, float]]] = {}
    for r in results:
        for m in r.measurements:
            if m.ms is not None:
                name = f"{m.label} g{r.workload['group_size']} kv{r.workload['kv_len']}"
                if sweep:
                    by_prov.setdefault(f"{name} q{r.workload['total_q']}", []).append(
                        (r.params["overlap"], m.ms))
                else:
                    by_prov.setdefault(name, []).append((r.workload["total_q"], m.ms))
    markers = "osD^v<>px*"
    for i, (name, pts) in enumerate(sorted(by_prov.items())):
        pts.sort()
        # Distinct markers and dashes: coinciding lines must not hide each other (issue #24).
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker=markers[i % len(markers)],
                linestyle=("-", "--", ":", "-.")[i % 4], label=name, alpha=0.85)
    p0 = results[0].workload
    import registry

    ax.set_title(f"sparse_prefill {p0['kind']}, {p0['dtype']}, KV "
                 f"{sorted({r.workload['kv_len'] for r in results})}, on "
                 f"{registry.probe().name}", fontsize=9)
    if sweep:
        ax.set_xlabel("--overlap (correlation of neighbouring rows' scores)")
    else:
        ax.set_xscale("log", base=2)
        ax.set_xlabel("total_q")
    ax.set_yscale("log")
    ax.set_ylabel("ms (median)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path)


@click.command("sparse_prefill")
@click.option("--kind", type=click.Choice(["prefill", "chunk"]), default="chunk",
              show_default=True)
@click.option("--group-size", default="6,12", show_default=True,
              help="query heads per KV head (comma list)")
@click.option("--kv-heads", type=int, default=1, show_default=True)
@click.option("--kv-len", default="8192", show_default=True, help="KV lengths (comma list)")
@click.option("--total-q", default="8192", show_default=True, help="query rows (comma list)")
@click.option("--req-lens", default=None,
              help="chunk: rows of each request (comma list; sets total_q to their sum)")
@click.option("--dtype", type=click.Choice(["bfloat16", "float16", "float32"]),
              default="bfloat16", show_default=True)
@click.option("--topk", type=int, default=2051, show_default=True)
@click.option("--head-dim", type=int, default=256, show_default=True)
@click.option("--page-size", type=int, default=1, show_default=True)
@click.option("--warmup", type=int, default=5, show_default=True)
@click.option("--iters", type=int, default=30, show_default=True)
@click.option("--providers", default="table,h200", show_default=True,
              help="comma list: reference, gather-sdpa, table, h200, geometry=BMxBNxWxS[:opt], "
                   "auto, <implementation>[:measure], flashinfer-paged")
@click.option("--baseline", default="table", show_default=True)
@click.option("--json", "as_json", is_flag=True, help="print JSON records instead of a table")
@click.option("--plot", type=click.Path(dir_okay=False), default=None,
              help="write a ms-vs-total_q plot (ms vs overlap for an --overlap sweep; needs "
                   "matplotlib)")
@click.option("--graphs", is_flag=True,
              help="time CUDA-graph replays of the timed providers (GPU time without host "
                   "launch cost; small total_q is host-bound with plain launches)")
@click.option("--indices", "index_set", type=click.Choice(["walk", "topk"]), default="walk",
              show_default=True,
              help="walk: the seed's affine walk; topk: the ascending top-k of synthetic indexer "
                   "scores (shared per-token importance, per-row noise, a recent window)")
@click.option("--overlap", default="0.95", show_default=True,
              help="--indices topk: the correlation of neighbouring rows' scores, 0..1 (comma "
                   "list: a sweep; 0 is the walk's overlap, 1 near-identical rows)")
@click.option("--window", type=int, default=64, show_default=True,
              help="--indices topk: the recent positions every row selects")
def bench_command(kind: str, group_size: str, kv_heads: int, kv_len: str, total_q: str,
                  req_lens: str | None, dtype: str, topk: int, head_dim: int, page_size: int,
                  warmup: int, iters: int, providers: str, baseline: str, as_json: bool,
                  plot: str | None, graphs: bool, index_set: str, overlap: str,
                  window: int) -> None:
    """Time sparse_prefill providers side by side and check each against the fp32 reference."""
    provs = [p.strip() for p in providers.split(",") if p.strip()]
    if baseline and baseline not in provs:
        provs.insert(0, baseline)
    if "flashinfer-paged" in provs:
        from backends import flashinfer_for_bench

        flashinfer_for_bench("flashinfer-paged")  # before any case: a usage error, not a failure
    reqs = tuple(_ints(req_lens)) or None
    tqs = [sum(reqs)] if reqs else _ints(total_q)
    overlaps = _overlaps(overlap) if index_set == "topk" else [0.95]
    if window < 0:
        raise click.BadParameter(f"--window={window}: expected an int >= 0")
    cases = [BenchCase(kind=kind, group_size=g, kv_heads=kv_heads, kv_len=kv, total_q=tq,
                       req_lens=reqs, topk=topk, head_dim=head_dim, dtype=dtype,
                       page_size=page_size, indices=index_set, overlap=ov, window=window)
             for g in _ints(group_size) for kv in _ints(kv_len) for tq in tqs
             for ov in overlaps]
    results = []
    with click.progressbar(cases, label="sparse_prefill", file=sys.stderr,
                           item_show_func=lambda c: c.label() if c else None) as bar:
        for case in bar:
            results.append(run_case(case, provs, warmup=warmup, iters=iters, baseline=baseline,
                                    graphs=graphs))
    if as_json:
        from registry.tuning.measure import bench_report

        click.echo(json.dumps(bench_report("sparse_prefill", results, graphs=graphs), indent=1))
    else:
        from registry.tuning.measure import bench_header, format_table

        click.echo(bench_header("sparse_prefill", graphs=graphs,
                                note="max_err = max |out - fp32 reference|"))
        click.echo(format_table(results, unit="ms", error_name="max_err"))
    if plot:
        _plot(results, plot)
    bad = [(r.case, m.label) for r in results for m in r.measurements if m.failed]
    if bad:
        click.echo(f"{len(bad)} provider run(s) failed the check against the fp32 reference "
                   f"or raised: {bad}", err=True)
        sys.exit(1)
