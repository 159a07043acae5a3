"""Attention over the pool against each sequence attending alone, written out naively here: a decode
batch with ragged contexts on scattered slots, prefills with ragged numbers of new tokens and cached
prefixes, and the layouts the pass picks."""

from __future__ import annotations

import math

import pytest
import torch

from kvadmit.model.forward_batch import ForwardBatch, Sequence, pool_attention

HEADS, KV_HEADS, DIM, POOL = 6, 2, 8, 64


def naive_attention(q: torch.Tensor, kv_pool: torch.Tensor, seq: Sequence) -> torch.Tensor:
    """One sequence: its new tokens [n, heads, dim] over its slots, causal, K/V heads shared by groups."""
    groups = HEADS // KV_HEADS
    ctx, n = seq.slots.shape[0], seq.num_new
    k = kv_pool[:KV_HEADS, seq.slots].transpose(0, 1).repeat_interleave(groups, dim=1)  # [ctx, heads, dim]
    v = kv_pool[KV_HEADS:, seq.slots].transpose(0, 1).repeat_interleave(groups, dim=1)
    scores = torch.einsum("nhd,chd->hnc", q, k) / math.sqrt(DIM)
    for i in range(n):
        scores[:, i, ctx - n + i + 1 :] = float("-inf")  # token i sits at position ctx − n + i
    return torch.einsum("hnc,chd->nhd", scores.softmax(-1), v).reshape(n, HEADS * DIM)


def batch_of(shapes: list[tuple[int, int]], seed: int = 0) -> tuple[list[Sequence], torch.Tensor]:
    """Sequences with (context, new tokens) each, on slots drawn at random from the whole pool."""
    gen = torch.Generator().manual_seed(seed)
    slots = torch.randperm(POOL, generator=gen)
    seqs, used = [], 0
    for ctx, new in shapes:
        seqs.append(Sequence(slots[used : used + ctx], new))
        used += ctx
    q = torch.randn(sum(n for _, n in shapes), HEADS, DIM, generator=gen)
    return seqs, q


CASES = {
    "decode, ragged contexts": [(5, 1), (17, 1), (1, 1), (9, 1)],
    "decode, equal contexts": [(7, 1), (7, 1), (7, 1)],
    "prefill, ragged new tokens and cached prefixes": [(7, 7), (12, 3), (4, 1), (9, 9)],
    "prefill, one sequence after a cached prefix": [(11, 4)],
    "prefill, equal new tokens": [(6, 2), (10, 2)],
}


@pytest.mark.parametrize("case", list(CASES))
def test_batched_attention_equals_each_sequence_alone(case: str) -> None:
    shapes = CASES[case]
    seqs, q = batch_of(shapes)
    kv_pool = torch.randn(2 * KV_HEADS, POOL, DIM, generator=torch.Generator().manual_seed(1))
    ids = torch.zeros(q.shape[0], dtype=torch.long)
    fb = ForwardBatch.build(ids, ids, seqs)
    new_kv = kv_pool[:, fb.out_slots].transpose(0, 1)  # the new tokens' K and V, already in their slots
    out = pool_attention(q, new_kv[:, :KV_HEADS], new_kv[:, KV_HEADS:], kv_pool, fb)
    expected, start = [], 0
    for seq in seqs:
        expected.append(naive_attention(q[start : start + seq.num_new], kv_pool, seq))
        start += seq.num_new
    torch.testing.assert_close(out, torch.cat(expected), atol=1e-5, rtol=1e-5)


def test_the_pass_layout_is_computed_once_in_its_cheapest_form() -> None:
    ids = torch.zeros(3, dtype=torch.long)
    equal, _ = batch_of([(7, 1), (7, 1), (7, 1)])
    fb = ForwardBatch.build(ids, ids, equal)
    assert fb.key_bias is None and fb.prefill == ()  # decode, every key seen: nothing to mask
    ragged, _ = batch_of([(5, 1), (3, 1), (2, 1)])
    fb = ForwardBatch.build(ids, ids, ragged)
    assert fb.gather is not None and fb.key_bias is not None
    assert fb.gather.view(3, 5)[1].tolist()[3:] == [0, 0]  # padding points at slot 0 ...
    assert fb.key_bias.shape == (1, 3, 1, 5)  # ... and is masked out: one row per sequence
    assert (fb.key_bias[0, :, 0] == 0).sum(-1).tolist() == [5, 3, 2]
    ids = torch.zeros(6, dtype=torch.long)
    prefill, _ = batch_of([(2, 2), (6, 4)])
    fb = ForwardBatch.build(ids, ids, prefill)
    assert fb.gather is None and fb.last.tolist() == [1, 5]
    assert fb.out_slots.tolist() == [*prefill[0].slots.tolist(), *prefill[1].slots[2:].tolist()]
    first, second = fb.prefill
    assert (first.start, first.num_new, first.slots, first.mask) == (0, 2, None, None)  # causal, own K/V
    assert (second.start, second.num_new) == (2, 4) and second.mask is not None
    assert second.slots is not None and second.slots.tolist() == prefill[1].slots.tolist()
    # Its new tokens sit at positions 2–5 and see the keys up to their own.
    assert second.mask.sum(-1).tolist() == [3, 4, 5, 6]
