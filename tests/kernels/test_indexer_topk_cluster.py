"""The cluster radix select (``backends/indexer_topk/cuda/cluster_topk.cu``).

Where ``nvcc`` is present (a CPU machine too): the kernel builds for sm_90a with no spills and no
stack, within the register budget its launch bounds promise (three 512-thread CTAs an SM), and
the built library loads and exports its entry points. On an sm_90 GPU: entry by entry against
the exact reference, into poisoned outputs, on every score distribution at 1-16 rows and
131,072 keys, and on the nasty cases (NaN, +-inf and -0.0; ties at the k-th key; strided score
views; strided, broadcast and out-of-range lengths; rows shorter than k, empty rows, no rows,
lengths that are not a multiple of anything; k = 1 and k above the row; bf16 and fp16), under
CUDA-graph replay, and through ``registry.dispatch`` where the policy takes it.
"""

from __future__ import annotations

import ctypes
import re
import subprocess

import pytest

torch = pytest.importorskip("torch")

from backends.indexer_topk import cluster  # noqa: E402
from backends.indexer_topk import distributions as D  # noqa: E402
from backends.indexer_topk.reference import indexer_topk_reference, topk_mismatches  # noqa: E402

from kernel_helpers import (  # noqa: E402
    check_topk_graph_replay,
    check_wrong_tie_rule_is_caught,
    cuda_kernel_marks,
    nasty_scores,
)

NVCC = cluster.nvcc()
needs_nvcc, gpu90 = cuda_kernel_marks("the cluster kernel")
POISON = 0x77777777


@needs_nvcc
def test_builds_for_sm90a_without_spills(tmp_path):
    res = subprocess.run([NVCC, *cluster.NVCC_FLAGS, "-Xptxas", "-v", "-o",
                          str(tmp_path / "k.so"), str(cluster.SOURCE)],
                         capture_output=True, text=True, timeout=600, check=False)
    assert res.returncode == 0, res.stderr
    info = res.stderr
    regs = [int(r) for r in re.findall(r"Used (\d+) registers", info)]
    assert len(regs) == 3, info   # float32, bfloat16, float16
    # __launch_bounds__(512, 3) for 4-byte keys, (256, 6) for 2-byte keys: the same register cap
    assert max(regs) <= 65536 // (3 * 512) == 65536 // (6 * 256), info
    assert "0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads" in info
    assert not re.search(r"[1-9]\d* bytes (spill|stack)", info), info


@needs_nvcc
def test_built_library_loads_and_exports(tmp_path, monkeypatch):
    monkeypatch.setenv("KREG_HOME", str(tmp_path))
    path = cluster.build()
    assert path.parent == tmp_path / "cuda" and path.is_file()
    assert cluster.build() == path   # built once
    lib = ctypes.CDLL(str(path))
    assert lib.kreg_cluster_topk_max_keys() == cluster.MAX_KEYS
    assert hasattr(lib, "kreg_cluster_topk")


# ---------------------------------------------------------------------------------------- GPU

def _run(scores, lengths, k):
    """The kernel into a poisoned output (the public entry allocates its own)."""
    out = torch.full((scores.shape[0], k), POISON, dtype=torch.int32, device=scores.device)
    cluster._launch(scores, lengths, k, out, scores.device.index or 0)
    return out


def _check(scores, lengths, k):
    got = _run(scores, lengths, k)
    want = indexer_topk_reference(scores, lengths, k)
    assert topk_mismatches(got, want) == []
    assert not bool((got == POISON).any())
    assert torch.equal(cluster.indexer_topk_cluster(scores, lengths, k), want)
    return got


@gpu90
@pytest.mark.parametrize("name", D.DISTRIBUTIONS)
@pytest.mark.parametrize("rows", [1, 4, 16])
def test_every_distribution_exact(name, rows):
    k, n = 2048, 131072
    scores = D.make_scores(name, rows, n, seed=rows, device="cuda")
    lengths = torch.full((rows,), n, dtype=torch.int32, device="cuda")
    _check(scores, lengths, k)
    if rows == 16:   # ragged: full, one short, exactly k, k + 1, a third, 5, 0, 3k, ...
        lens = [n, n - 1, k, k + 1, n // 3, 5, 0, 3 * k, 1, n - 7, 2 * k - 1, 4096, 100000,
                65536, 16383, 16385]
        _check(scores, torch.tensor(lens, dtype=torch.int32, device="cuda"), k)


