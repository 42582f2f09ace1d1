"""sparse_prefill's Gluon kernels (``ENGINE="gluon"``: mma_v2; ``ENGINE="gluon_wgmma"``: Hopper
wgmma; backends/sparse_prefill/gluon_kernels.py).

Gluon has no interpreter, so the kernel itself runs in the ``gpu`` tests only: every
conformance case it can take, the nasty ones again at the seed's head dim and in 16 bits, and
the seed shapes, each against the fp32 reference on an output poisoned with NaN first. On the
CPU: the configs it refuses and the calls it refuses, each with the fix in the message, and
the kernel cross-compiled for sm_90 by the installed Triton (Gluon renames its ops between
releases; this catches a break without a GPU).
"""

from __future__ import annotations

import re

import pytest

torch = pytest.importorskip("torch")
triton = pytest.importorskip("triton")

from backends.sparse_prefill.compare import compare  # noqa: E402
from backends.sparse_prefill.conformance import CASES  # noqa: E402
from backends.sparse_prefill.reference import sparse_prefill_reference  # noqa: E402
from backends.sparse_prefill.triton_kernels import (  # noqa: E402
    error_bound,
    sparse_prefill_triton,
    validate_config,
)
from registry.errors import ConfigError, KernelUnavailableError  # noqa: E402

GL = {"BLOCK_M": 8, "BLOCK_N": 16, "num_warps": 2, "num_stages": 1, "ENGINE": "gluon"}
WG = {"BLOCK_M": 8, "BLOCK_N": 64, "num_warps": 4, "num_stages": 2, "ENGINE": "gluon_wgmma"}


@pytest.mark.parametrize("cfg,group,d,match", [
    ({**GL, "BLOCK_M": 32}, 6, 256, r"BLOCK_M=32 must be 8 or 16"),
    (GL, 12, 256, r"at least group_size=12 \(use 16"),
    ({**GL, "BLOCK_M": 16}, 17, 256, r"groups over 16 need ENGINE='triton'"),
    ({**GL, "BLOCK_N": 128}, 6, 256, r"BLOCK_N=128 must be 16, 32 or 64"),
    ({**GL, "num_warps": 8}, 6, 256, r"num_warps=8 must be 1, 2 or 4"),
    ({**GL, "num_stages": 3}, 6, 256, r"num_stages=3 must be 1 or 2"),
    ({**GL, "LEAN": 1, "SPLIT_QK": 2}, 6, 256, r"does not take LEAN, SPLIT_QK"),
    ({**GL, "DENSE": 250, "REVERSE_ROWS": 1}, 6, 256, r"does not take REVERSE_ROWS"),
    ({**GL, "CHUNK_MODE": "staged"}, 6, 256, r"CHUNK_MODE='pretranslate' \(got 'staged'\)"),
    (GL, 6, 80, r"head_dim in \(64, 128, 256\) \(got 80\): use ENGINE='triton'"),
    ({**GL, "ENGINE": "cuda"}, 6, 256, r"ENGINE='cuda': expected one of"),
])
def test_gluon_config_errors(cfg, group, d, match):
    with pytest.raises(ConfigError, match=match):
        validate_config(cfg, group, d)


@pytest.mark.parametrize("cfg,group,d,match", [
    (WG, 12, 256, r"ENGINE='gluon_wgmma': BLOCK_M=8 must be 8 or 16 query lines and at least "
                  r"group_size=12 \(use 16"),
    ({**WG, "BLOCK_M": 32}, 6, 256, r"BLOCK_M=32 must be 8 or 16"),
    ({**WG, "BLOCK_N": 32}, 6, 256, r"BLOCK_N=64, num_warps=4, num_stages=2 \(got 32, 4, 2\)"),
    ({**WG, "num_warps": 8}, 6, 256, r"\(got 64, 8, 2\)"),
    ({**WG, "num_stages": 1}, 6, 256, r"\(got 64, 4, 1\)"),
    (WG, 6, 128, r"head_dim 256 only \(got 128\): use ENGINE='gluon' or ENGINE='triton'"),
    ({**WG, "SPLIT_QK": 2}, 6, 256, r"ENGINE='gluon_wgmma' does not take SPLIT_QK"),
    ({**WG, "CHUNK_MODE": "staged"}, 6, 256, r"CHUNK_MODE='pretranslate' \(got 'staged'\)"),
])
def test_gluon_wgmma_config_errors(cfg, group, d, match):
    with pytest.raises(ConfigError, match=match):
        validate_config(cfg, group, d)


