"""One Triton pass re-encoding indexer_topk scores into FlashInfer's key order.

The GPU side of :func:`plugins.flashinfer.order_keys` (whose docstring states the map; the torch
version there is the reference this kernel is tested against). Imported at the first dispatch of
``flashinfer.indexer_topk`` on a GPU, never at selection. Reads each score once and writes its
re-encoded copy: the price of exactness on FlashInfer's top-k (one extra read and write of the
scores).
"""

from __future__ import annotations

from typing import Any

import triton
import triton.language as tl

__all__ = ["order_keys_triton"]

_BLOCK = 4096


@triton.jit
def _order_keys_kernel(src, dst, n, LOW: tl.constexpr, NEG_INF: tl.constexpr,
                       EXP: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    b = tl.load(src + offs, mask=mask, other=0)
    mag = b & ~LOW                                 # the bits without the sign
    nan = mag > EXP                                # exponent all ones, mantissa not zero
    t = tl.where(b < 0, b - 1, b)
    t = tl.where(b == LOW, 0, t)                   # -0.0 -> +0.0
    t = tl.where(nan, NEG_INF, t)
    tl.store(dst + offs, t.to(b.dtype), mask=mask)


def order_keys_triton(scores: Any) -> Any:
    """:func:`plugins.flashinfer.order_keys` in one pass (GPU, or the Triton interpreter)."""
    import torch

    from plugins.flashinfer import neg_inf_bits

    x = scores.contiguous()
    int_t = torch.int32 if x.dtype == torch.float32 else torch.int16
    bits = x.view(int_t)
    out = torch.empty_like(bits)
    n = bits.numel()
    if n:
        low = torch.iinfo(int_t).min
        exp = {torch.float32: 0x7F800000, torch.float16: 0x7C00, torch.bfloat16: 0x7F80}[x.dtype]
        _order_keys_kernel[(triton.cdiv(n, _BLOCK),)](
            bits, out, n, LOW=low, NEG_INF=neg_inf_bits(x.dtype), EXP=exp, BLOCK=_BLOCK)
    return out.view(x.dtype)
