"""Batched attention over the pool (one call for the whole batch) against each sequence attending alone,
written out naively here: ragged contexts, scattered slots, ragged numbers of new tokens, cached
prefixes, and the layouts the batch picks (no mask, no query padding)."""

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
    k = kv_pool[seq.slots, :KV_HEADS].repeat_interleave(groups, dim=1)  # [ctx, heads, dim]
    v = kv_pool[seq.slots, KV_HEADS:].repeat_interleave(groups, dim=1)
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
    kv_pool = torch.randn(POOL, 2 * KV_HEADS, DIM, generator=torch.Generator().manual_seed(1))
    ids = torch.zeros(q.shape[0], dtype=torch.long)
    fb = ForwardBatch.build(ids, ids, seqs, groups=HEADS // KV_HEADS)
    out = pool_attention(q, kv_pool, fb)
    expected, start = [], 0
    for seq in seqs:
        expected.append(naive_attention(q[start : start + seq.num_new], kv_pool, seq))
        start += seq.num_new
    torch.testing.assert_close(out, torch.cat(expected), atol=1e-5, rtol=1e-5)


def test_the_batch_layout_is_computed_once_with_the_cheapest_form() -> None:
    ids = torch.zeros(3, dtype=torch.long)
    equal, _ = batch_of([(7, 1), (7, 1), (7, 1)])
    fb = ForwardBatch.build(ids, ids, equal, groups=3)
    assert fb.mask is None and fb.rows is None  # every key seen, one query each: nothing to pad
    ragged, _ = batch_of([(5, 1), (3, 1), (2, 1)])
    fb = ForwardBatch.build(ids, ids, ragged, groups=3)
    assert fb.rows is None and fb.mask is not None
    assert fb.mask.shape == (3, 1, 1, 5)  # one query row, broadcast over the 3 query heads of a group
    assert fb.mask[:, 0, 0].sum(-1).tolist() == [5, 3, 2]
    assert fb.gather[1].tolist()[3:] == [0, 0]  # padding points at slot 0, masked out
    ids = torch.zeros(6, dtype=torch.long)
    prefill, _ = batch_of([(2, 2), (6, 4)])
    fb = ForwardBatch.build(ids, ids, prefill, groups=3)
    # Sequence 0's two tokens go to rows 0–1, sequence 1's four to rows 4–7 of the padded [2 × 4] layout.
    assert fb.rows is not None and fb.rows.tolist() == [0, 1, 4, 5, 6, 7]
    assert fb.last.tolist() == [1, 5]
    assert fb.out_slots.tolist() == [*prefill[0].slots.tolist(), *prefill[1].slots[2:].tolist()]
    assert fb.mask is not None and fb.mask.shape == (2, 1, 3 * 4, 6)
    # Query rows repeat per head of a group. Sequence 1's new tokens (positions 2–5) see keys up to their
    # own; sequence 0's two tokens see 1 and 2 keys, its padding rows all its 2.
    assert fb.mask[1, 0, :4].sum(-1).tolist() == [3, 4, 5, 6]
    assert fb.mask[0, 0, :4].sum(-1).tolist() == [1, 2, 2, 2]
    assert torch.equal(fb.mask[:, :, :4], fb.mask[:, :, 8:])