@gpu90
def test_nasty_cases():
    g = torch.Generator().manual_seed(5)
    n = 131072
    s = nasty_scores(n, g)   # row 2: the k-th key inside a tie that spans CTAs
    s = s.cuda()
    full = torch.full((6,), n, dtype=torch.int32, device="cuda")
    for k in (1, 2048, 4096):
        _check(s, full, k)
    # strided scores (a view of wider rows), strided, broadcast and out-of-range lengths
    wide = torch.full((6, n + 64), 9.0, device="cuda")
    wide[:, :n] = s
    view = wide[:, :n]
    lens2 = torch.tensor([n, 0, -5, 0, 10, 0, n + 100, 0, 2049, 0, 3, 0], dtype=torch.int32,
                         device="cuda")[::2]   # strided; negative and past-the-row entries
    _check(view, lens2, 2048)
    _check(view, torch.tensor([777], dtype=torch.int32, device="cuda").expand(6), 2048)
    # row lengths that are not multiples of 8 x 1024, k above the row, short rows
    for n2, k2 in ((100000, 2048), (5000, 2048), (1500, 2048), (7, 3), (1, 1), (3000, 4000)):
        s2 = torch.randn(3, n2, generator=g).cuda()
        _check(s2, torch.full((3,), n2, dtype=torch.int32, device="cuda"), k2)
    # no rows, no keys
    empty = cluster.indexer_topk_cluster(torch.empty(0, n, device="cuda"),
                                         torch.empty(0, dtype=torch.int32, device="cuda"), 8)
    assert empty.shape == (0, 8)
    nokeys = cluster.indexer_topk_cluster(torch.empty(2, 0, device="cuda"),
                                          torch.zeros(2, dtype=torch.int32, device="cuda"), 4)
    assert nokeys.tolist() == [[-1] * 4] * 2


