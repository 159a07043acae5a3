"""Token times of many requests at once, from how the client records them (see client.py): a request's
token times are pieces, each either one prefill step's end time or a run of consecutive decode steps
(first, last) whose end times sit in one shared array.

What bench_serving reports is each request's first token time and the gaps between its later tokens
(np.diff of its times). The gaps inside a decode run are gaps between consecutive decode steps, the same
for every request, so they are taken once from the shared array; only the gaps where one piece meets
the next are computed per request. One concatenate builds every request's gaps, end to end, with the very
floats a per-request np.diff gives, and without first building every token's time.
"""

from __future__ import annotations

import numpy as np

Piece = float | tuple[int, int]


def gather_gaps(
    decode_times: np.ndarray, requests: list[list[Piece]]
) -> tuple[np.ndarray, np.ndarray, list[int]]:
    """(first token times, every request's gaps end to end, bounds): request k's first token came at
    firsts[k] and its gaps are gaps[bounds[k] : bounds[k+1]]. Every request has at least one piece."""
    step_gaps = decode_times[1:] - decode_times[:-1]  # step_gaps[i]: from decode step i to i + 1
    joins: list[float] = []  # gaps where one piece meets the next (placed after step_gaps in a source)
    spans: list[tuple[int, int]] = []  # each run of gaps as [start, end) in that source
    firsts: list[float] = []
    bounds = [0]
    n_steps = len(step_gaps)
    # Python floats for the per-piece arithmetic below (numpy scalars are slow to index and subtract; the
    # doubles, and so every difference, are the same)
    times = decode_times.tolist()
    for pieces in requests:
        total = bounds[-1]
        last: float | None = None  # the previous piece's last token time
        for piece in pieces:
            if isinstance(piece, tuple):
                first_t, last_t = times[piece[0]], times[piece[1]]
            else:
                first_t = last_t = piece
            if last is None:
                firsts.append(first_t)
            else:
                spans.append((n_steps + len(joins), n_steps + len(joins) + 1))
                joins.append(first_t - last)
                total += 1
            if isinstance(piece, tuple) and piece[1] > piece[0]:
                spans.append(piece)  # step_gaps[first : last] are the gaps inside the run
                total += piece[1] - piece[0]
            last = last_t
        bounds.append(total)
    source = np.concatenate((step_gaps, np.asarray(joins, dtype=float)))
    gaps = np.concatenate([source[a:b] for a, b in spans]) if spans else source[:0]
    return np.asarray(firsts, dtype=float), gaps, bounds
