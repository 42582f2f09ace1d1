"""The one-read streaming select (``backends/indexer_topk/cuda/stream_topk.cu``).

Where ``nvcc`` is present (a CPU machine too): the kernel builds for sm_90a inside the register
budget of three 256-thread CTAs an SM, and the built library loads and exports its entry points.
On an sm_90 GPU: entry by entry against the exact reference, into poisoned outputs, on every
score distribution at 1-300 rows; the nasty cases (NaN, +-inf and -0.0, ties at the k-th key,
all-equal rows, unaligned and strided score views, strided, broadcast and out-of-range lengths,
rows shorter than k, empty rows, no rows, k = 1 and the largest k); rows built to mislead the
sample in both directions (the retry reads, counted); bf16 and fp16; CUDA-graph replay; and
``registry.dispatch`` where the policy takes it.
"""

from __future__ import annotations

import ctypes
import re
import subprocess

import pytest

torch = pytest.importorskip("torch")

from backends.indexer_topk import cluster, stream  # noqa: E402
from backends.indexer_topk import distributions as D  # noqa: E402
from backends.indexer_topk.reference import indexer_topk_reference, topk_mismatches  # noqa: E402
from registry.errors import KernelUnavailableError  # noqa: E402

from kernel_helpers import (  # noqa: E402
    check_topk_graph_replay,
    check_wrong_tie_rule_is_caught,
    cuda_kernel_marks,
    nasty_scores,
)

NVCC = cluster.nvcc()
needs_nvcc, gpu90 = cuda_kernel_marks("the streaming kernel")
POISON = 0x77777777


@needs_nvcc
def test_builds_for_sm90a_within_the_register_budget_and_loads(tmp_path, monkeypatch):
    """One nvcc build (the product's flags, with ptxas's report): every kernel inside its
    launch bounds, the library loads and exports its entry points, and ``stream.build()`` finds
    it where it puts builds instead of compiling again."""
    monkeypatch.setenv("KREG_HOME", str(tmp_path))
    target = cluster.library_path(NVCC, stream.SOURCE)
    target.parent.mkdir(parents=True)
    res = subprocess.run([NVCC, *cluster.NVCC_FLAGS, "-Xptxas", "-v", "-o", str(target),
                          str(stream.SOURCE)],
                         capture_output=True, text=True, timeout=600, check=False)
    assert res.returncode == 0, res.stderr
    info = res.stderr
    # per kernel: its geometry (threads, CTAs an SM) from the mangled name, its registers, stack
    found = re.findall(r"Function properties for \w*stream_topk_kernel\w*?Li(\d+)ELi(\d+)E\w*\n"
                       r"\s*(\d+) bytes stack frame.*\n.*Used (\d+) registers", info)
    assert len(found) == 6, info   # float32, bfloat16, float16 x two geometries
    for threads, blocks, stack, regs in found:
        assert int(regs) <= 65536 // (int(threads) * int(blocks)), info
        # the sample's keys (256-thread CTAs) spill a few words outside the stream's loops
        assert int(stack) <= 64, info
    assert stream.build() == target and target.name.startswith("stream_topk-")
    lib = ctypes.CDLL(str(target))
    assert lib.kreg_stream_topk_max_keys() == stream.MAX_KEYS
    assert lib.kreg_stream_topk_max_k() == stream.MAX_K
    assert stream.load_library(target).kreg_stream_topk.restype is ctypes.c_int


