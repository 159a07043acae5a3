"""kvadmit's decode attention kernel (model/decode_attention.c through attention_native.py) against the
definition, softmax(q·Kᵀ/√d)·V over each sequence's own slots, computed in float64 from the same bf16 pool;
and the forward pass choosing it."""

from __future__ import annotations

import math

import pytest
import torch

from kvadmit.model import attention_native
from kvadmit.model.forward_batch import ForwardBatch, Sequence, _decode_attention

needs_kernel = pytest.mark.skipif(not attention_native.available(), reason="the kernel does not run here")


def _definition(q: torch.Tensor, pool: torch.Tensor, slots: list[torch.Tensor]) -> torch.Tensor:
    """[B, heads·dim] float64: each query head g of KV head h = g // groups over its sequence's slots."""
    b, heads, dim = q.shape
    kv_heads = pool.shape[0] // 2
    groups = heads // kv_heads
    out = torch.empty(b, heads, dim, dtype=torch.float64)
    for i in range(b):
        for g in range(heads):
            h = g // groups
            keys, values = pool[h, slots[i]].double(), pool[kv_heads + h, slots[i]].double()
            p = torch.softmax(keys @ q[i, g].double() / math.sqrt(dim), dim=0)
            out[i, g] = p @ values
    return out.reshape(b, heads * dim)


def _case(lengths: list[int], kv_heads: int, groups: int, dim: int, seed: int) -> tuple:
    g = torch.Generator().manual_seed(seed)
    slots_total = sum(lengths) + 5
    pool = torch.randn(2 * kv_heads, slots_total, dim, generator=g).bfloat16()
    perm = torch.randperm(slots_total, generator=g)  # slots in no order, as a radix cache leaves them
    slots, at = [], 0
    for n in lengths:
        slots.append(perm[at : at + n])
        at += n
    q = torch.randn(len(lengths), kv_heads * groups, dim, generator=g) * 2
    return q, pool, slots


@needs_kernel
@pytest.mark.parametrize(
    ("lengths", "kv_heads", "groups", "dim"),
    [([1], 1, 1, 8), ([7, 8, 9, 17], 3, 3, 64), ([580, 3, 250], 3, 3, 64), ([33], 2, 4, 128)],
)
def test_the_kernel_computes_the_definition(lengths: list[int], kv_heads: int, groups: int, dim: int) -> None:
    q, pool, slots = _case(lengths, kv_heads, groups, dim, seed=len(lengths) + dim)
    gather = torch.nn.utils.rnn.pad_sequence(slots, batch_first=True)
    got = attention_native.decode_attention(q, pool, gather, torch.tensor(lengths, dtype=torch.int32))
    # float32 sums of up to 580 terms and a polynomial exp (relative error ~2e-7)
    torch.testing.assert_close(got.double(), _definition(q, pool, slots), rtol=1e-5, atol=1e-5)


@needs_kernel
def test_large_score_gaps_underflow_to_zero_weight() -> None:
    """A key far above the others takes all the weight (exp of −90 and below is 0, not a NaN)."""
    q, pool, slots = _case([4], 1, 1, 8, seed=3)
    q[0, 0] = 0
    q[0, 0, 0] = 400.0
    pool[0, slots[0][2], 0] = 4.0  # score 400·4/√8 ≈ 566 against |400·x| / √8 for the others
    pool[0, slots[0][[0, 1, 3]], 0] = torch.tensor([-1.0, 0.5, 1.0]).bfloat16()
    got = attention_native.decode_attention(q, pool, slots[0][None], torch.tensor([4], dtype=torch.int32))
    assert torch.equal(got[0], pool[1, slots[0][2]].float())


@needs_kernel
def test_the_forward_pass_takes_the_kernel_and_agrees_with_pytorchs_path(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    q, pool, slots = _case([5, 12, 9], 3, 3, 64, seed=4)
    fb = ForwardBatch.build(torch.zeros(3, dtype=torch.long), torch.zeros(3, dtype=torch.long),
                            [Sequence(s, 1) for s in slots])  # fmt: skip
    assert fb.lengths is not None and fb.lengths.tolist() == [5, 12, 9]
    native = _decode_attention(q, pool, fb.gather, fb.key_bias, fb.lengths)
    monkeypatch.setattr(attention_native, "applies", lambda q, pool: False)
    pytorch = _decode_attention(q, pool, fb.gather, fb.key_bias, fb.lengths)  # bf16 matmuls
    torch.testing.assert_close(native, pytorch, rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(native.double(), _definition(q, pool, slots), rtol=1e-5, atol=1e-5)


def test_the_environment_can_choose_pytorchs_attention(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(attention_native.ENV, "torch")
    monkeypatch.setattr(attention_native, "_available", None)
    attention_native._function.cache_clear()
    try:
        assert not attention_native.available()
    finally:
        monkeypatch.delenv(attention_native.ENV)
        attention_native._function.cache_clear()
        attention_native._available = None
