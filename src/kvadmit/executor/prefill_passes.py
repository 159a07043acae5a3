"""A long prefill batch as several forward passes of at most PASS_TOKENS new tokens each.

The scheduler's batch is what SGLang would run (up to --chunked-prefill-size new tokens); on the CPU its
activations grow with the tokens of a pass (the default model in float32: about 180 MB above the weights
and KV for a 4,096-token pass, 70 MB for 1,024, measured in process), while the time per token stays the
same. So the executor computes such a batch in consecutive passes, of 512 tokens: with int4 weights and an
int8 KV pool, 16 concurrent requests of 512 + 128 tokens peaked at 547-549 MB resident against 563-598 with
1,024 (two runs each, benchmarks/engine_speed.py's load). A request's new tokens may spread over
consecutive passes: K and V are written to the pool before attention, so a later piece attends to the
earlier ones through the pool as to a cached prefix. Only a piece that ends its request gives logits.
"""

from __future__ import annotations

from dataclasses import dataclass

PASS_TOKENS = 512


@dataclass(frozen=True, slots=True)
class Piece:
    row: int  # the request's index in the batch
    begin: int  # the position of the piece's first new token
    end: int  # one past its last
    last: bool  # whether the piece holds the request's last new token (its logits are the request's)


def split_passes(spans: list[tuple[int, int]], limit: int = PASS_TOKENS) -> list[list[Piece]]:
    """Passes of at most `limit` new tokens over each request's new positions [begin, end), requests in
    order; a pass is filled before the next begins, so a request's pieces fall in consecutive passes."""
    if limit < 1:
        raise ValueError(f"a pass holds at least one token, not {limit}")
    passes: list[list[Piece]] = []
    current: list[Piece] = []
    room = limit
    for row, (begin, end) in enumerate(spans):
        start = begin
        while True:
            take = min(end - start, room)
            current.append(Piece(row, start, start + take, start + take == end))
            start += take
            room -= take
            if room == 0:
                passes.append(current)
                current, room = [], limit
            if start == end:
                break
    if current:
        passes.append(current)
    return passes
