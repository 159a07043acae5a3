"""One forward pass over the token pool: what every layer needs, computed once per pass, and the attention
that reads each sequence's K and V from its pool slots.

A pass computes the new tokens of B sequences: a ragged prefill, or one token each (decode). Sequence b has
`ctx_b` tokens in its slots, the last `n_b` of them new. A layer's pool is one tensor [2·kv_heads, slots,
row] (K heads, then V heads; a row is a token's head, as kv_quant.py stores it), so that gathering slots
yields each head's keys as one contiguous block.

* Decode: through kvadmit's own kernel where it runs (attention_native: each sequence's slots read in
  place, float32 arithmetic); else one gather of every sequence's slots into a padded
  [2·kv_heads, B, L, dim] layout (L = the longest context; padding points at slot 0 and is masked out),
  then attention for the whole batch in two batched matmuls: each KV head's `groups` query heads against
  its keys (in the model's dtype, or float32 for a single sequence), softmax in float32 (as transformers'
  eager attention does).
* Prefill: attention per sequence (its cost is in the matmuls, not in the loop). A sequence without a
  cached prefix attends causally over its own new K and V; one with a prefix gathers its slots and uses a
  mask aligned to its last token.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from kvadmit.model import attention_native, kv_quant


@dataclass(frozen=True, slots=True)
class Sequence:
    """One sequence of a forward pass: the pool slots of all its tokens (position order); the last
    `num_new` of them are this pass's tokens."""

    slots: torch.Tensor  # [context] int64
    num_new: int


@dataclass(frozen=True, slots=True)
class PrefillPart:
    """One sequence of a prefill: its new tokens are rows start:start+num_new of the pass."""

    start: int
    num_new: int
    slots: torch.Tensor | None  # all its slots when it has a cached prefix; None: it attends to itself only
    mask: torch.Tensor | None  # [num_new, context] keys each new token sees (with a prefix)


@dataclass(frozen=True, slots=True)
class ForwardBatch:
    input_ids: torch.Tensor  # [T] the new tokens, sequence after sequence
    positions: torch.Tensor  # [T]
    out_slots: torch.Tensor  # [T] where the new tokens' K and V are written
    last: torch.Tensor  # [B] index into T of each sequence's last new token
    gather: torch.Tensor | None  # decode: [B, L] every sequence's slots, each padded to L with slot 0
    key_bias: torch.Tensor | None  # decode: [1, B, 1, L] 0 for a key, −inf for padding; None: no padding
    prefill: tuple[PrefillPart, ...]  # prefill: one part per sequence; empty for decode
    lengths: torch.Tensor | None = None  # decode: [B] int32 each sequence's context length

    @property
    def num_seqs(self) -> int:
        return self.last.shape[0]

    @classmethod
    def build(
        cls,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        seqs: list[Sequence],
        device: torch.device | str = "cpu",
    ) -> ForwardBatch:
        new = [s.num_new for s in seqs]
        ctx = [s.slots.shape[0] for s in seqs]
        out_slots = torch.cat([s.slots[c - n :] for s, c, n in zip(seqs, ctx, new, strict=True)])
        last = torch.cumsum(torch.tensor(new), 0) - 1
        gather = key_bias = lengths = None
        parts: list[PrefillPart] = []
        if all(n == 1 for n in new):
            length = max(ctx)
            gather = torch.nn.utils.rnn.pad_sequence([s.slots for s in seqs], batch_first=True)
            if any(c != length for c in ctx):
                padding = torch.arange(length)[None, :] >= torch.tensor(ctx)[:, None]  # [B, L]
                key_bias = torch.zeros(padding.shape).masked_fill_(padding, float("-inf"))[None, :, None]
                key_bias = key_bias.to(device)
            gather = gather.to(device)
            lengths = torch.tensor(ctx, dtype=torch.int32, device=device)
        else:
            start = 0
            for s, c, n in zip(seqs, ctx, new, strict=True):
                if c == n:
                    parts.append(PrefillPart(start, n, None, None))
                else:
                    # New token i sits at position c − n + i and sees the keys up to it.
                    mask = torch.arange(c)[None, :] <= (c - n + torch.arange(n))[:, None]
                    parts.append(PrefillPart(start, n, s.slots.to(device), mask.to(device)))
                start += n
        return cls(
            input_ids=input_ids.to(device),
            positions=positions.to(device),
            out_slots=out_slots.to(device),
            last=last.to(device),
            gather=gather,
            key_bias=key_bias,
            prefill=tuple(parts),
            lengths=lengths,
        )