def test_gluon_wgmma_configs_that_validate():
    for bm, group in ((8, 1), (8, 6), (16, 9), (16, 12), (16, 16)):
        validate_config({**WG, "BLOCK_M": bm, "OFFS32": 1, "SLOT_ORDER": 1, "MAXNREG": 96,
                         "CHUNK_MODE": "pretranslate"}, group, 256)


def test_gluon_configs_that_validate():
    for bm, group in ((8, 1), (8, 8), (16, 9), (16, 16)):
        for bn in (16, 32, 64):
            for w in (1, 2, 4):
                for st in (1, 2):
                    validate_config({**GL, "BLOCK_M": bm, "BLOCK_N": bn, "num_warps": w,
                                     "num_stages": st, "OFFS32": 1, "SLOT_ORDER": 1,
                                     "CHUNK_MODE": "pretranslate"}, group, 128)


def _small(device="cpu", dtype=torch.float16, d=64):
    g = torch.Generator().manual_seed(0)
    q = torch.randn(4, 6, d, generator=g).to(device=device, dtype=dtype)
    k = torch.randn(32, 1, d, generator=g).to(device=device, dtype=dtype)
    v = torch.randn(32, 1, d, generator=g).to(device=device, dtype=dtype)
    idx = torch.randint(0, 32, (4, 8), generator=g, dtype=torch.int32).to(device)
    return q, k, v, idx


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without "
                    "a GPU (or under TRITON_INTERPRET=1)")
def test_gluon_refuses_cpu_tensors_and_the_interpreter():
    # KernelUnavailableError (not runnable on this machine): the conformance kit reports it as
    # not runnable here, by config, instead of failing the plugin.
    q, k, v, idx = _small()
    with pytest.raises(KernelUnavailableError, match=r"ENGINE='gluon' .*use ENGINE='triton'"):
        sparse_prefill_triton(q, k, v, idx, config=GL)
    q, k, v, idx = _small(d=256)
    with pytest.raises(KernelUnavailableError,
                       match=r"ENGINE='gluon_wgmma' .*use ENGINE='triton'"):
        sparse_prefill_triton(q, k, v, idx, config=WG)


def test_gluon_chunk_rows_need_pretranslation():
    q, k, v, idx = _small()
    chunk = {"kind": "chunk", "cu_seqlens_q": torch.tensor([0, 4], dtype=torch.int32),
             "prefix_lens": torch.tensor([3], dtype=torch.int32),
             "page_table": torch.arange(32, dtype=torch.int32)[None], "max_q": 4}
    with pytest.raises(ConfigError, match=r"chunk rows need CHUNK_MODE='pretranslate' "
                                          r"\(got 'fused'\)"):
        sparse_prefill_triton(q, k, v, idx, config=GL, **chunk)


# ------------------------------------------------------------------ GPU


def _check(args, kwargs, cfg, dtype):
    q, k, v, idx = args
    ref = sparse_prefill_reference(q, k, v, idx, out_dtype=torch.float32, **kwargs)
    poison = torch.full_like(q, float("nan"))
    del poison  # the caching allocator hands this NaN block to the kernel's output
    out = sparse_prefill_triton(q, k, v, idx, config=cfg, **kwargs)
    assert out.dtype == q.dtype and out.shape == q.shape
    # NaN and inf exactly where the op's rules put them (the non_finite case), else finite
    assert compare(out, ref) is None, f"{cfg}: {compare(out, ref)}"
    finite = torch.isfinite(ref)
    err = (out.float() - ref).abs()[finite].max().item() if finite.any() else 0.0
    assert err <= error_bound(dtype), f"{cfg}: max abs err {err}"
    return out, ref


# (BLOCK_M lines, BLOCK_N keys, warps, stages): the shipped one first, then both line counts,
# both ring depths, every stage size and warp count
_GEOMS = ((8, 16, 2, 1), (8, 32, 4, 2), (8, 64, 1, 1), (16, 16, 2, 1), (16, 64, 1, 2))


