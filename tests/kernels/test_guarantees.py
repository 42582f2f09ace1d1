"""The contracts the in-tree implementations declare, proven on fresh random inputs
(registry/_contract.py; backends/sparse_prefill/guarantees.py).

CPU: the Triton kernels under the interpreter (float32), at small sizes. GPU (``gpu``): the
H200-sized claims, including a row's bits across total_q from 1 to 8192 under
``KREG_REQUIRE_SPARSE_PREFILL=batch_invariant``.
"""

from __future__ import annotations

import os
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

import registry  # noqa: E402
from backends.sparse_prefill.bench import BenchCase, make_inputs  # noqa: E402
from backends.sparse_prefill.guarantees import ORDER_NEUTRAL, order_class  # noqa: E402
from backends.sparse_prefill.triton_kernels import sparse_prefill_triton  # noqa: E402

CPU = not torch.cuda.is_available()
if CPU and os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("no GPU and TRITON_INTERPRET is not 1: the Triton kernels cannot run here",
                allow_module_level=True)
DEV = "cpu" if CPU else "cuda"

# Each config the generic table gives some total_q (plugins/generic.py), and a family config.
TABLE = [{"BLOCK_M": 16, "BLOCK_N": bn, "num_warps": w, "num_stages": 2}
         for bn, w in ((32, 8), (64, 8), (64, 4), (32, 4), (16, 1))]
FAMILY = {"BLOCK_M": 8, "BLOCK_N": 16, "num_warps": 1, "num_stages": 2, "SPLIT_QK": 2,
          "SPLIT_V": 2, "LEAN": 1, "OFFS32": 1, "REVERSE_ROWS": 1}


def _prefill(rows: int, seed: int, *, slots: int = 48, topk: int = 12, group: int = 2,
             d: int = 16) -> tuple[tuple[Any, ...], dict[str, Any]]:
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(rows, group, d, generator=g)
    k = torch.randn(slots, 1, d, generator=g)
    v = torch.randn(slots, 1, d, generator=g)
    idx = torch.randint(-2, slots + 2, (rows, topk), generator=g, dtype=torch.int32)
    idx[:, 1] = idx[:, 0]   # a duplicate in every row (counts twice)
    lens = torch.randint(0, topk + 1, (rows,), generator=g, dtype=torch.int32)
    return ((q.to(DEV), k.to(DEV), v.to(DEV), idx.to(DEV)),
            {"kind": "prefill", "lengths": lens.to(DEV)})


def _rows(args: tuple[Any, ...], kw: dict[str, Any], a: int, b: int) -> tuple[Any, Any]:
    q, k, v, idx = args
    return (q[a:b], k, v, idx[a:b]), {**kw, "lengths": kw["lengths"][a:b]}


@pytest.mark.parametrize("cfg", [*TABLE, FAMILY], ids=order_class)
def test_sparse_triton_is_deterministic_and_row_local_per_config(cfg: dict[str, Any]) -> None:
    args, kw = _prefill(9, seed=1)
    full = sparse_prefill_triton(*args, config=cfg, **kw)
    assert torch.equal(full, sparse_prefill_triton(*args, config=cfg, **kw))   # run to run
    for a, b in ((4, 5), (0, 5), (3, 9), (2, 7)):   # row 4 alone and inside other batches
        sub_args, sub_kw = _rows(args, kw, a, b)
        part = sparse_prefill_triton(*sub_args, config=cfg, **sub_kw)
        assert torch.equal(part[4 - a], full[4]), (a, b)


def test_configs_of_one_order_class_give_the_same_bits() -> None:
    args, kw = _prefill(7, seed=2)
    base = sparse_prefill_triton(*args, config=FAMILY, **kw)
    neutral = {**FAMILY, "OFFS32": 0, "REVERSE_ROWS": 0, "num_stages": 3, "MAXNREG": 64}
    assert order_class(neutral) == order_class(FAMILY)
    assert torch.equal(sparse_prefill_triton(*args, config=neutral, **kw), base)
    # chunk rows through the page table: every translation mode is one class
    inp = make_inputs(BenchCase(kind="chunk", group_size=2, kv_len=40, total_q=6, topk=8,
                                head_dim=16, dtype="float32", page_size=4), DEV)
    outs = []
    for mode in ("fused", "pretranslate", "staged"):
        cfg = {**TABLE[4], "CHUNK_MODE": mode}
        assert "CHUNK_MODE" in ORDER_NEUTRAL and order_class(cfg) == order_class(TABLE[4])
        outs.append(sparse_prefill_triton(inp["q"], inp["k"], inp["v"], inp["indices"],
                                          config=cfg, **inp["kwargs"]))
    assert torch.equal(outs[0], outs[1]) and torch.equal(outs[0], outs[2])


