"""sparse_prefill index sets (backends/sparse_prefill/indices.py) and ``kreg bench
sparse_prefill --indices topk``: shapes, ascending order, -1 padding, determinism, overlap rising
with ``--overlap``, the walk unchanged; the bench end to end at tiny sizes (interpreter, float32).
"""

from __future__ import annotations

import itertools
import json

import pytest

torch = pytest.importorskip("torch")

from click.testing import CliRunner  # noqa: E402

from backends.sparse_prefill.bench import BenchCase, make_inputs  # noqa: E402
from backends.sparse_prefill.indices import (  # noqa: E402
    TopkParams,
    overlap_stats,
    topk_indices,
    walk_indices,
)


def _ramp(kv: int, rows: int) -> torch.Tensor:
    return torch.clamp(max(0, kv - rows) + torch.arange(rows) + 1, max=kv)


def _valid(idx: torch.Tensor, lens: torch.Tensor) -> torch.Tensor:
    return torch.arange(idx.shape[1])[None, :] < lens[:, None].long()


def test_topk_shapes_order_padding_and_visibility():
    vis = _ramp(64, 48)  # rows see 17..64 positions; topk 24 > 17: short rows are padded
    idx, lens = topk_indices(vis, 24, TopkParams(overlap=0.9, window=4, seed=3))
    assert idx.shape == (48, 24) and idx.dtype == torch.int32 and idx.is_contiguous()
    assert lens.dtype == torch.int32 and torch.equal(lens, torch.clamp(vis, max=24).int())
    ok = _valid(idx, lens)
    assert torch.all(idx[~ok] == -1) and torch.all(idx[ok] >= 0)
    assert torch.all(idx[ok] < vis[:, None].expand_as(idx)[ok])  # causal: only visible
    for r in range(48):
        row = idx[r, : int(lens[r])]
        assert torch.all(row[1:] > row[:-1])  # strictly ascending: distinct positions
        # the recent window is always selected
        assert set(range(int(vis[r]) - 4, int(vis[r]))) <= set(row.tolist())
    # a row that sees fewer positions than topk selects them all
    assert idx[0, :17].tolist() == list(range(17))


def test_topk_is_deterministic_by_seed():
    vis = _ramp(200, 40)
    a = topk_indices(vis, 32, TopkParams(window=4, seed=1))
    b = topk_indices(vis, 32, TopkParams(window=4, seed=1))
    c = topk_indices(vis, 32, TopkParams(window=4, seed=2))
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert not torch.equal(a[0], c[0])


def test_overlap_rises_with_the_knob_from_the_walk_to_near_identical():
    kv, rows, topk = 512, 128, 64
    vis = _ramp(kv, rows)
    walk = overlap_stats(*walk_indices(vis, topk), width=kv)
    stats = [overlap_stats(*topk_indices(vis, topk, TopkParams(overlap=ov, window=8)), width=kv)
             for ov in (0.0, 0.5, 0.9, 0.99, 1.0)]
    jac = [s["jaccard"] for s in stats]
    union = [s["union16_over_topk"] for s in stats]
    assert all(a < b for a, b in itertools.pairwise(jac)), jac
    assert all(a > b for a, b in itertools.pairwise(union)), union
    assert abs(jac[0] - walk["jaccard"]) < 0.1  # overlap 0: about the walk's
    assert jac[-1] > 0.95 and union[-1] < 1.3  # overlap 1: near-identical (the window slides)
    assert walk["union16_over_topk"] > 3


def test_overlap_stats_by_hand():
    idx = torch.tensor([[0, 1, 2, -1], [1, 2, 3, 9], [5, 5, 7, 0]], dtype=torch.int32)
    lens = torch.tensor([4, 3, 4], dtype=torch.int32)  # row 1's 9 is past its length
    st = overlap_stats(idx, lens, width=8, block=2)
    # {0,1,2} vs {1,2,3}: 2/4; {1,2,3} vs {0,5,7} (5 twice counts once): 0/6
    assert st["jaccard"] == pytest.approx((0.5 + 0.0) / 2)
    assert st["union16"] == 4 and st["union16_over_topk"] == 1.0  # one 2-row block: {0,1,2,3}
    # requests of 1 and 2 rows: only the pair (1, 2) and the block of rows 1-2 are inside one
    st = overlap_stats(idx, lens, width=8, block=2, row_groups=[1, 2])
    assert st["jaccard"] == 0.0 and st["union16"] == 6