def _gluon_cases():
    for case in CASES:
        if case.name == "head_dim_80":
            continue  # not a head dim the kernel takes (refused: test_gluon_config_errors)
        for dtype in ("bfloat16", "float16"):
            yield pytest.param(case, dtype, id=f"{case.name}-{dtype}")


@pytest.mark.gpu
@pytest.mark.parametrize("case,dtype", list(_gluon_cases()))
def test_gpu_gluon_conformance(case, dtype):
    args, kwargs = case.make("cuda", getattr(torch, dtype), 11)
    group = args[0].shape[1] // args[1].shape[1]
    extra = {"CHUNK_MODE": "pretranslate"} if kwargs["kind"] == "chunk" else {}
    for i, (bm, bn, w, st) in enumerate(_GEOMS):
        if bm < group:
            continue
        for offs32 in (1, 0) if i == 0 else (1,):  # int64 row offsets on the shipped one
            cfg = {**GL, "BLOCK_M": bm, "BLOCK_N": bn, "num_warps": w, "num_stages": st,
                   "OFFS32": offs32, **extra}
            _check(args, kwargs, cfg, dtype)


def _nasty(d, group=6, hkv=1, dtype=torch.bfloat16, seed=None, logit_scale=1.0):
    """Rows with invalid and duplicate entries, ties, lengths 0 / past topk / negative, a row
    with nothing valid, NaN in unselected slots (never read), top-k not a multiple of any
    tile; ``logit_scale`` scales Q (large logits: the online softmax rescales)."""
    g = torch.Generator().manual_seed(d if seed is None else seed)
    total_q, slots, topk = 40, 300, 133
    q = (torch.randn(total_q, group * hkv, d, generator=g) * logit_scale).to(dtype).cuda()
    k = torch.randn(slots, hkv, d, generator=g).to(dtype).cuda()
    v = torch.randn(slots, hkv, d, generator=g).to(dtype).cuda()
    k[0], v[0] = 1.0, 2.0  # slot 0 ties with itself everywhere it is selected
    k[-20:], v[-20:] = float("nan"), float("nan")  # never selected
    idx = torch.randint(0, slots - 20, (total_q, topk), generator=g, dtype=torch.int32)
    idx[:, ::9] = 0
    idx[1, :] = -1
    idx[2, ::2] = -(2**31)
    idx[3, 1::2] = slots + 7
    idx[4, :] = 2**31 - 1
    idx[5, :40] = idx[5, 40:80]  # duplicates
    lengths = torch.randint(0, topk + 1, (total_q,), generator=g, dtype=torch.int32)
    lengths[6], lengths[7], lengths[8], lengths[9] = 0, topk + 50, -3, 1
    return (q, k, v, idx.cuda()), {"kind": "prefill", "lengths": lengths.cuda()}


@pytest.mark.gpu
@pytest.mark.parametrize("d", [64, 128, 256])
def test_gpu_gluon_nasty_rows(d):
    args, kwargs = _nasty(d)
    for bm, bn, w, st in _GEOMS:
        if d < 16 * w:
            continue
        out, _ = _check(args, kwargs, {**GL, "BLOCK_M": bm, "BLOCK_N": bn, "num_warps": w,
                                       "num_stages": st, "OFFS32": 1}, "bfloat16")
        for r in (1, 4, 6, 8):  # nothing valid: zeros, never NaN
            assert (out[r] == 0).all()


def _wgmma_ok():
    return torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)


@pytest.mark.gpu
@pytest.mark.skipif(not _wgmma_ok(), reason="ENGINE='gluon_wgmma' needs an sm_90 GPU (wgmma)")
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("group,hkv", [(1, 1), (6, 1), (8, 2), (12, 1), (12, 2), (16, 1)])
def test_gpu_gluon_wgmma_nasty_rows(group, hkv, dtype):
    dt = getattr(torch, dtype)
    for scale in (1.0, 8.0):  # ordinary and large logits
        args, kwargs = _nasty(256, group, hkv, dt, seed=group * 10 + hkv, logit_scale=scale)
        for offs32, mr, order in ((1, 96, 0), (0, 0, 0), (1, 0, 1)):
            cfg = {**WG, "BLOCK_M": 8 if group <= 8 else 16, "OFFS32": offs32, "MAXNREG": mr,
                   "SLOT_ORDER": order}
            out, _ = _check(args, kwargs, cfg, dtype)
            for r in (1, 4, 6, 8):  # nothing valid: zeros, never NaN
                assert (out[r] == 0).all()


