"""The streaming kernel's CUDA source run on the CPU (``tests/kernels/cuda_emu``).

``stream_topk.cu`` built with ``-DKREG_CUDA_EMU`` and g++ runs one CTA a row, each CUDA thread a
fiber switched at every barrier, warp collective, global load and shared atomic in a random
order; the emulator reports divergent warp collectives, deadlocks, reads outside the row or
misaligned, and writes past shared memory or the output. This checks the kernel's code (its
barriers, collectives, indexing, retries and selection), not its speed or the GPU's memory
model, on a machine without a GPU: entry by entry against the exact reference, outputs poisoned
first, on every score distribution in fp32, bf16 and fp16, both CTA geometries, the nasty cases
(NaN, +-inf, -0.0, subnormals, ties at the k-th key, unaligned and strided views, ragged and
broadcast lengths, rows shorter than k), rows built to mislead the sample (the retry reads
counted and bounded), and a negative control (a barrier removed is caught). The GPU tests are
``test_indexer_topk_stream.py``.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from backends.indexer_topk import distributions as D  # noqa: E402
from backends.indexer_topk import stream  # noqa: E402
from backends.indexer_topk.reference import indexer_topk_reference, topk_mismatches  # noqa: E402

from kernel_helpers import build_emu, nasty_scores, needs_cxx  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
CODES = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}
# extra reads of a row: one retry from the buffer, the radix counts (three reads of 32-bit
# keys, two of 16-bit ones), the last read
MAX_EXTRA_READS = 5


def _build(out: Path, source: Path, *defines: str) -> Path:
    return build_emu("stream_driver.cpp", out, source, *defines,
                     includes=(stream.SOURCE.parent,))


@pytest.fixture(scope="module")
def emu(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _build(tmp_path_factory.mktemp("emu") / "stream_emu", stream.SOURCE)


@pytest.fixture(scope="module")
def emu_unpacked(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The STREAM_PACKED=0 variant (one float compare a 2-byte key; the product compares two at
    a time since session 40), kept for A/Bs."""
    return _build(tmp_path_factory.mktemp("emu") / "stream_emu_unpacked", stream.SOURCE,
                  "-DSTREAM_PACKED=0")


def run_emu(binary: Path, scores: torch.Tensor, lengths: torch.Tensor, k: int, *,
            threads: int = 256, offset: int = 0, row_stride: int | None = None,
            len_stride: int = 1, mode: int = 0, seed: int = 1, split: int = 1,
            tmp: Path) -> tuple[torch.Tensor, int, int]:
    """The kernel's output for ``scores`` ([rows, n], stored ``offset`` elements into a 16-byte
    aligned buffer with ``row_stride``; ``split`` CTAs a row, a cluster), its extra reads (stats)
    and the emulator's errors."""
    rows, n = scores.shape
    rs = n if row_stride is None else row_stride
    total = max(offset + (rows - 1) * rs + n if rows else offset, 1)
    store = torch.zeros(total, dtype=scores.dtype)
    for r in range(rows):
        store[offset + r * rs: offset + r * rs + n] = scores[r]
    raw = store.view(torch.int16 if scores.element_size() == 2 else torch.int32).numpy()
    lens = lengths.to(torch.int32).numpy()
    head = np.array([CODES[scores.dtype], threads, rows, n, k, rs, offset, len_stride,
                     len(lens), total, split], dtype=np.int32)
    fin, fout = tmp / "in.bin", tmp / "out.bin"
    fin.write_bytes(head.tobytes() + raw.tobytes() + lens.tobytes())
    res = subprocess.run([str(binary), str(fin), str(fout), str(mode)], capture_output=True,
                         text=True, timeout=300, check=False,
                         env={**os.environ, "KREG_EMU_SEED": str(seed)})
    assert res.returncode == 0, res.stderr
    data = np.fromfile(fout, dtype=np.int32)
    assert len(data) == rows * k + 2
    errors = int(data[-1])
    assert (errors == 0) == (res.stderr == ""), res.stderr
    got = torch.from_numpy(data[: rows * k].copy()).view(rows, k)
    return got, int(data[-2]), errors


def check(binary: Path, tmp: Path, scores: torch.Tensor, lengths: torch.Tensor, k: int,
          **kw) -> int:
    """Exact against the reference, no emulator error; returns the extra reads."""
    got, extra, errors = run_emu(binary, scores, lengths, k, tmp=tmp, **kw)
    stride = kw.get("len_stride", 1)
    eff = torch.tensor([int(lengths[r * stride]) for r in range(scores.shape[0])],
                       dtype=torch.int32).clamp(0, scores.shape[1])
    want = indexer_topk_reference(scores, eff, k)
    assert errors == 0
    assert topk_mismatches(got, want) == []
    return extra