def test_batch_invariant_dispatch_keeps_a_rows_bits_across_batch_sizes() -> None:
    args, kw = _prefill(130, seed=3)
    full_q = args[0]
    got, configs = [], set()
    with registry.require("sparse_prefill", "batch_invariant"):
        for n in (1, 2, 33, 65, 130):   # across the table's 32 / 64 / 128 row thresholds
            sub_args, sub_kw = _rows(args, kw, 0, n)
            with registry.record() as launches:
                out = registry.dispatch("sparse_prefill", *sub_args, **sub_kw)
            got.append(out[0])
            configs.add(tuple(sorted(launches[0].config.items())))
    assert len(configs) == 1
    assert all(torch.equal(g, got[0]) for g in got)
    # without the requirement the table moves with total_q
    per_batch = set()
    for n in (1, 33, 65, 130):
        sub_args, sub_kw = _rows(args, kw, 0, n)
        with registry.record() as launches:
            registry.dispatch("sparse_prefill", *sub_args, **sub_kw)
        per_batch.add(tuple(sorted(launches[0].config.items())))
    assert len(per_batch) > 1 and full_q.shape[0] == 130


def test_sparse_reference_is_deterministic() -> None:
    from backends.sparse_prefill.reference import sparse_prefill_reference

    args, kw = _prefill(5, seed=4)
    assert torch.equal(sparse_prefill_reference(*args, **kw),
                       sparse_prefill_reference(*args, **kw))


@pytest.mark.parametrize("fill", ["randn", "ties"])
def test_indexer_is_exact_so_run_to_run_and_row_alone_agree(fill: str) -> None:
    g = torch.Generator().manual_seed(5)
    scores = torch.randn(6, 256, generator=g)
    if fill == "ties":
        scores = (scores * 2).round() / 2   # few distinct values: ties at the k-th score
    scores = scores.to(DEV)
    lengths = torch.tensor([256, 200, 17, 0, 256, 100], dtype=torch.int32, device=DEV)
    with registry.require("indexer_topk", "exact"):
        full = registry.dispatch("indexer_topk", scores, lengths, k=16)
        assert torch.equal(full, registry.dispatch("indexer_topk", scores, lengths, k=16))
        for r in range(6):
            alone = registry.dispatch("indexer_topk", scores[r:r + 1], lengths[r:r + 1], k=16)
            assert torch.equal(alone[0], full[r])


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["prefill", "chunk"])
@pytest.mark.parametrize("group", [6, 12])
@pytest.mark.parametrize("kv_len", [8192, 32768])
def test_gpu_a_rows_bits_across_total_q_1_to_8192_under_batch_invariance(
        kind: str, group: int, kv_len: int) -> None:
    """The seed shape (top-k 2051, head dim 256, bf16) on the device: rows 0 and 7 computed in
    batches of 1..8192 rows (every total_q the policies switch at) give the same bits."""
    case = BenchCase(kind=kind, group_size=group, kv_len=kv_len, total_q=8192)
    inp = make_inputs(case, "cuda")
    q, k, v, idx, kw = inp["q"], inp["k"], inp["v"], inp["indices"], inp["kwargs"]
    first = None
    configs = set()
    with registry.require("sparse_prefill", "batch_invariant"):
        for n in (8, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192):
            sub = dict(kw, lengths=kw["lengths"][:n])
            if kind == "chunk":
                # the same request, fewer rows: the first n rows of the chunk
                sub.update(cu_seqlens_q=torch.tensor([0, n], dtype=torch.int32, device="cuda"),
                           max_q=n)
            with registry.record() as launches:
                out = registry.dispatch("sparse_prefill", q[:n], k, v, idx[:n], **sub)
            configs.add(str(launches[0].config))
            rows = out[[0, 7]]
            if first is None:
                first = rows
            assert torch.equal(rows, first), n
    assert len(configs) == 1, configs


@pytest.mark.gpu
def test_gpu_every_h200_policy_config_is_deterministic() -> None:
    offered = registry.get_registry().offered_configs("sparse_prefill")
    for name, cfg in offered.items():
        kind = "chunk" if ".chunk_" in name else "prefill"
        group = 12 if "g12" in name else 6
        case = BenchCase(kind=kind, group_size=group, kv_len=8192, total_q=2048)
        inp = make_inputs(case, "cuda")
        a = sparse_prefill_triton(inp["q"], inp["k"], inp["v"], inp["indices"], config=cfg,
                                  **inp["kwargs"])
        b = sparse_prefill_triton(inp["q"], inp["k"], inp["v"], inp["indices"], config=cfg,
                                  **inp["kwargs"])
        assert torch.equal(a, b), name