def test_walk_is_the_bench_walk():
    # the walk as the bench built it before indices.py (bit for bit)
    vis = torch.tensor([1, 5, 40, 300, 300], dtype=torch.int64)
    r, j = torch.arange(5)[:, None], torch.arange(77)[None, :]
    n = torch.clamp(vis, max=77)
    t = (r * 7919 + j * 1000003) % vis[:, None]
    want = torch.where(j < n[:, None], t, torch.full_like(t, -1)).to(torch.int32)
    idx, lens = walk_indices(vis, 77)
    assert torch.equal(idx, want) and torch.equal(lens, n.int())
    case = BenchCase(kind="prefill", kv_len=50, total_q=20, topk=16, head_dim=8,
                     dtype="float32")
    assert case.indices == "walk" and "topk" not in case.label()
    inp = make_inputs(case, "cpu")
    assert torch.equal(inp["indices"], walk_indices(_ramp(50, 20), 16)[0])


@pytest.mark.parametrize("kind", ["prefill", "chunk"])
def test_bench_topk_inputs(kind):
    base = dict(kind=kind, kv_len=60, total_q=40, topk=16, head_dim=8, dtype="float32",
                page_size=4, req_lens=(15, 25) if kind == "chunk" else None)
    walk = make_inputs(BenchCase(**base), "cpu")
    top = make_inputs(BenchCase(**base, indices="topk", overlap=0.9, window=3), "cpu")
    for key in ("q", "k", "v"):  # only the index set differs
        assert torch.equal(walk[key], top[key])
    assert torch.equal(walk["kwargs"]["lengths"], top["kwargs"]["lengths"])
    idx, lens = top["indices"], top["kwargs"]["lengths"]
    ok = _valid(idx, lens)
    assert torch.all(idx[~ok] == -1)
    if kind == "chunk":  # positions of each row's request, at most the row's position
        kw = top["kwargs"]
        assert torch.equal(kw["page_table"], walk["kwargs"]["page_table"])
        pos = torch.cat([kw["prefix_lens"][b] + torch.arange(n) for b, n in enumerate((15, 25))])
        assert torch.all(idx[ok] <= pos[:, None].expand_as(idx)[ok])
    assert all(torch.all(idx[r, 1:int(lens[r])] > idx[r, :int(lens[r]) - 1]) for r in range(40))


_TINY = ["--group-size", "6", "--kv-len", "48", "--total-q", "32", "--topk", "12",
         "--head-dim", "16", "--dtype", "float32", "--warmup", "0", "--iters", "1",
         "--providers", "reference,table", "--baseline", "reference"]


@pytest.mark.parametrize("kind", ["prefill", "chunk"])
def test_bench_indices_topk_end_to_end(kind):
    pytest.importorskip("triton")
    import cli

    extra = ["--req-lens", "12,20", "--page-size", "2"] if kind == "chunk" else []
    res = CliRunner().invoke(cli.main, ["bench", "sparse_prefill", "--kind", kind, *_TINY, *extra,
                                        "--indices", "topk", "--overlap", "0,1", "--window",
                                        "2", "--json"])
    assert res.exit_code == 0, res.output
    rep = json.loads(res.output[res.output.index("{"):])
    lo, hi = rep["cases"]
    for case, ov in ((lo, 0.0), (hi, 1.0)):
        assert case["params"]["indices"] == "topk" and case["params"]["overlap"] == ov
        assert case["params"]["window"] == 2
        assert set(case["extra"]) == {"jaccard", "union16", "union16_over_topk", "note"}
        assert "Jaccard" in case["extra"]["note"] and f"overlap={ov:g}" in case["extra"]["note"]
        assert [r["status"] for r in case["results"]] == ["ok", "ok"]
    assert hi["extra"]["jaccard"] > lo["extra"]["jaccard"]
    # the table prints the overlap on the case's note line
    res = CliRunner().invoke(cli.main, ["bench", "sparse_prefill", "--kind", kind, *_TINY, *extra,
                                        "--indices", "topk"])
    assert res.exit_code == 0, res.output
    assert "# indices topk overlap=0.95 window=64: rows r, r+1 Jaccard" in res.output


def test_bench_walk_params_and_bad_overlap():
    pytest.importorskip("triton")
    import cli

    res = CliRunner().invoke(cli.main, ["bench", "sparse_prefill", "--kind", "prefill", *_TINY,
                                        "--json"])
    assert res.exit_code == 0, res.output
    (case,) = json.loads(res.output[res.output.index("{"):])["cases"]
    assert case["params"]["indices"] == "walk" and "overlap" not in case["params"]
    assert case["extra"]["note"].startswith("indices walk: ")
    res = CliRunner().invoke(cli.main, ["bench", "sparse_prefill", *_TINY, "--indices", "topk",
                                        "--overlap", "1.5"])
    assert res.exit_code != 0 and "[0, 1]" in res.output