def full(rows: int, n: int) -> torch.Tensor:
    return torch.full((rows,), n, dtype=torch.int32)


@needs_cxx
@pytest.mark.parametrize("name", D.DISTRIBUTIONS)
def test_every_distribution_fp32_both_geometries_in_one_read(emu, tmp_path, name):
    n = 131072
    s = D.make_scores(name, 2, n, seed=3)
    for threads in (256, 512):
        assert check(emu, tmp_path, s, full(2, n), 2048, threads=threads) == 0, name


@needs_cxx
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("name", ["randn", "ties", "zeros", "recent", "relu", "lowbits"])
def test_two_byte_keys(emu, tmp_path, dtype, name):
    n = 65536
    s = D.make_scores(name, 2, n, seed=5, dtype=dtype)
    check(emu, tmp_path, s, full(2, n), 2048, threads=512 if name in ("ties", "relu") else 256)


def _nasty(n: int, g: torch.Generator) -> torch.Tensor:
    s = nasty_scores(n, g)                    # stripes; all NaN, all equal, the k-th in a tie
    s[3, 1::2] = -0.0                         # -0 and +0 alternating: one value
    s[3, ::2] = 0.0
    s[4] = torch.where(torch.rand(n, generator=g) < 0.5, torch.tensor(float("nan")), s[4])
    s[5, 19::227] = 1e-40                     # subnormals
    s[5, 23::229] = -1e-40
    return s


@needs_cxx
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_nasty_rows_every_k(emu, tmp_path, dtype):
    n = 40000
    s = _nasty(n, torch.Generator().manual_seed(7)).to(dtype)
    if dtype != torch.float32:
        fi = torch.finfo(dtype)
        s[5, 19::227] = fi.tiny / 4
        s[5, 23::229] = -fi.tiny / 4
        s[5, 13::211] = fi.max
    for k, threads in ((1, 256), (2048, 512), (stream.MAX_K, 256)):
        check(emu, tmp_path, s, full(6, n), k, threads=threads)


@needs_cxx
@pytest.mark.parametrize("offset", [1, 2, 3, 5])
def test_unaligned_strided_views_and_ragged_lengths(emu, tmp_path, offset):
    """Rows starting off the 16-byte grid (element loads), a row stride that is no multiple of
    the vector, lengths 0, negative, past the row, around k, and a length broadcast to every
    row (stride 0); the emulator checks every read stays inside the row's length."""
    n = 20000
    g = torch.Generator().manual_seed(offset)
    for dtype in (torch.float32, torch.bfloat16):
        s = _nasty(n, g).to(dtype)
        lens = torch.tensor([n, 0, -5, n + 100, 2049, 3], dtype=torch.int32)
        check(emu, tmp_path, s, lens, 2048, offset=offset, row_stride=n + 3)
        check(emu, tmp_path, s, torch.tensor([777], dtype=torch.int32), 512, threads=512,
              offset=offset, len_stride=0)


@needs_cxx
@pytest.mark.parametrize("n, k", [(8192, 2048), (8193, 2048), (5000, 2048), (2049, 2048),
                                  (3000, 3000), (7, 3), (1, 1), (16387, stream.MAX_K),
                                  (70001, stream.MAX_K), (65533, 1)])
def test_rows_around_the_sample_size_and_k(emu, tmp_path, n, k):
    g = torch.Generator().manual_seed(n)
    for dtype, threads in ((torch.float32, 256), (torch.float16, 512)):
        s = torch.randn(2, n, generator=g).to(dtype)
        check(emu, tmp_path, s, torch.tensor([n, max(n - 5, 0)], dtype=torch.int32), k,
              threads=threads)


@needs_cxx
def test_misleading_samples_cost_counted_reads_never_the_answer(emu, tmp_path):
    """Rows built so the sample misses: too many keys above its threshold (hidden high keys),
    too few (only the sampled keys high), a sample that is one value (its ties cover k: no
    miss), and keys above the threshold rising with position (the first retry's buffer is a
    biased prefix: the radix counts bound the reads). Exact every time; each row's extra reads
    counted and at most MAX_EXTRA_READS."""
    n = 131072
    g = torch.Generator().manual_seed(11)
    pos = torch.tensor(stream.sample_positions(n))
    hidden = torch.ones(n, dtype=torch.bool)
    hidden[pos] = False
    hid = hidden.nonzero().flatten()
    s = torch.randn(5, n, generator=g)
    s[0, hid[torch.randperm(hid.numel(), generator=g)[:9000]]] = 50.0 + torch.rand(9000)
    s[1, pos] = 100.0 + torch.rand(pos.numel(), generator=g)
    s[1, hid[:10]] = 200.0
    s[2, pos] = 7.0
    s[3, hid[:40000]] = 100.0 + torch.arange(40000).float()
    s[4] = -1.0
    s[4, hid] = torch.arange(hid.numel()).float()          # rising with position, unsampled
    s[4, pos] = -2.0 - torch.rand(pos.numel(), generator=g)
    for dtype in (torch.float32, torch.bfloat16):
        for r in range(5):
            extra = check(emu, tmp_path, s[r:r + 1].to(dtype), full(1, n), 2048, threads=512)
            assert (r != 2) <= extra <= MAX_EXTRA_READS, (dtype, r, extra)


