"""One forward pass over the token pool: what every layer needs, computed once per step, and the batched
attention that reads each sequence's K and V from its pool slots.

A pass computes the new tokens of B sequences (a ragged prefill, or one token each for decode). Sequence b
has `ctx_b` tokens in its slots, the last `n_b` of them new. Attention runs once per layer for the whole
batch: each sequence's slots are gathered into a padded [B, L] layout (L = the longest context; padding
points at slot 0 and is masked out), the new tokens' queries into a padded [B, Q] layout (Q = the most new
tokens), and one scaled_dot_product_attention call does the rest.

Grouped-query attention without repeating K and V: the `groups` query heads that share a KV head are
folded into the query-length axis, so queries are [B, kv_heads, groups·Q, dim] against keys [B, kv_heads,
L, dim]; the mask is repeated over the groups to match.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass(frozen=True, slots=True)
class Sequence:
    """One sequence of a forward pass: the pool slots of all its tokens (position order); the last
    `num_new` of them are this pass's tokens."""

    slots: torch.Tensor  # [context] int64
    num_new: int


@dataclass(frozen=True, slots=True)
class ForwardBatch:
    input_ids: torch.Tensor  # [T] the new tokens, sequence after sequence
    positions: torch.Tensor  # [T]
    out_slots: torch.Tensor  # [T] where the new tokens' K and V are written
    gather: torch.Tensor  # [B, L] each sequence's slots, padded with slot 0
    mask: torch.Tensor | None  # [B, 1, groups·Q, L] keys each query sees; None: every key, every query
    rows: torch.Tensor | None  # [T] row of each new token in the padded [B·Q] layout; None: T == B·Q
    max_new: int  # Q
    last: torch.Tensor  # [B] index into T of each sequence's last new token

    @property
    def num_seqs(self) -> int:
        return self.gather.shape[0]

    @classmethod
    def build(
        cls,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        seqs: list[Sequence],
        groups: int,
        device: torch.device | str = "cpu",
    ) -> ForwardBatch:
        new = [s.num_new for s in seqs]
        ctx_list = [s.slots.shape[0] for s in seqs]
        b, q, length = len(seqs), max(new), max(ctx_list)
        n = torch.tensor(new)
        ctx = torch.tensor(ctx_list)
        gather = torch.nn.utils.rnn.pad_sequence([s.slots for s in seqs], batch_first=True)
        out_slots = torch.cat([s.slots[c - k :] for s, c, k in zip(seqs, ctx_list, new, strict=True)])
        last = torch.cumsum(n, 0) - 1
        rows = None
        if any(k != q for k in new):
            # Token t of sequence s sits at row s·Q + (t − the index of s's first token).
            starts = torch.repeat_interleave(last + 1 - n, n)
            rows = torch.repeat_interleave(torch.arange(b) * q, n) + torch.arange(int(n.sum())) - starts
        key = torch.arange(length)[None, None, :]
        if q == 1 and all(c == length for c in ctx_list):
            mask = None  # one query per sequence and no padding: every key is seen
        else:
            # Query i of sequence s (context position ctx − n + i) sees keys up to its own position.
            query = torch.arange(q)[None, :, None]
            seen = (key < ctx[:, None, None]) & (key <= (ctx - n)[:, None, None] + query)  # [B, Q, L]
            mask = seen[:, None]  # with Q == 1 it broadcasts over the groups as it is
            if q > 1:
                mask = mask.expand(b, groups, q, length).reshape(b, 1, groups * q, length)
        return cls(
            input_ids=input_ids.to(device),
            positions=positions.to(device),
            out_slots=out_slots.to(device),
            gather=gather.to(device),
            mask=None if mask is None else mask.to(device),
            rows=None if rows is None else rows.to(device),
            max_new=q,
            last=last.to(device),
        )


def pool_attention(
    q: torch.Tensor,  # [T, heads, dim]
    kv_pool: torch.Tensor,  # [pool, 2·kv_heads, dim]: K heads then V heads
    fb: ForwardBatch,
) -> torch.Tensor:
    """Attention of the new tokens over their sequences' slots (already holding the new K and V).
    Returns [T, heads·dim]."""
    _, heads, dim = q.shape
    kv_heads = kv_pool.shape[1] // 2
    groups = heads // kv_heads
    b, nq = fb.num_seqs, fb.max_new
    # One row gather (index_select is several times faster than advanced indexing on CPU).
    kv = kv_pool.index_select(0, fb.gather.view(-1)).view(b, -1, 2 * kv_heads, dim)  # [B, L, 2·kv, dim]
    k = kv[:, :, :kv_heads].transpose(1, 2)  # [B, kv_heads, L, dim]
    v = kv[:, :, kv_heads:].transpose(1, 2)
    if fb.rows is None:
        padded = q
    else:
        padded = q.new_zeros(b * nq, heads, dim)
        padded[fb.rows] = q
    # [B·Q, heads, dim] → [B, kv_heads, groups·Q, dim] (heads = kv_head·groups + group).
    queries = padded.view(b, nq, kv_heads, groups, dim).permute(0, 2, 3, 1, 4).reshape(b, kv_heads, -1, dim)
    out = F.scaled_dot_product_attention(queries, k, v, attn_mask=fb.mask)
    out = out.view(b, kv_heads, groups, nq, dim).permute(0, 3, 1, 2, 4).reshape(b * nq, heads * dim)
    return out if fb.rows is None else out[fb.rows]
