"""Token times of many requests at once, from how the client records them (see client.py): a request's
token times are pieces, each either one prefill step's end time or a run of consecutive decode steps
(first, last) whose end times sit in one shared array.

What bench_serving reports is each request's first token time and the gaps between its later tokens
(np.diff of its times). The gaps inside a decode run are gaps between consecutive decode steps, the same
for every request, so they are taken once from the shared array; only the gaps where one piece meets
the next are computed per request. One concatenate builds every request's gaps, end to end, with the very
floats a per-request np.diff gives, and without first building every token's time.

A fleet's replicas each have their own decode steps: their arrays are laid end to end and each request's
decode indices moved by its replica's offset (`offsets`), so the gaps of every replica's requests come out
of one pass, in whatever order the caller lists the requests (the outcomes' order, which the metrics read).
A gap across the seam of two replicas' arrays is computed but never taken: a run's gaps lie inside it.
"""

from __future__ import annotations

import numpy as np

Piece = float | tuple[int, int]


class Gathered:
    """Every request's first token time and gaps: request k's first token came at firsts[k] and its gaps
    are gaps[bounds[k] : bounds[k+1]]."""

    def __init__(
        self,
        firsts: np.ndarray,
        gaps: np.ndarray,
        bounds: list[int],
        source: np.ndarray,
        spans: list[tuple[int, int]],
    ) -> None:
        self.firsts = firsts
        self.gaps = gaps
        self.bounds = bounds
        self._source = source
        self._spans = spans

    def rewrite(self) -> None:
        """Write the gaps again, in order, into the same array (after a reader reordered it in place)."""
        if self._spans:
            np.concatenate([self._source[a:b] for a, b in self._spans], out=self.gaps)


def gather_gaps(
    decode_times: np.ndarray, requests: list[list[Piece]], offsets: list[int] | None = None
) -> Gathered:
    """Every request's gaps, end to end, in the order of `requests`. Every request has at least one
    piece. `offsets[k]`: where request k's decode indices start in `decode_times` (0 for all when
    None)."""
    step_gaps = decode_times[1:] - decode_times[:-1]  # step_gaps[i]: from decode step i to i + 1
    joins: list[float] = []  # gaps where one piece meets the next (placed after step_gaps in a source)
    spans: list[tuple[int, int]] = []  # each run of gaps as [start, end) in that source
    firsts: list[float] = []
    bounds = [0]
    n_steps = len(step_gaps)
    # Python floats for the per-piece arithmetic below (numpy scalars are slow to index and subtract; the
    # doubles, and so every difference, are the same)
    times = decode_times.tolist()
    for k, pieces in enumerate(requests):
        off = 0 if offsets is None else offsets[k]
        total = bounds[-1]
        last: float | None = None  # the previous piece's last token time
        for piece in pieces:
            if isinstance(piece, tuple):
                a, b = piece[0] + off, piece[1] + off
                first_t, last_t = times[a], times[b]
            else:
                a = b = 0
                first_t = last_t = piece
            if last is None:
                firsts.append(first_t)
            else:
                spans.append((n_steps + len(joins), n_steps + len(joins) + 1))
                joins.append(first_t - last)
                total += 1
            if b > a:
                spans.append((a, b))  # step_gaps[a : b] are the gaps inside the run
                total += b - a
            last = last_t
        bounds.append(total)
    source = np.concatenate((step_gaps, np.asarray(joins, dtype=float)))
    gaps = np.concatenate([source[a:b] for a, b in spans]) if spans else source[:0]
    return Gathered(np.asarray(firsts, dtype=float), gaps, bounds, source, spans)
