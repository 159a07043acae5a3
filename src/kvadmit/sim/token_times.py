"""Token times of many requests at once, from how the client records them (see client.py): a request's
token times are pieces, each either one prefill step's end time or a run of consecutive decode steps
(first, last) whose end times sit in one shared array. One concatenate of every piece (views into that
array) beats a small concatenate per request; the values are the very same floats.
"""

from __future__ import annotations

import numpy as np

Piece = float | tuple[int, int]


def gather_token_times(decode_times: np.ndarray, requests: list[list[Piece]]) -> tuple[np.ndarray, list[int]]:
    """(every request's token times end to end, bounds): request k's are times[bounds[k] : bounds[k+1]]."""
    extra: list[float] = []  # prefill token times, placed after the decode times in one source array
    spans: list[tuple[int, int]] = []  # each piece as [start, end) in that source
    bounds = [0]
    n_decode = len(decode_times)
    for pieces in requests:
        total = bounds[-1]
        for piece in pieces:
            if isinstance(piece, tuple):
                spans.append((piece[0], piece[1] + 1))
                total += piece[1] + 1 - piece[0]
            else:
                spans.append((n_decode + len(extra), n_decode + len(extra) + 1))
                extra.append(piece)
                total += 1
        bounds.append(total)
    source = np.concatenate((decode_times, np.asarray(extra, dtype=float)))
    if not spans:
        return source[:0], bounds
    return np.concatenate([source[a:b] for a, b in spans]), bounds