@pytest.mark.gpu
@pytest.mark.skipif(not _wgmma_ok(), reason="ENGINE='gluon_wgmma' needs an sm_90 GPU (wgmma)")
def test_gpu_gluon_wgmma_separate_kv_strides_and_conformance():
    # K and V with different row strides (V a view into a wider cache: separate row offsets),
    # and the conformance suite's head_dim-256 case
    (q, k, _, idx), kwargs = _nasty(256, 12, 1)
    wide = torch.randn(k.shape[0], 1, 384, device="cuda").bfloat16()
    v = wide[:, :, 64:320]
    assert v.stride(0) != k.stride(0)
    _check((q, k, v, idx), kwargs, {**WG, "BLOCK_M": 16, "OFFS32": 1, "MAXNREG": 96},
           "bfloat16")
    case = next(c for c in CASES if c.name == "head_dim_256")
    args, kw = case.make("cuda", torch.bfloat16, 5)
    _check(args, kw, {**WG, "OFFS32": 1}, "bfloat16")


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["prefill", "chunk"])
@pytest.mark.parametrize("group,hkv", [(6, 1), (12, 2)])
def test_gpu_gluon_seed_shapes(kind, group, hkv):
    # bf16 at the seed's shape (2560 rows, top-k 2051, head_dim 256); both Gluon engines (wgmma
    # on sm_90) with 8 lines for group 6 and 16 for group 12; chunk rows pretranslated
    from backends.sparse_prefill.bench import BenchCase, make_inputs

    inp = make_inputs(BenchCase(kind=kind, group_size=group, kv_heads=hkv, kv_len=16384,
                                total_q=2560), "cuda")
    bm = 8 if group <= 8 else 16
    cfgs = [{**GL, "BLOCK_M": bm, "OFFS32": 1}]
    if _wgmma_ok():
        cfgs.append({**WG, "BLOCK_M": bm, "OFFS32": 1, "MAXNREG": 96})
    for cfg in cfgs:
        if kind == "chunk":
            cfg["CHUNK_MODE"] = "pretranslate"
        for slot_order in (0, 1):
            _check((inp["q"], inp["k"], inp["v"], inp["indices"]), inp["kwargs"],
                   {**cfg, "SLOT_ORDER": slot_order}, "bfloat16")


@pytest.mark.gpu
def test_gpu_gluon_refuses_unaligned_rows_with_the_fix():
    q, _, _, idx = _small("cuda", torch.bfloat16)
    kk = torch.zeros(33 * 64 + 1, dtype=torch.bfloat16, device="cuda")[1:].view(33, 1, 64)
    with pytest.raises(ConfigError, match=r"k needs a 16-byte aligned base .*k.contiguous\(\)"):
        sparse_prefill_triton(q, kk, kk, idx, config=GL)
    if _wgmma_ok():
        q, _, _, idx = _small("cuda", torch.bfloat16, d=256)
        kk = torch.zeros(33 * 256 + 1, dtype=torch.bfloat16, device="cuda")[1:].view(33, 1, 256)
        with pytest.raises(ConfigError, match=r"ENGINE='gluon_wgmma' gathers 16-byte aligned "
                                              r"rows: k needs"):
            sparse_prefill_triton(q, kk, kk, idx, config=WG)



# ("gl", head_dim, BM, BN, warps, stages) for ENGINE="gluon"; ("wg", BM, maxnreg) for
# ENGINE="gluon_wgmma"
_CROSS = [("gl", 256, 8, 16, 2, 1), ("gl", 256, 16, 32, 4, 2), ("gl", 64, 8, 64, 1, 1),
          ("wg", 16, 96), ("wg", 8, 0)]
