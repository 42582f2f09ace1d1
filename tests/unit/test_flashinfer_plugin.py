"""The flashinfer plugin on a CPU: availability, explain, the pure logic, and both ops against the
references through a torch stand-in for FlashInfer.

CI has neither FlashInfer nor a GPU, and a developer machine may have FlashInfer: every test
patches the plugin's availability probe (and, where a kernel runs, ``_flashinfer`` with the
stand-in below), so the tests run the same either way.

The stand-in has FlashInfer 0.6.18's documented output contract and the key order read from its
source (docs/PLUGINS.md, "Hosting an existing kernel library"):

* ``top_k_ragged_transform(input, offsets, lengths, k, deterministic, tie_break)``: rows of at
  most k valid keys are ``0..len-1`` then -1; longer rows get the k best by FlashInfer's key,
  ties to the smaller index (``tie_break=1``), in no particular order (here: shuffled), plus
  ``offsets``. The key is the raw bits with the sign handled (``+0.0`` above ``-0.0``, a positive
  NaN above ``+inf``, a negative NaN below ``-inf``), and for float32 first the coarse bin of an
  fp16 copy in which every NaN is the positive NaN ``0x7FFF`` (topk.cuh FilteredTopKTraits,
  cuda_fp16.hpp ``__float2half_rn``). Refuses ``k > 2048`` and empty grids, as FlashInfer does.
* ``BatchDecodeWithPagedKVCacheWrapper(ws, "NHD", use_tensor_cores=...)``: ``plan`` takes
  ``indptr``/``indices``/``last_page_len`` and the head shape, computes each request's length as
  FlashInfer's ``get_seq_lens`` does (a request of no pages has one token) and refuses the
  CUDA-core path's group sizes; ``run(q, (k_cache, v_cache))`` attends each request to its
  tokens in float32 (NaN for a request of none).
"""

from __future__ import annotations

import math
import types
from collections import OrderedDict
from collections.abc import Iterator
from typing import Any, ClassVar

import pytest
import torch
from click.testing import CliRunner

import cli
import plugins.flashinfer as fi
import registry
from backends.indexer_topk.reference import indexer_topk_reference, score_keys
from backends.sparse_prefill.reference import sparse_prefill_reference

NOT_INSTALLED = fi.Availability(None, "no module named 'flashinfer' (pip install "
                                      "'kreg[flashinfer]')")
INSTALLED = fi.Availability("0.6.18.post1")
TOPK_WL = {"k": 2048, "num_rows": 64, "max_keys": 131072, "dtype": "float32"}
SPARSE_WL = {"kind": "prefill", "topk": 2051, "head_dim": 256, "group_size": 12,
             "num_kv_heads": 1, "total_q": 8192, "num_requests": 1, "max_q": 8192,
             "dtype": "bfloat16", "kv_len": 8192}

# ---------------------------------------------------------------------------------------------
# the stand-in


def _fine_key(x: torch.Tensor) -> torch.Tensor:
    """FlashInfer's ordered key (int64, larger ranks higher): the bits, sign handled."""
    if x.dtype == torch.float32:
        b = x.contiguous().view(torch.int32).to(torch.int64) & 0xFFFFFFFF
        return torch.where(b >= 2**31, ~b & 0xFFFFFFFF, b | 2**31)
    b = x.contiguous().view(torch.int16).to(torch.int64) & 0xFFFF
    return torch.where(b >= 2**15, ~b & 0xFFFF, b | 2**15)


def _coarse_key(x: torch.Tensor) -> torch.Tensor:
    """float32's coarse bin: the top byte of an fp16 copy's key, every NaN as 0x7FFF."""
    h = x.to(torch.float16).view(torch.int16).to(torch.int64) & 0xFFFF
    h = torch.where(torch.isnan(x), torch.full_like(h, 0x7FFF), h)
    return torch.where(h >= 2**15, ~h & 0xFFFF, h | 2**15) >> 8


def flashinfer_key(x: torch.Tensor) -> torch.Tensor:
    if x.dtype == torch.float32:
        return _coarse_key(x) << 32 | _fine_key(x)
    return _fine_key(x)


def top_k_ragged_transform(input: torch.Tensor, offsets: torch.Tensor, lengths: torch.Tensor,
                           k: int, deterministic: bool = False, tie_break: int = 0,
                           dsa_graph_safe: bool = False, row_starts: Any = None) -> torch.Tensor:
    rows, n = input.shape
    assert input.is_contiguous() and input.dtype in (torch.float32, torch.float16,
                                                      torch.bfloat16)
    assert offsets.dtype == torch.int32 and lengths.dtype == torch.int32
    assert tie_break == 1, "kreg's membership rule is tie_break=1 (prefer smaller indices)"
    if k > 2048:
        raise RuntimeError("TopKRaggedTransform failed with error code operation not supported")
    if rows == 0:
        raise RuntimeError("invalid configuration argument (an empty grid)")
    key = flashinfer_key(input)
    gen = torch.Generator().manual_seed(7)
    out = torch.full((rows, k), -1, dtype=torch.int32)
    for r in range(rows):
        length = int(lengths[r])
        assert 0 <= length <= n, f"row {r}: FlashInfer would read past the row ({length} > {n})"
        if length <= k:
            out[r, :length] = torch.arange(length, dtype=torch.int32) + offsets[r]
            continue
        order = sorted(range(length), key=lambda j: (-int(key[r, j]), j))[:k]
        picked = torch.tensor(order, dtype=torch.int32)[torch.randperm(k, generator=gen)]
        out[r] = picked + offsets[r]
    return out.to(input.device)