def pool_attention(
    q: torch.Tensor,  # [T, heads, dim]
    k: torch.Tensor,  # [T, kv_heads, dim] the new tokens' K and V (already in the pool too)
    v: torch.Tensor,
    kv_pool: torch.Tensor,  # [2·kv_heads, pool, dim]: K heads then V heads
    fb: ForwardBatch,
) -> torch.Tensor:
    """Attention of the new tokens over their sequences' slots. Returns [T, heads·dim]."""
    if fb.gather is not None:
        # One opaque call in the compiled graph (decode_attention_op) for a batch, or any decode where
        # kvadmit's kernel runs; else one sequence is left to inductor, which fuses its attention.
        if torch.compiler.is_compiling() and (q.shape[0] > 1 or attention_native.applies(q, kv_pool)):
            return torch.ops.kvadmit.decode_attention(q, kv_pool, fb.gather, fb.key_bias, fb.lengths)
        return _decode_attention(q, kv_pool, fb.gather, fb.key_bias, fb.lengths)
    out = []
    for part in fb.prefill:
        rows = slice(part.start, part.start + part.num_new)
        qs = q[rows].transpose(0, 1)[None]  # [1, heads, n, dim]
        if part.slots is None:  # its own new K and V, as the pool holds them
            ks = kv_quant.as_stored(k[rows], kv_pool, q.dtype).transpose(0, 1)[None]
            vs = kv_quant.as_stored(v[rows], kv_pool, q.dtype).transpose(0, 1)[None]
        else:
            kv = kv_quant.read(kv_pool.index_select(1, part.slots), q.dtype)  # [2·kv_heads, context, dim]
            ks, vs = kv.chunk(2)
            ks, vs = ks[None], vs[None]
        o = F.scaled_dot_product_attention(
            qs, ks, vs, attn_mask=part.mask, is_causal=part.mask is None, enable_gqa=True
        )
        out.append(o[0].transpose(0, 1).reshape(part.num_new, -1))
    return torch.cat(out) if len(out) > 1 else out[0]


def _decode_attention(
    q: torch.Tensor, kv_pool: torch.Tensor, gather: torch.Tensor, key_bias: torch.Tensor | None,
    lengths: torch.Tensor | None,
) -> torch.Tensor:  # fmt: skip
    if lengths is not None and attention_native.applies(q, kv_pool):
        return attention_native.decode_attention(q, kv_pool, gather, lengths)
    b, heads, dim = q.shape
    kv_heads = kv_pool.shape[0] // 2
    # A single sequence is computed in float32: its matrices are tiny, and tiny bf16 matmuls are slower
    # than float32 ones on CPU. A batch multiplies in the pool's dtype (scores in it, softmax in float32):
    # a quantized model computes in float32 over a bf16 pool, and converting the gathered K and V to float32
    # cost more than the two matmuls (at 16 sequences of 577 tokens, 4.1 ms a layer against 1.8 in bf16).
    # (int8 rows are read back in float32)
    dtype = torch.float32 if b == 1 or kv_quant.is_int8_rows(kv_pool) else kv_pool.dtype
    kv = kv_quant.read(kv_pool.index_select(1, gather.view(-1)), dtype).view(2 * kv_heads, b, -1, dim)
    keys, values = kv[:kv_heads], kv[kv_heads:]
    # Heads are kv_head·groups + group: [B, heads, dim] → [kv_heads, B, groups, dim].
    queries = q.view(b, kv_heads, -1, dim).transpose(0, 1).to(dtype)
    scores = torch.matmul(queries, keys.transpose(-1, -2)).float() * (1 / math.sqrt(dim))  # [kv, B, g, L]
    if key_bias is not None:
        scores += key_bias
    probs = torch.softmax(scores, dim=-1).to(dtype)
    return torch.matmul(probs, values).transpose(0, 1).reshape(b, heads * dim).to(q.dtype)


# Decode attention as an operator of its own for torch.compile (model/compiled.py): inductor would otherwise
# lower the slot gather into generic indexed loops (two copies of every gathered K and V, with an integer
# division per vector) around its matmul calls, 2.0 ms a layer at 16 sequences of 577 tokens where this eager
# code takes 1.3 (index_select, then two bf16 matmuls).
@torch.library.custom_op("kvadmit::decode_attention", mutates_args=())
def decode_attention_op(
    q: torch.Tensor, kv_pool: torch.Tensor, gather: torch.Tensor, key_bias: torch.Tensor | None,
    lengths: torch.Tensor | None,
) -> torch.Tensor:  # fmt: skip
    return _decode_attention(q, kv_pool, gather, key_bias, lengths)


@decode_attention_op.register_fake
def _decode_attention_shape(
    q: torch.Tensor, kv_pool: torch.Tensor, gather: torch.Tensor, key_bias: torch.Tensor | None,
    lengths: torch.Tensor | None,
) -> torch.Tensor:  # fmt: skip
    return q.new_empty((q.shape[0], q.shape[1] * q.shape[2]))
