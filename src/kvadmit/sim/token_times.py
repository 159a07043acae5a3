"""Token times of many requests at once, from how the client records them (see client.py): a request's
token times are pieces, each either one prefill step's end time or a run of consecutive decode steps
(first, last) whose end times sit in one shared array. Gathering every request's pieces with one
fancy-index beats a small concatenate per request; the values are the very same floats.
"""

from __future__ import annotations

import numpy as np

Piece = float | tuple[int, int]


def gather_token_times(decode_times: np.ndarray, requests: list[list[Piece]]) -> tuple[np.ndarray, list[int]]:
    """(every request's token times end to end, bounds): request k's are times[bounds[k] : bounds[k+1]]."""
    extra: list[float] = []  # prefill token times, placed after the decode times in one source array
    starts: list[int] = []  # where each piece starts in that source
    lens: list[int] = []  # tokens per piece
    bounds = [0]
    n_decode = len(decode_times)
    for pieces in requests:
        total = bounds[-1]
        for piece in pieces:
            if isinstance(piece, tuple):
                starts.append(piece[0])
                lens.append(piece[1] - piece[0] + 1)
            else:
                starts.append(n_decode + len(extra))
                extra.append(piece)
                lens.append(1)
            total += lens[-1]
        bounds.append(total)
    source = np.concatenate((decode_times, np.asarray(extra, dtype=float)))
    lengths = np.asarray(lens, dtype=np.int64)
    out_starts = np.cumsum(lengths) - lengths  # where each piece starts in the output
    # Output position i of a piece maps to source position i + (its source start − its output start).
    shift = np.asarray(starts, dtype=np.int64) - out_starts
    index = np.arange(bounds[-1], dtype=np.int64) + np.repeat(shift, lengths)
    return source[index], bounds
