"""Bad calls through registry.dispatch: a WorkloadError naming the argument and the fix."""

from __future__ import annotations

import pytest
import torch

import registry
from registry.errors import UnknownOpError, WorkloadError

Q = torch.zeros(4, 6, 16)
K = torch.zeros(8, 1, 16)
IDX = torch.zeros(4, 5, dtype=torch.int32)


@pytest.mark.parametrize("args,kwargs,match", [
    ((torch.zeros(4, 16), K, K, IDX), {}, r"q \[total_q, num_q_heads, head_dim\]"),
    ((Q, torch.zeros(8), K, IDX), {}, r"k/v \[num_slots, num_kv_heads, head_dim\]"),
    ((Q, torch.zeros(8, 4, 16), torch.zeros(8, 4, 16), IDX), {},
     "group_size: num_q_heads=6 is not a multiple of num_kv_heads=4"),
    ((Q, K, K, IDX), {"kind": "decode"}, "kind='decode' is not one of"),
    ((Q, K, K, IDX), {"kind": "chunk"}, "needs cu_seqlens_q"),
    ((Q, K, K, IDX), {"lenghts": None}, r"unknown keyword\(s\) \['lenghts'\]"),
    ((Q, K, K), {}, "see `kreg ops`"),
])
def test_sparse_prefill_bad_calls(args: tuple, kwargs: dict, match: str) -> None:
    with pytest.raises(WorkloadError, match=match):
        registry.dispatch("sparse_prefill", *args, **kwargs)


def test_indexer_topk_bad_calls() -> None:
    lengths = torch.zeros(2, dtype=torch.int32)
    with pytest.raises(WorkloadError, match=r"scores \[rows, max_keys\]; got \[2, 3, 4\]"):
        registry.dispatch("indexer_topk", torch.zeros(2, 3, 4), lengths, k=4)
    with pytest.raises(WorkloadError, match="got list"):
        registry.dispatch("indexer_topk", [[1.0]], lengths, k=4)
    with pytest.raises(WorkloadError, match="k: Input should be greater than or equal to 1"):
        registry.dispatch("indexer_topk", torch.zeros(2, 8), lengths, k=0)


def test_unknown_op() -> None:
    with pytest.raises(UnknownOpError, match="known ops: indexer_topk, sparse_prefill"):
        registry.dispatch("sparse_decode", Q)
