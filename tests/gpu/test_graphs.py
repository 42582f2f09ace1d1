"""Dispatch inside CUDA graph capture: no host synchronization, and the replay is correct.

``torch.cuda.set_sync_debug_mode("error")`` turns every synchronizing call into an error; it is
set inside the capture only (entering and leaving ``torch.cuda.graph`` synchronize on purpose).
The first dispatch of each workload (selection, kernel load, Triton compilation) happens before
the capture, as a framework's warm-up does; in the capture the dispatch takes the hit path. Check
mode and the recorder stay on during the capture: the recorder records, and check mode counts the
dispatch as skipped (its comparison would read device memory).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

import registry
from registry import observe

pytestmark = [pytest.mark.gpu,
              pytest.mark.filterwarnings("ignore:Synchronization debug mode:UserWarning")]

torch = pytest.importorskip("torch")


@pytest.fixture(autouse=True)
def _clean(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> Iterator[None]:
    monkeypatch.setenv("KREG_HOME", str(tmp_path))
    observe.reset_stats()
    yield
    torch.cuda.set_sync_debug_mode(0)  # whatever a failing test left behind
    observe.check(0.0)
    observe.reset_stats()


def _sparse_prefill() -> tuple[tuple[Any, ...], dict[str, Any], Callable[..., Any], Any]:
    from backends.sparse_prefill.compare import compare
    from backends.sparse_prefill.reference import sparse_prefill_reference

    g = torch.Generator().manual_seed(0)
    dev = "cuda"
    q = torch.randn(64, 6, 256, generator=g).to(dev, torch.bfloat16)
    k = torch.randn(4096, 1, 256, generator=g).to(dev, torch.bfloat16)
    v = torch.randn(4096, 1, 256, generator=g).to(dev, torch.bfloat16)
    idx = torch.randint(-4, 4100, (64, 2051), generator=g, dtype=torch.int32).to(dev)
    lengths = torch.randint(0, 2052, (64,), generator=g, dtype=torch.int32).to(dev)
    return (q, k, v, idx), {"kind": "prefill", "lengths": lengths}, sparse_prefill_reference, \
        compare


def _indexer_topk() -> tuple[tuple[Any, ...], dict[str, Any], Callable[..., Any], Any]:
    from backends.indexer_topk.compare import compare
    from backends.indexer_topk.reference import indexer_topk_reference

    g = torch.Generator().manual_seed(1)
    scores = torch.randn(16, 16384, generator=g).to("cuda")
    scores[3, ::7] = float("nan")
    lengths = torch.tensor([16384, 2047, 2048, 2049, 0, 1, 9000, 16000] * 2,
                           dtype=torch.int32).to("cuda")
    return (scores, lengths), {"k": 2048}, indexer_topk_reference, compare


def _refill(args: tuple[Any, ...]) -> None:
    """New data in the captured input buffers (same shapes, same validity structure)."""
    for t in args:
        if t.is_floating_point():
            nan = t.isnan()
            fresh = torch.randn_like(t, dtype=torch.float32).to(t.dtype)
            t.copy_(fresh.masked_fill(nan, float("nan")))


@pytest.mark.parametrize("make", [_sparse_prefill, _indexer_topk],
                         ids=["sparse_prefill", "indexer_topk"])
@pytest.mark.parametrize("through", ["dispatch", "torch_op"])
def test_dispatch_in_graph_capture_does_not_sync_and_replays_correctly(
        make: Any, through: str) -> None:
    import backends.indexer_topk.torch_op
    import backends.sparse_prefill.torch_op  # noqa: F401

    args, kwargs, reference, compare = make()
    op = "sparse_prefill" if make is _sparse_prefill else "indexer_topk"

    def call() -> Any:
        if through == "dispatch":
            return registry.dispatch(op, *args, **kwargs)
        if op == "sparse_prefill":
            return torch.ops.kreg.sparse_prefill(*args, **kwargs)
        return torch.ops.kreg.indexer_topk(*args, kwargs["k"])

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up on a side stream, as torch recommends
        for _ in range(2):
            call()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()

    graph = torch.cuda.CUDAGraph()
    with registry.check(1.0), registry.record() as launches, torch.cuda.graph(graph):
        try:
            torch.cuda.set_sync_debug_mode("error")
            out = call()
        finally:
            torch.cuda.set_sync_debug_mode(0)
    assert len(launches) == 1 and not launches[0].fallback, launches
    counter = registry.stats().counter(launches[0].implementation)
    assert (counter.skipped, counter.checked) == (1, 0)

    for _ in range(2):
        _refill(args)
        graph.replay()
        torch.cuda.synchronize()
        assert compare(out, reference(*args, **kwargs)) is None