class BatchDecodeWithPagedKVCacheWrapper:
    made: ClassVar[list[BatchDecodeWithPagedKVCacheWrapper]] = []

    #: FlashInfer 0.6.18 keeps plan()'s device page tensor as it is (decode.py:1512); False
    #: stands for a release that copies it
    keeps_pages: ClassVar[bool] = True

    def __init__(self, float_workspace_buffer: torch.Tensor, kv_layout: str = "NHD",
                 use_cuda_graph: bool = False, use_tensor_cores: bool = False) -> None:
        assert kv_layout == "NHD" and not use_cuda_graph
        self.tensor_cores = use_tensor_cores
        self.plans = 0
        BatchDecodeWithPagedKVCacheWrapper.made.append(self)

    def plan(self, indptr: torch.Tensor, indices: torch.Tensor, last_page_len: torch.Tensor,
             num_qo_heads: int, num_kv_heads: int, head_dim: int, page_size: int,
             *positional: Any, pos_encoding_mode: str = "NONE", q_data_type: Any = "float16",
             kv_data_type: Any = None, sm_scale: float | None = None) -> None:
        assert not positional, "pass plan()'s options by keyword (positional is deprecated)"
        group = num_qo_heads // num_kv_heads
        if not self.tensor_cores and group not in (1, 2, 3, 4, 6, 8):
            raise RuntimeError(f"Unsupported group_size: {group}")
        assert indptr.dtype == indices.dtype == last_page_len.dtype == torch.int32
        ptr, last = indptr.cpu().to(torch.int64), last_page_len.cpu().to(torch.int64)
        self.kv_lens = torch.clamp(ptr[1:] - ptr[:-1] - 1, min=0) * page_size + last
        self.ptr, self.page_size = ptr, page_size
        # what run() reads: the tensor given (FlashInfer's indices.to(device)) or a copy
        self._paged_kv_indices_buf = indices if self.keeps_pages else indices.clone()
        self.heads = (num_qo_heads, num_kv_heads, head_dim)
        self.q_dtype, self.scale = q_data_type, sm_scale
        self.plans += 1

    def run(self, q: torch.Tensor, paged_kv_cache: tuple[torch.Tensor, torch.Tensor]
            ) -> torch.Tensor:
        k_cache, v_cache = paged_kv_cache
        assert q.dtype == self.q_dtype and k_cache.shape[1] == self.page_size
        hq, hkv, d = self.heads
        g = hq // hkv
        out = torch.empty_like(q)
        for b in range(q.shape[0]):
            n_tok = int(self.kv_lens[b])
            n_pages = -(-n_tok // self.page_size)
            start = int(self.ptr[b])
            held = self._paged_kv_indices_buf
            if start + n_pages > held.numel():
                raise IndexError(f"request {b} reads past the page list")
            pages = held[start:start + n_pages].to(torch.int64)
            slots = (pages[:, None] * self.page_size + torch.arange(self.page_size)).reshape(-1)
            slots = slots[:n_tok]
            kg = k_cache.reshape(-1, hkv, d)[slots].float()   # [tokens, hkv, d]
            vg = v_cache.reshape(-1, hkv, d)[slots].float()
            qq = q[b].float().reshape(hkv, g, d)
            s = torch.einsum("hgd,thd->hgt", qq, kg) * self.scale
            p = torch.softmax(s, dim=-1)   # NaN for a request of no tokens
            out[b] = torch.einsum("hgt,thd->hgd", p, vg).reshape(hq, d).to(q.dtype)
        return out


STANDIN = types.SimpleNamespace(top_k_ragged_transform=top_k_ragged_transform,
                                BatchDecodeWithPagedKVCacheWrapper=BatchDecodeWithPagedKVCacheWrapper)

# ---------------------------------------------------------------------------------------------
# fixtures


@pytest.fixture
def without_flashinfer(monkeypatch: pytest.MonkeyPatch) -> Iterator[registry.Registry]:
    monkeypatch.setattr(fi, "availability", lambda: NOT_INSTALLED)
    yield registry.reset_registry()
    registry.reset_registry()


@pytest.fixture
def standin(monkeypatch: pytest.MonkeyPatch) -> Iterator[registry.Registry]:
    """FlashInfer 'installed' as the stand-in, and this CPU presented as an H200 (so the
    implementations' device checks pass; the tensors stay on the CPU)."""
    monkeypatch.setattr(fi, "availability", lambda: INSTALLED)
    monkeypatch.setattr(fi, "_flashinfer", lambda: STANDIN)
    monkeypatch.setattr(fi, "_WRAPPERS", OrderedDict())
    monkeypatch.setattr(fi, "_WORKSPACES", {})
    BatchDecodeWithPagedKVCacheWrapper.made.clear()
    reg = registry.reset_registry()
    h200 = registry.profiles()["h200"]
    reg._facts[-1] = reg.facts_for_index(-1).what_if(
        vendor="nvidia", arch="sm_90", name=h200.name, sm_count=h200.sm_count,
        compute_capability=(9, 0), runtime_version="13.0")
    yield reg
    registry.reset_registry()


# ---------------------------------------------------------------------------------------------
# without FlashInfer: listed, ineligible with the reason, never an error


def test_without_flashinfer_kreg_plugins_lists_both_with_the_reason(
        without_flashinfer: registry.Registry) -> None:
    rec = without_flashinfer.plugins["flashinfer"]
    assert rec.loaded and rec.error is None
    assert rec.implementations == ["flashinfer.indexer_topk", "flashinfer.sparse_prefill"]
    out = CliRunner().invoke(cli.main, ["plugins"]).output
    assert "flashinfer  [loaded]  entry point plugins.flashinfer" in out
    assert "impl flashinfer.indexer_topk (op indexer_topk, priority 5)" in out
    assert "impl flashinfer.sparse_prefill (op sparse_prefill, priority 5)" in out
    assert out.count("not available here: flashinfer not importable: no module named "
                     "'flashinfer'") == 2
    assert "NOT CUDA-graph capturable" in out


@pytest.mark.parametrize(("op", "wl"), [("indexer_topk", TOPK_WL),
                                        ("sparse_prefill", SPARSE_WL)])
def test_without_flashinfer_explain_names_the_reason(without_flashinfer: registry.Registry,
                                                     op: str, wl: dict[str, Any]) -> None:
    d = registry.select(op, wl, "h200")
    assert not d.implementation.startswith("flashinfer.")
    cand = next(c for c in d.candidates if c.implementation == f"flashinfer.{op}")
    assert not cand.eligible and cand.priority == 5
    assert [str(c) for c in cand.failed] == [
        "library: flashinfer not importable: no module named 'flashinfer' (pip install "
        "'kreg[flashinfer]'), requires flashinfer-python >= 0.6.18, importable"]
    assert f"flashinfer.{op}" in d.explain()
    res = CliRunner().invoke(cli.main, ["explain", op, "--device", "h200", "-w",
                                        ",".join(f"{k}={v}" for k, v in wl.items())])
    assert res.exit_code == 0 and "library: flashinfer not importable" in res.output


def test_without_flashinfer_an_override_is_not_honoured_and_says_why(
        without_flashinfer: registry.Registry) -> None:
    plain = registry.select("indexer_topk", TOPK_WL, "h200").implementation
    with registry.override("indexer_topk", "flashinfer.indexer_topk"):
        d = registry.select("indexer_topk", TOPK_WL, "h200")
    assert d.implementation == plain != "flashinfer.indexer_topk"   # what it picks without one
    assert d.override is not None and not d.override.honoured
    assert "flashinfer not importable" in d.override.reason


def test_selection_never_imports_flashinfer() -> None:
    import subprocess
    import sys

    code = ("import sys, registry\n"
            "registry.select('indexer_topk', {'k': 2048, 'num_rows': 64, 'max_keys': 131072, "
            "'dtype': 'float32'}, 'h200')\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('flashinfer', 'tvm_ffi')"
            " or m == 'plugins.flashinfer_keys'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=120).stdout.strip()
    assert out == "[]"


def test_availability_probe_reads_find_spec_and_metadata_once(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.metadata
    import importlib.util

    calls: list[str] = []

    def find_spec(name: str) -> Any:
        calls.append(name)
        return object()

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    monkeypatch.setattr(importlib.metadata, "version", lambda dist: "0.6.17")
    monkeypatch.setattr(fi, "_AVAILABILITY", [])
    assert fi.availability() == fi.Availability("0.6.17")
    assert fi.availability() == fi.Availability("0.6.17")
    assert calls == ["flashinfer", "tvm_ffi"]
    # below the measured version: a failed capability check with the version
    facts = registry.profiles()["h200"]
    wl = registry.get_registry().workload("indexer_topk", TOPK_WL)
    check = fi.LIBRARY.check(facts, wl)
    assert not check.passed and str(check) == (
        "library: flashinfer 0.6.17, requires flashinfer-python >= 0.6.18, importable")
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    monkeypatch.setattr(fi, "_AVAILABILITY", [])
    assert fi.availability().reason.startswith("no module named 'flashinfer'")


def test_capability_checks_on_devices_and_workloads(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fi, "availability", lambda: INSTALLED)
    reg = registry.get_registry()
    topk = reg.workload("indexer_topk", TOPK_WL)
    sparse = reg.workload("sparse_prefill", SPARSE_WL)

    def failed(reqs: tuple[Any, ...], facts: registry.DeviceFacts, wl: Any) -> list[str]:
        return [str(c) for c in (r.check(facts, wl) for r in reqs) if not c.passed]

    h200, b5090 = registry.profiles()["h200"], registry.profiles()["rtx-5090"]
    assert failed(fi.TOPK_REQUIREMENTS, h200, topk) == []
    assert failed(fi.SPARSE_REQUIREMENTS, h200, sparse) == []
    assert failed(fi.TOPK_REQUIREMENTS, b5090, topk) == [
        "arch: sm_120, requires one of {sm_80, sm_90, sm_100, sm_103} (FilteredTopK, its only "
        "path with tie_break, needs 128 KiB of shared memory per SM)"]
    assert failed(fi.TOPK_REQUIREMENTS, h200, topk.model_copy(update={"k": 4096})) == [
        "k: 4096, requires <= 2048 (FlashInfer's FILTERED_TOPK_MAX_K)"]
    assert failed(fi.SPARSE_REQUIREMENTS, registry.profiles()["mi355x"], sparse)[:1] == [
        "vendor: amd, requires nvidia"]
    odd = sparse.model_copy(update={"head_dim": 80, "dtype": "float32"})
    assert failed(fi.SPARSE_REQUIREMENTS, h200, odd) == [
        "dtype: float32, requires one of {float16, bfloat16} (FlashInfer's attention kernels "
        "take 16-bit inputs)", "head_dim: 80, requires one of {64, 128, 256}"]
    # group 12 (the CUDA-core decode refuses it) is fine: the tensor-core path runs
    assert sparse.group_size == 12
    # what-if facts may carry FlashInfer's availability themselves
    told = h200.what_if(extra={"flashinfer": "built for another CUDA"})
    assert failed((fi.LIBRARY,), told, topk) == [
        "library: flashinfer not importable: built for another CUDA, requires "
        "flashinfer-python >= 0.6.18, importable"]
    assert failed((fi.LIBRARY,), h200.what_if(extra={"flashinfer": "0.7.0"}), topk) == []


# ---------------------------------------------------------------------------------------------
# indexer_topk: the key order, the sort, the padding


def _specials(dtype: torch.dtype) -> torch.Tensor:
    info = torch.finfo(dtype)
    vals = [float("nan"), -float("nan"), float("inf"), -float("inf"), 0.0, -0.0, info.max,
            -info.max, info.tiny, -info.tiny, 1.0, -1.0, 65504.0, -65504.0, 65520.0, 1e-8,
            -1e-8, 3.0e38, -3.0e38]
    x = torch.tensor(vals, dtype=torch.float32).to(dtype)
    int_t = torch.int32 if dtype == torch.float32 else torch.int16
    nans = {torch.float32: [0x7FC00001, -0x00400001], torch.float16: [0x7E01, -0x01FF],
            torch.bfloat16: [0x7FC1, -0x003F]}[dtype]   # NaNs with payloads, of both signs
    payload = torch.tensor(nans, dtype=torch.int64).to(int_t).view(dtype)
    subnormal = torch.tensor([1, -2**(int_t.itemsize * 8 - 1) + 1],
                             dtype=torch.int64).to(int_t).view(dtype)  # +-smallest subnormal
    g = torch.Generator().manual_seed(0)
    rand = (torch.randn(400, generator=g) * torch.logspace(-30, 30, 400)).to(dtype)
    return torch.cat([x, payload, subnormal, rand])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_order_keys_makes_flashinfers_order_kregs(dtype: torch.dtype) -> None:
    x = _specials(dtype)
    kreg_key = score_keys(x).to(torch.int64)
    raw = flashinfer_key(x)
    # as FlashInfer sees them, raw scores are ordered otherwise: NaN above +inf (float32: any
    # NaN, by the fp16 bins), +0.0 above -0.0
    nan = torch.isnan(x)
    assert bool((raw[nan].min() > raw[~nan].max()) if dtype == torch.float32 else
                (raw[nan].max() > raw[~nan].max()))
    zeros = (x == 0).nonzero().flatten()
    assert raw[zeros].unique().numel() == 2
    keyed = flashinfer_key(fi.order_keys(x))
    assert not bool(torch.isnan(fi.order_keys(x)).any())
    # the same strict order and the same ties
    i, j = torch.meshgrid(torch.arange(x.numel()), torch.arange(x.numel()), indexing="ij")
    assert torch.equal(kreg_key[i] < kreg_key[j], keyed[i] < keyed[j])
    assert torch.equal(kreg_key[i] == kreg_key[j], keyed[i] == keyed[j])
    # the coarse bins never contradict the fine key
    if dtype == torch.float32:
        fine, coarse = keyed & 0xFFFFFFFF, keyed >> 32
        assert not bool(((fine[i] < fine[j]) & (coarse[i] > coarse[j])).any())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_the_triton_pass_matches_the_torch_encoding(dtype: torch.dtype) -> None:
    from plugins.flashinfer_keys import order_keys_triton

    x = _specials(dtype).repeat(30)[:10000].reshape(100, 100)
    int_t = torch.int32 if dtype == torch.float32 else torch.int16
    assert torch.equal(order_keys_triton(x).view(int_t), fi.order_keys(x).view(int_t))
    assert order_keys_triton(x[:, :0]).shape == (100, 0)


def test_ascending_positions_sorts_and_pads_last() -> None:
    raw = torch.tensor([[5, 1, 9, 3], [0, 1, -1, -1], [-1, -1, -1, -1], [7, -1, 2, -1]],
                       dtype=torch.int32)
    assert fi.ascending_positions(raw).tolist() == [
        [1, 3, 5, 9], [0, 1, -1, -1], [-1, -1, -1, -1], [2, 7, -1, -1]]
    assert fi.ascending_positions(raw).dtype == torch.int32


def test_raw_flashinfer_breaks_kregs_contract_and_the_wrapper_closes_it(
        standin: registry.Registry) -> None:
    from backends.indexer_topk.conformance import CASES

    for name in ("nan_inf", "all_zeros"):
        case = next(c for c in CASES if c.name == name)
        (scores, lengths), kw = case.make(torch.device("cpu"), torch.float32, 0)
        want = indexer_topk_reference(scores, lengths, kw["k"])
        offsets = torch.zeros(scores.shape[0], dtype=torch.int32)
        raw = fi.ascending_positions(top_k_ragged_transform(scores, offsets, lengths, kw["k"],
                                                            tie_break=1))
        assert not torch.equal(raw, want), name   # the gap: NaN first, +0.0 before -0.0
        assert torch.equal(fi.indexer_topk(scores, lengths, **kw), want), name


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_indexer_topk_matches_the_reference(standin: registry.Registry,
                                            dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(3)
    scores = torch.randint(-3, 4, (7, 300), generator=g).float().to(dtype)
    scores[0, ::3] = float("nan")
    scores[1] = -0.0
    scores[2, 5] = float("inf")
    lengths = torch.tensor([300, 17, 16, 15, 0, 1, 299], dtype=torch.int32)
    for k in (16, 1, 2048):
        got = fi.indexer_topk(scores, lengths, k)
        assert torch.equal(got, indexer_topk_reference(scores, lengths, k)), (dtype, k)
    empty = torch.empty(0, 300, dtype=dtype)
    assert fi.indexer_topk(empty, torch.empty(0, dtype=torch.int32), 4).shape == (0, 4)


# ---------------------------------------------------------------------------------------------
# sparse_prefill: workload -> FlashInfer's call arguments


def test_paged_kv_args_concatenates_valid_slots_and_gives_empty_rows_one_page() -> None:
    slot = torch.tensor([[4, 9, 2], [7, 7, 1], [3, 0, 5], [8, 6, 1]])
    valid = torch.tensor([[True, False, True], [True, True, False], [False, False, False],
                          [False, True, True]])
    pages = fi.paged_kv_args(slot, valid)
    assert pages.indptr.tolist() == [0, 2, 4, 5, 7]
    assert pages.indptr.device.type == "cpu" and pages.indptr.dtype == torch.int32
    assert pages.indices.tolist() == [4, 2, 7, 7, 0, 6, 1]   # row 2: the dummy page 0
    assert pages.indices.dtype == torch.int32
    assert pages.last_page_len.tolist() == [1, 1, 1, 1]
    assert pages.empty.tolist() == [False, False, True, False]
    # FlashInfer's length rule on these pages: every row's valid count, the empty row 1 token
    lens = torch.clamp(pages.indptr[1:] - pages.indptr[:-1] - 1, min=0) + pages.last_page_len
    assert lens.tolist() == [2, 2, 1, 2]


def test_chunk_positions_are_translated_through_the_page_table() -> None:
    # two requests, page size 4; request 1's page table maps its pages 0, 1 to 5, 2
    indices = torch.tensor([[0, 3, 5, -1], [1, 6, 7, 8], [2, 4, 0, 9]], dtype=torch.int32)
    cu = torch.tensor([0, 1, 3], dtype=torch.int32)
    prefix = torch.tensor([5, 6], dtype=torch.int32)   # row 0 at position 5; rows 1-2 at 6, 7
    pt = torch.tensor([[0, 1, -1], [5, 2, -1]], dtype=torch.int32)
    slot, valid = fi.selected_slots(indices, kind="chunk", lengths=None, num_slots=24,
                                    cu_seqlens_q=cu, prefix_lens=prefix, page_table=pt,
                                    page_size=4)
    pages = fi.paged_kv_args(slot, valid)
    # row 0 (req 0, pos 5): 0->0, 3->3, 5->1*4+1=5; -1 skipped
    # row 1 (req 1, pos 6): 1->5*4+1=21, 6->2*4+2=10; 7, 8 are future positions
    # row 2 (req 1, pos 7): 2->22, 4->2*4+0=8, 0->20; 9 is a future position
    assert pages.indptr.tolist() == [0, 3, 5, 8]
    assert pages.indices.tolist() == [0, 3, 5, 21, 10, 22, 8, 20]


def _sparse_call(kind: str, dtype: torch.dtype, group: int, d: int = 64,
                 ) -> tuple[tuple[Any, ...], dict[str, Any]]:
    g = torch.Generator().manual_seed(1)
    total_q, hkv, topk, slots = 9, 2, 12, 40
    q = torch.randn(total_q, group * hkv, d, generator=g).to(dtype)
    k = torch.randn(slots, hkv, d, generator=g).to(dtype)
    v = torch.randn(slots, hkv, d, generator=g).to(dtype)
    idx = torch.randint(-3, slots + 3, (total_q, topk), generator=g, dtype=torch.int32)
    lengths = torch.tensor([12, 0, 5, 12, 12, 1, 11, 12, 3], dtype=torch.int32)
    kw: dict[str, Any] = {"kind": kind, "lengths": lengths}
    if kind == "chunk":
        kw.update(cu_seqlens_q=torch.tensor([0, 4, 9], dtype=torch.int32),
                  prefix_lens=torch.tensor([6, 10], dtype=torch.int32),
                  page_table=torch.tensor([[3, 0, 7, 1, 9], [2, 8, 4, 6, 5]], dtype=torch.int32),
                  page_size=4, max_q=5)
        idx = idx.abs() % 16
    idx[4] = -1                                       # a row with nothing valid
    return (q, k, v, idx), kw


@pytest.mark.parametrize("kind", ["prefill", "chunk"])
@pytest.mark.parametrize("group", [6, 12])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_sparse_prefill_matches_the_reference(standin: registry.Registry, kind: str,
                                              group: int, dtype: torch.dtype) -> None:
    from backends.sparse_prefill import error_bound
    from backends.sparse_prefill.compare import compare

    args, kw = _sparse_call(kind, dtype, group)
    got = fi.sparse_prefill(*args, **kw, sm_scale=0.3)
    want = sparse_prefill_reference(*args, **kw, sm_scale=0.3, out_dtype=torch.float32)
    assert compare(got, want) is None, compare(got, want)
    assert got.dtype == dtype and bool((got[4] == 0).all())   # the empty row: zeros, not NaN
    assert error_bound(str(dtype).removeprefix("torch.")) > 0
    [wrapper] = BatchDecodeWithPagedKVCacheWrapper.made
    assert wrapper.tensor_cores   # group 12: the CUDA-core decode would refuse it
    assert wrapper.scale == 0.3 and wrapper.page_size == 1


@pytest.mark.parametrize("keeps_pages", [True, False])
def test_the_wrapper_and_workspace_are_cached_and_plan_reruns_only_when_counts_change(
        standin: registry.Registry, monkeypatch: pytest.MonkeyPatch, keeps_pages: bool) -> None:
    from backends.sparse_prefill.compare import compare

    monkeypatch.setattr(BatchDecodeWithPagedKVCacheWrapper, "keeps_pages", keeps_pages)
    args, kw = _sparse_call("prefill", torch.float16, 6)
    for _ in range(3):
        fi.sparse_prefill(*args, **kw)
    q, k, v, idx = args
    # the next layer: the same valid counts, other slots (and scale): plan() reruns only for
    # the scale; the planned page tensor must hold the new slots, or the output is the old one's
    moved = torch.where((idx >= 0) & (idx < k.shape[0] - 1), idx + 1, idx)
    for scale in (None, None, 0.5):
        got = fi.sparse_prefill(q, k, v, moved, **kw, sm_scale=scale)
        want = sparse_prefill_reference(q, k, v, moved, **kw, sm_scale=scale,
                                        out_dtype=torch.float32)
        assert compare(got, want) is None, compare(got, want)
    other, okw = _sparse_call("prefill", torch.float16, 12)
    fi.sparse_prefill(*other, **okw)
    made = BatchDecodeWithPagedKVCacheWrapper.made
    # one wrapper per head shape; plan() when its arguments change, or (a FlashInfer that
    # copies the pages) on every call
    assert [w.plans for w in made] == ([2, 1] if keeps_pages else [6, 1])
    # fewer valid entries in one row: new counts, plan() again, still right
    shorter = dict(kw, lengths=kw["lengths"].clone())
    shorter["lengths"][0] = 1
    got = fi.sparse_prefill(q, k, v, moved, **shorter)
    want = sparse_prefill_reference(q, k, v, moved, **shorter, out_dtype=torch.float32)
    assert compare(got, want) is None and made[0].plans == (3 if keeps_pages else 7)
    assert len(fi._WORKSPACES) == 1
    [ws] = fi._WORKSPACES.values()
    assert ws.numel() == fi.WORKSPACE_BYTES and not bool(ws.any())


def test_the_wrapper_cache_is_bounded(standin: registry.Registry,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fi, "MAX_WRAPPERS", 2)
    for group in (2, 3, 6):   # one wrapper per head shape
        args, kw = _sparse_call("prefill", torch.float16, group)
        fi.sparse_prefill(*args, **kw)
    assert len(fi._WRAPPERS) == 2 and len(BatchDecodeWithPagedKVCacheWrapper.made) == 3


def test_without_the_dummy_page_flashinfer_reads_the_next_rows_page() -> None:
    slot = torch.tensor([[1, 2], [0, 0]])
    valid = torch.tensor([[True, True], [False, False]])
    wrapper = BatchDecodeWithPagedKVCacheWrapper(torch.zeros(1), use_tensor_cores=True)
    # the naive arguments: row 1 has no pages, and FlashInfer gives it one token anyway
    wrapper.plan(torch.tensor([0, 2, 2], dtype=torch.int32),
                 torch.tensor([1, 2], dtype=torch.int32), torch.ones(2, dtype=torch.int32),
                 1, 1, 4, 1, q_data_type=torch.float32, sm_scale=1.0)
    q, k = torch.randn(2, 1, 4), torch.randn(3, 1, 1, 4)
    with pytest.raises(IndexError, match="reads past the page list"):
        wrapper.run(q, (k, k))
    pages = fi.paged_kv_args(slot, valid)
    wrapper.plan(pages.indptr, pages.indices, pages.last_page_len, 1, 1, 4, 1,
                 q_data_type=torch.float32, sm_scale=1.0)
    assert wrapper.run(q, (k, k)).shape == (2, 1, 4)


# ---------------------------------------------------------------------------------------------
# the conformance kit, with the stand-in


def test_the_conformance_kit_passes_on_the_flashinfer_plugin(standin: registry.Registry) -> None:
    from registry.testing import conformance_targets, run_target

    targets = conformance_targets("flashinfer", devices=["cpu"])
    outcomes = {t.name: run_target(t) for t in targets}
    failed = {n: o.message for n, o in outcomes.items() if o.status == "failed"}
    # The one contract point the kit finds the stand-in missing (it has torch's softmax, which
    # gives NaN for a row-head whose every score is -inf, where kreg's contract says zeros). It
    # depends on values, so no capability check can refuse it; whether FlashInfer itself differs
    # is for the kit on the H200 to say (docs/PLUGINS.md, chapter 10).
    assert set(failed) == {"flashinfer.sparse_prefill[cpu-float16-non_finite]"}, failed
    (message,) = failed.values()
    assert "at (row, head, dim) (5, 0, 0): got nan, the contract says finite" in message
    skipped = {n: o.message for n, o in outcomes.items() if o.status == "skipped"}
    # what it cannot run is refused by a capability check, with the reason
    assert set(skipped) == {n for n in outcomes if n.startswith("flashinfer.sparse_prefill")
                            and ("-float32-" in n or n.endswith("head_dim_80]"))}
    assert all("dtype: float32" in m or "head_dim: 80" in m for m in skipped.values())
    passed = [n for n, o in outcomes.items() if o.status == "passed"]
    assert len([n for n in passed if n.startswith("flashinfer.indexer_topk")]) >= 18
    assert len(passed) > 18


def test_kreg_bench_lists_flashinfer_like_any_implementation(standin: registry.Registry) -> None:
    from backends.indexer_topk.bench import BenchCase, run_case

    res = run_case(BenchCase(rows=3, keys=300, k=16), ["reference", "flashinfer.indexer_topk",
                                                       "auto"], warmup=0, iters=1)
    by = {m.label: m for m in res.measurements}
    assert by["flashinfer.indexer_topk"].status == "ok"
    assert by["flashinfer.indexer_topk"].runs.startswith("flashinfer.indexer_topk")
    assert by["auto"].implementation != "flashinfer.indexer_topk"   # priority 5: not by default


def test_exactness_is_declared_only_where_the_wrapper_makes_it() -> None:
    impls = {i.name: i for i in fi.kreg_implementations()}
    assert impls["flashinfer.indexer_topk"].contract_for(None).exact
    assert impls["flashinfer.sparse_prefill"].contract_for(None).names == {"deterministic"}
    assert "NOT CUDA-graph capturable" in impls["flashinfer.sparse_prefill"].description
    assert all(i.priority == fi.PRIORITY < 10 for i in impls.values())
    assert math.isclose(fi.WORKSPACE_BYTES / 2**20, 256)


def test_a_failed_import_at_the_first_dispatch_is_an_error_and_then_the_reason(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib

    from registry.errors import KernelUnavailableError

    real = importlib.import_module

    def broken(name: str, *args: Any) -> Any:
        if name == "flashinfer":
            raise OSError("libcudart.so.13: cannot open shared object file")
        return real(name, *args)

    monkeypatch.setattr(fi, "_MODULE", [])
    monkeypatch.setattr(fi, "_AVAILABILITY", [INSTALLED])
    monkeypatch.setattr(importlib, "import_module", broken)
    with pytest.raises(KernelUnavailableError, match="flashinfer not importable: import failed: "
                                                     "OSError: libcudart"):
        fi._flashinfer()
    assert fi.availability().version is None
    assert fi.availability().reason.startswith("import failed: OSError: libcudart")


# ---------------------------------------------------------------------------------------------
# on a GPU with FlashInfer (the device step runs these beside the kit)


def _real_flashinfer() -> None:
    if fi.availability().version is None:
        pytest.skip(f"flashinfer not importable: {fi.availability().reason}")


@pytest.mark.gpu
def test_gpu_sparse_prefill_is_deterministic_and_within_the_bound() -> None:
    from backends.sparse_prefill.bench import BenchCase, make_inputs
    from backends.sparse_prefill.compare import compare

    _real_flashinfer()
    for kind, group in (("prefill", 12), ("chunk", 6)):
        case = BenchCase(kind=kind, group_size=group, kv_len=4096, total_q=1024, topk=2051)
        inp = make_inputs(case)
        args = (inp["q"], inp["k"], inp["v"], inp["indices"])
        first = fi.sparse_prefill(*args, **inp["kwargs"])
        again = fi.sparse_prefill(*args, **inp["kwargs"])
        assert torch.equal(first, again), (kind, group)   # the declared contract
        want = sparse_prefill_reference(*args, **inp["kwargs"], out_dtype=torch.float32)
        assert compare(first, want) is None, (kind, group, compare(first, want))
        # the next layer: the same valid counts, other slots; plan() is reused, so the refilled
        # page tensor must be the one run() reads (FlashInfer keeps plan()'s tensor as it is)
        q, k = inp["q"], inp["k"]
        entry = fi._WRAPPERS[(q.device, q.shape[1], k.shape[1], q.shape[2], q.dtype, k.dtype)]
        idx = inp["indices"]
        moved = torch.where((idx > 0) & (idx < 1024), idx + 1, idx)
        other = fi.sparse_prefill(inp["q"], inp["k"], inp["v"], moved, **inp["kwargs"])
        want = sparse_prefill_reference(inp["q"], inp["k"], inp["v"], moved, **inp["kwargs"],
                                        out_dtype=torch.float32)
        assert compare(other, want) is None, (kind, group, "reused plan", compare(other, want))
        assert entry.pages is not None   # FlashInfer 0.6.18 keeps plan()'s tensor: reuse is on


@pytest.mark.gpu
def test_gpu_indexer_topk_is_exact_on_ties_nan_and_zeros() -> None:
    _real_flashinfer()
    g = torch.Generator().manual_seed(5)
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        scores = torch.randint(-2, 3, (64, 8192), generator=g).float()
        scores[:, ::7] = float("nan")
        scores[1] = -0.0
        scores[2, ::2] = float("-inf")
        scores = scores.to(dtype).cuda()
        lengths = torch.randint(0, 8193, (64,), generator=g, dtype=torch.int32).cuda()
        lengths[:4] = 8192
        for k in (2048, 64):
            got = fi.indexer_topk(scores, lengths, k)
            assert torch.equal(got, indexer_topk_reference(scores, lengths, k)), (dtype, k)


# ---------------------------------------------------------------------------------------------
# kreg bench indexer_topk --providers flashinfer-topk (FlashInfer's raw kernel as an anchor)


def _bench_json(args: list[str]) -> Any:
    import json

    from backends.indexer_topk import bench

    res = CliRunner().invoke(bench.bench_command, args)
    return res, (json.loads(res.output[res.output.index("{"):]) if res.exit_code == 0 else None)


BENCH_ARGS = ["--rows", "3", "--keys", "700", "--k", "16", "--iters", "1", "--warmup", "0",
              "--dist", "randn,ties", "--json", "--providers", "flashinfer-topk,auto"]


def test_bench_raw_flashinfer_is_a_set_checked_anchor(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "flashinfer", STANDIN)
    res, data = _bench_json(BENCH_ARGS)
    assert res.exit_code == 0, res.output
    for case in data["cases"]:   # randn and the tie-heavy rows: the same membership rule
        prov = {m["label"]: m for m in case["results"]}
        raw = prov["flashinfer-topk"]
        assert raw["status"] == "unjudged" and raw["detail"] == "same set", raw
        assert "tie_break=1" in raw["runs"] and prov["auto"]["error"] == 0

    # negative control: a kernel that breaks ties the other way is reported, not hidden
    def larger_index_first(input, offsets, lengths, k, deterministic=False, tie_break=0):
        flipped = top_k_ragged_transform(input.flip(1).contiguous(), offsets, lengths, k,
                                         tie_break=1)
        return torch.where(flipped >= 0, input.shape[1] - 1 - flipped, flipped)

    monkeypatch.setitem(sys.modules, "flashinfer", types.SimpleNamespace(
        top_k_ragged_transform=larger_index_first))
    res, data = _bench_json(BENCH_ARGS)
    assert res.exit_code == 0, res.output   # an anchor never fails the run
    details = [m["detail"] for c in data["cases"] for m in c["results"]
               if m["label"] == "flashinfer-topk"]
    assert details[0] == "same set" and details[1].startswith("differs on "), details


def test_bench_raw_flashinfer_missing_is_a_usage_error(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "flashinfer", None)   # import raises ImportError
    res, _ = _bench_json(BENCH_ARGS)
    assert res.exit_code == 1 and "Traceback" not in res.output
    assert "flashinfer is not importable" in res.output
    assert "pip install 'kreg[flashinfer]'" in res.output and "drop the provider" in res.output


# ---------------------------------------------------------------------------------------------
# kreg bench sparse_prefill --providers flashinfer-paged (FlashInfer's raw paged attention:
# planned once, run() timed alone)


def _sparse_bench(args: list[str]) -> Any:
    import json

    from backends.sparse_prefill import bench

    res = CliRunner().invoke(bench.bench_command, args)
    return res, (json.loads(res.output[res.output.index("{"):]) if res.exit_code == 0 else None)


SPARSE_ARGS = ["--group-size", "6", "--kv-len", "96", "--total-q", "24", "--topk", "16",
               "--head-dim", "16", "--dtype", "float32", "--iters", "2", "--warmup", "1",
               "--json", "--providers", "flashinfer-paged", "--baseline", "flashinfer-paged"]


@pytest.mark.parametrize("kind,index_set", [("prefill", "walk"), ("prefill", "topk"),
                                            ("chunk", "topk")])
def test_bench_raw_flashinfer_paged_plans_once_and_is_checked(
        monkeypatch: pytest.MonkeyPatch, kind: str, index_set: str) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "flashinfer", STANDIN)
    BatchDecodeWithPagedKVCacheWrapper.made.clear()
    runs = []
    real_run = BatchDecodeWithPagedKVCacheWrapper.run

    def counted(self: Any, *a: Any, **kw: Any) -> Any:
        runs.append(self)
        return real_run(self, *a, **kw)

    monkeypatch.setattr(BatchDecodeWithPagedKVCacheWrapper, "run", counted)
    res, data = _sparse_bench(["--kind", kind, "--indices", index_set, *SPARSE_ARGS])
    assert res.exit_code == 0, res.output
    [case] = data["cases"]
    [m] = case["results"]
    assert m["label"] == "flashinfer-paged" and m["status"] == "ok", m
    assert m["error"] < 1e-4 and "run() alone" in m["runs"], m
    # one wrapper, planned once (tensor cores, one page a slot), run() on every timed call
    [wrapper] = BatchDecodeWithPagedKVCacheWrapper.made
    assert wrapper.plans == 1 and wrapper.tensor_cores and wrapper.page_size == 1
    assert len(runs) >= 3 and all(r is wrapper for r in runs)


def test_bench_raw_flashinfer_paged_wrong_output_fails_the_run(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Negative control: a paged kernel that drops each row's last page is caught by the check
    against the reference (the provider is judged, unlike the top-k anchor)."""
    import sys

    class Short(BatchDecodeWithPagedKVCacheWrapper):
        def plan(self, indptr: torch.Tensor, *a: Any, **kw: Any) -> None:
            super().plan(indptr, *a, **kw)
            self.kv_lens = torch.clamp(self.kv_lens - 1, min=1)

    monkeypatch.setitem(sys.modules, "flashinfer", types.SimpleNamespace(
        BatchDecodeWithPagedKVCacheWrapper=Short))
    res, _ = _sparse_bench(["--kind", "prefill", "--indices", "walk", *SPARSE_ARGS])
    assert res.exit_code == 1 and "failed the check" in res.output, res.output


def test_bench_raw_flashinfer_paged_missing_is_a_usage_error(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "flashinfer", None)   # import raises ImportError
    res, _ = _sparse_bench(["--kind", "prefill", *SPARSE_ARGS])
    assert res.exit_code == 1 and "Traceback" not in res.output
    assert "--providers flashinfer-paged: flashinfer is not importable" in res.output
    assert "pip install 'kreg[flashinfer]'" in res.output


def test_bench_raw_flashinfer_paged_refusing_a_case_fails_only_itself(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A case FlashInfer's plan() refuses (fp32 attention, say) is that provider's failure,
    named with FlashInfer's reason, not a traceback; the other providers of the case still run
    and pass."""
    import sys

    class Refuses(BatchDecodeWithPagedKVCacheWrapper):
        def plan(self, *a: Any, **kw: Any) -> None:
            raise ValueError("unsupported q_data_type torch.float32")

    monkeypatch.setitem(sys.modules, "flashinfer", types.SimpleNamespace(
        BatchDecodeWithPagedKVCacheWrapper=Refuses))
    res, _ = _sparse_bench(["--kind", "prefill", "--group-size", "6", "--kv-len", "96",
                            "--total-q", "24", "--topk", "16", "--head-dim", "16", "--dtype",
                            "float32", "--iters", "1", "--warmup", "0", "--providers",
                            "flashinfer-paged,gather-sdpa", "--baseline", "gather-sdpa"])
    assert res.exit_code == 1 and "Traceback" not in res.output, res.output
    assert "FlashInfer refused the case: plan() raised ValueError: unsupported q_data_type" \
        in res.output
    [sdpa] = [ln for ln in res.output.splitlines() if "gather-sdpa " in ln]
    assert " ok " in sdpa, sdpa
    assert "failed the check against the fp32 reference or raised: [('prefill g=6 hkv=1 " \
        "kv=96 q=24', 'flashinfer-paged')]" in res.output