def test_sample_positions_are_spread_and_inside_the_row():
    pos = stream.sample_positions(131072)
    assert len(pos) == stream.SAMPLE == len(set(pos))
    assert min(pos) == 0 and max(pos) == 131071
    assert stream.sample_positions(5000) == list(range(5000))
    # every 1/16 of a full row holds its share of the sample (ramp and recent rows rely on it)
    per = [0] * 16
    for p in pos:
        per[p * 16 // 131072] += 1
    assert min(per) >= stream.SAMPLE // 16 - stream.SAMPLE_CHUNK


def test_the_negative_control_sees_a_wrong_tie_rule_on_the_cpu():
    """The GPU tests' negative control, on the reference's own answer here: taking the last
    tied positions instead of the first must be told apart."""
    n, k = 131072, 2048
    s = D.make_scores("ties", 2, n, seed=1)
    lengths = torch.full((2,), n, dtype=torch.int32)
    check_wrong_tie_rule_is_caught(indexer_topk_reference(s, lengths, k), s, lengths, k)


# ---------------------------------------------------------------------------------------- GPU

def _run(scores, lengths, k, stats=None, wide=-1):
    """The kernel into a poisoned output (the public entry allocates its own)."""
    out = torch.full((scores.shape[0], k), POISON, dtype=torch.int32, device=scores.device)
    stream._launch(scores, lengths, k, out, scores.device.index or 0, stats=stats, wide=wide)
    return out


def _check(scores, lengths, k):
    """Every CTA geometry (256- and 512-thread CTAs, clusters of two and four a row) into
    poisoned outputs, and the public entry, against the reference; returns the extra row reads
    of the first."""
    want = indexer_topk_reference(scores, lengths, k)
    retries = []
    for wide in (0, 1, 2, 4):
        stats = torch.zeros(1, dtype=torch.int32, device=scores.device)
        got = _run(scores, lengths, k, stats, wide)
        assert topk_mismatches(got, want) == [], f"wide={wide}"
        assert not bool((got == POISON).any())
        retries.append(int(stats.item()))
    assert torch.equal(stream.indexer_topk_stream(scores, lengths, k), want)
    return retries[0]


@gpu90
@pytest.mark.parametrize("name", D.DISTRIBUTIONS)
@pytest.mark.parametrize("rows", [1, 37, 300])
def test_every_distribution_exact(name, rows):
    k, n = 2048, 131072
    scores = D.make_scores(name, rows, n, seed=rows, device="cuda")
    lengths = torch.full((rows,), n, dtype=torch.int32, device="cuda")
    retries = _check(scores, lengths, k)
    if name in ("randn", "recent", "ramp", "lowbits") and rows == 300:
        assert retries <= 3, retries   # the sample holds on these (a miss costs a second read)
    if rows == 37:   # ragged: full, one short, exactly k, k + 1, a third, 5, 0, 3k, ...
        lens = [n, n - 1, k, k + 1, n // 3, 5, 0, 3 * k, 1, n - 7, 2 * k - 1, 4096, 100000,
                65536, 16383, 16385, 8192, 8193, 8191] * 2
        _check(scores, torch.tensor(lens[:37], dtype=torch.int32, device="cuda"), k)


@gpu90
def test_nasty_cases():
    g = torch.Generator().manual_seed(5)
    n = 131072
    s = nasty_scores(n, g)   # NaN, +-inf, +-0; all-NaN, one-value and k-th-in-a-tie rows
    s = s.cuda()
    full = torch.full((6,), n, dtype=torch.int32, device="cuda")
    for k in (1, 2048, stream.MAX_K):
        _check(s, full, k)
    # unaligned (4 bytes past 16) and strided scores, strided / broadcast / out-of-range lengths
    wide = torch.full((6, n + 64), 9.0, device="cuda")
    wide[:, 1:n + 1] = s
    view = wide[:, 1:n + 1]
    lens2 = torch.tensor([n, 0, -5, 0, 10, 0, n + 100, 0, 2049, 0, 3, 0], dtype=torch.int32,
                         device="cuda")[::2]
    _check(view, lens2, 2048)
    _check(wide[:, :n], torch.tensor([777], dtype=torch.int32, device="cuda").expand(6), 2048)
    # rows of every size class: below k, the whole row as its own sample, just past it, long
    for n2, k2 in ((100000, 2048), (8192, 2048), (8193, 2048), (5000, 2048), (1500, 2048),
                   (7, 3), (1, 1), (3000, 3000), (524288, 2048), (1 << 20, 512)):
        s2 = torch.randn(2, n2, generator=g).cuda()
        _check(s2, torch.full((2,), n2, dtype=torch.int32, device="cuda"), k2)
    empty = stream.indexer_topk_stream(torch.empty(0, n, device="cuda"),
                                       torch.empty(0, dtype=torch.int32, device="cuda"), 8)
    assert empty.shape == (0, 8)
    nokeys = stream.indexer_topk_stream(torch.empty(2, 0, device="cuda"),
                                        torch.zeros(2, dtype=torch.int32, device="cuda"), 4)
    assert nokeys.tolist() == [[-1] * 4] * 2


@gpu90
def test_a_misleading_sample_costs_a_read_never_an_answer():
    """Rows built against the sample: big keys only where it does not look (too many above its
    threshold: the buffer overflows), and a sample of outliers (too few: the threshold is too
    high). Both are read again with a corrected threshold, counted, and exact."""
    g = torch.Generator().manual_seed(7)
    n, k = 131072, 2048
    pos = torch.tensor(stream.sample_positions(n))
    unseen = torch.ones(n, dtype=torch.bool)
    unseen[pos] = False
    s = torch.randn(4, n, generator=g)
    hidden = unseen.nonzero().flatten()
    s[0, hidden[torch.randperm(hidden.numel(), generator=g)[:9000]]] = 50.0 + torch.rand(9000)
    s[1, pos] = 100.0 + torch.rand(pos.numel(), generator=g)   # sampled outliers: ~200 above t
    s[1, hidden[:10]] = 200.0
    s[2, pos] = 7.0                                             # the sample one tie
    s[3] = torch.randn(n, generator=g)
    s = s.cuda()
    for rows in ((0,), (1,), (2,), (3,), (0, 1, 2, 3)):
        sel = s[list(rows)].contiguous()
        lens = torch.full((len(rows),), n, dtype=torch.int32, device="cuda")
        retries = _check(sel, lens, k)
        if rows in ((0,), (1,)):
            assert retries >= 1, "the misleading sample was not caught"
        if rows == (3,):
            assert retries == 0


@gpu90
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_scores(dtype):
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
    for k in (1, 2048, stream.MAX_K):
        _check(s, full, k)
    wide = torch.full((6, n + 3), 9.0, dtype=dtype, device="cuda")
    wide[:, 1:n + 1] = s
    _check(wide[:, 1:n + 1], torch.tensor([n, 0, -5, n + 100, 2049, 3], dtype=torch.int32,
                                          device="cuda"), 2048)
    for n2 in (100000, 8193, 5000, 7):
        s2 = torch.randn(3, n2, generator=g).to(dtype).cuda()
        _check(s2, torch.tensor([n2, n2 - 1, n2 // 2], dtype=torch.int32, device="cuda"), 2048)
    for name in D.DISTRIBUTIONS:
        s3 = D.make_scores(name, 40, n, dtype=dtype, seed=6, device="cuda")
        _check(s3, torch.full((40,), n, dtype=torch.int32, device="cuda"), 2048)


@gpu90
def test_negative_control_a_wrong_tie_rule_is_caught():
    # ties at the k-th key: the reference takes the first positions; the last positions of the
    # same tie are a different answer, and the comparison must see it
    n, k = 131072, 2048
    s = D.make_scores("ties", 2, n, seed=1, device="cuda")
    lengths = torch.full((2,), n, dtype=torch.int32, device="cuda")
    _check(s, lengths, k)
    got = stream.indexer_topk_stream(s, lengths, k)
    check_wrong_tie_rule_is_caught(got, s, lengths, k)


@gpu90
def test_an_unknown_geometry_is_named():
    s = torch.randn(2, 8192, device="cuda")
    lengths = torch.full((2,), 8192, dtype=torch.int32, device="cuda")
    with pytest.raises(KernelUnavailableError, match="unknown CTA geometry"):
        _run(s, lengths, 2048, wide=3)


@gpu90
@pytest.mark.parametrize("wide", [2, 4])
def test_split_rows_in_a_cuda_graph(wide):
    """A cluster launch captured and replayed (every replay exact, the output poisoned between
    replays)."""
    k, n = 2048, 131072
    s = D.make_scores("relu", 24, n, seed=wide, device="cuda")
    lengths = torch.full((24,), n, dtype=torch.int32, device="cuda")
    want = indexer_topk_reference(s, lengths, k)
    out = torch.full((24, k), POISON, dtype=torch.int32, device="cuda")
    stream._launch(s, lengths, k, out, 0, wide=wide)   # build and warm outside the capture
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        stream._launch(s, lengths, k, out, 0, wide=wide)
    for _ in range(3):
        out.fill_(POISON)
        g.replay()
        torch.cuda.synchronize()
        assert topk_mismatches(out, want) == []


@gpu90
def test_cuda_graph_replay():
    check_topk_graph_replay(stream.indexer_topk_stream, rows=64)


@gpu90
def test_dispatch_takes_it_where_the_policy_does():
    import plugins.nvidia_hopper as hopper
    import registry

    n, k = 131072, 2048
    rows = hopper.STREAM_MIN_ROWS
    wl = {"k": k, "num_rows": rows, "max_keys": n, "dtype": "float32"}
    d = registry.select("indexer_topk", wl)
    name = torch.cuda.get_device_name()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    if (name, sms) not in hopper.STREAM_DEVICES:
        pytest.skip(f"{name} ({sms} SMs) is outside the measured set {hopper.STREAM_DEVICES}")
    assert d.implementation == stream.NAME, d.explain()
    s = D.make_scores("ties", rows, n, seed=4, device="cuda")
    lengths = torch.full((rows,), n, dtype=torch.int32, device="cuda")
    got = registry.dispatch("indexer_topk", s, lengths, k=k)
    assert torch.equal(got, indexer_topk_reference(s, lengths, k))
    small = registry.select("indexer_topk", {**wl, "num_rows": rows - 1})
    assert small.implementation != stream.NAME
