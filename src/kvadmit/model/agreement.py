"""Greedy next-token agreement of two models over a text: at every position of the text, whether both
models' most likely next token is the same (teacher-forced: both read the text itself, not their own
output). The quality measure of quantized weights against the float32 model (tests/test_quant_quality.py,
benchmarks/engine_speed.py)."""

from __future__ import annotations

import torch

from kvadmit.model.forward_batch import ForwardBatch, Sequence
from kvadmit.model.llama import CausalLM

CHUNK = 512  # tokens a prefill pass computes at once (the attention of a pass is [chunk, context])


def greedy_tokens(model: CausalLM, ids: list[int]) -> list[int]:
    """The model's most likely next token after each prefix ids[:i+1], in chunked prefill passes."""
    pool = model.new_kv_pool(len(ids) + 1)  # slot 0 stays the padding slot
    out: list[int] = []
    for begin in range(0, len(ids), CHUNK):
        end = min(begin + CHUNK, len(ids))
        seq = Sequence(torch.arange(1, end + 1), end - begin)
        fb = ForwardBatch.build(torch.tensor(ids[begin:end]), torch.arange(begin, end), [seq], model.device)
        out += model.forward_batch(fb, pool, all_positions=True).float().argmax(dim=-1).tolist()
    return out


def decode_tokens(model: CausalLM, parts: list[list[int]]) -> list[int]:
    """The decode path's greedy next tokens, teacher-forced: the sequences `parts` (of one length) are
    decoded side by side, one token of each a step, so that every step is a batched decode (the attention
    of forward_batch.py over the gathered pool slots); the most likely next token after each prefix,
    sequence after sequence, comparable with `greedy_tokens` of each part."""
    length = len(parts[0])
    if any(len(p) != length for p in parts):
        raise ValueError("the parts must have one length")
    pool = model.new_kv_pool(len(parts) * length + 1)  # slot 0 stays the padding slot
    starts = [1 + b * length for b in range(len(parts))]
    out: list[list[int]] = [[] for _ in parts]
    for t in range(length):
        seqs = [Sequence(torch.arange(s, s + t + 1), 1) for s in starts]
        ids = torch.tensor([p[t] for p in parts])
        fb = ForwardBatch.build(ids, torch.full((len(parts),), t), seqs, model.device)
        for row, token in zip(
            out, model.forward_batch(fb, pool).float().argmax(dim=-1).tolist(), strict=True
        ):
            row.append(token)
    return [token for row in out for token in row]


def agreement(reference: list[int], other: list[int]) -> float:
    """The share of positions where two greedy token lists agree."""
    if len(reference) != len(other) or not reference:
        raise ValueError(f"token lists of lengths {len(reference)} and {len(other)}")
    return sum(a == b for a, b in zip(reference, other, strict=True)) / len(reference)