@needs_cxx
def test_rising_keys_at_2_20_and_the_largest_k(emu, tmp_path):
    n = 1 << 20
    pos = torch.tensor(stream.sample_positions(n))
    hidden = torch.ones(n, dtype=torch.bool)
    hidden[pos] = False
    s = torch.full((1, n), -1.0)
    s[0, hidden] = torch.arange(int(hidden.sum())).float()
    s[0, pos] = -2.0
    extra = check(emu, tmp_path, s, full(1, n), stream.MAX_K, threads=512)
    assert extra <= MAX_EXTRA_READS


@needs_cxx
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("variant", ["product", "unpacked"])
def test_two_byte_compares(emu, emu_unpacked, tmp_path, dtype, variant):
    """2-byte keys, in the product (STREAM_PACKED=1: two keys a compare, HSET2) and the
    STREAM_PACKED=0 variant: the distributions, the nasty rows (NaN, +-inf, +-0, subnormals:
    HSET2's compares must keep the float rule), unaligned views (the element-load loop), and a
    too-few sample (the t = 1 path, NaN as the tie)."""
    binary = emu if variant == "product" else emu_unpacked
    n = 65536
    for name in ("randn", "ties", "zeros", "recent", "relu", "lowbits", "ramp"):
        s = D.make_scores(name, 1, n, seed=6, dtype=dtype)
        check(binary, tmp_path, s, full(1, n), 2048, threads=512)
    g = torch.Generator().manual_seed(9)
    s = _nasty(20000, g).to(dtype)
    fi = torch.finfo(dtype)
    s[5, 19::227] = fi.tiny / 4
    s[5, 13::211] = fi.max
    check(binary, tmp_path, s, full(6, 20000), 2048)
    check(binary, tmp_path, s, torch.tensor([20000, 0, 2049, 19999, 5, 20000],
                                                dtype=torch.int32), 3, offset=3,
          row_stride=20005)
    pos = torch.tensor(stream.sample_positions(n))
    under = torch.randn(1, n, generator=g)
    under[0, ::3] = float("nan")
    under[0, pos] = 100.0 + torch.arange(pos.numel()).float()   # few keys above any t
    assert check(binary, tmp_path, under.to(dtype), full(1, n), 2048) >= 1