_CROSS_SCRIPT = """
import inspect, json, sys
import triton
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon._runtime import GluonASTSource
from backends.sparse_prefill import gluon_kernels as gk

out = {}
for case in json.loads(sys.argv[1]):
    if case[0] == "gl":
        kernel, (d, bm, bn, w, nst), opts = gk._sparse_prefill_gl, case[1:], {}
        const = {"D": d, "BM": bm, "BN": bn, "NST": nst, "HAS_LENS": 1, "OFFS32": 1,
                 "SKIP_TILES": 1, "TILE_RP": 4, "num_warps": w}
    else:
        kernel, (bm, mr), w = gk._sparse_prefill_wg, case[1:], 4
        opts = {"maxnreg": mr} if mr else {}
        const = {"BM": bm, "HAS_LENS": 1, "OFFS32": 1, "SAME_STRIDE": 1, "num_warps": w,
                 "NB": gk.WG_RING, "LA": gk.WG_AHEAD, "SKIP_TILES": 1, "TILE_RP": 4}
    names = list(inspect.signature(kernel.fn).parameters)
    sig = {n: ("constexpr" if n in const else "*bf16" if n in ("Q", "K", "V", "OUT")
               else "*i32" if n in ("IDX", "LENS", "FLAG")
               else "fp32" if n == "qk_scale" else "i32")
           for n in names}
    # what the launcher specializes for contiguous tensors: 16-aligned pointers and strides
    attrs = {(names.index(n),): [["tt.divisibility", 16]] for n in names
             if sig[n].startswith("*") or n.startswith("s_")}
    ck = triton.compile(GluonASTSource(kernel, sig, const, attrs),
                        target=GPUTarget("cuda", 90, 32), options={"num_warps": w, **opts})
    out[repr(tuple(case))] = {"ptx": ck.asm["ptx"], "shared": ck.metadata.shared}
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def cross_compiled():
    """The kernel compiled for sm_90 by this machine's Triton (its own ptxas; no GPU needed), in
    a subprocess without TRITON_INTERPRET (under the interpreter ``gluon.jit`` helpers do not
    compile)."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    pytest.importorskip("triton.experimental.gluon._runtime",
                        reason="this Triton has no Gluon runtime")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    root = Path(__file__).resolve().parents[2]
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(root), env.get("PYTHONPATH")]))
    res = subprocess.run([sys.executable, "-c", _CROSS_SCRIPT, json.dumps(_CROSS)], env=env,
                         capture_output=True, text=True, timeout=300, cwd=root)
    if res.returncode and "ptxas" in res.stderr.lower() and "not found" in res.stderr.lower():
        pytest.skip("this Triton install has no ptxas to assemble for sm_90")
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("case", [c for c in _CROSS if c[0] == "gl"])
def test_gluon_kernel_cross_compiles_for_sm90_on_the_installed_triton(case, cross_compiled):
    # Gluon is experimental and renames its ops between releases (cp.async's load, the CTA
    # barrier): the GPU tests would catch a break only on a GPU, this one on every CI run.
    _, d, _, bn, w, nst = case
    got = cross_compiled[repr(tuple(case))]
    ptx = got["ptx"]
    assert f".reqntid {w * 32}" in ptx  # num_warps warps a program
    assert "cp.async.cg.shared.global" in ptx and "cp.async.wait_group" in ptx
    assert "mma.sync.aligned.m16n8k16" in ptx and ".bf16" in ptx
    # the ring: nst stages of bn K rows and bn V rows of d bf16 values
    assert got["shared"] >= nst * 2 * bn * d * 2


@pytest.mark.parametrize("case", [c for c in _CROSS if c[0] == "wg"])
def test_gluon_wgmma_kernel_cross_compiles_for_sm90_on_the_installed_triton(case,
                                                                            cross_compiled):
    _, bm, mr = case
    got = cross_compiled[repr(tuple(case))]
    ptx = got["ptx"]
    assert ".reqntid 128" in ptx  # one warpgroup
    if mr:
        assert f".maxnreg {mr}" in ptx
    assert "cp.async.cg.shared.global" in ptx and "cp.async.wait_group" in ptx
    # S^T: 4 chunks x 4 k-steps, O^T: 4 chunks x 4 k-steps, m64 n=BM k16, bf16 in, f32 out
    assert ptx.count("wgmma.mma_async") == 32
    # two chunks in flight: each step waits until at most one committed copy is pending
    assert re.findall(r"cp\.async\.wait_group\s+(\d+)", ptx).count("1") == 8
    assert f"wgmma.mma_async.sync.aligned.m64n{bm}k16.f32.bf16.bf16" in ptx
    # the ring (three 64 x 64 chunks), Q's four [BM, 64] chunks and P^T [BM, 64], bf16
    assert got["shared"] >= 3 * 64 * 64 * 2 + 4 * bm * 64 * 2 + bm * 64 * 2

