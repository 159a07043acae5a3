"""A bf16 embedding table kept as int8 with a float32 scale per group of 32, when that is exact.

A GGUF file stores SmolLM2's token embedding as Q8_0: blocks of 32 int8 values q and an fp16 scale d, the
weight d·q. The converted checkpoint holds bf16(d·q) (converted in float32, where d·q is exact, then
rounded). Those values come back bit for bit from q and a float32 scale: every value's bf16 rounding
interval divided by its q holds d, so a scale inside all of them, with the same q, rounds back to the same
values. The largest value (|q| = 127 in a Q8_0 block) bounds d first; the values whose q that leaves no
doubt about narrow it. `exact_int8_groups` builds q and scales so and checks every value; a table that does
not come back exactly (one that never was Q8_0) is left as it is.

The default model's 49,152 × 576 table then takes 30 MB instead of 54 MB (1 byte a value and 4 bytes
per 32), for its rows looked up by the embedding and by the output projection's float32 refinement
(quant.RefinedHead), with the same values.
"""

from __future__ import annotations

import torch
from torch import nn

GROUP = 32  # a Q8_0 block
# a table is converted in blocks of rows, so that its float32 temporaries stay small (a dozen of a block's
# size at once: 4,096 rows of the default model raised loading's peak ~170 MB, 512 rows ~20 MB)
ROWS_AT_ONCE = 512


def exact_int8_groups(w: torch.Tensor, group: int = GROUP) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(q int8 [V, H], scales float32 [V, H/group]) with bf16(q · scale) == w everywhere, or None if
    w is not bf16, its rows do not split into groups, or no such scales reproduce it."""
    if w.dtype != torch.bfloat16 or w.dim() != 2 or w.shape[1] % group or w.device.type != "cpu":
        return None
    # (written block by block into the result: a list of blocks and their concatenation held both)
    q = torch.empty(w.shape, dtype=torch.int8)
    scales = torch.empty((w.shape[0], w.shape[1] // group), dtype=torch.float32)
    for start in range(0, w.shape[0], ROWS_AT_ONCE):
        found = _block(w[start : start + ROWS_AT_ONCE], group)
        if found is None:
            return None
        q[start : start + ROWS_AT_ONCE] = found[0]
        scales[start : start + ROWS_AT_ONCE] = found[1]
    return q, scales


def _block(w: torch.Tensor, group: int) -> tuple[torch.Tensor, torch.Tensor] | None:
    rows, cols = w.shape
    x = w.float().view(rows, cols // group, group)
    # Each value's bf16 rounding interval [low, high], in magnitude: half a unit in the last place (8
    # significant bits) above; below, a quarter at a power of two (where the spacing halves).
    mantissa, exponent = torch.frexp(x)
    half = torch.ldexp(torch.ones_like(x), exponent - 9)
    low = x.abs() - torch.where(mantissa.abs() == 0.5, half / 2, half)
    high = x.abs() + half
    # The scale d lies in [lowest, highest]: first from the largest value (|q| = 127), then narrowed by
    # every value whose |q| that range leaves no doubt about (bf16 keeps 8 bits, so a value near full
    # scale can round to either of two q at first).
    top = x.abs().argmax(-1, keepdim=True)
    lowest, highest = low.gather(-1, top) / 127, high.gather(-1, top) / 127
    for _ in range(3):
        q_low = torch.ceil(low / highest.clamp(min=1e-30))
        q_high = torch.floor(high / lowest.clamp(min=1e-30))
        sure = (q_low == q_high) & (q_low > 0)
        size = q_low.clamp(min=1)
        lowest = torch.maximum(lowest, torch.where(sure, low / size, 0).amax(-1, keepdim=True))
        highest = torch.minimum(highest, torch.where(sure, high / size, torch.inf).amin(-1, keepdim=True))
    # Any scale in the range with an integer q for every value that gives it back will do: the middle
    # first, then, for the groups where it fails, other points of the range (rarely needed)
    scale = torch.where(highest > 0, (lowest + highest) / 2, 0)
    q, ok = _fit(x, scale)
    for fraction in (0.25, 0.75, 0.125, 0.375, 0.625, 0.875, 0.0625, 0.9375):
        if bool(ok.all()):
            break
        bad = ~ok[..., 0]
        other = (lowest[bad] + fraction * (highest[bad] - lowest[bad])).clamp(min=0)
        q_other, ok_other = _fit(x[bad], other)
        scale[bad] = torch.where(ok_other, other, scale[bad])
        q[bad] = torch.where(ok_other, q_other, q[bad])
        ok[bad] = ok_other
    if not bool(ok.all()):
        return None
    return q.to(torch.int8).view(rows, cols), scale.view(rows, cols // group)


def _fit(x: torch.Tensor, scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """For groups x [..., G] and scales [..., 1]: q (the nearest integer to x / scale, or a neighbour of it,
    whichever gives x back), and per group whether every value comes back as bf16(q · scale)."""
    target = x.to(torch.bfloat16)
    nearest = torch.round(x / torch.where(scale > 0, scale, 1))
    q = nearest
    for other in (nearest - 1, nearest + 1):
        q = torch.where((q * scale).to(torch.bfloat16) == target, q, other)
    q = q.clamp(-127, 127)
    return q, ((q * scale).to(torch.bfloat16) == target).all(-1, keepdim=True)


def int8_group_rows(q: torch.Tensor, scales: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """Rows `index` of the table, bf16 [..., H], exactly the values it was built from."""
    rows = q[index].float()
    groups = rows.view(*rows.shape[:-1], scales.shape[-1], -1)
    return (groups * scales[index][..., None]).view(rows.shape).to(torch.bfloat16)


class Int8GroupEmbedding(nn.Module):
    """An embedding whose table is exact_int8_groups'; looks up the same bf16 rows as the table did."""

    def __init__(self, q: torch.Tensor, scales: torch.Tensor) -> None:
        super().__init__()
        self.register_buffer("q", q, persistent=False)
        self.register_buffer("scales", scales, persistent=False)
        self.num_embeddings, self.embedding_dim = q.shape

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return int8_group_rows(self.q, self.scales, ids)
