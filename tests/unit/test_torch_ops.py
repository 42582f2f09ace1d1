"""``torch.ops.kreg.sparse_prefill`` and ``torch.ops.kreg.indexer_topk``: schema, fake kernels,
dispatch through the registry, and ``torch.compile(fullgraph=True)`` without graph breaks.

Runs on the CPU with the torch references (forced by override, to stay fast); the GPU variant
(CUDA graph capture) lives in tests/gpu/test_graphs.py.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch

import backends.indexer_topk.torch_op
import backends.sparse_prefill.torch_op  # noqa: F401  (registers kreg::sparse_prefill)
import registry
from backends.indexer_topk.reference import indexer_topk_reference
from backends.sparse_prefill.reference import sparse_prefill_reference


@pytest.fixture(autouse=True)
def _references() -> Iterator[None]:
    with registry.override("sparse_prefill", "reference.sparse_prefill"), \
            registry.override("indexer_topk", "reference.indexer_topk"):
        yield


def _prefill() -> tuple[tuple[Any, ...], dict[str, Any]]:
    g = torch.Generator().manual_seed(0)
    q = torch.randn(5, 4, 16, generator=g)
    k = torch.randn(20, 2, 16, generator=g)
    v = torch.randn(20, 2, 16, generator=g)
    idx = torch.randint(-2, 22, (5, 8), generator=g, dtype=torch.int32)
    lengths = torch.tensor([8, 0, 3, 7, 1], dtype=torch.int32)
    return (q, k, v, idx), {"kind": "prefill", "lengths": lengths, "sm_scale": 0.3}


def _chunk() -> tuple[tuple[Any, ...], dict[str, Any]]:
    g = torch.Generator().manual_seed(1)
    q = torch.randn(5, 4, 16, generator=g)
    k = torch.randn(24, 2, 16, generator=g)
    v = torch.randn(24, 2, 16, generator=g)
    idx = torch.randint(-1, 9, (5, 6), generator=g, dtype=torch.int32)
    cu = torch.tensor([0, 2, 5], dtype=torch.int32)
    prefix = torch.tensor([3, 5], dtype=torch.int32)
    pt = torch.tensor([[4, 1, 0], [2, 5, -1]], dtype=torch.int32)
    return (q, k, v, idx), {"kind": "chunk", "cu_seqlens_q": cu, "prefix_lens": prefix,
                            "page_table": pt, "page_size": 4, "max_q": 3}


def _topk() -> tuple[torch.Tensor, torch.Tensor]:
    scores = torch.randn(4, 50, generator=torch.Generator().manual_seed(2))
    scores[1, 3] = float("nan")
    return scores, torch.tensor([50, 10, 0, 4], dtype=torch.int32)


def test_schemas_hold_the_optional_arguments() -> None:
    sp = str(torch.ops.kreg.sparse_prefill.default._schema)
    for arg in ('str kind="prefill"', "Tensor? lengths=None", "float? sm_scale=None",
                "Tensor? cu_seqlens_q=None", "Tensor? prefix_lens=None",
                "Tensor? page_table=None", "page_size=1", "max_q=None"):
        assert arg in sp, sp
    assert sp.endswith("-> Tensor")
    tk = str(torch.ops.kreg.indexer_topk.default._schema)
    assert tk.startswith("kreg::indexer_topk(Tensor scores, Tensor lengths,") and "k=2048" in tk


@pytest.mark.parametrize("make", [_prefill, _chunk], ids=["prefill", "chunk"])
def test_sparse_prefill_op_dispatches_through_the_registry(make: Any) -> None:
    args, kwargs = make()
    with registry.record() as launches:
        out = torch.ops.kreg.sparse_prefill(*args, **kwargs)
    assert [x.implementation for x in launches] == ["reference.sparse_prefill"]
    assert launches[0].workload["kind"] == kwargs["kind"]
    torch.testing.assert_close(out, sparse_prefill_reference(*args, **kwargs))
    torch.library.opcheck(torch.ops.kreg.sparse_prefill.default, args, kwargs,
                          test_utils=("test_schema", "test_faketensor"))


def test_indexer_topk_op_dispatches_through_the_registry() -> None:
    scores, lengths = _topk()
    with registry.record() as launches:
        out = torch.ops.kreg.indexer_topk(scores, lengths, 8)
    assert [(x.implementation, x.workload["k"]) for x in launches] == [
        ("reference.indexer_topk", 8)]
    assert torch.equal(out, indexer_topk_reference(scores, lengths, 8))
    assert out.dtype == torch.int32 and out.shape == (4, 8)
    torch.library.opcheck(torch.ops.kreg.indexer_topk.default, (scores, lengths, 8),
                          test_utils=("test_schema", "test_faketensor"))


# torch 2.11's dynamo touches torch.jit.script_method on import, which warns.
compile_warnings = pytest.mark.filterwarnings(
    "ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")


def _compile(fn: Any) -> Any:
    try:
        import torch._dynamo
    except Exception as exc:  # pragma: no cover - builds without dynamo
        pytest.skip(f"torch.compile is unavailable here: {exc}")
    torch._dynamo.reset()
    # aot_eager traces through the fake kernels (what inductor would see) without compiling C++
    return torch.compile(fn, fullgraph=True, backend="aot_eager")


@compile_warnings
def test_compile_fullgraph_sparse_prefill_chunk() -> None:
    args, kwargs = _chunk()

    def layer(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, idx: torch.Tensor,
              cu: torch.Tensor, prefix: torch.Tensor, pt: torch.Tensor) -> torch.Tensor:
        out = torch.ops.kreg.sparse_prefill(q * 2, k, v, idx, kind="chunk", cu_seqlens_q=cu,
                                            prefix_lens=prefix, page_table=pt, page_size=4,
                                            max_q=3)
        return out.sum(dim=1) + 1  # ops around the custom op stay in the same graph

    compiled = _compile(layer)
    q, k, v, idx = args
    call = (q, k, v, idx, kwargs["cu_seqlens_q"], kwargs["prefix_lens"], kwargs["page_table"])
    with registry.record() as launches:
        got = compiled(*call)  # fullgraph=True: a graph break would raise here
    assert [x.implementation for x in launches] == ["reference.sparse_prefill"]
    torch.testing.assert_close(got, layer(*call))


@compile_warnings
def test_compile_fullgraph_indexer_topk_with_lengths() -> None:
    scores, lengths = _topk()

    def select(s: torch.Tensor, n: torch.Tensor) -> torch.Tensor:
        return torch.ops.kreg.indexer_topk(s.float() * 0.5, n, 8).clamp_min(-1)

    got = _compile(select)(scores, lengths)
    assert torch.equal(got, indexer_topk_reference(scores * 0.5, lengths, 8))


@compile_warnings
def test_calling_dispatch_directly_breaks_the_graph() -> None:
    """The control: without the custom op, fullgraph compilation fails, so the tests above can."""
    scores, lengths = _topk()

    def select(s: torch.Tensor, n: torch.Tensor) -> torch.Tensor:
        return registry.dispatch("indexer_topk", s * 0.5, n, k=8)  # type: ignore[no-any-return]

    compiled = _compile(select)
    with pytest.raises(torch._dynamo.exc.Unsupported):
        compiled(scores, lengths)
