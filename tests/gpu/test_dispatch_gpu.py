"""Through the real dispatch on a GPU: which implementation and geometry actually launched.

On the H200 the expectation is the nvidia_hopper family inside its envelope and the table
outside; on any other GPU it is derived from ``registry.select`` (as the seed's H100 run derived
its expectation from the table).
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import registry  # noqa: E402
from backends.sparse_prefill.bench import BenchCase, make_inputs, workload_of  # noqa: E402
from backends.sparse_prefill.reference import sparse_prefill_reference  # noqa: E402
from plugins.generic import sparse_prefill_table_config  # noqa: E402
from plugins.nvidia_hopper import H200_PREFILL_CONFIGS  # noqa: E402
from plugins.nvidia_sm120 import SM120_PREFILL_CONFIGS  # noqa: E402

pytestmark = pytest.mark.gpu


def _is_h200() -> bool:
    f = registry.probe()
    return (f.name, f.sm_count) == ("NVIDIA H200", 132)


def _run(case: BenchCase) -> tuple[list, torch.Tensor, torch.Tensor]:
    inp = make_inputs(case)
    with registry.record() as launches:
        out = registry.dispatch("sparse_prefill", inp["q"], inp["k"], inp["v"], inp["indices"],
                                **inp["kwargs"])
    ref = sparse_prefill_reference(inp["q"], inp["k"], inp["v"], inp["indices"],
                                   out_dtype=torch.float32, **inp["kwargs"])
    return launches, out, ref


@pytest.mark.parametrize("kind", ["prefill", "chunk"])
@pytest.mark.parametrize("group", [6, 12])
def test_tuned_group_through_the_real_dispatch(kind: str, group: int) -> None:
    # 2,560 rows at prefix 0 (prefill) / one request with a prefix (chunk): inside the envelope
    case = BenchCase(kind=kind, group_size=group, kv_len=2560 if kind == "prefill" else 4096,
                     total_q=2560)
    launches, out, ref = _run(case)
    assert len(launches) == 1
    launch = launches[0]
    if _is_h200():
        assert launch.implementation == "nvidia_hopper.sparse_prefill_tuned"
        assert dict(launch.config) == H200_PREFILL_CONFIGS[(kind, group)]
    else:
        want = registry.select("sparse_prefill", workload_of(case))
        assert (launch.implementation, dict(launch.config)) == (want.implementation, want.config)
    assert torch.isfinite(out).all()
    assert (out.float() - ref).abs().max().item() <= 2e-2


@pytest.mark.parametrize("kind", ["prefill", "chunk"])
@pytest.mark.parametrize("group", [6, 12])
def test_long_kv_launches_the_slot_ordered_family(kind: str, group: int) -> None:
    # KV 64K and 1024 rows (the policy's floors): the long-KV config (SLOT_ORDER=1) launches
    from plugins.nvidia_hopper import H200_LONG_KV_CONFIGS, LONG_KV_FROM, LONG_KV_MIN_TOTAL_Q

    case = BenchCase(kind=kind, group_size=group, kv_len=LONG_KV_FROM,
                     total_q=LONG_KV_MIN_TOTAL_Q[(kind, group)])
    launches, out, ref = _run(case)
    assert len(launches) == 1
    if _is_h200():
        assert launches[0].implementation == "nvidia_hopper.sparse_prefill_tuned"
        assert dict(launches[0].config) == H200_LONG_KV_CONFIGS[(kind, group)]
    assert torch.isfinite(out).all()
    assert (out.float() - ref).abs().max().item() <= 2e-2


@pytest.mark.parametrize("group", [6, 12])
def test_short_prefill_launches_the_dense_family(group: int) -> None:
    # prefill at KV 8K (group 12: 4K, below the wgmma kernel's KV band, which takes KV 8K) and
    # 8192 rows (the policy's bounds): the dense config (DENSE) launches, at group 6 with union
    # tiles beside (UNION_OVER_DENSE); the causal ramp has dense tiles (its first rows) and
    # gathered ones
    from plugins.nvidia_hopper import (
        DENSE_MAX_KV,
        DENSE_MIN_TOTAL_Q,
        H200_DENSE_CONFIGS,
        H200_UNION_CONFIGS,
    )

    case = BenchCase(kind="prefill", group_size=group,
                     kv_len=DENSE_MAX_KV if group == 6 else DENSE_MAX_KV // 2,
                     total_q=DENSE_MIN_TOTAL_Q)
    launches, out, ref = _run(case)
    assert len(launches) == 1
    if _is_h200():
        assert launches[0].implementation == "nvidia_hopper.sparse_prefill_tuned"
        want = (H200_UNION_CONFIGS if group == 6 else H200_DENSE_CONFIGS)[("prefill", group)]
        assert dict(launches[0].config) == want and want["DENSE"]
    assert torch.isfinite(out).all()
    assert (out.float() - ref).abs().max().item() <= 2e-2


@pytest.mark.parametrize("kv", [8192, 16384, 32768])
def test_mid_kv_group_6_prefill_launches_the_gluon_kernel(kv: int) -> None:
    # prefill group 6 from KV 8K below the long-KV band, at the Gluon floor of rows (below the
    # dense tiles' floor): on the H200 with Triton 3.6 the Gluon kernel (ENGINE=gluon) launches,
    # and is correct
    import triton

    from plugins.nvidia_hopper import GLUON_MIN_TOTAL_Q, H200_GLUON_CONFIGS, gluon_triton

    case = BenchCase(kind="prefill", group_size=6, kv_len=kv,
                     total_q=GLUON_MIN_TOTAL_Q[("prefill", 6)])
    launches, out, ref = _run(case)
    assert len(launches) == 1
    if _is_h200() and gluon_triton(triton.__version__):
        assert launches[0].implementation == "nvidia_hopper.sparse_prefill_tuned"
        assert dict(launches[0].config) == H200_GLUON_CONFIGS[("prefill", 6)]
    else:
        want = registry.select("sparse_prefill", workload_of(case))
        assert dict(launches[0].config) == want.config
    assert torch.isfinite(out).all()
    assert (out.float() - ref).abs().max().item() <= 2e-2


@pytest.mark.parametrize("group,kv,rows", [(6, 16384, 0), (6, 32768, 0), (12, 8192, 0),
                                            (12, 32768, 0), (12, 8192, 8192)])
def test_mid_kv_prefill_from_the_wgmma_floor_launches_the_wgmma_kernel(group: int, kv: int,
                                                                       rows: int) -> None:
    # prefill from KV 8K from the wgmma floor of rows (rows 0), and group 12 at KV 8K with 8192
    # rows (where it goes before the dense tiles): on the H200 with Triton 3.6 the wgmma kernel
    # (ENGINE=gluon_wgmma) launches, and is correct
    import triton

    from plugins.nvidia_hopper import H200_WGMMA_CONFIGS, WGMMA_MIN_TOTAL_Q, gluon_triton

    case = BenchCase(kind="prefill", group_size=group, kv_len=kv,
                     total_q=rows or WGMMA_MIN_TOTAL_Q[("prefill", group)])
    launches, out, ref = _run(case)
    assert len(launches) == 1
    if _is_h200() and gluon_triton(triton.__version__):
        assert launches[0].implementation == "nvidia_hopper.sparse_prefill_tuned"
        assert dict(launches[0].config) == H200_WGMMA_CONFIGS[("prefill", group)]
    else:
        want = registry.select("sparse_prefill", workload_of(case))
        assert dict(launches[0].config) == want.config
    assert torch.isfinite(out).all()
    assert (out.float() - ref).abs().max().item() <= 2e-2


@pytest.mark.parametrize("group", [6, 12])
def test_below_the_crossover_the_table_launches(group: int) -> None:
    case = BenchCase(kind="chunk", group_size=group, kv_len=4096, total_q=128)
    launches, out, ref = _run(case)
    assert launches[0].implementation == "generic.sparse_prefill_table"
    assert dict(launches[0].config) == sparse_prefill_table_config(group, 128)
    assert (out.float() - ref).abs().max().item() <= 2e-2


@pytest.mark.parametrize("group", [6, 12])
def test_sm120_tuples_compile_and_run_here(group: int) -> None:
    """The sm120 tuned tuples are valid Triton on this GPU: forced through the kernel, checked.

    Through the registry, ``nvidia_sm120.sparse_prefill_tuned:measure`` stays refused off sm_120:
    the architecture is a capability gate, which :measure never waives; the decision says so.
    """
    from backends.sparse_prefill.triton_kernels import sparse_prefill_triton

    case = BenchCase(kind="chunk", group_size=group, kv_len=4096, total_q=1024)
    inp = make_inputs(case)
    out = sparse_prefill_triton(inp["q"], inp["k"], inp["v"], inp["indices"],
                                config=SM120_PREFILL_CONFIGS[group], **inp["kwargs"])
    ref = sparse_prefill_reference(inp["q"], inp["k"], inp["v"], inp["indices"],
                                   out_dtype=torch.float32, **inp["kwargs"])
    assert (out.float() - ref).abs().max().item() <= 2e-2
    if registry.probe().arch != "sm_120":
        with registry.override("sparse_prefill", "nvidia_sm120.sparse_prefill_tuned:measure"):
            d = registry.select("sparse_prefill", workload_of(case))
        assert d.implementation != "nvidia_sm120.sparse_prefill_tuned"
        assert d.override is not None and not d.override.honoured
        assert "arch" in d.override.reason


def test_indexer_topk_dispatch_is_exact_on_the_gpu() -> None:
    from backends.indexer_topk.reference import indexer_topk_reference

    g = torch.Generator(device="cuda").manual_seed(3)
    scores = torch.randn(64, 131072, generator=g, device="cuda")
    scores[5] = 0.0
    scores[7, ::3] = float("nan")
    lengths = torch.full((64,), 131072, dtype=torch.int32, device="cuda")
    lengths[:4] = torch.tensor([0, 1, 2047, 2049], dtype=torch.int32)
    with registry.record() as launches:
        got = registry.dispatch("indexer_topk", scores, lengths, k=2048)
    assert launches[0].implementation != "reference.indexer_topk"
    want = indexer_topk_reference(scores, lengths, 2048)
    assert torch.equal(got, want)