@pytest.fixture(scope="module")
def emu_ties1(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """STREAM_TIES=1 (a step's tie masks transposed across the lane group: the A/B candidate
    against the product's shuffle tree a vector)."""
    return _build(tmp_path_factory.mktemp("emu") / "stream_emu_ties1", stream.SOURCE,
                  "-DSTREAM_TIES=1")


@needs_cxx
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_tie_bitmap_both_forms(emu, emu_ties1, tmp_path, dtype):
    """The per-vector shuffle tree (the product, STREAM_TIES=0) and the step's tie masks
    transposed across the lane group (STREAM_TIES=1) on the rows where ties decide: every key
    a tie, the k-th inside a tie, ties scattered among the rows' positives, both geometries, a
    split row, and rows whose length leaves a partial step (the tail runs the per-vector form
    in both)."""
    n = 65536
    for binary in (emu, emu_ties1):
        for name, threads in (("zeros", 512), ("ties", 256), ("relu", 512), ("quant256", 256)):
            s = D.make_scores(name, 2, n, seed=4, dtype=dtype)
            check(binary, tmp_path, s, torch.tensor([n, n - 37], dtype=torch.int32), 2048,
                  threads=threads)
        s = D.make_scores("relu", 1, n, seed=5, dtype=dtype)
        check(binary, tmp_path, s, full(1, n), 2048, threads=512, split=2)


@needs_cxx
def test_run_ahead_schedule(emu, tmp_path):
    """The second scheduling mode (a few threads far ahead of the rest) on tie-heavy rows."""
    n = 65536
    for name in ("ties", "relu", "randn"):
        s = D.make_scores(name, 1, n, seed=2)
        check(emu, tmp_path, s, full(1, n), 2048, threads=256, mode=1, seed=3)


@needs_cxx
def test_negative_control_a_missing_barrier_is_caught(tmp_path):
    """The pass's reset of the append count and the bitmap without its barrier: some threads
    append and mark ties before the reset lands. The emulator must see a wrong answer."""
    src = stream.SOURCE.read_text()
    marker = "    if (tid == 0) sh.count = 0u;\n    __syncthreads();\n"
    assert marker in src, "the negative control's barrier moved: update the marker"
    broken = tmp_path / "stream_topk.cu"
    broken.write_text(src.replace(marker, "    if (tid == 0) sh.count = 0u;\n"))
    binary = _build(tmp_path / "broken_emu", broken)
    n = 65536
    caught = 0
    for name, seed in (("ties", 1), ("randn", 2), ("relu", 3)):
        s = D.make_scores(name, 2, n, seed=seed)
        got, _, errors = run_emu(binary, s, full(2, n), 2048, tmp=tmp_path, mode=1, seed=seed)
        want = indexer_topk_reference(s, full(2, n), 2048)
        caught += errors > 0 or topk_mismatches(got, want) != []
    assert caught > 0


def _late_ties(rows: int, n: int, parts: int, g: torch.Generator) -> torch.Tensor:
    """Rows whose k-th key sits in a tie that lies only in the last part of a split row (and in
    row 1 only in the first part, its positives in the last): the first CTA's own bitmap cannot
    answer them; the other parts' tie words must reach it."""
    s = torch.full((rows, n), -1.0)
    lo = n - n // parts
    s[:, lo:] = 0.0
    for r in range(rows):
        s[r, lo + torch.randperm(n // parts, generator=g)[:300]] = torch.rand(300, generator=g) + 1
    if rows > 1:
        s[1] = s[1].flip(0)
    return s


@needs_cxx
@pytest.mark.parametrize("split", [2, 4])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_split_rows_a_cluster_a_row(emu, tmp_path, split, dtype):
    """A row read by a cluster of 2 or 4 CTAs (the geometry of small batches): each reads a
    part, the first takes the others' buffers and tie words through their shared memory and
    selects alone. Every distribution; a second row too short to split (the first CTA alone);
    ties only in a later part; unaligned views (the element loads); rows that make the sample
    miss (the first CTA alone re-reads the row: the reads stay within MAX_EXTRA_READS)."""
    n = 65536 if dtype == torch.float32 else 131072
    short = n // 2 + 7   # fewer vectors than split x a step at split 4 (bf16: at 2 and 4)
    lens = torch.tensor([n, short], dtype=torch.int32)
    for name in ("randn", "ties", "zeros", "relu", "recent", "lowbits", "ramp"):
        s = D.make_scores(name, 2, n, seed=8, dtype=dtype)
        assert check(emu, tmp_path, s, lens, 2048, threads=512, split=split) == 0, name
    g = torch.Generator().manual_seed(split)
    check(emu, tmp_path, _late_ties(2, n, split, g).to(dtype), full(2, n), 2048, threads=512,
          split=split)
    s = D.make_scores("randn", 2, n, seed=9, dtype=dtype)
    check(emu, tmp_path, s, lens, 2048, threads=512, split=split, offset=3, row_stride=n + 5)
    if dtype == torch.float32:
        pos = torch.tensor(stream.sample_positions(n))
        hidden = torch.ones(n, dtype=torch.bool)
        hidden[pos] = False
        hid = hidden.nonzero().flatten()
        miss = torch.randn(3, n, generator=g)
        miss[0, hid[torch.randperm(hid.numel(), generator=g)[:9000]]] = 50.0   # too many
        miss[1, pos] = 100.0 + torch.rand(pos.numel(), generator=g)            # too few
        miss[2] = -1.0
        miss[2, hid] = torch.arange(hid.numel()).float()   # rising: the radix counts
        for r in range(3):
            extra = check(emu, tmp_path, miss[r:r + 1], full(1, n), 2048, threads=512,
                          split=split)
            assert 1 <= extra <= MAX_EXTRA_READS, (r, extra)


@needs_cxx
def test_negative_control_split_rows_need_the_other_parts(tmp_path):
    """The split row's first CTA without the other parts' tie words: the rows whose ties lie in
    a later part must come out wrong (the test above would see it)."""
    src = stream.SOURCE.read_text()
    marker = "bits[w] = rbits[w];"
    assert src.count(marker) == 1, "the negative control's copy moved: update the marker"
    broken = tmp_path / "stream_topk.cu"
    broken.write_text(src.replace(marker, "(void)rbits;"))
    binary = _build(tmp_path / "broken_emu", broken)
    n = 65536
    s = _late_ties(2, n, 2, torch.Generator().manual_seed(2))
    got, _, errors = run_emu(binary, s, full(2, n), 2048, threads=512, split=2, tmp=tmp_path)
    assert errors == 0
    assert topk_mismatches(got, indexer_topk_reference(s, full(2, n), 2048)) != []