@gpu90
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_candidate_list_and_its_overflow(dtype):
    """The second pass lists a CTA's keys at or above the first pass's bin when they fit (4,096
    slots for 4-byte keys, 1,024 for 2-byte), else that CTA keeps sweeping every key: rows where
    some CTAs list and others overflow, the k-th key in the list's bin, all exact. In bf16 and
    fp16 it caught a ptxas miscompile of the selection's masks (docs/notes/indexer_topk.md,
    "Sessions 33-35")."""
    g = torch.Generator().manual_seed(11)
    n, sl = 131072, 16384
    s = torch.randn(8, n, generator=g) - 8.0     # every key in bins below the crowds
    s[0, :6000] = 1.0 + torch.rand(6000, generator=g)        # CTA 0: 6000 keys in [1, 2)
    s[1, sl:sl + 900] = 1.0 + torch.rand(900, generator=g)   # fits both lists
    s[1, 5 * sl:5 * sl + 1500] = 1.5 + torch.rand(1500, generator=g) * 0.5   # 4-byte list only
    s[2, ::64] = 3.0 + torch.rand(n // 64, generator=g)      # 256 a CTA, every CTA lists
    s[3, 7 * sl:] = 1.0                                      # a CTA of one value: the k-th tie
    s[3, 7 * sl + 100] = 1.5
    s[4, 2 * sl:3 * sl] = 1.25                              # 16384 equal keys in one CTA
    s[4, 6 * sl + 3:6 * sl + 40] = float("nan")
    s[5, 3 * sl:3 * sl + 5000] = torch.linspace(1.0, 1.9, 5000)   # the k-th inside CTA 3's crowd
    s[6, 7 * sl:7 * sl + 4097] = 1.0 + torch.rand(4097, generator=g)   # one past the 4-byte list
    s[7] = torch.randn(n, generator=g)
    s = s.to(dtype).cuda()
    full = torch.full((8,), n, dtype=torch.int32, device="cuda")
    for k in (1, 1000, 2048, 4096, 7000):
        _check(s, full, k)
    lens = torch.tensor([n, 2 * sl - 5, 3 * sl + 1, 7 * sl + 200, n - 1, 3 * sl + 4000, n, 77],
                        dtype=torch.int32, device="cuda")
    _check(s, lens, 2048)


@gpu90
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("name", ["randn", "ties", "recent", "quant256"])
def test_half_precision_scores(dtype, name):
    n = 131072
    s = D.make_scores(name, 4, n, dtype=dtype, seed=3, device="cuda")
    s[1, ::50] = float("nan")
    _check(s, torch.tensor([n, n - 3, 40000, 2048], dtype=torch.int32, device="cuda"), 2048)


@gpu90
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_two_byte_keys_nasty_cases(dtype):
    # bf16 / fp16 rows keep 16-bit order keys: NaN (last, by position), +-inf, -0.0 == +0.0,
    # the largest and smallest finite values, subnormals, all-equal rows, unaligned views (the
    # element-by-element load), short and ragged rows, k above the row
    g = torch.Generator().manual_seed(11)
    n = 131072
    fin = torch.finfo(dtype)
    s = torch.randn(6, n, generator=g).to(dtype)
    s[:, ::97] = float("nan")
    s[:, 5::101] = float("inf")
    s[:, 9::103] = float("-inf")
    s[:, 7::89] = -0.0
    s[:, 11::89] = 0.0
    s[:, 13::211] = fin.max
    s[:, 17::223] = fin.min
    s[:, 19::227] = fin.tiny / 4   # subnormal
    s[0] = float("nan")
    s[1, :] = -0.0
    s[2, 3000:] = -1.0
    s = s.cuda()
    full = torch.full((6,), n, dtype=torch.int32, device="cuda")
    for k in (1, 2048, 4096):
        _check(s, full, k)
    wide = torch.full((6, n + 3), 9.0, dtype=dtype, device="cuda")
    wide[:, 1:n + 1] = s
    view = wide[:, 1:n + 1]   # 2 bytes past 16-byte alignment
    _check(view, torch.tensor([n, 0, -5, n + 100, 2049, 3], dtype=torch.int32, device="cuda"),
           2048)
    for n2, k2 in ((100000, 2048), (5000, 2048), (7, 3), (3000, 4000)):
        s2 = torch.randn(3, n2, generator=g).to(dtype).cuda()
        _check(s2, torch.tensor([n2, n2 - 1, n2 // 2], dtype=torch.int32, device="cuda"), k2)
    for name in D.DISTRIBUTIONS:
        s3 = D.make_scores(name, 3, n, dtype=dtype, seed=6, device="cuda")
        _check(s3, torch.full((3,), n, dtype=torch.int32, device="cuda"), 2048)


@gpu90
def test_negative_control_a_wrong_tie_rule_is_caught():
    # ties at the k-th key: the reference takes the first positions; the last positions of the
    # same tie are a different answer, and the comparison must see it
    n, k = 131072, 2048
    s = D.make_scores("ties", 2, n, seed=1, device="cuda")
    lengths = torch.full((2,), n, dtype=torch.int32, device="cuda")
    got = _check(s, lengths, k)
    check_wrong_tie_rule_is_caught(got, s, lengths, k)


@gpu90
def test_cuda_graph_replay():
    check_topk_graph_replay(cluster.indexer_topk_cluster, rows=4)


@gpu90
def test_dispatch_takes_it_where_the_policy_does():
    import plugins.nvidia_hopper as hopper
    import registry

    n, k = 131072, 2048
    wl = {"k": k, "num_rows": 4, "max_keys": n, "dtype": "float32"}
    d = registry.select("indexer_topk", wl)
    name = torch.cuda.get_device_name()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    if (name, sms) not in hopper.CLUSTER_DEVICES:
        pytest.skip(f"{name} ({sms} SMs) is outside the measured set {hopper.CLUSTER_DEVICES}")
    assert d.implementation == "nvidia_hopper.indexer_topk_cluster", d.explain()
    s = D.make_scores("relu", 4, n, seed=4, device="cuda")
    lengths = torch.full((4,), n, dtype=torch.int32, device="cuda")
    got = registry.dispatch("indexer_topk", s, lengths, k=k)
    assert torch.equal(got, indexer_topk_reference(s, lengths, k))
    big = registry.select("indexer_topk", {**wl, "num_rows": hopper.CLUSTER_MAX_ROWS + 1})
    assert big.implementation != "nvidia_hopper.indexer_topk_cluster"
